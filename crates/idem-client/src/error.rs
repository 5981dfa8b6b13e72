//! [`ClientError`]: why an operation ended without an answer to return.

use std::time::Duration;

/// Why an operation ended without an answer. Every variant after the request was built
/// names the key, so the caller can ask about it later or hand it to an operator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request could not be built (bad URL, header or key); nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The server says an earlier attempt with this key may have acted and nothing will run
    /// until the key is resolved (an operator, a reconciler). Retrying cannot help.
    #[error(
        "the outcome of key {key} is unknown: an earlier attempt may have acted; resolve the key before trying again"
    )]
    OutcomeUnknown {
        /// The key.
        key: String,
    },
    /// A request was sent, no usable answer came back, and there is no status endpoint to
    /// tell whether it ran. Retrying blindly is the caller's decision, not the client's.
    #[error(
        "key {key}: the request was sent but its outcome cannot be told ({cause}); no status endpoint is configured"
    )]
    Ambiguous {
        /// The key.
        key: String,
        /// What went wrong.
        cause: String,
    },
    /// Every attempt the policy allows was used up on retryable answers or failures.
    #[error("key {key}: gave up after {attempts} attempts; last: {last}")]
    AttemptsExhausted {
        /// The key.
        key: String,
        /// Requests sent.
        attempts: u32,
        /// The last failure or retryable answer.
        last: String,
    },
    /// The overall deadline passed (or the next wait would pass it).
    #[error("key {key}: deadline of {deadline:?} reached after {attempts} attempts; last: {last}")]
    DeadlineExceeded {
        /// The key.
        key: String,
        /// Requests sent.
        attempts: u32,
        /// The deadline.
        deadline: Duration,
        /// The last failure or retryable answer.
        last: String,
    },
    /// The status endpoint answered something that is not a status for this key (a wrong
    /// path or route, a refused credential).
    #[error("key {key}: status query refused: {detail}")]
    StatusQuery {
        /// The key.
        key: String,
        /// What came back.
        detail: String,
    },
    /// The key completed, but its answer was too large for the server to keep, so it
    /// cannot be returned.
    #[error("key {key}: completed, but the answer was too large to keep")]
    ResponseNotStored {
        /// The key.
        key: String,
    },
}

impl ClientError {
    /// The key of the operation, when one was made.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Invalid(_) => None,
            Self::OutcomeUnknown { key }
            | Self::Ambiguous { key, .. }
            | Self::AttemptsExhausted { key, .. }
            | Self::DeadlineExceeded { key, .. }
            | Self::StatusQuery { key, .. }
            | Self::ResponseNotStored { key, .. } => Some(key),
        }
    }
}
