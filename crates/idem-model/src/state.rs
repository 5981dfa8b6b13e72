//! The whole system's state.

use crate::client::Client;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::store::Store;
use crate::upstream::Upstream;

/// Everything the checker explores: the store, the upstream, each gateway and client, and the
/// faults still allowed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The store's record for the key.
    pub store: Store,
    /// The upstream: requests in transit, windows passed, executions.
    pub upstream: Upstream,
    /// Each gateway, by [`GatewayId`](crate::GatewayId).
    pub gateways: Vec<Gateway>,
    /// Each client, by [`ClientId`](crate::ClientId).
    pub clients: Vec<Client>,
    /// Crashes still allowed.
    pub crashes_left: u8,
    /// Pauses still allowed.
    pub pauses_left: u8,
    /// Which rarer transitions this run has taken, so that `sometimes` properties can ask.
    pub seen: Seen,
}

/// The rarer transitions a run has taken (the state alone cannot tell who settled a record).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    /// A prober resolved an unknown record to the upstream's answer.
    pub probe_completed: bool,
    /// A prober released an unknown record the upstream had not acted on and claimed it afresh.
    pub probe_released: bool,
    /// A holder completed its own record after it had become unknown.
    pub late_completed: bool,
    /// A holder's completion was refused: someone else had settled or claimed the key.
    pub fenced_out: bool,
}

impl State {
    /// The start: no record, nothing sent, every client about to send its first request.
    pub fn initial(config: &Config) -> Self {
        Self {
            store: Store::new(),
            upstream: Upstream::default(),
            gateways: vec![Gateway::Idle; usize::from(config.gateways)],
            clients: vec![Client::new(); usize::from(config.clients)],
            crashes_left: config.crashes,
            pauses_left: config.pauses,
            seen: Seen::default(),
        }
    }
}
