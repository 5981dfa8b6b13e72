//! `idem-chaos run …`: one run of the fault suite against the real `idem` binary; prints the
//! report and exits 1 when the checker found an anomaly (2 when the run could not be set up).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use idem_chaos::config::KeepDir;
use idem_chaos::{FaultKind, PlantedBug, RunConfig, StoreKind, Takeover};

#[derive(Debug, Parser)]
#[command(
    name = "idem-chaos",
    about = "A Jepsen-style fault suite for the idem gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One run: start the store, gateways, relays, clients and the nemesis, then check.
    Run(Args),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Keep {
    Never,
    OnAnomaly,
    Always,
}

#[derive(Debug, clap::Args)]
struct Args {
    /// The store every gateway and relay shares (started privately).
    #[arg(long, value_enum, default_value = "redis")]
    store: StoreKind,
    /// `idem serve` processes.
    #[arg(long, default_value_t = 3)]
    gateways: usize,
    /// `idem relay` processes (0: no brokers).
    #[arg(long, default_value_t = 1)]
    relays: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long load and faults run (`40s`, `30m` for a soak).
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed; a random one when omitted (printed, so the run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// The routes' takeover policy (`default`: the routes name none).
    #[arg(long, value_enum, default_value = "default")]
    takeover: Takeover,
    /// The routes' lease (default: the gateway's default for the route).
    #[arg(long, value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// Run `idem-planted` with this deliberate bug, to see the checker catch it.
    #[arg(long, value_enum)]
    planted: Option<PlantedBug>,
    /// Routes with the upstream's status webhook and the reconciler in `serve`.
    #[arg(long, value_enum, default_value = "off")]
    status_webhook: OnOff,
    /// The faults to inject (default: every fault the store supports).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Option<Vec<FaultKind>>,
    /// The `idem` binary (default: `IDEM_BIN`, else the build next to this one).
    #[arg(long, env = "IDEM_BIN")]
    idem: Option<PathBuf>,
    /// Keep the run's directory (configurations, logs, history, ledger).
    #[arg(long, value_enum, default_value = "on-anomaly")]
    keep: Keep,
    /// Print only the report.
    #[arg(long)]
    quiet: bool,
}

// Four workers: a child's brief blocking wait (a signal, a reap) must not stall the clients.
#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let Command::Run(args) = Cli::parse().command;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..1 << 32));
    let config = RunConfig {
        store: args.store,
        gateways: args.gateways.max(1),
        relays: args.relays,
        clients: args.clients.max(1),
        duration: args.duration,
        seed,
        takeover: args.takeover,
        lease: args.lease,
        planted: args.planted,
        status_webhook: args.status_webhook == OnOff::On,
        idem: args.idem,
        faults: args.faults,
        keep_dir: match args.keep {
            Keep::Never => KeepDir::Never,
            Keep::OnAnomaly => KeepDir::OnAnomaly,
            Keep::Always => KeepDir::Always,
        },
        verbose: !args.quiet,
        ..RunConfig::default()
    };
    eprintln!("idem-chaos: seed {seed} (replay with --seed {seed})");
    match idem_chaos::run(config).await {
        Ok(report) => {
            println!("{report}");
            if report.anomalies().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("idem-chaos: the run could not be carried out (seed {seed}): {e:#}");
            ExitCode::from(2)
        }
    }
}
