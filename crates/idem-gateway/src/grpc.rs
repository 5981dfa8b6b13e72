//! gRPC behind the gateway: what a gRPC answer's status means for its record, and the
//! gateway's own answers in gRPC's terms.
//!
//! A gRPC answer is HTTP 200 whatever happened; its outcome is `grpc-status` (in the trailers,
//! or in the head of a trailers-only answer). The idempotency layer decides by HTTP status,
//! so on a protected route the proxy shows it the HTTP status that means the same thing and
//! the data plane restores the 200 afterwards (see [`crate::proxy::ShownAs`]):
//!
//! | `grpc-status` | the layer sees | the record |
//! |---|---|---|
//! | `OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | 200 | stored and replayed: a definite answer about this request |
//! | `CANCELLED`, `DEADLINE_EXCEEDED`, `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `UNAVAILABLE`, `UNAUTHENTICATED` | 503 | released: a retry runs |
//! | `UNKNOWN`, `INTERNAL`, `DATA_LOSS`, anything else | 500 | released, as an HTTP 500 is |
//!
//! A gRPC client cannot read the gateway's `application/problem+json` refusals, so for a
//! gRPC request they become trailers-only gRPC answers ([`refusal`]), built by idem-grpc's
//! [`layer_status`]: where idem-grpc's layer meets the same situation (a key missing, in
//! flight, reused, an unknown outcome, the store down, …) the answer has its code and
//! `ErrorInfo.reason`; the gateway's own situations (no route, a token refused, the
//! upstream failed, …) have reasons of their own. A problem's `Retry-After` becomes a
//! `RetryInfo`. The table is in `docs/gateway.md`.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use idem_grpc::Reason;
use idem_grpc::tonic::{self, Code};
use idem_http::PROBLEM_BASE;

use crate::proxy::{self, ResBody};

/// The most of a problem body read to answer it in gRPC's terms.
const PROBLEM_CAP: usize = 64 * 1024;

/// Whether `headers` (a request's or a response's) are gRPC's (`application/grpc`,
/// `application/grpc+proto`, …).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            let ct = ct.trim_start().as_bytes();
            let grpc = b"application/grpc";
            ct.len() >= grpc.len()
                && ct[..grpc.len()].eq_ignore_ascii_case(grpc)
                && matches!(ct.get(grpc.len()), None | Some(b'+' | b';'))
        })
}

/// The answer's `grpc-status`: from the head (a trailers-only answer) or the trailers.
pub fn status_code(head: &HeaderMap, trailers: Option<&HeaderMap>) -> Option<u32> {
    let field = HeaderName::from_static("grpc-status");
    head.get(&field)
        .or_else(|| trailers.and_then(|t| t.get(&field)))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The HTTP status the idempotency layer should decide on for an answer with `grpc-status`
/// `code`, when it is not the 200 the answer carries (see the module's table).
pub fn layer_status(code: u32) -> Option<StatusCode> {
    match code {
        // OK and definite answers about the request.
        0 | 3 | 5 | 6 | 9 | 11 | 12 => None,
        // Not done now; a retry may succeed.
        1 | 4 | 7 | 8 | 10 | 14 | 16 => Some(StatusCode::SERVICE_UNAVAILABLE),
        _ => Some(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// How the gateway answers one of its problems to a gRPC call: idem-grpc's row for the same
/// situation, or one of the gateway's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    /// The row idem-grpc's layer answers with.
    Layer(Reason),
    /// A situation only the gateway meets: its code and `ErrorInfo.reason`.
    Own(Code, &'static str),
}

impl Row {
    fn code(self) -> Code {
        match self {
            Self::Layer(r) => r.code(),
            Self::Own(code, _) => code,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Self::Layer(r) => r.as_str(),
            Self::Own(_, reason) => reason,
        }
    }
}

/// The row for the gateway problem `slug` (the last segment of its `type`).
fn row(slug: &str) -> Option<Row> {
    use Row::{Layer, Own};
    Some(match slug {
        // The idempotency layer's problems (idem-http's table): idem-grpc's rows.
        "key-missing" => Layer(Reason::KeyMissing),
        "key-malformed" => Layer(Reason::KeyMalformed),
        "key-multiple" => Layer(Reason::KeyMultiple),
        "unauthenticated" => Layer(Reason::Unauthenticated),
        "credential-ambiguous" => Layer(Reason::CredentialAmbiguous),
        "body-too-large" => Layer(Reason::RequestTooLarge),
        "body-unreadable" => Layer(Reason::RequestUnreadable),
        "in-flight" => Layer(Reason::InFlight),
        "key-reused" => Layer(Reason::KeyReused),
        "outcome-unknown" => Layer(Reason::OutcomeUnknown),
        "response-not-stored" => Layer(Reason::ResponseNotStored),
        "store-unavailable" => Layer(Reason::StoreUnavailable),
        "lease-lost" => Layer(Reason::LeaseLost),
        "handler-timeout" => Layer(Reason::HandlerTimeout),
        "handler-panicked" => Layer(Reason::HandlerPanicked),
        "response-failed" => Layer(Reason::ResponseFailed),
        "answer-not-recorded" => Layer(Reason::AnswerNotRecorded),
        "internal" => Layer(Reason::Internal),
        // Routing and the request target.
        "no-route" => Own(Code::Unimplemented, "NO_ROUTE"),
        "method-not-allowed" => Own(Code::Unimplemented, "METHOD_NOT_ALLOWED"),
        "path-rejected" => Own(Code::InvalidArgument, "PATH_REJECTED"),
        "bad-request-target" => Own(Code::InvalidArgument, "BAD_REQUEST_TARGET"),
        "status-path" => Own(Code::InvalidArgument, "STATUS_PATH"),
        "status-route" => Own(Code::InvalidArgument, "STATUS_ROUTE"),
        "overloaded" => Own(Code::Unavailable, "OVERLOADED"),
        "body-timeout" => Own(Code::DeadlineExceeded, "BODY_TIMEOUT"),
        // The upstream. A retry with the same key is safe on a protected route: it replays,
        // waits or is refused, never runs twice.
        "upstream-unavailable" => Own(Code::Unavailable, "UPSTREAM_UNAVAILABLE"),
        "upstream-tls" => Own(Code::Unavailable, "UPSTREAM_TLS"),
        "upstream-failed" => Own(Code::Unavailable, "UPSTREAM_FAILED"),
        "upstream-timeout" => Own(Code::DeadlineExceeded, "UPSTREAM_TIMEOUT"),
        "answer-unreadable" => Own(Code::Internal, "ANSWER_UNREADABLE"),
        // One-time tokens.
        "token-missing" => Own(Code::InvalidArgument, "TOKEN_MISSING"),
        "token-malformed" => Own(Code::InvalidArgument, "TOKEN_MALFORMED"),
        "token-with-key" => Own(Code::InvalidArgument, "TOKEN_WITH_KEY"),
        "token-unknown" => Own(Code::PermissionDenied, "TOKEN_UNKNOWN"),
        "token-expired" => Own(Code::FailedPrecondition, "TOKEN_EXPIRED"),
        "token-used" => Own(Code::FailedPrecondition, "TOKEN_USED"),
        "token-mismatch" => Own(Code::FailedPrecondition, "TOKEN_MISMATCH"),
        "token-rate-limited" => Own(Code::ResourceExhausted, "TOKEN_RATE_LIMITED"),
        "token-store-unavailable" => Own(Code::Unavailable, "TOKEN_STORE_UNAVAILABLE"),
        "token-store-full" => Own(Code::Unavailable, "TOKEN_STORE_FULL"),
        _ => return None,
    })
}

/// The gRPC code for a problem without a row (a problem type this table does not know), by
/// its HTTP status.
fn code_for(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 | 405 => Code::Unimplemented,
        409 | 410 | 412 | 422 | 428 => Code::FailedPrecondition,
        413 | 429 => Code::ResourceExhausted,
        502 | 503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Unknown,
    }
}

/// The gRPC status for a problem answered with HTTP `status`, from its JSON body and its
/// `Retry-After` (whole seconds).
fn status_for(
    status: StatusCode,
    problem: &serde_json::Value,
    retry_after: Option<u64>,
) -> tonic::Status {
    let text = |field: &str| problem[field].as_str().unwrap_or("");
    let Some(slug) = text("type").strip_prefix(PROBLEM_BASE) else {
        // Not one of idem's problems (an upstream's own): no idem reason to give.
        let detail = match text("detail") {
            "" => text("title"),
            detail => detail,
        };
        return tonic::Status::new(code_for(status), detail);
    };
    let (code, reason) = match row(slug) {
        Some(row) => (row.code(), Cow::Borrowed(row.reason())),
        // A problem newer than this table: its slug in the reasons' spelling.
        None => (
            code_for(status),
            Cow::Owned(slug.to_ascii_uppercase().replace('-', "_")),
        ),
    };
    let key = problem["key"].as_str();
    idem_grpc::layer_status(
        code,
        &reason,
        format!("idem {slug}: {}", text("detail")),
        key,
        retry_after.map(Duration::from_secs),
    )
}

/// Rewrites one of the gateway's own `application/problem+json` answers to a gRPC request as
/// a trailers-only gRPC answer: HTTP 200, `content-type: application/grpc`, and the status
/// of the problem's row (`grpc-status`; `grpc-message` = `idem <slug>: <detail>`;
/// `grpc-status-details-bin` with the `ErrorInfo` and, for a problem with `Retry-After`, a
/// `RetryInfo`). The other headers stay (`Retry-After` included). Every other answer is
/// returned as it is.
pub async fn refusal(res: Response<ResBody>) -> Response<ResBody> {
    let problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !problem {
        return res;
    }
    let (mut head, body) = res.into_parts();
    // The gateway's problems are small bodies it holds; an upstream's is read up to a cap
    // (past it, the answer is a status without its detail).
    let text = read_capped(body, PROBLEM_CAP).await;
    let json: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    let retry_after = head
        .headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let status = status_for(head.status, &json, retry_after);
    let (grpc, ()) = status.into_http::<()>().into_parts();
    head.status = StatusCode::OK;
    head.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &grpc.headers {
        head.headers.insert(name.clone(), value.clone());
    }
    let empty = idem_http::ResponseBody::<proxy::UpstreamBody>::full(Bytes::new());
    Response::from_parts(head, empty.boxed_unsync())
}

/// The body's data, or nothing when it fails or holds more than `cap` bytes.
async fn read_capped(mut body: ResBody, cap: usize) -> Vec<u8> {
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Vec::new();
        };
        if let Ok(data) = frame.into_data() {
            if text.len() + data.len() > cap {
                return Vec::new();
            }
            text.extend_from_slice(&data);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use idem_grpc::LayerDetails;
    use idem_http::Problem;

    use super::*;

    #[test]
    fn content_types_and_codes() {
        let mut h = HeaderMap::new();
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC; charset=x", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&h), grpc, "{ct}");
        }
        assert_eq!(layer_status(0), None);
        assert_eq!(layer_status(9), None);
        assert_eq!(layer_status(14), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(layer_status(13), Some(StatusCode::INTERNAL_SERVER_ERROR));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("14"));
        assert_eq!(status_code(&HeaderMap::new(), Some(&t)), Some(14));
        assert_eq!(status_code(&HeaderMap::new(), None), None);
    }

    /// The answer a gRPC caller gets for `problem`, read back as a status.
    async fn answered(problem: Problem) -> (HeaderMap, tonic::Status) {
        let res = refusal(proxy::boxed(proxy::problem(problem))).await;
        assert_eq!(res.status(), StatusCode::OK);
        let (head, body) = res.into_parts();
        let rest = body.collect().await.expect("body").to_bytes();
        assert!(rest.is_empty(), "trailers-only");
        assert_eq!(head.headers[header::CONTENT_TYPE], "application/grpc");
        let status = tonic::Status::from_header_map(&head.headers).expect("grpc-status");
        (head.headers, status)
    }

    #[tokio::test]
    async fn problems_become_the_statuses_idem_grpc_answers() {
        let key = idem_core::Key::new("order-7").expect("key");
        let in_flight = Problem::new(StatusCode::CONFLICT, "in-flight", "t", "busy")
            .key(Some(&key))
            .retry_after(Duration::from_millis(300));
        let (headers, s) = answered(in_flight).await;
        assert_eq!(s.code(), Reason::InFlight.code());
        assert_eq!(s.message(), "idem in-flight: busy");
        let d = LayerDetails::of(&s).expect("idem details");
        assert_eq!(d.reason(), Some(Reason::InFlight));
        assert_eq!(d.key.as_deref(), Some("order-7"));
        assert_eq!(
            d.retry_after,
            Some(Duration::from_secs(1)),
            "Retry-After: 1"
        );
        assert_eq!(headers[header::RETRY_AFTER], "1", "kept as metadata");

        let unknown = Problem::new(StatusCode::CONFLICT, "outcome-unknown", "t", "résolu? 100%")
            .key(Some(&key));
        let (_, s) = answered(unknown).await;
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "idem outcome-unknown: résolu? 100%",
            "percent-encoded, read back"
        );
        let d = LayerDetails::of(&s).expect("idem details");
        assert_eq!(
            (d.reason(), d.retry_after),
            (Some(Reason::OutcomeUnknown), None)
        );

        let token = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "token-rate-limited",
            "t",
            "slow",
        )
        .retry_after(Duration::from_secs(3));
        let (_, s) = answered(token).await;
        assert_eq!(s.code(), Code::ResourceExhausted);
        let d = LayerDetails::of(&s).expect("idem details");
        assert_eq!(
            (d.reason.as_str(), d.retry_after),
            ("TOKEN_RATE_LIMITED", Some(Duration::from_secs(3)))
        );

        // A slug newer than the table still names itself.
        let newer = Problem::new(StatusCode::CONFLICT, "some-new-thing", "t", "d");
        let (_, s) = answered(newer).await;
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(LayerDetails::of(&s).expect("idem").reason, "SOME_NEW_THING");
    }

    #[tokio::test]
    async fn other_problems_and_answers_are_not_dressed_as_idem_ones() {
        let body =
            r#"{"type":"https://example.com/out-of-stock","title":"Out of stock","status":409}"#;
        let res = Response::builder()
            .status(StatusCode::CONFLICT)
            .header(header::CONTENT_TYPE, "application/problem+json")
            .body(
                idem_http::ResponseBody::<proxy::UpstreamBody>::full(Bytes::from(body))
                    .boxed_unsync(),
            )
            .expect("response");
        let (head, _) = refusal(res).await.into_parts();
        let s = tonic::Status::from_header_map(&head.headers).expect("grpc-status");
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "Out of stock")
        );
        assert_eq!(LayerDetails::of(&s), None);

        // An oversized problem is not read whole: the status keeps its code, not its text.
        let huge = format!(r#"{{"title":"{}"}}"#, "x".repeat(PROBLEM_CAP));
        let res = Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header(header::CONTENT_TYPE, "application/problem+json")
            .body(
                idem_http::ResponseBody::<proxy::UpstreamBody>::full(Bytes::from(huge))
                    .boxed_unsync(),
            )
            .expect("response");
        let (head, _) = refusal(res).await.into_parts();
        let s = tonic::Status::from_header_map(&head.headers).expect("grpc-status");
        assert_eq!((s.code(), s.message()), (Code::Unavailable, ""));

        let plain = Response::builder()
            .status(StatusCode::CREATED)
            .body(
                idem_http::ResponseBody::<proxy::UpstreamBody>::full(Bytes::from("{}"))
                    .boxed_unsync(),
            )
            .expect("response");
        assert_eq!(refusal(plain).await.status(), StatusCode::CREATED);
    }

    #[test]
    fn every_problem_the_gateway_makes_has_a_row() {
        // The slugs of idem-http's problems and the gateway's own.
        let slugs = [
            "key-missing",
            "key-malformed",
            "key-multiple",
            "unauthenticated",
            "credential-ambiguous",
            "body-too-large",
            "body-unreadable",
            "in-flight",
            "key-reused",
            "outcome-unknown",
            "response-not-stored",
            "store-unavailable",
            "lease-lost",
            "handler-timeout",
            "handler-panicked",
            "response-failed",
            "answer-not-recorded",
            "internal",
            "no-route",
            "method-not-allowed",
            "path-rejected",
            "bad-request-target",
            "status-path",
            "status-route",
            "overloaded",
            "upstream-unavailable",
            "upstream-tls",
            "upstream-failed",
            "upstream-timeout",
            "answer-unreadable",
            "token-missing",
            "token-malformed",
            "token-with-key",
            "token-unknown",
            "token-expired",
            "token-used",
            "token-mismatch",
            "token-rate-limited",
            "token-store-unavailable",
            "token-store-full",
            "body-timeout",
        ];
        let mut reasons = std::collections::HashSet::new();
        for slug in slugs {
            let row = row(slug).unwrap_or_else(|| panic!("{slug} has no row"));
            assert!(reasons.insert(row.reason()), "{slug}: reason used twice");
        }
        // Every reason idem-grpc's layer answers that the gateway can meet is reached.
        for r in Reason::ALL {
            let reached = slugs.iter().any(|s| row(s) == Some(Row::Layer(r)));
            assert_eq!(reached, r != Reason::NotOneMessage, "{r}");
        }
    }
}
