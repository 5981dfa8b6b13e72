//! A Jepsen-style fault suite for idem: real `idem serve` and `idem relay` processes over one
//! private store, an upstream that ledgers every execution, retrying clients, a nemesis on a
//! seeded schedule, and a checker that reads the clients' history and the ledger.
//!
//! idem-chaos talks to idem only as a user would: it writes TOML configurations, starts the
//! binary, sends HTTP requests and signals. One run:
//!
//! 1. starts a private store (Redis, a Redis Cluster, PostgreSQL, or PostgreSQL with a
//!    synchronous standby), the upstream, N gateways (each reaching the store through a
//!    [`link::Link`] of its own, which the nemesis can cut or slow) and M relays;
//! 2. runs C clients, the publishers and the [`nemesis`] for the run's duration;
//! 3. heals everything, lets leases run out, retries every unfinished key until it settles or a
//!    bound passes, and asks the gateways about the keys still open;
//! 4. hands the history, the ledger and the fault log to the [`checker`], whose
//!    [`report::Report`] lists the faults injected and the anomalies found.
//!
//! ```no_run
//! use idem_chaos::{RunConfig, StoreKind};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let config = RunConfig {
//!     store: StoreKind::Redis,
//!     seed: 7,
//!     ..RunConfig::default()
//! };
//! let report = idem_chaos::run(config).await?;
//! println!("{report}");
//! assert!(report.anomalies().is_empty(), "seed {}", report.seed);
//! # Ok(()) }
//! ```
//!
//! How to run it, the faults and what the checker checks: `crates/idem-chaos/README.md`.

pub mod binary;
pub mod brokers;
pub mod checker;
pub mod clients;
pub mod clock;
pub mod config;
pub mod gateway;
pub mod history;
pub mod link;
pub mod nemesis;
pub mod postgres;
pub mod proc;
pub mod report;
mod run;
pub mod settle;
pub mod store;
pub mod upstream;
pub mod world;

pub use config::{FaultKind, PlantedBug, RunConfig, StoreKind, Takeover};
pub use report::Report;
pub use run::run;
