//! What one run does: the store, the processes, the workload, the faults and the timings.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The store every gateway and relay of a run shares; each is started privately by the
/// harness on spare ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum StoreKind {
    /// One `redis-server`.
    Redis,
    /// Three masters with one replica each; the gateways wait for one replica (`WAIT`).
    RedisCluster,
    /// One PostgreSQL instance (`initdb` as the `postgres` user).
    Postgres,
    /// A PostgreSQL primary with a synchronous standby; the gateways get a multi-host URL.
    PostgresStandby,
}

impl StoreKind {
    /// Its name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::Postgres => "postgres",
            Self::PostgresStandby => "postgres-standby",
        }
    }

    /// The faults the nemesis can inject on this store (with `relays` relays).
    pub fn faults(self, relays: usize) -> Vec<FaultKind> {
        let mut faults = vec![FaultKind::KillGateway, FaultKind::PauseGateway];
        if relays > 0 {
            faults.push(FaultKind::KillRelay);
        }
        match self {
            Self::Redis => faults.extend([
                FaultKind::FreezeStore,
                FaultKind::RestartStoreEmpty,
                FaultKind::CutLink,
                FaultKind::SlowLink,
            ]),
            Self::RedisCluster => faults.push(FaultKind::KillClusterMaster),
            Self::Postgres => faults.extend([
                FaultKind::FreezeStore,
                FaultKind::CutLink,
                FaultKind::SlowLink,
            ]),
            Self::PostgresStandby => faults.extend([
                FaultKind::FreezeStore,
                FaultKind::PromoteStandby,
                FaultKind::CutLink,
                FaultKind::SlowLink,
            ]),
        }
        faults
    }

    /// Whether the gateways reach this store through a [`Link`](crate::link::Link) each (for
    /// a primary with a standby, the link also stands in as the virtual IP that follows a
    /// promotion).
    pub fn linked(self) -> bool {
        !matches!(self, Self::RedisCluster)
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The routes' `takeover` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum Takeover {
    /// The routes name no policy: the gateway's default (`hold`).
    Default,
    /// `takeover = "reexecute"`: an expired lease is claimed again with a higher fence.
    Reexecute,
    /// `takeover = "hold"`: an expired lease makes the record unknown.
    Hold,
}

impl Takeover {
    /// Its name in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Reexecute => "reexecute",
            Self::Hold => "hold",
        }
    }

    /// The routes' `takeover` line, if they set one.
    pub fn config_line(self) -> Option<&'static str> {
        match self {
            Self::Default => None,
            Self::Reexecute => Some("takeover = \"reexecute\""),
            Self::Hold => Some("takeover = \"hold\""),
        }
    }

    /// Whether an expired lease is re-run rather than held.
    pub fn reexecutes(self) -> bool {
        self == Self::Reexecute
    }
}

/// A deliberate gateway bug, to show the checker catches it (`crates/idem-gateway/src/planted.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum PlantedBug {
    /// A claim that finds the key held or unknown runs the handler anyway.
    ClaimSkipsFencing,
    /// The completion is written in the background, after the answer went out.
    AnswerBeforeDurable,
    /// A claim the store failed (timeout, unreachable) runs the handler anyway.
    StoreTimeoutRuns,
}

impl PlantedBug {
    /// Its `CHAOS_PLANTED_BUG` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClaimSkipsFencing => "claim-skips-fencing",
            Self::AnswerBeforeDurable => "answer-before-durable",
            Self::StoreTimeoutRuns => "store-timeout-runs",
        }
    }
}

/// One kind of fault the nemesis injects.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FaultKind {
    /// SIGKILL a gateway, then start it again.
    KillGateway,
    /// SIGSTOP a gateway for longer than the lease, then SIGCONT.
    PauseGateway,
    /// SIGKILL a relay, then start it again.
    KillRelay,
    /// SIGSTOP the store (the PostgreSQL primary) for a few seconds, then SIGCONT.
    FreezeStore,
    /// Kill Redis and start it again empty: the store loses its data.
    RestartStoreEmpty,
    /// SIGKILL a Redis Cluster master; its replica is promoted and a new replica joins.
    KillClusterMaster,
    /// SIGKILL the PostgreSQL primary and promote the synchronous standby.
    PromoteStandby,
    /// Cut one gateway's connection to the store (open connections reset, new ones refused).
    CutLink,
    /// Delay every chunk between one gateway and the store.
    SlowLink,
}

impl FaultKind {
    /// Its name in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KillGateway => "kill-gateway",
            Self::PauseGateway => "pause-gateway",
            Self::KillRelay => "kill-relay",
            Self::FreezeStore => "freeze-store",
            Self::RestartStoreEmpty => "restart-store-empty",
            Self::KillClusterMaster => "kill-cluster-master",
            Self::PromoteStandby => "promote-standby",
            Self::CutLink => "cut-link",
            Self::SlowLink => "slow-link",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the run's directory (configurations, logs, history) is kept afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeepDir {
    /// Always removed.
    Never,
    /// Kept when the checker found an anomaly.
    OnAnomaly,
    /// Always kept.
    Always,
}

/// One run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The store.
    pub store: StoreKind,
    /// `idem serve` processes.
    pub gateways: usize,
    /// `idem relay` processes (0: no brokers, no publishers).
    pub relays: usize,
    /// Concurrent HTTP clients.
    pub clients: usize,
    /// How long clients, publishers and the nemesis run.
    pub duration: Duration,
    /// Seeds the schedule, the workload and the upstream's behaviour.
    pub seed: u64,
    /// The routes' takeover policy.
    pub takeover: Takeover,
    /// The routes' `lease`; `None`: the gateway's default for the route.
    pub lease: Option<Duration>,
    /// The planted bug the gateways run with (`CHAOS_PLANTED_BUG`, a build of `idem` with the
    /// `planted-bugs` feature); `None`: a sound gateway.
    pub planted: Option<PlantedBug>,
    /// Whether the routes have a `status_url` on the upstream's webhook and `serve` runs the
    /// reconciler (`[reconcile] every`).
    pub status_webhook: bool,
    /// The `idem` binary; found by [`binary::locate`](crate::binary::locate) when `None`.
    pub idem: Option<PathBuf>,
    /// The faults to inject; `None`: every fault the store supports.
    pub faults: Option<Vec<FaultKind>>,
    /// The gap between two faults' starts is drawn from this range.
    pub fault_gap: (Duration, Duration),
    /// The routes' upstream `timeout`.
    pub route_timeout: Duration,
    /// The gateways' `store_timeout`.
    pub store_timeout: Duration,
    /// After healing, how long unfinished keys are retried.
    pub settle_bound: Duration,
    /// Whether the run's directory is kept.
    pub keep_dir: KeepDir,
    /// Print progress lines on stderr.
    pub verbose: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            store: StoreKind::Redis,
            gateways: 3,
            relays: 0,
            clients: 32,
            duration: Duration::from_secs(40),
            seed: 1,
            takeover: Takeover::Default,
            lease: None,
            planted: None,
            status_webhook: false,
            idem: None,
            faults: None,
            fault_gap: (Duration::from_millis(1500), Duration::from_secs(4)),
            route_timeout: Duration::from_secs(1),
            store_timeout: Duration::from_secs(1),
            settle_bound: Duration::from_secs(40),
            keep_dir: KeepDir::OnAnomaly,
            verbose: true,
        }
    }
}

impl RunConfig {
    /// The routes' lease: the one set, else the gateway's default for such a route (short
    /// under `hold` with a status webhook; otherwise the route timeout plus a margin, rounded
    /// up here to 16 s).
    pub fn lease(&self) -> Duration {
        match self.lease {
            Some(lease) => lease,
            None if self.status_webhook && !self.takeover.reexecutes() => Duration::from_secs(4),
            None => self.route_timeout + Duration::from_secs(16),
        }
    }

    /// How long the run's queues and stream keep what they hold: past the load, the faults'
    /// last heal, the leases running out and the settle phase, with ten minutes to spare for
    /// the checker's reads (and a slow machine).
    pub fn broker_keep(&self) -> Duration {
        self.duration
            + Duration::from_secs(60)
            + self.lease()
            + self.settle_bound
            + Duration::from_secs(600)
    }

    /// The faults this run injects.
    pub fn fault_kinds(&self) -> Vec<FaultKind> {
        let possible = self.store.faults(self.relays);
        match &self.faults {
            None => possible,
            Some(chosen) => chosen
                .iter()
                .copied()
                .filter(|f| possible.contains(f))
                .collect(),
        }
    }

    /// The longest a gateway that is neither stopped nor killed may take to answer: the
    /// upstream timeout, the engine's one-second backstop, a claim, two completion retries
    /// and a release each bounded by the store timeout, and two seconds of slack for a
    /// loaded machine.
    pub fn answer_bound(&self) -> Duration {
        self.route_timeout + Duration::from_secs(3) + self.store_timeout * 4
    }
}
