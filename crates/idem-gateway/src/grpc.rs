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
//! gRPC request they become trailers-only gRPC answers ([`refusal`]).

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use idem_core::Outcome;

use crate::proxy::{self, ResBody};

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

/// The gRPC code for one of the gateway's own refusals.
fn code_for(status: StatusCode, outcome: Option<Outcome>) -> u32 {
    match (status.as_u16(), outcome) {
        (409, Some(Outcome::InFlight)) => 10, // ABORTED: retry shortly
        (400, _) => 3,                        // INVALID_ARGUMENT
        (401, _) => 16,                       // UNAUTHENTICATED
        (403, _) => 7,                        // PERMISSION_DENIED
        (404, _) => 12,                       // UNIMPLEMENTED
        (409 | 422, _) => 9,                  // FAILED_PRECONDITION
        (413, _) => 8,                        // RESOURCE_EXHAUSTED
        (429 | 502 | 503, _) => 14,           // UNAVAILABLE
        (504, _) => 4,                        // DEADLINE_EXCEEDED
        _ => 2,                               // UNKNOWN
    }
}

/// Rewrites one of the gateway's own `application/problem+json` answers to a gRPC request as
/// a trailers-only gRPC answer: HTTP 200, `content-type: application/grpc`, `grpc-status`
/// per the problem, `grpc-message` naming the problem (`idem <slug>: <detail>`). Every
/// other answer is returned as it is.
pub async fn refusal(res: Response<ResBody>) -> Response<ResBody> {
    let problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !problem {
        return res;
    }
    let outcome = res.extensions().get::<Outcome>().copied();
    let (mut head, body) = res.into_parts();
    // The gateway's problems are small bodies it holds.
    let text = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    let slug = json["type"]
        .as_str()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap_or("");
    let detail = json["detail"].as_str().unwrap_or("");
    let code = code_for(head.status, outcome);
    let message = percent_encode(&format!("idem {slug}: {detail}"));
    head.status = StatusCode::OK;
    head.headers.remove(header::CONTENT_LENGTH);
    head.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    head.headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(code),
    );
    if let Ok(v) = HeaderValue::from_str(&message) {
        head.headers
            .insert(HeaderName::from_static("grpc-message"), v);
    }
    let empty = idem_http::ResponseBody::<proxy::UpstreamBody>::full(Bytes::new());
    Response::from_parts(head, empty.boxed_unsync())
}

/// `grpc-message` encoding: printable ASCII but `%` as is, every other byte `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
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
        assert_eq!(percent_encode("a b%é"), "a b%25%C3%A9");
        assert_eq!(code_for(StatusCode::CONFLICT, Some(Outcome::InFlight)), 10);
        assert_eq!(code_for(StatusCode::CONFLICT, Some(Outcome::Unknown)), 9);
    }
}
