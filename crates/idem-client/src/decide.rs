//! The retry decision, carrier-neutral: what one attempt came back with ([`Attempt`]), what a
//! status query said ([`KeyState`]), and the pure table from those to the next step
//! ([`Step`]). The HTTP and gRPC clients only classify; this table decides.
//!
//! | attempt | next step |
//! |---|---|
//! | nothing was sent (connection refused, DNS, TLS handshake) | retry after backoff |
//! | sent, no usable answer (timeout, reset, 502, 504) | ask the status endpoint |
//! | in flight (409 `in-flight`; gRPC `ABORTED` with retry info) | wait (at least `Retry-After`), retry |
//! | throttled or unavailable (429, 503; gRPC `UNAVAILABLE`) | wait (at least `Retry-After`), retry |
//! | outcome unknown (409 `outcome-unknown`) | stop: [`ClientError::OutcomeUnknown`](crate::ClientError::OutcomeUnknown) |
//! | a replayed answer, or any other answer (2xx, 400, 401, 403, 404, 422, 500, …) | return it |
//!
//! | status query | next step |
//! |---|---|
//! | completed | return the stored answer |
//! | processing | wait (at least `Retry-After`), ask again |
//! | absent | retry the request, same key |
//! | unknown | stop: [`ClientError::OutcomeUnknown`](crate::ClientError::OutcomeUnknown) |
//! | the query failed (connection, timeout, 503) | wait, ask again |
//! | no status endpoint, or an answer that is not a status | stop: [`ClientError::Ambiguous`](crate::ClientError::Ambiguous) |

use std::time::Duration;

/// What one attempt came back with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Attempt<T> {
    /// Nothing reached the server (the connection could not be made): a retry is safe.
    NotSent(String),
    /// The request was sent but no usable answer came back (timeout, reset after sending,
    /// 502, 504): it may or may not have run.
    Ambiguous(String),
    /// The server asked to come back later without running anything for this attempt.
    Retryable {
        /// The answer, kept in case the client gives up.
        answer: T,
        /// Why.
        why: Later,
        /// The server's `Retry-After` (or gRPC retry delay).
        retry_after: Option<Duration>,
    },
    /// The server says an earlier attempt's outcome is unknown.
    OutcomeUnknown(T),
    /// A final answer (a replay included): returned, never retried.
    Final(T),
}

/// The kind of `attempt` in one word, as the unit tests compare it (a retryable one by why).
#[cfg(test)]
pub(crate) fn kind<T>(attempt: &Attempt<T>) -> &'static str {
    match attempt {
        Attempt::NotSent(_) => "not_sent",
        Attempt::Ambiguous(_) => "ambiguous",
        Attempt::Retryable { why, .. } => why.as_str(),
        Attempt::OutcomeUnknown(_) => "unknown",
        Attempt::Final(_) => "final",
    }
}

/// Why a server asked to come back later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Later {
    /// Another attempt with this key is running (409 `in-flight`, gRPC `ABORTED`).
    InFlight,
    /// Too many requests (429, gRPC `RESOURCE_EXHAUSTED` with retry info).
    Throttled,
    /// The service or its idempotency store is unavailable (503, gRPC `UNAVAILABLE`).
    Unavailable,
}

impl Later {
    /// A short name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Throttled => "throttled",
            Self::Unavailable => "unavailable",
        }
    }
}

/// What the status endpoint said about a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyState<T> {
    /// No record: the request never ran, or its claim was released.
    Absent,
    /// Claimed and running.
    InFlight {
        /// The endpoint's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// Done: the stored answer.
    Completed(T),
    /// An earlier attempt may have acted; nothing runs until an operator resolves it.
    Unknown,
    /// The query itself failed (connection, timeout, 503): ask again.
    Unavailable(String),
}

/// The next step after an attempt or a status query.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<T> {
    /// Return this answer.
    Return(T),
    /// Send the request again (same key) after a wait of at least `Option<Duration>`.
    Retry(Option<Duration>),
    /// Ask the status endpoint (after a wait of at least `Option<Duration>`).
    AskStatus(Option<Duration>),
    /// Stop: the outcome is unknown.
    Unknown,
}

/// The next step after an attempt.
pub fn after_attempt<T>(attempt: Attempt<T>) -> Step<T> {
    match attempt {
        Attempt::NotSent(_) => Step::Retry(None),
        Attempt::Ambiguous(_) => Step::AskStatus(None),
        Attempt::Retryable { retry_after, .. } => Step::Retry(retry_after),
        Attempt::OutcomeUnknown(_) => Step::Unknown,
        Attempt::Final(answer) => Step::Return(answer),
    }
}

/// The next step after a status query.
pub fn after_status<T>(state: KeyState<T>) -> Step<T> {
    match state {
        KeyState::Completed(answer) => Step::Return(answer),
        KeyState::InFlight { retry_after } => Step::AskStatus(retry_after),
        KeyState::Unavailable(_) => Step::AskStatus(None),
        KeyState::Absent => Step::Retry(None),
        KeyState::Unknown => Step::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_table() {
        let s = Duration::from_secs(2);
        assert_eq!(
            after_attempt::<()>(Attempt::NotSent("refused".into())),
            Step::Retry(None)
        );
        assert_eq!(
            after_attempt::<()>(Attempt::Ambiguous("timeout".into())),
            Step::AskStatus(None)
        );
        for why in [Later::InFlight, Later::Throttled, Later::Unavailable] {
            assert_eq!(
                after_attempt(Attempt::Retryable {
                    answer: (),
                    why,
                    retry_after: Some(s)
                }),
                Step::Retry(Some(s))
            );
        }
        assert_eq!(after_attempt(Attempt::OutcomeUnknown(())), Step::Unknown);
        assert_eq!(after_attempt(Attempt::Final(())), Step::Return(()));
    }

    #[test]
    fn the_status_table() {
        assert_eq!(after_status(KeyState::Completed(())), Step::Return(()));
        assert_eq!(after_status::<()>(KeyState::Absent), Step::Retry(None));
        assert_eq!(after_status::<()>(KeyState::Unknown), Step::Unknown);
        assert_eq!(
            after_status::<()>(KeyState::InFlight {
                retry_after: Some(Duration::from_secs(1))
            }),
            Step::AskStatus(Some(Duration::from_secs(1)))
        );
        assert_eq!(
            after_status::<()>(KeyState::Unavailable("503".into())),
            Step::AskStatus(None)
        );
    }
}
