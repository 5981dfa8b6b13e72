//! An exhaustive model check of idem's protocol for one key: clients, gateways, the store and
//! the upstream, with crashes, pauses, delayed requests and lost answers.
//!
//! The model is spec-level: it states the rules of `docs/design.md` and of the new design
//! (hold an expired lease as unknown, settle unknown records by the upstream's status webhook,
//! trust "not done" only after the attempt's window, guard resolves by fence, accept a late
//! holder's completion) as plain Rust over a small state, and lets
//! [stateright](https://docs.rs/stateright) walk every interleaving within small bounds. Each
//! rule is a switch in [`Config`], so each can be shown to matter. The crate's README says what
//! is modelled, the bounds and the assumptions.
//!
//! ```
//! use idem_model::{properties, Config, ProtocolModel};
//! use stateright::{Checker, Model};
//!
//! // One gateway, one client with one request, no faults: the smallest space there is.
//! let config = Config {
//!     gateways: 1,
//!     requests_per_client: 1,
//!     crashes: 0,
//!     pauses: 0,
//!     ..Config::fixed()
//! };
//! let checker = ProtocolModel::new(config).checker().spawn_bfs().join();
//! assert!(checker.is_done());
//! assert!(checker.discovery(properties::AT_MOST_ONCE).is_none());
//! assert!(checker.discovery(properties::COMPLETED).is_some());
//! ```

mod action;
mod client;
mod config;
mod gateway;
mod ids;
mod model;
pub mod properties;
mod state;
mod store;
mod trace;
mod upstream;

pub use action::Action;
pub use client::{Answer, Client, Phase};
pub use config::{Config, Takeover};
pub use gateway::{Gateway, Job, Step, Verdict};
pub use ids::{ClientId, Fence, FenceSet, GatewayId, Response};
pub use model::ProtocolModel;
pub use state::{Seen, State};
pub use store::{ClaimOutcome, Completion, Record, Store};
pub use trace::trace;
pub use upstream::{Execution, Status, Upstream};

/// The model checker this crate is written for, re-exported so callers use the same version.
pub use stateright;
