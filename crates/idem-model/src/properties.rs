//! The properties the checker holds the model to, as predicates over a state.

use crate::client::Phase;
use crate::gateway::Gateway;
use crate::state::State;
use crate::store::Record;

/// `always`: the upstream executed the key at most once.
pub const AT_MOST_ONCE: &str = "at most one effect per key";
/// `always`: every 2xx a client received is the first execution's response.
pub const FIRST_ANSWER: &str = "every 2xx is the first execution's response";
/// `sometimes`: the key gets completed.
pub const COMPLETED: &str = "a key gets completed";
/// `sometimes`: a gateway crashes while serving a request.
pub const CRASHED: &str = "a gateway crashes mid-request";
/// `sometimes`: the probe settles an unknown record (to the upstream's answer, or released and
/// run afresh).
pub const PROBE_SETTLES: &str = "the probe settles a key";
/// `sometimes`: a holder completes its own record after it became unknown.
pub const LATE_COMPLETE: &str = "a late holder completes its own record";
/// `sometimes`: a holder's completion is refused because someone else settled or claimed the
/// key meanwhile.
pub const FENCED_OUT: &str = "a holder's completion is fenced out";
/// `sometimes`: everyone is finished and the key is still unknown.
pub const LEFT_UNKNOWN: &str = "a key is left unknown";

/// The ledger holds at most one execution.
pub fn at_most_once(state: &State) -> bool {
    state.upstream.ledger.len() <= 1
}

/// Each client's 2xx, if it got one, is the first execution's response (so there was one).
pub fn first_answer(state: &State) -> bool {
    let first = state.upstream.first_response();
    state
        .clients
        .iter()
        .filter_map(|c| c.ok())
        .all(|response| Some(response) == first)
}

/// The record is completed.
pub fn completed(state: &State) -> bool {
    matches!(state.store.record, Record::Completed { .. })
}

/// A crash happened. Crashes are only possible while a gateway serves a request, so a spent
/// crash is a crash mid-request.
pub fn crashed(state: &State, crashes_allowed: u8) -> bool {
    state.crashes_left < crashes_allowed
}

/// A prober completed or released an unknown record.
pub fn probe_settles(state: &State) -> bool {
    state.seen.probe_completed || state.seen.probe_released
}

/// A holder completed its own unknown record.
pub fn late_complete(state: &State) -> bool {
    state.seen.late_completed
}

/// A holder's completion was refused.
pub fn fenced_out(state: &State) -> bool {
    state.seen.fenced_out
}

/// No client will send anything again, no gateway is serving, and the record is unknown:
/// nothing will ever settle it (an operator would have to).
pub fn left_unknown(state: &State) -> bool {
    matches!(state.store.record, Record::Unknown { .. })
        && state.gateways.iter().all(|g| *g == Gateway::Idle)
        && state
            .clients
            .iter()
            .all(|c| matches!(c.phase, Phase::Done(_) | Phase::GaveUp))
}
