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
//! Each row is a [`Reason`]; [`layer_status`] builds the status (the idem gateway builds its
//! answers to gRPC calls with it too) and [`LayerDetails`] reads it back.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use idem_core::ReleaseKind;
use idem_http::StoreDecision;
use idem_http::policy::PrincipalRejection;
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

/// One status the layer answers itself: its `ErrorInfo.reason` and its gRPC code, a row of
/// the module's table. The idem gateway answers a gRPC call with the same row for the same
/// situation, so a client reads one mapping whichever of the two protects the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// No key where one is required.
    KeyMissing,
    /// The key is not one valid key.
    KeyMalformed,
    /// The key was sent twice (or a key field is repeated).
    KeyMultiple,
    /// The principal could not be determined.
    Unauthenticated,
    /// The principal's credential was sent more than once.
    CredentialAmbiguous,
    /// The request is not exactly one message.
    NotOneMessage,
    /// The request is above the cap.
    RequestTooLarge,
    /// The request could not be read.
    RequestUnreadable,
    /// A call with this key is running; retry after the `RetryInfo` delay.
    InFlight,
    /// The key was used with a different request.
    KeyReused,
    /// An earlier call's outcome is unknown; nothing runs until it is resolved.
    OutcomeUnknown,
    /// The call completed, but its answer was too large to keep.
    ResponseNotStored,
    /// The idempotency store failed or timed out; nothing ran.
    StoreUnavailable,
    /// The claim was lost while the handler ran; the handler was cancelled.
    LeaseLost,
    /// The handler ran past its deadline and was cancelled.
    HandlerTimeout,
    /// The handler panicked.
    HandlerPanicked,
    /// The handler's answer failed while being read.
    ResponseFailed,
    /// The call ran, but the store failed to record its answer; retry with the same key
    /// for it.
    AnswerNotRecorded,
    /// Anything else the layer could not complete.
    Internal,
}

impl Reason {
    /// Every reason, in the table's order.
    pub const ALL: [Self; 19] = [
        Self::KeyMissing,
        Self::KeyMalformed,
        Self::KeyMultiple,
        Self::Unauthenticated,
        Self::CredentialAmbiguous,
        Self::NotOneMessage,
        Self::RequestTooLarge,
        Self::RequestUnreadable,
        Self::InFlight,
        Self::KeyReused,
        Self::OutcomeUnknown,
        Self::ResponseNotStored,
        Self::StoreUnavailable,
        Self::LeaseLost,
        Self::HandlerTimeout,
        Self::HandlerPanicked,
        Self::ResponseFailed,
        Self::AnswerNotRecorded,
        Self::Internal,
    ];

    /// The `ErrorInfo.reason`: `KEY_MISSING`, `IN_FLIGHT`, ….
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KeyMissing => "KEY_MISSING",
            Self::KeyMalformed => "KEY_MALFORMED",
            Self::KeyMultiple => "KEY_MULTIPLE",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::CredentialAmbiguous => "CREDENTIAL_AMBIGUOUS",
            Self::NotOneMessage => "NOT_ONE_MESSAGE",
            Self::RequestTooLarge => "REQUEST_TOO_LARGE",
            Self::RequestUnreadable => "REQUEST_UNREADABLE",
            Self::InFlight => "IN_FLIGHT",
            Self::KeyReused => "KEY_REUSED",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::ResponseNotStored => "RESPONSE_NOT_STORED",
            Self::StoreUnavailable => "STORE_UNAVAILABLE",
            Self::LeaseLost => "LEASE_LOST",
            Self::HandlerTimeout => "HANDLER_TIMEOUT",
            Self::HandlerPanicked => "HANDLER_PANICKED",
            Self::ResponseFailed => "RESPONSE_FAILED",
            Self::AnswerNotRecorded => "ANSWER_NOT_RECORDED",
            Self::Internal => "INTERNAL",
        }
    }

    /// The gRPC code the layer answers this reason with.
    pub const fn code(self) -> Code {
        match self {
            Self::KeyMissing
            | Self::KeyMalformed
            | Self::KeyMultiple
            | Self::CredentialAmbiguous
            | Self::NotOneMessage => Code::InvalidArgument,
            Self::Unauthenticated => Code::Unauthenticated,
            Self::RequestTooLarge => Code::ResourceExhausted,
            Self::RequestUnreadable => Code::Cancelled,
            Self::InFlight => Code::Aborted,
            Self::KeyReused | Self::OutcomeUnknown | Self::ResponseNotStored => {
                Code::FailedPrecondition
            }
            Self::StoreUnavailable | Self::LeaseLost | Self::AnswerNotRecorded => Code::Unavailable,
            Self::HandlerTimeout => Code::DeadlineExceeded,
            Self::HandlerPanicked | Self::ResponseFailed | Self::Internal => Code::Internal,
        }
    }

    /// The reason a refused principal is answered with: [`Self::CredentialAmbiguous`] for
    /// a credential sent twice, [`Self::Unauthenticated`] otherwise.
    pub fn of_principal(r: &PrincipalRejection) -> Self {
        match r {
            PrincipalRejection::Ambiguous(_) => Self::CredentialAmbiguous,
            _ => Self::Unauthenticated,
        }
    }

    /// The reason named `reason` (an `ErrorInfo.reason` of [`ERROR_DOMAIN`]), if it is one
    /// of these.
    pub fn parse(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }

    /// The status for this reason: [`layer_status`] with its code.
    pub fn status(
        self,
        message: impl Into<String>,
        key: Option<&str>,
        retry_after: Option<Duration>,
    ) -> tonic::Status {
        layer_status(self.code(), self.as_str(), message, key, retry_after)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status answered by idem itself rather than by a handler: `code` and `message`, with a
/// `google.rpc.ErrorInfo` (`reason`, domain [`ERROR_DOMAIN`], the `key` in its metadata when
/// there is one) and, when `retry_after` is given, a `google.rpc.RetryInfo` with that delay,
/// in its details (`grpc-status-details-bin`).
///
/// The layer builds every status of its own with it, and so does the idem gateway for its
/// answers to gRPC calls. `Status::into_http` renders it as a trailers-only answer.
///
/// ```
/// use std::time::Duration;
/// use idem_grpc::{LayerDetails, Reason, layer_status};
///
/// let s = layer_status(
///     Reason::InFlight.code(),
///     Reason::InFlight.as_str(),
///     "a call with this key is being processed",
///     Some("order-42"),
///     Some(Duration::from_millis(500)),
/// );
/// let details = LayerDetails::of(&s).expect("an idem status");
/// assert_eq!(details.reason(), Some(Reason::InFlight));
/// assert_eq!(details.retry_after, Some(Duration::from_millis(500)));
/// let trailers_only = s.into_http::<()>();
/// assert_eq!(trailers_only.headers()["grpc-status"], "10");
/// assert!(trailers_only.headers().contains_key("grpc-status-details-bin"));
/// ```
pub fn layer_status(
    code: Code,
    reason: &str,
    message: impl Into<String>,
    key: Option<&str>,
    retry_after: Option<Duration>,
) -> tonic::Status {
    let mut meta = HashMap::new();
    if let Some(key) = key {
        meta.insert("key".to_owned(), key.to_owned());
    }
    let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, meta);
    if let Some(after) = retry_after {
        details.set_retry_info(Some(after));
    }
    tonic::Status::with_error_details(code, message, details)
}

/// What a status idem answered itself says in its details: the `ErrorInfo` of domain
/// [`ERROR_DOMAIN`] and the `RetryInfo` delay. The reading side of [`layer_status`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerDetails {
    /// `ErrorInfo.reason`: one of [`Reason`], or one of the gateway's own (`NO_ROUTE`,
    /// `TOKEN_USED`, …; `docs/gateway.md`).
    pub reason: String,
    /// The key, when the answer names one.
    pub key: Option<String>,
    /// The `RetryInfo` delay, when a retry after it helps.
    pub retry_after: Option<Duration>,
}

impl LayerDetails {
    /// The details of `status` when idem made it (an `ErrorInfo` of domain
    /// [`ERROR_DOMAIN`]); `None` for any other status, a handler's own included.
    pub fn of(status: &tonic::Status) -> Option<Self> {
        let mut info = status
            .get_details_error_info()
            .filter(|i| i.domain == ERROR_DOMAIN)?;
        Some(Self {
            key: info.metadata.remove("key"),
            reason: info.reason,
            retry_after: status.get_details_retry_info().and_then(|r| r.retry_delay),
        })
    }

    /// The reason as one of the layer's, if it is one.
    pub fn reason(&self) -> Option<Reason> {
        Reason::parse(&self.reason)
    }
}

/// The duration a `grpc-timeout` value names (up to 8 digits and a unit: `H`, `M`, `S`, `m`,
/// `u`, `n`), or `None` when it is malformed.
pub fn grpc_timeout(value: &http::HeaderValue) -> Option<Duration> {
    let raw = value.to_str().ok()?;
    let (digits, unit) = raw.split_at_checked(raw.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
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
        let s = Reason::InFlight.status("busy", Some("k-1"), Some(Duration::from_millis(250)));
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

    #[test]
    fn reasons_round_trip_and_other_domains_are_not_ours() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            let s = r.status("m", None, None);
            assert_eq!(s.code(), r.code(), "{r}");
            let d = LayerDetails::of(&s).expect("idem's");
            assert_eq!((d.reason(), d.key, d.retry_after), (Some(r), None, None));
        }
        assert_eq!(Reason::parse("NO_ROUTE"), None);
        let own = layer_status(Code::Unimplemented, "NO_ROUTE", "m", None, None);
        let d = LayerDetails::of(&own).expect("idem's");
        assert_eq!((d.reason.as_str(), d.reason()), ("NO_ROUTE", None));
        let theirs = tonic::Status::with_error_details(
            Code::FailedPrecondition,
            "m",
            ErrorDetails::with_error_info("OUTCOME_UNKNOWN", "example.com", HashMap::new()),
        );
        assert_eq!(LayerDetails::of(&theirs), None, "another domain's reason");
        assert_eq!(LayerDetails::of(&tonic::Status::internal("plain")), None);
    }
}
