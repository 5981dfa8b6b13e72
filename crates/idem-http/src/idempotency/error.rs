//! How the layer's own refusals and the engine's errors become problem responses.
//!
//! | cause | status | `type` slug |
//! |---|---|---|
//! | no key on a required route | 400 | `key-missing` |
//! | malformed key | 400 | `key-malformed` |
//! | two key headers, or a list | 400 | `key-multiple` |
//! | principal refused | 401 | `unauthenticated` |
//! | the principal's credential sent twice (two headers of its name) | 400 | `credential-ambiguous` |
//! | request body unreadable | 400 | `body-unreadable` |
//! | request body means two things (a JSON member named twice) | 400 | `body-ambiguous` |
//! | request body above the cap | 413 | `body-too-large` |
//! | request body stalled or too slow (its [`BodyPace`](crate::buffer::BodyPace)) | 408 | `body-timeout` |
//! | same key, different request | 422 | `key-reused` |
//! | same key in flight | 409 + `Retry-After` | `in-flight` |
//! | earlier outcome unknown | 409 | `outcome-unknown` |
//! | completed, response too large to keep | 409 | `response-not-stored` |
//! | store failed or timed out | 503 + `Retry-After` | `store-unavailable` |
//! | lease lost mid-handler (handler cancelled) | 503 + `Retry-After` | `lease-lost` |
//! | handler panicked (claim released) | 500 | `handler-panicked` |
//! | handler timed out (released per takeover policy) | 504 | `handler-timeout` |
//! | response body failed while being stored | 500 | `response-failed` |
//! | ran, but the store failed to record its answer | 503 + `Retry-After` | `answer-not-recorded` |

use std::time::Duration;

use http::Response;
use idem_core::{EngineError, Key, Outcome, Refusal};
use idem_wire::Reason;

use crate::body::ResponseBody;
use crate::key::KeyRejection;
use crate::policy::PrincipalRejection;
use crate::problem::Problem;

/// A problem answered before any claim, with the reason it carries as its [`Outcome`].
#[derive(Debug)]
pub(crate) struct Refused {
    problem: Problem,
    why: Refusal,
}

impl Refused {
    fn new(problem: Problem, why: Refusal) -> Self {
        Self { problem, why }
    }

    #[cold]
    pub(crate) fn into_response<B>(self) -> Response<ResponseBody<B>> {
        super::with_outcome(self.problem.into_response(), Outcome::Refused(self.why))
    }
}

#[cold]
pub(crate) fn key_rejection(r: &KeyRejection) -> Refused {
    Refused::new(Problem::new(r.reason(), r.to_string()), r.refusal())
}

#[cold]
pub(crate) fn body_ambiguous(key: &Key, why: &crate::policy::AmbiguousBody) -> Refused {
    let problem = Problem::new(Reason::BodyAmbiguous, why.to_string()).key(Some(key));
    Refused::new(problem, Refusal::BodyAmbiguous)
}

#[cold]
pub(crate) fn principal_refused(r: &PrincipalRejection) -> Refused {
    Refused::new(Problem::new(r.reason(), r.detail()), r.refusal())
}

#[cold]
pub(crate) fn body_too_large(key: Option<&Key>, limit: usize) -> Refused {
    let problem = Problem::new(
        Reason::RequestTooLarge,
        format!("the request body exceeds the {limit}-byte limit of this route"),
    )
    .key(key);
    Refused::new(problem, Refusal::BodyTooLarge)
}

#[cold]
pub(crate) fn body_unreadable(key: Option<&Key>) -> Refused {
    let problem = Problem::new(
        Reason::RequestUnreadable,
        "the request body could not be read",
    )
    .key(key);
    Refused::new(problem, Refusal::BodyUnreadable)
}

#[cold]
pub(crate) fn body_timeout(key: Option<&Key>) -> Refused {
    let problem = Problem::new(
        Reason::BodyTimeout,
        "the request body did not arrive in time; nothing ran, and the key is free",
    )
    .key(key);
    Refused::new(problem, Refusal::BodyTimeout)
}

#[cold]
pub(crate) fn mismatch(key: &Key) -> Problem {
    Problem::new(
        Reason::KeyReused,
        "this key was used with a different request (method, path or body); nothing ran",
    )
    .key(Some(key))
}

/// Longest `Retry-After` suggested for an in-flight duplicate. The store's answer is the time
/// left on the holder's lease, which only bounds a *crashed* holder; a live one usually
/// finishes much sooner, so telling clients to wait out the whole lease (45 s by default)
/// would delay nearly every retry for nothing.
pub(crate) const IN_FLIGHT_RETRY_CAP: Duration = Duration::from_secs(1);

#[cold]
pub(crate) fn in_flight(key: &Key, retry_after: Duration) -> Problem {
    let retry_after = retry_after.min(IN_FLIGHT_RETRY_CAP);
    Problem::new(
        Reason::InFlight,
        "a request with this key is being processed; retry later",
    )
    .key(Some(key))
    .state("processing")
    .retry_after(retry_after)
}

#[cold]
pub(crate) fn outcome_unknown(key: &Key) -> Problem {
    Problem::new(
        Reason::OutcomeUnknown,
        "an earlier attempt with this key may or may not have taken effect; it awaits resolution",
    )
    .key(Some(key))
    .state("unknown")
}

#[cold]
pub(crate) fn response_not_stored(key: &Key, status: u16) -> Refused {
    let problem = Problem::new(Reason::ResponseNotStored, format!("the request with this key completed with status {status}, but its response was too large to keep"),
    )
    .key(Some(key))
    .state("completed");
    Refused::new(problem, Refusal::ResponseNotStored)
}

#[cold]
pub(crate) fn response_failed(key: &Key) -> Problem {
    Problem::new(
        Reason::ResponseFailed,
        "the handler's response body failed; the claim was released",
    )
    .key(Some(key))
}

#[cold]
pub(crate) fn internal(key: &Key) -> Problem {
    Problem::new(Reason::Internal, "the request could not be completed").key(Some(key))
}

/// The request ran, but its answer could not be recorded: retry with the same key for it.
#[cold]
pub(crate) fn answer_not_recorded(key: &Key, retry_after: Duration) -> Problem {
    Problem::new(Reason::AnswerNotRecorded, "the request ran, but the idempotency store failed to record its answer; retry with the same key to get it once it is recorded",
    )
    .key(Some(key))
    .retry_after(retry_after)
}

#[cold]
pub(crate) fn engine_error(key: &Key, e: &EngineError, store_retry_after: Duration) -> Problem {
    match e {
        EngineError::Store(_) => Problem::new(Reason::StoreUnavailable, "the idempotency store failed or timed out; nothing ran",
        )
        .key(Some(key))
        .retry_after(store_retry_after),
        EngineError::LeaseLost => Problem::new(Reason::LeaseLost, "the claim on this key was lost while the handler ran, so it was cancelled; ask the status endpoint or retry",
        )
        .key(Some(key))
        .retry_after(store_retry_after),
        EngineError::HandlerPanicked => Problem::new(Reason::HandlerPanicked, "the handler panicked; the claim was released and a retry runs again",
        )
        .key(Some(key)),
        EngineError::HandlerTimedOut(after) => Problem::new(Reason::HandlerTimeout, format!("the handler did not finish within {after:?} and was cancelled"),
        )
        .key(Some(key)),
        _ => internal(key),
    }
}
