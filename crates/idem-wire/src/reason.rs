//! [`Reason`]: every answer idem makes itself, with its HTTP status, problem type, gRPC code
//! and `ErrorInfo.reason`, in one table.
//!
//! The HTTP layer answers a reason as `application/problem+json` with
//! `type = https://idem.dev/problems/<slug>`; the gRPC layer and the gateway (to a gRPC
//! call) answer it as a status with its code and an `ErrorInfo` of domain
//! [`ERROR_DOMAIN`](crate::ERROR_DOMAIN) naming the reason. One row per reason, so an answer
//! means the same thing whichever carrier made it.

use std::fmt;

use http::StatusCode;

use crate::GrpcCode;

/// Base of every problem `type` URI idem answers with.
pub const PROBLEM_BASE: &str = "https://idem.dev/problems/";

/// One answer idem makes itself rather than the protected service: a row of the table in
/// `docs/http.md` and `docs/grpc.md`.
///
/// ```
/// use idem_wire::{GrpcCode, Reason};
///
/// let r = Reason::InFlight;
/// assert_eq!(r.http_status().as_u16(), 409);
/// assert_eq!(r.slug(), "in-flight");
/// assert_eq!(r.type_uri(), "https://idem.dev/problems/in-flight");
/// assert_eq!(r.grpc_code(), GrpcCode::Aborted);
/// assert_eq!(r.as_str(), "IN_FLIGHT");
/// assert_eq!(Reason::from_type_uri("https://idem.dev/problems/in-flight"), Some(r));
/// assert_eq!(Reason::parse("IN_FLIGHT"), Some(r));
/// ```
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
    /// A gRPC request is not exactly one message.
    NotOneMessage,
    /// The request is above the cap.
    RequestTooLarge,
    /// The request could not be read.
    RequestUnreadable,
    /// The request body could mean two things (a JSON object naming a member twice).
    BodyAmbiguous,
    /// The request body did not arrive in time (stalled, or slower than the minimum rate).
    BodyTimeout,
    /// A request with this key is running; retry after the hinted delay.
    InFlight,
    /// The key was used with a different request.
    KeyReused,
    /// An earlier attempt's outcome is unknown; nothing runs until it is resolved.
    OutcomeUnknown,
    /// The request completed, but its answer was too large to keep.
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
    /// The request ran, but the store failed to record its answer; retry with the same key
    /// for it.
    AnswerNotRecorded,
    /// Anything else idem could not complete.
    Internal,
    /// The method is not answered at this path.
    MethodNotAllowed,
    /// No route of the gateway matches the request.
    NoRoute,
    /// The method is a case variant of a configured one (`post` for `POST`).
    MethodNotCanonical,
    /// The request path is refused (dot segments, encoded slashes, …).
    PathRejected,
    /// The request target cannot be forwarded.
    BadRequestTarget,
    /// A status query's path names no key.
    StatusPath,
    /// A status query does not say which route it asks about.
    StatusRoute,
    /// A status query's token is malformed, or sent in the URL.
    StatusToken,
    /// The gateway is at its limit of requests in progress.
    Overloaded,
    /// The upstream could not be reached; nothing was sent.
    UpstreamUnavailable,
    /// The TLS handshake with the upstream failed; nothing was sent.
    UpstreamTls,
    /// The upstream's connection failed while the request was sent or answered.
    UpstreamFailed,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// The upstream's answer could not be read.
    AnswerUnreadable,
    /// A token route got no token.
    TokenMissing,
    /// The token is not one well-formed token.
    TokenMalformed,
    /// A token route got an `Idempotency-Key` too.
    TokenWithKey,
    /// The token was not issued to this caller for this route, or is forgotten.
    TokenUnknown,
    /// The token expired before it was used.
    TokenExpired,
    /// The token was used and no answer is kept under it.
    TokenUsed,
    /// The token is bound to another request.
    TokenMismatch,
    /// Tokens were asked for faster than the route allows.
    TokenRateLimited,
    /// The token store failed.
    TokenStoreUnavailable,
    /// The token store holds as many live tokens as it may.
    TokenStoreFull,
}

/// One row of the table.
struct Row {
    slug: &'static str,
    reason: &'static str,
    status: StatusCode,
    code: GrpcCode,
    title: &'static str,
}

const fn row(
    slug: &'static str,
    reason: &'static str,
    status: StatusCode,
    code: GrpcCode,
    title: &'static str,
) -> Row {
    Row {
        slug,
        reason,
        status,
        code,
        title,
    }
}

impl Reason {
    /// Every reason, in the table's order.
    pub const ALL: [Self; 45] = [
        Self::KeyMissing,
        Self::KeyMalformed,
        Self::KeyMultiple,
        Self::Unauthenticated,
        Self::CredentialAmbiguous,
        Self::NotOneMessage,
        Self::RequestTooLarge,
        Self::RequestUnreadable,
        Self::BodyAmbiguous,
        Self::BodyTimeout,
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
        Self::MethodNotAllowed,
        Self::NoRoute,
        Self::MethodNotCanonical,
        Self::PathRejected,
        Self::BadRequestTarget,
        Self::StatusPath,
        Self::StatusRoute,
        Self::StatusToken,
        Self::Overloaded,
        Self::UpstreamUnavailable,
        Self::UpstreamTls,
        Self::UpstreamFailed,
        Self::UpstreamTimeout,
        Self::AnswerUnreadable,
        Self::TokenMissing,
        Self::TokenMalformed,
        Self::TokenWithKey,
        Self::TokenUnknown,
        Self::TokenExpired,
        Self::TokenUsed,
        Self::TokenMismatch,
        Self::TokenRateLimited,
        Self::TokenStoreUnavailable,
        Self::TokenStoreFull,
    ];

    #[rustfmt::skip] // one line per row reads as the table it is
    const fn row(self) -> Row {
        use GrpcCode::{
            Aborted, Cancelled, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
            PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable, Unimplemented,
        };
        use StatusCode as S;
        match self {
            Self::KeyMissing => row("key-missing", "KEY_MISSING", S::BAD_REQUEST, InvalidArgument, "Idempotency key missing"),
            Self::KeyMalformed => row("key-malformed", "KEY_MALFORMED", S::BAD_REQUEST, InvalidArgument, "Idempotency key malformed"),
            Self::KeyMultiple => row("key-multiple", "KEY_MULTIPLE", S::BAD_REQUEST, InvalidArgument, "More than one idempotency key"),
            Self::Unauthenticated => row("unauthenticated", "UNAUTHENTICATED", S::UNAUTHORIZED, Unauthenticated, "Principal required"),
            Self::CredentialAmbiguous => row("credential-ambiguous", "CREDENTIAL_AMBIGUOUS", S::BAD_REQUEST, InvalidArgument, "Credential ambiguous"),
            Self::NotOneMessage => row("not-one-message", "NOT_ONE_MESSAGE", S::BAD_REQUEST, InvalidArgument, "Request not one message"),
            Self::RequestTooLarge => row("body-too-large", "REQUEST_TOO_LARGE", S::PAYLOAD_TOO_LARGE, ResourceExhausted, "Request body too large"),
            Self::RequestUnreadable => row("body-unreadable", "REQUEST_UNREADABLE", S::BAD_REQUEST, Cancelled, "Request body unreadable"),
            Self::BodyAmbiguous => row("body-ambiguous", "BODY_AMBIGUOUS", S::BAD_REQUEST, InvalidArgument, "Request body ambiguous"),
            Self::BodyTimeout => row("body-timeout", "BODY_TIMEOUT", S::REQUEST_TIMEOUT, DeadlineExceeded, "Request body too slow"),
            Self::InFlight => row("in-flight", "IN_FLIGHT", S::CONFLICT, Aborted, "Request in flight"),
            Self::KeyReused => row("key-reused", "KEY_REUSED", S::UNPROCESSABLE_ENTITY, FailedPrecondition, "Idempotency key reused"),
            Self::OutcomeUnknown => row("outcome-unknown", "OUTCOME_UNKNOWN", S::CONFLICT, FailedPrecondition, "Outcome unknown"),
            Self::ResponseNotStored => row("response-not-stored", "RESPONSE_NOT_STORED", S::CONFLICT, FailedPrecondition, "Response not replayable"),
            Self::StoreUnavailable => row("store-unavailable", "STORE_UNAVAILABLE", S::SERVICE_UNAVAILABLE, Unavailable, "Idempotency store unavailable"),
            Self::LeaseLost => row("lease-lost", "LEASE_LOST", S::SERVICE_UNAVAILABLE, Unavailable, "Claim lost"),
            Self::HandlerTimeout => row("handler-timeout", "HANDLER_TIMEOUT", S::GATEWAY_TIMEOUT, DeadlineExceeded, "Handler timed out"),
            Self::HandlerPanicked => row("handler-panicked", "HANDLER_PANICKED", S::INTERNAL_SERVER_ERROR, Internal, "Handler failed"),
            Self::ResponseFailed => row("response-failed", "RESPONSE_FAILED", S::INTERNAL_SERVER_ERROR, Internal, "Response failed"),
            Self::AnswerNotRecorded => row("answer-not-recorded", "ANSWER_NOT_RECORDED", S::SERVICE_UNAVAILABLE, Unavailable, "Answer not recorded yet"),
            Self::Internal => row("internal", "INTERNAL", S::INTERNAL_SERVER_ERROR, Internal, "Internal error"),
            Self::MethodNotAllowed => row("method-not-allowed", "METHOD_NOT_ALLOWED", S::METHOD_NOT_ALLOWED, Unimplemented, "Method not allowed"),
            Self::NoRoute => row("no-route", "NO_ROUTE", S::NOT_FOUND, Unimplemented, "No route"),
            Self::MethodNotCanonical => row("method-not-canonical", "METHOD_NOT_CANONICAL", S::BAD_REQUEST, InvalidArgument, "Method not canonical"),
            Self::PathRejected => row("path-rejected", "PATH_REJECTED", S::BAD_REQUEST, InvalidArgument, "Request path rejected"),
            Self::BadRequestTarget => row("bad-request-target", "BAD_REQUEST_TARGET", S::BAD_REQUEST, InvalidArgument, "Bad request target"),
            Self::StatusPath => row("status-path", "STATUS_PATH", S::BAD_REQUEST, InvalidArgument, "Status path malformed"),
            Self::StatusRoute => row("status-route", "STATUS_ROUTE", S::BAD_REQUEST, InvalidArgument, "Status route not chosen"),
            Self::StatusToken => row("status-token", "STATUS_TOKEN", S::BAD_REQUEST, InvalidArgument, "Status token refused"),
            Self::Overloaded => row("overloaded", "OVERLOADED", S::SERVICE_UNAVAILABLE, Unavailable, "Too many requests in progress"),
            Self::UpstreamUnavailable => row("upstream-unavailable", "UPSTREAM_UNAVAILABLE", S::SERVICE_UNAVAILABLE, Unavailable, "Upstream unavailable"),
            Self::UpstreamTls => row("upstream-tls", "UPSTREAM_TLS", S::BAD_GATEWAY, Unavailable, "Upstream TLS handshake failed"),
            Self::UpstreamFailed => row("upstream-failed", "UPSTREAM_FAILED", S::BAD_GATEWAY, Unavailable, "Upstream failed"),
            Self::UpstreamTimeout => row("upstream-timeout", "UPSTREAM_TIMEOUT", S::GATEWAY_TIMEOUT, DeadlineExceeded, "Upstream timed out"),
            Self::AnswerUnreadable => row("answer-unreadable", "ANSWER_UNREADABLE", S::INTERNAL_SERVER_ERROR, Internal, "Answer unreadable"),
            Self::TokenMissing => row("token-missing", "TOKEN_MISSING", S::PRECONDITION_REQUIRED, InvalidArgument, "Token required"),
            Self::TokenMalformed => row("token-malformed", "TOKEN_MALFORMED", S::BAD_REQUEST, InvalidArgument, "Token malformed"),
            Self::TokenWithKey => row("token-with-key", "TOKEN_WITH_KEY", S::BAD_REQUEST, InvalidArgument, "Idempotency-Key not accepted here"),
            Self::TokenUnknown => row("token-unknown", "TOKEN_UNKNOWN", S::FORBIDDEN, PermissionDenied, "Token unknown"),
            Self::TokenExpired => row("token-expired", "TOKEN_EXPIRED", S::GONE, FailedPrecondition, "Token expired"),
            Self::TokenUsed => row("token-used", "TOKEN_USED", S::CONFLICT, FailedPrecondition, "Token already used"),
            Self::TokenMismatch => row("token-mismatch", "TOKEN_MISMATCH", S::UNPROCESSABLE_ENTITY, FailedPrecondition, "Token bound to another request"),
            Self::TokenRateLimited => row("token-rate-limited", "TOKEN_RATE_LIMITED", S::TOO_MANY_REQUESTS, ResourceExhausted, "Too many tokens requested"),
            Self::TokenStoreUnavailable => row("token-store-unavailable", "TOKEN_STORE_UNAVAILABLE", S::SERVICE_UNAVAILABLE, Unavailable, "Token store unavailable"),
            Self::TokenStoreFull => row("token-store-full", "TOKEN_STORE_FULL", S::SERVICE_UNAVAILABLE, Unavailable, "Token store full"),
        }
    }

    /// The `ErrorInfo.reason` it is answered with over gRPC: `KEY_MISSING`, `IN_FLIGHT`, ….
    pub const fn as_str(self) -> &'static str {
        self.row().reason
    }

    /// The last segment of its problem `type` URI: `key-missing`, `in-flight`, ….
    pub const fn slug(self) -> &'static str {
        self.row().slug
    }

    /// The HTTP status it is answered with.
    pub const fn http_status(self) -> StatusCode {
        self.row().status
    }

    /// The gRPC code it is answered with.
    pub const fn grpc_code(self) -> GrpcCode {
        self.row().code
    }

    /// The problem's `title`: a short summary, the same for every occurrence.
    pub const fn title(self) -> &'static str {
        self.row().title
    }

    /// Its problem `type` URI: [`PROBLEM_BASE`] and the slug.
    pub fn type_uri(self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug())
    }

    /// The reason named `reason` (an `ErrorInfo.reason` of
    /// [`ERROR_DOMAIN`](crate::ERROR_DOMAIN)), if it is one of these.
    pub fn parse(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }

    /// The reason whose slug is `slug`, if it is one of these.
    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.slug() == slug)
    }

    /// The reason whose problem `type` URI is `uri`, if it is one of these.
    pub fn from_type_uri(uri: &str) -> Option<Self> {
        uri.strip_prefix(PROBLEM_BASE).and_then(Self::from_slug)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_row_is_distinct_and_reads_back() {
        let (mut slugs, mut reasons) = (HashSet::new(), HashSet::new());
        for r in Reason::ALL {
            assert!(slugs.insert(r.slug()), "{r}: slug used twice");
            assert!(reasons.insert(r.as_str()), "{r}: reason used twice");
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert_eq!(Reason::from_type_uri(&r.type_uri()), Some(r));
            assert!(r.http_status().is_client_error() || r.http_status().is_server_error());
            assert_ne!(r.grpc_code(), GrpcCode::Ok, "{r}");
            assert!(!r.title().is_empty());
        }
        assert_eq!(Reason::parse("in-flight"), None);
        assert_eq!(Reason::from_type_uri("https://example.com/in-flight"), None);
        assert_eq!(Reason::from_slug("IN_FLIGHT"), None);
    }

    #[test]
    fn every_503_is_unavailable() {
        // What a client may retry with the same key without being told when: every 503
        // idem answers is UNAVAILABLE over gRPC, so both carriers mean "retry" alike.
        for r in Reason::ALL {
            if r.http_status() == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(r.grpc_code(), GrpcCode::Unavailable, "{r}");
            }
        }
    }
}
