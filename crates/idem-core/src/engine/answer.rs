//! What a run hands back: the handler's [`Settlement`], the engine's [`Answer`] and
//! [`EngineError`], and the function-level [`Reply`], each naming its [`Outcome`].

use std::time::Duration;

use thiserror::Error;

use crate::outcome::{Kept, Outcome};
use crate::record::{Lease, ReleaseKind, StoredResponse};
use crate::store::{ClaimOutcome, StoreError};

/// What the handler asks the engine to do with its result.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Keep this response and replay it to every retry.
    Complete(StoredResponse),
    /// Keep nothing; release the claim as this kind.
    Release(ReleaseKind),
}

/// A handler's result: the value for this caller, and what to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement<T> {
    /// Returned to the caller of [`Engine::run`](super::Engine::run).
    pub output: T,
    /// What the engine records.
    pub action: Action,
}

impl<T> Settlement<T> {
    /// Return `output` and store `response` for replay.
    pub fn complete(output: T, response: StoredResponse) -> Self {
        Self {
            output,
            action: Action::Complete(response),
        }
    }

    /// Return `output` and release the claim.
    pub fn release(output: T, kind: ReleaseKind) -> Self {
        Self {
            output,
            action: Action::Release(kind),
        }
    }
}

/// What became of the handler's result after it ran.
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled {
    /// The response is stored for replay.
    Stored,
    /// The claim was released as asked.
    Released(ReleaseKind),
    /// Another holder took the key over meanwhile; the result was discarded.
    Fenced,
    /// The store failed while settling, also when tried again for a lease's time. A
    /// completion is still tried in the background; carriers must not hand the handler's
    /// answer out as recorded (the HTTP layer answers `503 answer-not-recorded`), since a
    /// retry could not find it yet.
    Failed(StoreError),
}

/// The answer to one [`Engine::run`](super::Engine::run); [`Answer::outcome`] names it for metrics and logs.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer<T> {
    /// This call claimed the key and ran the handler.
    Executed {
        /// The handler's output.
        output: T,
        /// The lease it ran under (its fence is the write token downstream).
        lease: Lease,
        /// True if an expired lease was taken over.
        takeover: bool,
        /// What was recorded.
        settled: Settled,
    },
    /// The key had completed; this is the stored response.
    Replayed(StoredResponse),
    /// Another holder is running the handler.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with a different fingerprint; nothing ran.
    Mismatch,
    /// An earlier attempt's outcome is unknown; nothing ran.
    Unknown,
}

impl<T> Answer<T> {
    /// The answer to a claim that did not claim: the stored response, in flight, a
    /// mismatch; anything else (an unknown record the caller did not settle) is unknown,
    /// under which nothing runs.
    pub(crate) fn unclaimed(outcome: ClaimOutcome) -> Self {
        match outcome {
            ClaimOutcome::Done { response } => Self::Replayed(response),
            ClaimOutcome::Busy { retry_after } => Self::InFlight { retry_after },
            ClaimOutcome::Mismatch { .. } => Self::Mismatch,
            _ => Self::Unknown,
        }
    }

    /// The same answer with the handler's output mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Answer<U> {
        match self {
            Self::Executed {
                output,
                lease,
                takeover,
                settled,
            } => Answer::Executed {
                output: f(output),
                lease,
                takeover,
                settled,
            },
            Self::Replayed(stored) => Answer::Replayed(stored),
            Self::InFlight { retry_after } => Answer::InFlight { retry_after },
            Self::Mismatch => Answer::Mismatch,
            Self::Unknown => Answer::Unknown,
        }
    }

    /// What became of the request, for metrics, logs and audit.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Executed { settled, .. } => match settled {
                Settled::Stored => Outcome::Executed(Kept::Stored),
                Settled::Released(kind) => Outcome::Executed(Kept::Released(*kind)),
                Settled::Fenced => Outcome::Fenced,
                Settled::Failed(_) => Outcome::Executed(Kept::Unsettled),
            },
            Self::Replayed(_) => Outcome::Replayed,
            Self::InFlight { .. } => Outcome::InFlight,
            Self::Mismatch => Outcome::Mismatch,
            Self::Unknown => Outcome::Unknown,
        }
    }
}

/// The engine could not give a definite answer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The store failed before the handler ran; nothing ran.
    #[error("store failed")]
    Store(#[from] StoreError),
    /// The lease was lost while the handler ran; the handler was cancelled.
    #[error("lease lost; handler cancelled")]
    LeaseLost,
    /// The handler ran past its timeout and was cancelled; the claim was released per policy.
    #[error("handler timed out after {0:?}")]
    HandlerTimedOut(Duration),
    /// The handler panicked; the claim was released so a retry can run.
    #[error("handler panicked")]
    HandlerPanicked,
    /// A stored response could not be decoded into the caller's type.
    #[error("stored response does not decode: {0}")]
    Decode(String),
    /// The closure's value could not be encoded for storage; the claim was released.
    #[error("value does not encode: {0}")]
    Encode(String),
    /// Same-transaction work ([`Engine::run_in_tx_owned`](super::Engine::run_in_tx_owned))
    /// did not give its transaction back, so nothing committed: the writes and the claim
    /// roll back, and a retry runs again.
    #[error("the work kept its transaction; nothing committed")]
    TxNotReturned,
}

impl EngineError {
    /// What became of the request. `interrupted` is what an interrupted handler leaves
    /// behind under the run's policy ([`Policy::interrupted_release`](super::Policy::interrupted_release)).
    pub fn outcome(&self, interrupted: ReleaseKind) -> Outcome {
        match self {
            Self::Store(_) => Outcome::StoreUnavailable,
            Self::LeaseLost => Outcome::Fenced,
            Self::HandlerTimedOut(_) => Outcome::Executed(Kept::Interrupted(interrupted)),
            Self::HandlerPanicked => Outcome::Executed(Kept::Interrupted(ReleaseKind::Retryable)),
            // A stored value was found; only its decoding for this caller failed.
            Self::Decode(_) => Outcome::Replayed,
            Self::Encode(_) | Self::TxNotReturned => {
                Outcome::Executed(Kept::Released(ReleaseKind::Retryable))
            }
        }
    }
}

/// The function-level answer of [`Engine::call_json`](super::Engine::call_json).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply<T, E> {
    /// The closure ran now and succeeded; its value is stored.
    Executed(T),
    /// A stored value from an earlier run.
    Replayed(T),
    /// The closure ran now and failed; the claim was released so a retry runs again.
    Failed(E),
    /// Another holder is running it.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with different arguments.
    Mismatch,
    /// An earlier attempt's outcome is unknown.
    Unknown,
}

impl<T, E> Reply<T, E> {
    /// What became of the call, for metrics, logs and audit.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Executed(_) => Outcome::Executed(Kept::Stored),
            Self::Replayed(_) => Outcome::Replayed,
            Self::Failed(_) => Outcome::Executed(Kept::Released(ReleaseKind::Retryable)),
            Self::InFlight { .. } => Outcome::InFlight,
            Self::Mismatch => Outcome::Mismatch,
            Self::Unknown => Outcome::Unknown,
        }
    }
}
