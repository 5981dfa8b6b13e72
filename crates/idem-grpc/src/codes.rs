//! The status mapping: which handler statuses are stored, and the statuses the layer answers
//! itself. The table with the reasons is in `docs/grpc.md`.
//!
//! | the handler answered | the record |
//! |---|---|
//! | `OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | stored, replayed to every retry |
//! | `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `CANCELLED`, `UNAUTHENTICATED`, `PERMISSION_DENIED`, `INTERNAL`, `UNKNOWN`, `DATA_LOSS` | released (retryable): a retry runs again |
//!
//! | the layer answers | code | `ErrorInfo.reason` | details |
//! |---|---|---|---|
//! | key missing (where required) | `INVALID_ARGUMENT` | `KEY_MISSING` | |
//! | key malformed, or sent twice | `INVALID_ARGUMENT` | `KEY_MALFORMED` / `KEY_MULTIPLE` | |
//! | principal refused | `UNAUTHENTICATED` | `UNAUTHENTICATED` | |
//! | request not one message | `INVALID_ARGUMENT` | `NOT_ONE_MESSAGE` | |
//! | request above the cap | `RESOURCE_EXHAUSTED` | `REQUEST_TOO_LARGE` | |
//! | request unreadable | `CANCELLED` | `REQUEST_UNREADABLE` | |
//! | in flight | `ABORTED` | `IN_FLIGHT` | `RetryInfo` |
//! | same key, different request | `FAILED_PRECONDITION` | `KEY_REUSED` | |
//! | earlier outcome unknown | `FAILED_PRECONDITION` | `OUTCOME_UNKNOWN` | |
//! | completed, answer too large to keep | `FAILED_PRECONDITION` | `RESPONSE_NOT_STORED` | |
//! | store failed or timed out | `UNAVAILABLE` | `STORE_UNAVAILABLE` | `RetryInfo` |
//! | lease lost while the handler ran | `UNAVAILABLE` | `LEASE_LOST` | `RetryInfo` |
//! | handler past its deadline | `DEADLINE_EXCEEDED` | `HANDLER_TIMEOUT` | |
//! | handler panicked | `INTERNAL` | `HANDLER_PANICKED` | |
//! | answer failed while being read | `INTERNAL` | `RESPONSE_FAILED` | |

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use idem_core::{Key, ReleaseKind};
use idem_http::StoreDecision;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every status the layer answers itself.
pub const ERROR_DOMAIN: &str = "idem.dev";

/// Decides, from the handler's gRPC status, whether its answer is kept for replay.
pub trait GrpcStorePolicy: fmt::Debug + Send + Sync + 'static {
    /// The decision for `code`.
    fn decide(&self, code: Code) -> StoreDecision;
}

/// The default: answers that say something definite about the request are stored; those
/// that say it was refused before it ran, or failed in a way a retry may fix, release the
/// claim so a retry runs again. See the module table.
#[derive(Clone, Debug, Default)]
pub struct StoreDeterministic {
    ambiguous_unknown: bool,
}

impl StoreDeterministic {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// `DEADLINE_EXCEEDED` and `UNKNOWN` (the handler may have acted) release the claim as
    /// *unknown* instead of retryable: for handlers that are not idempotent downstream.
    #[must_use]
    pub fn ambiguous_as_unknown(mut self) -> Self {
        self.ambiguous_unknown = true;
        self
    }
}

impl GrpcStorePolicy for StoreDeterministic {
    fn decide(&self, code: Code) -> StoreDecision {
        match code {
            Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented => StoreDecision::Store,
            Code::DeadlineExceeded | Code::Unknown if self.ambiguous_unknown => {
                StoreDecision::Release(ReleaseKind::Unknown)
            }
            _ => StoreDecision::Release(ReleaseKind::Retryable),
        }
    }
}

/// A status the layer answers itself, with `ErrorInfo` (and `RetryInfo` where a retry
/// helps) in its details.
pub(crate) fn status(
    code: Code,
    reason: &'static str,
    message: impl Into<String>,
    key: Option<&Key>,
    retry_after: Option<Duration>,
) -> tonic::Status {
    let mut meta = HashMap::new();
    if let Some(key) = key {
        meta.insert("key".to_owned(), key.as_str().to_owned());
    }
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, meta);
    if let Some(after) = retry_after {
        details.set_retry_info(Some(after));
    }
    tonic::Status::with_error_details(code, message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_table() {
        let p = StoreDeterministic::new();
        let stored = [
            Code::Ok,
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::Unimplemented,
        ];
        let released = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Cancelled,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Internal,
            Code::Unknown,
            Code::DataLoss,
        ];
        assert_eq!(stored.len() + released.len(), 17, "every gRPC code");
        for c in stored {
            assert_eq!(p.decide(c), StoreDecision::Store, "{c:?}");
        }
        for c in released {
            assert_eq!(
                p.decide(c),
                StoreDecision::Release(ReleaseKind::Retryable),
                "{c:?}"
            );
        }
        let held = StoreDeterministic::new().ambiguous_as_unknown();
        assert_eq!(
            held.decide(Code::DeadlineExceeded),
            StoreDecision::Release(ReleaseKind::Unknown)
        );
        assert_eq!(
            held.decide(Code::Unavailable),
            StoreDecision::Release(ReleaseKind::Retryable)
        );
    }

    #[test]
    fn layer_statuses_carry_error_and_retry_info() {
        let key = Key::new("k-1").expect("key");
        let s = status(
            Code::Aborted,
            "IN_FLIGHT",
            "busy",
            Some(&key),
            Some(Duration::from_millis(250)),
        );
        assert_eq!(s.code(), Code::Aborted);
        let info = s.get_details_error_info().expect("error info");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("IN_FLIGHT", ERROR_DOMAIN)
        );
        assert_eq!(info.metadata["key"], "k-1");
        let retry = s.get_details_retry_info().expect("retry info");
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(250)));
    }
}
