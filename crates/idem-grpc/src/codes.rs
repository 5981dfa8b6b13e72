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
//! | the principal's credential sent twice | `INVALID_ARGUMENT` | `CREDENTIAL_AMBIGUOUS` | |
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
//!
//! Each row is an [`idem_wire::Reason`] (re-exported here as [`Reason`]), the same table the
//! HTTP layer and the gateway answer from; [`Reason::status`] builds the status and
//! [`LayerDetails`] reads it back.

use idem_core::ReleaseKind;
use idem_http::{AnswerHead, StoreDecision, StorePolicy};
use idem_wire::GrpcCode;
pub use idem_wire::grpc::LayerDetails;
pub use idem_wire::header::grpc_timeout;
pub use idem_wire::{ERROR_DOMAIN, Reason};

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

impl StoreDeterministic {
    /// The decision for an answer with gRPC status `code`: the module's table.
    pub fn decide_code(&self, code: GrpcCode) -> StoreDecision {
        use GrpcCode as C;
        match code {
            C::Ok
            | C::InvalidArgument
            | C::NotFound
            | C::AlreadyExists
            | C::FailedPrecondition
            | C::OutOfRange
            | C::Unimplemented => StoreDecision::Store,
            C::DeadlineExceeded | C::Unknown if self.ambiguous_unknown => {
                StoreDecision::Release(ReleaseKind::Unknown)
            }
            _ => StoreDecision::Release(ReleaseKind::Retryable),
        }
    }
}

/// By the answer's gRPC status ([`AnswerHead::grpc_status`]); an answer without one is
/// `UNKNOWN`, as gRPC clients read it.
impl StorePolicy for StoreDeterministic {
    fn decide(&self, answer: &AnswerHead<'_>) -> StoreDecision {
        self.decide_code(answer.grpc_status().unwrap_or(GrpcCode::Unknown))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt as _};

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
            assert_eq!(p.decide_code(c.into()), StoreDecision::Store, "{c:?}");
        }
        for c in released {
            assert_eq!(
                p.decide_code(c.into()),
                StoreDecision::Release(ReleaseKind::Retryable),
                "{c:?}"
            );
        }
        let held = StoreDeterministic::new().ambiguous_as_unknown();
        assert_eq!(
            held.decide_code(GrpcCode::DeadlineExceeded),
            StoreDecision::Release(ReleaseKind::Unknown)
        );
        assert_eq!(
            held.decide_code(GrpcCode::Unavailable),
            StoreDecision::Release(ReleaseKind::Retryable)
        );
    }

    #[test]
    fn reasons_round_trip_and_other_domains_are_not_ours() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            let s = r.status("m", None, None);
            assert_eq!(s.code(), r.code(), "{r}");
            let d = LayerDetails::of(&s).expect("idem's");
            assert_eq!((d.reason(), d.key, d.retry_after), (Some(r), None, None));
        }
        assert_eq!(Reason::parse("A_NEWER_REASON"), None);
        let newer = tonic::Status::with_error_details(
            Code::Unimplemented,
            "m",
            ErrorDetails::with_error_info("A_NEWER_REASON", ERROR_DOMAIN, HashMap::new()),
        );
        let d = LayerDetails::of(&newer).expect("idem's");
        assert_eq!((d.reason.as_str(), d.reason()), ("A_NEWER_REASON", None));
        let theirs = tonic::Status::with_error_details(
            Code::FailedPrecondition,
            "m",
            ErrorDetails::with_error_info("OUTCOME_UNKNOWN", "example.com", HashMap::new()),
        );
        assert_eq!(LayerDetails::of(&theirs), None, "another domain's reason");
        assert_eq!(LayerDetails::of(&tonic::Status::internal("plain")), None);
    }
}
