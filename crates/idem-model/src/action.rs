//! The steps the checker may take from a state.

use crate::ids::{ClientId, Fence, GatewayId};

/// One step of one actor (or one fault). Each store operation inside a step is atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// The client sends its next request (the first or a retry) to an idle gateway, which
    /// claims the key at once: it then runs, probes, or answers the client.
    Request {
        /// Who sends.
        client: ClientId,
        /// To which gateway.
        gateway: GatewayId,
    },
    /// The upstream executes the in-transit request with this fence and answers the gateway
    /// that sent it (if that gateway is still waiting for it).
    Execute {
        /// The request's fence.
        fence: Fence,
    },
    /// The gateway completes its record with the upstream's answer and answers the client.
    Complete {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// The gateway's handler timeout fires while it waits for the upstream: it gives the
    /// claim up per the takeover policy and answers the client an error.
    TimeOut {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// The gateway asks the upstream's status webhook about the key.
    Probe {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// The gateway resolves the unknown record by what the upstream said.
    Resolve {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// The window of attempt `fence` passes: the upstream will never act on it now.
    WindowPasses {
        /// The attempt's fence.
        fence: Fence,
    },
    /// The client stops waiting for its latest request's answer (lost, or late).
    GiveUpWaiting {
        /// Which client.
        client: ClientId,
    },
    /// Fault: the gateway crashes and restarts idle, losing what it had in flight (a request
    /// it sent may still execute).
    Crash {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// Fault: the live holder stalls (a long pause, a GC, a frozen store) until its lease runs
    /// out; afterwards it carries on with what it had.
    Pause {
        /// Which gateway.
        gateway: GatewayId,
    },
    /// A crashed holder's lease runs out (no fault of its own: the crash was the fault).
    LeaseExpires,
}
