//! `idem`: an idempotency gateway in front of any HTTP service.
//!
//! ```text
//! idem demo                      # gateway + built-in sample upstream, embedded SQLite store
//! idem serve --config idem.toml  # reverse proxy with the configured routes and store
//! idem check-config --config idem.toml
//! idem reconcile --config idem.toml [--dry-run] [--json]
//! idem admin records list --state unknown   # the admin API from a shell (IDEM_ADMIN_TOKEN)
//! idem admin audit KEY --namespace payments
//! idem relay --config idem.toml   # consume the [[relay]] queues, POST each message once
//! idem sample-upstream --listen 127.0.0.1:9000
//! idem request http://127.0.0.1:8080/charge -d '{"amount":1}' --status http://127.0.0.1:8080/idem/status
//! ```
//!
//! See `docs/gateway.md` for the configuration reference and a quick start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use anyhow::Context as _;
use idem_gateway::cli::config::Checked;
use idem_gateway::config::{self, LogFormat, OverrideAdmin, OverrideLog, Overrides};
use idem_gateway::observe::{build, logging};
use idem_gateway::{cli, demo, metrics, reconcile, relay, request, server, store};

/// mimalloc keeps freed blocks on per-thread lists: a proxy frees on one worker thread much of
/// what another allocated (buffers, futures, records), where glibc's allocator contends on
/// its arena locks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Idempotency gateway: at most one execution per Idempotency-Key, replays for every retry"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reverse proxy.
    Serve(ServeArgs),
    /// Run the gateway in front of the built-in sample upstream (a charge endpoint).
    Demo(ServeArgs),
    /// Check a configuration and explain what it sets up; exits 2 if it is invalid.
    CheckConfig(ServeArgs),
    /// Send one request with an idempotency key and safe retries (curl-like).
    Request(request::RequestArgs),
    /// Check unknown and stuck records against the routes' status webhooks and settle them;
    /// exits 0 when nothing is left, 3 when some record was left unsettled.
    Reconcile {
        #[command(flatten)]
        serve: ServeArgs,
        /// Ask the webhooks and print the plan, but change nothing.
        #[arg(long)]
        dry_run: bool,
        /// One JSON object per record instead of lines for people.
        #[arg(long)]
        json: bool,
    },
    /// Talk to a running gateway's admin API: records and the audit trail.
    Admin(cli::admin::AdminArgs),
    /// Run the configured `[[relay]]`s: consume queues and POST each message once.
    Relay {
        #[command(flatten)]
        args: ServeArgs,
        /// Serve Prometheus metrics at `http://ADDR/metrics`.
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
    },
    /// Publish the outbox table's pending messages to RabbitMQ or JetStream (`[outbox]` of
    /// the file); any number of instances may share one table.
    Outbox {
        /// TOML file with an `[outbox]` table.
        #[arg(long, short)]
        config: PathBuf,
        /// Check the file, print what it sets up (credentials hidden) and exit.
        #[arg(long)]
        check: bool,
    },
    /// Print the OpenAPI 3.1 description of what the gateway answers itself (also served at
    /// `/openapi.json` on the admin listener).
    Openapi,
    /// Run only the sample upstream (for experiments and benchmarks).
    SampleUpstream {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Clone, Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short, env = "IDEM_CONFIG")]
    config: Option<PathBuf>,
    /// Data listener address [default: 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<String>,
    /// Default upstream URL, e.g. http://127.0.0.1:3000.
    #[arg(long)]
    upstream: Option<String>,
    /// Store URL: memory:, sqlite:PATH, redis://…, redis+cluster://…, postgres://…, mysql://… [default: sqlite:./idem.db].
    #[arg(long)]
    store: Option<String>,
    /// Serve the built-in sample upstream and proxy to it.
    #[arg(long)]
    demo_upstream: bool,
    /// Admin listener address (needs a token).
    #[arg(long)]
    admin_listen: Option<String>,
    /// Admin bearer token (prefer IDEM_ADMIN__TOKEN or admin.token_file).
    #[arg(long)]
    admin_token: Option<String>,
    /// `text` or `json`.
    #[arg(long)]
    log_format: Option<String>,
    /// Log filter, e.g. `info`, `warn`, `idem=debug`.
    #[arg(long)]
    log_level: Option<String>,
}

impl ServeArgs {
    fn overrides(&self, demo: bool) -> Overrides {
        let admin =
            (self.admin_listen.is_some() || self.admin_token.is_some()).then(|| OverrideAdmin {
                listen: self.admin_listen.clone(),
                token: self.admin_token.clone(),
            });
        let log = (self.log_format.is_some() || self.log_level.is_some()).then(|| OverrideLog {
            format: self.log_format.clone(),
            level: self.log_level.clone(),
        });
        Overrides {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            store: self.store.clone(),
            demo_upstream: (demo || self.demo_upstream).then_some(true),
            admin,
            log,
        }
    }

    fn settings(&self, demo: bool) -> anyhow::Result<(Checked, config::Sources)> {
        let (mut raw, sources) = config::load(self.config.as_deref(), &self.overrides(demo))?;
        if demo {
            // The demo upstream is one tenant's charge endpoint: keys are not scoped by caller
            // unless the configuration says otherwise.
            let defaults = raw.defaults.get_or_insert_with(Default::default);
            defaults
                .principal
                .get_or_insert_with(|| config::RawPrincipal {
                    from: Some(config::PrincipalFrom::None),
                    ..Default::default()
                });
            if raw.routes.as_ref().is_none_or(Vec::is_empty) {
                raw.routes = Some(demo::routes());
            }
            // The demo shows the status endpoint too (`idem request --status …`).
            raw.status.get_or_insert_with(|| config::RawStatus {
                path: Some(demo::STATUS_PATH.into()),
            });
        }
        let checked = cli::config::compile(&raw)?;
        store::available(&checked.settings.store).context("`store`")?;
        Ok((checked, sources))
    }
}

// `pub(crate)`: `src/planted_main.rs` builds this same program as `idem-planted`.
pub(crate) fn main() -> ExitCode {
    // One crypto provider for every TLS connection the process makes or accepts.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        eprintln!("error: a TLS crypto provider was already installed");
        return ExitCode::FAILURE;
    }
    // `--version` names the store backends this build can open.
    let matches = Cli::command().version(build::version_line()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::CheckConfig(args) => check_config(&args),
        Command::Serve(args) => serve(&args, false),
        Command::Demo(args) => serve(&args, true),
        Command::Reconcile {
            serve,
            dry_run,
            json,
        } => reconcile(&serve, dry_run, json),
        Command::Admin(args) => {
            let Some(runtime) = runtime() else {
                return ExitCode::FAILURE;
            };
            ExitCode::from(runtime.block_on(cli::admin::run(args)))
        }
        Command::Relay {
            args,
            metrics_listen,
        } => relay(&args, metrics_listen),
        Command::Outbox { config, check } => outbox(&config, check),
        Command::Openapi => {
            print!("{}", idem_gateway::openapi::pretty());
            ExitCode::SUCCESS
        }
        Command::SampleUpstream { listen } => sample_upstream(listen),
        Command::Request(args) => request::run(&args),
    }
}

/// `idem outbox` in a build without every SQL backend: says which features it needs.
#[cfg(not(all(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn outbox(_config: &std::path::Path, _check: bool) -> ExitCode {
    eprintln!(
        "error: `idem outbox` is not available in this build: it needs the gateway's \
         `postgres`, `mysql` and `sqlite` features (the default build has them)"
    );
    ExitCode::from(2)
}

#[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn outbox(config: &std::path::Path, check: bool) -> ExitCode {
    let settings = match idem_gateway::outbox::OutboxSettings::load(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if check {
        print!("{settings}");
        println!("ok: outbox configuration is valid");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = logging::init(LogFormat::Text, "info", None) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let result = runtime.block_on(idem_gateway::outbox::run(settings));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn reconcile(args: &ServeArgs, dry_run: bool, json: bool) -> ExitCode {
    let settings = match args.settings(false) {
        Ok((c, _)) => c.settings,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let _ = logging::init(settings.log_format, "warn", None);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(reconcile::run_once(&settings, dry_run, json)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(args: &ServeArgs) -> ExitCode {
    match args.settings(false) {
        Ok((checked, sources)) => {
            print!("{}", checked.report(&sources));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: &ServeArgs, demo: bool) -> ExitCode {
    let (settings, risks) = match args.settings(demo) {
        Ok((c, _)) => {
            let risks = c.risks();
            (c.settings, risks)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    // Inside the runtime: the span exporter's channel runs on it.
    let telemetry = {
        let _in = runtime.enter();
        logging::init(
            settings.log_format,
            &settings.log_level,
            settings.otel.as_ref(),
        )
    };
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let metrics = match metrics::install() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "metrics disabled");
            None
        }
    };
    for risk in risks {
        tracing::warn!(risk = %risk, "configuration risks the at-most-once promise");
    }
    for risk in settings.credential_risks() {
        tracing::warn!(risk = %risk, "configuration accepts tokens minted for another service");
    }
    let again = args.clone();
    let load = Box::new(move || again.settings(demo).map(|(checked, _)| checked.settings));
    let result = runtime.block_on(server::run(settings, metrics, load));
    telemetry.shutdown();
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "gateway stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn relay(args: &ServeArgs, metrics_listen: Option<SocketAddr>) -> ExitCode {
    let Checked { settings, relays } = match args.settings(false) {
        Ok((c, _)) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if metrics_listen.is_some()
        && let Err(e) = relay::metrics_tokens(&settings)
    {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    if let Err(e) = logging::init(settings.log_format, &settings.log_level, None) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let metrics = metrics::install()
        .inspect_err(|e| tracing::warn!(error = %e, "metrics disabled"))
        .ok();
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let result = runtime.block_on(relay::run(settings, relays, metrics, metrics_listen));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "relay stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn sample_upstream(listen: SocketAddr) -> ExitCode {
    let _ = logging::init(LogFormat::Text, "warn", None);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        match listener.local_addr() {
            Ok(addr) => println!("sample upstream on http://{addr}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        tokio::select! {
            () = demo::serve(listener, std::sync::Arc::default()) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        ExitCode::SUCCESS
    })
}

/// The multi-threaded runtime, or `None` after saying why it could not start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            None
        }
    }
}
