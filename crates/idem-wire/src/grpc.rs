//! gRPC's side of the contract (the `grpc` feature): a [`Reason`] as a `tonic::Status` with
//! its `ErrorInfo` and `RetryInfo`, the reading side of that, and the status service's
//! generated code.

use std::collections::HashMap;
use std::time::Duration;

use tonic_types::{ErrorDetails, StatusExt};

use crate::{ERROR_DOMAIN, Reason};

/// A status answered by idem itself rather than by a handler: `code` and `message`, with a
/// `google.rpc.ErrorInfo` (`reason`, domain [`ERROR_DOMAIN`], the `key` in its metadata when
/// there is one) and, when `retry_after` is given, a `google.rpc.RetryInfo` with that delay,
/// in its details (`grpc-status-details-bin`). `Status::into_http` renders it as a
/// trailers-only answer.
///
/// ```
/// use std::time::Duration;
/// use idem_wire::Reason;
/// use idem_wire::grpc::{LayerDetails, status};
///
/// let s = status(
///     Reason::InFlight,
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
pub fn status(
    reason: Reason,
    message: impl Into<String>,
    key: Option<&str>,
    retry_after: Option<Duration>,
) -> tonic::Status {
    let mut meta = HashMap::new();
    if let Some(key) = key {
        meta.insert("key".to_owned(), key.to_owned());
    }
    let mut details = ErrorDetails::with_error_info(reason.as_str(), ERROR_DOMAIN, meta);
    if let Some(after) = retry_after {
        details.set_retry_info(Some(after));
    }
    tonic::Status::with_error_details(reason.grpc_code().into(), message, details)
}

/// What a status idem answered itself says in its details: the `ErrorInfo` of domain
/// [`ERROR_DOMAIN`] and the `RetryInfo` delay. The reading side of [`status`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerDetails {
    /// `ErrorInfo.reason`: one of [`Reason`]'s, or one this version does not know.
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

    /// The reason as one of [`Reason`]'s, if it is one.
    pub fn reason(&self) -> Option<Reason> {
        Reason::parse(&self.reason)
    }
}

impl Reason {
    /// Its gRPC code as tonic's.
    pub fn code(self) -> tonic::Code {
        self.grpc_code().into()
    }

    /// The status for this reason: [`status`].
    pub fn status(
        self,
        message: impl Into<String>,
        key: Option<&str>,
        retry_after: Option<Duration>,
    ) -> tonic::Status {
        status(self, message, key, retry_after)
    }
}

/// The status service's messages and its generated server and client
/// (`proto/idem/status/v1/status.proto`, compiled by `build.rs` with protox).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/idem.status.v1.rs"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GrpcCode;

    #[test]
    fn statuses_carry_error_and_retry_info() {
        let s = Reason::InFlight.status("busy", Some("k-1"), Some(Duration::from_millis(250)));
        assert_eq!(s.code(), tonic::Code::Aborted);
        let info = s.get_details_error_info().expect("error info");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("IN_FLIGHT", ERROR_DOMAIN)
        );
        assert_eq!(info.metadata["key"], "k-1");
        let d = LayerDetails::of(&s).expect("details");
        assert_eq!(d.key.as_deref(), Some("k-1"));
        assert_eq!(d.retry_after, Some(Duration::from_millis(250)));
        assert_eq!(LayerDetails::of(&tonic::Status::aborted("theirs")), None);
        for c in GrpcCode::ALL {
            assert_eq!(GrpcCode::from(tonic::Code::from(c)), c);
        }
    }
}
