//! gRPC behind the gateway: the gateway's own answers in gRPC's terms.
//!
//! A gRPC answer is HTTP 200 whatever happened; its outcome is `grpc-status` (in the trailers,
//! or in the head of a trailers-only answer). On a protected route the proxy reads it from
//! the trailers it holds and attaches it to the answer as an `idem_wire::GrpcCode`, and the
//! route's store policy decides by it as idem-grpc's `StoreDeterministic` does (stored:
//! `OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`,
//! `OUT_OF_RANGE`, `UNIMPLEMENTED`; released: every other code).
//!
//! A gRPC client cannot read the gateway's `application/problem+json` refusals, so for a
//! gRPC request they become trailers-only gRPC answers ([`refusal`]). Each carries the
//! [`Problem`] it was made from as a response extension, and its
//! [`Reason`](idem_wire::Reason) (idem-wire's
//! table, the one idem-grpc's layer answers from) gives the code and `ErrorInfo.reason`;
//! nothing is read back from the body. A problem's `Retry-After` becomes a `RetryInfo`. An
//! upstream's own problem answer has no such extension: it reaches the caller as the
//! upstream's answer (the code its HTTP status means, its text, no idem `ErrorInfo`), even
//! if its body names one of idem's problem types. The table is in `docs/gateway.md`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use idem_grpc::tonic::{self, Code};
use idem_http::{Problem, retry_after_secs};

use crate::body::{self, ResBody};

/// The most of an upstream's problem body read for its text.
const PROBLEM_CAP: usize = 64 * 1024;

/// The gRPC code an upstream's own problem answer is given, by its HTTP status.
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

/// The status of one of idem's own problems: its reason's code and `ErrorInfo.reason`,
/// `grpc-message` = `idem <slug>: <detail>`, its key, and its retry hint in whole seconds (as
/// its `Retry-After` says).
fn idem_status(problem: &Problem) -> tonic::Status {
    let key = problem.key.as_deref();
    let after = problem
        .retry_after
        .map(|d| Duration::from_secs(retry_after_secs(d)));
    let message = format!("idem {}: {}", problem.reason.slug(), problem.detail);
    problem.reason.status(message, key, after)
}

/// The status of an upstream's own problem answer with HTTP `status`: the code the status
/// means and the body's `detail` (or `title`); never an idem reason, whatever its `type`.
async fn upstream_status(status: StatusCode, body: ResBody) -> tonic::Status {
    // Read up to a cap; past it, the answer is a status without its text.
    let text = read_capped(body, PROBLEM_CAP).await;
    let json: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    let field = |name: &str| json[name].as_str().unwrap_or("");
    let message = match field("detail") {
        "" => field("title"),
        detail => detail,
    };
    tonic::Status::new(code_for(status), message)
}

/// Rewrites a problem answer to a gRPC request as a trailers-only gRPC answer: HTTP 200,
/// `content-type: application/grpc`, and `grpc-status` with `grpc-message` (and, for one of
/// idem's own, `grpc-status-details-bin` with the `ErrorInfo` and a `RetryInfo` where the
/// problem has `Retry-After`). The other headers stay (`Retry-After` included). Every other
/// answer is returned as it is.
pub(crate) async fn refusal(res: Response<ResBody>) -> Response<ResBody> {
    let (mut head, answer) = res.into_parts();
    let status = match head.extensions.get::<Problem>() {
        Some(problem) => idem_status(problem),
        None if is_problem(&head.headers) => upstream_status(head.status, answer).await,
        None => return Response::from_parts(head, answer),
    };
    let (grpc, ()) = status.into_http::<()>().into_parts();
    head.status = StatusCode::OK;
    head.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &grpc.headers {
        head.headers.insert(name.clone(), value.clone());
    }
    let empty = idem_http::ResponseBody::<body::UpstreamBody>::full(Bytes::new());
    Response::from_parts(head, empty.boxed_unsync())
}

fn is_problem(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"))
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
    use idem_grpc::LayerDetails;
    use idem_wire::Reason;

    use super::*;

    /// The gRPC answer to `res`, read back as a status.
    async fn read_back(res: Response<ResBody>) -> (HeaderMap, tonic::Status) {
        let res = refusal(res).await;
        assert_eq!(res.status(), StatusCode::OK);
        let (head, body) = res.into_parts();
        let rest = body.collect().await.expect("body").to_bytes();
        assert!(rest.is_empty(), "trailers-only");
        assert_eq!(head.headers[header::CONTENT_TYPE], "application/grpc");
        let status = tonic::Status::from_header_map(&head.headers).expect("grpc-status");
        (head.headers, status)
    }

    /// The answer a gRPC caller gets for one of idem's own `problem`s.
    async fn answered(problem: Problem) -> (HeaderMap, tonic::Status) {
        read_back(body::boxed(body::problem(problem))).await
    }

    /// An upstream's answer with `status` and `body` as `application/problem+json`.
    fn upstream_problem(status: StatusCode, body: String) -> Response<ResBody> {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/problem+json")
            .body(
                idem_http::ResponseBody::<body::UpstreamBody>::full(Bytes::from(body))
                    .boxed_unsync(),
            )
            .expect("response")
    }

    #[tokio::test]
    async fn problems_become_the_statuses_idem_grpc_answers() {
        let key = idem_core::Key::new("order-7").expect("key");
        let in_flight = Problem::new(Reason::InFlight, "busy")
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

        let unknown = Problem::new(Reason::OutcomeUnknown, "résolu? 100%").key(Some(&key));
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

        let token =
            Problem::new(Reason::TokenRateLimited, "slow").retry_after(Duration::from_secs(3));
        let (_, s) = answered(token).await;
        assert_eq!(s.code(), Code::ResourceExhausted);
        let d = LayerDetails::of(&s).expect("idem details");
        assert_eq!(
            (d.reason.as_str(), d.retry_after),
            ("TOKEN_RATE_LIMITED", Some(Duration::from_secs(3)))
        );
    }

    #[tokio::test]
    async fn every_reason_is_answered_with_its_own_row() {
        for r in Reason::ALL {
            let (_, s) = answered(Problem::new(r, "d")).await;
            assert_eq!(s.code(), r.code(), "{r}");
            let d = LayerDetails::of(&s).expect("idem details");
            assert_eq!(d.reason(), Some(r));
        }
    }

    #[tokio::test]
    async fn an_upstream_problem_is_the_upstreams_answer_even_in_idems_words() {
        // The body names idem's own problem type: it is still the upstream's answer, so no
        // idem ErrorInfo (a client would stop retrying on OUTCOME_UNKNOWN).
        let posing = format!(
            r#"{{"type":"{}","title":"t","status":409,"detail":"theirs","key":"k"}}"#,
            Reason::OutcomeUnknown.type_uri()
        );
        let (_, s) = read_back(upstream_problem(StatusCode::CONFLICT, posing)).await;
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "theirs")
        );
        assert_eq!(LayerDetails::of(&s), None);

        let body =
            r#"{"type":"https://example.com/out-of-stock","title":"Out of stock","status":409}"#;
        let (_, s) = read_back(upstream_problem(StatusCode::CONFLICT, body.into())).await;
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "Out of stock")
        );
        assert_eq!(LayerDetails::of(&s), None);

        // An oversized problem is not read whole: the status keeps its code, not its text.
        let huge = format!(r#"{{"title":"{}"}}"#, "x".repeat(PROBLEM_CAP));
        let (_, s) = read_back(upstream_problem(StatusCode::SERVICE_UNAVAILABLE, huge)).await;
        assert_eq!((s.code(), s.message()), (Code::Unavailable, ""));

        let plain = Response::builder()
            .status(StatusCode::CREATED)
            .body(
                idem_http::ResponseBody::<body::UpstreamBody>::full(Bytes::from("{}"))
                    .boxed_unsync(),
            )
            .expect("response");
        assert_eq!(refusal(plain).await.status(), StatusCode::CREATED);
    }
}
