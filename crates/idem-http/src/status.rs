//! The status endpoint: `GET <prefix>/{key}` tells the calling principal what became of its
//! key (the seeds' "idempotent query"), so a client that timed out can ask before retrying.
//!
//! The answer is JSON: `{"key", "namespace", "state", "created_at", "expires_at",
//! "lease_until"?, "completed_at"?, "status"?}` with times in milliseconds since the Unix
//! epoch (store clock) and `state` one of `processing` (with `Retry-After`), `completed`,
//! `unknown`, `absent` (404). The scope includes the caller's principal, so another
//! principal's keys always read as absent.
//!
//! With `?answer=1`, a completed key is answered with its stored response instead, exactly as
//! a retry would replay it (`Idempotent-Replayed: true`); every other state is answered as
//! above. Every answer carries its [`Outcome`](idem_core::Outcome): `Queried`, `Replayed` for
//! a stored response, or the refusal.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Empty;
use idem_core::{Engine, Outcome, Record, RecordState, ScopedKey, Store};
use serde::Serialize;
use tower::Service;

use crate::body::ResponseBody;
use crate::config::IdempotencyConfig;
use crate::idempotency::{principal_refused, replay, with_outcome};
use crate::key::{KeyRejection, parse_key};
use crate::policy::{FoundKey, IDEMPOTENCY_KEY};
use crate::problem::{Problem, Reason};

/// A status query's read of `scoped`'s record within `limit`, for every carrier's status
/// answer: `None` when the store failed (logged here) or took longer, which the caller
/// answers as "store unavailable".
pub async fn read_record<St: Store>(
    store: &St,
    scoped: &ScopedKey,
    limit: Duration,
) -> Option<Option<Record>> {
    match tokio::time::timeout(limit, store.get(scoped)).await {
        Ok(Ok(record)) => Some(record),
        Ok(Err(e)) => {
            tracing::warn!(key = %scoped, error = %e, "status query failed");
            None
        }
        Err(_) => None,
    }
}

/// A tower service answering `GET <prefix>/{key}` for one namespace. Mount it with axum's
/// `Router::route_service("/idempotency/{key}", status)` or call it from a hyper service.
pub struct IdempotencyStatus<St> {
    engine: Engine<St>,
    config: Arc<IdempotencyConfig>,
    prefix: Arc<str>,
}

impl<St> Clone for IdempotencyStatus<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
            prefix: Arc::clone(&self.prefix),
        }
    }
}

impl<St> fmt::Debug for IdempotencyStatus<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyStatus")
            .field("namespace", &self.config.namespace())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl<St: Store> IdempotencyStatus<St> {
    /// Status of the keys of `config`'s namespace, for the principal `config` extracts,
    /// under `prefix` (e.g. `/idempotency`).
    pub fn new(engine: &Engine<St>, config: IdempotencyConfig, prefix: &str) -> Self {
        Self {
            engine: engine.clone(),
            config: Arc::new(config),
            prefix: prefix.trim_end_matches('/').into(),
        }
    }
}

#[derive(Serialize)]
struct StatusBody<'a> {
    key: &'a str,
    namespace: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_until: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
}

type StatusResponse = Response<ResponseBody<Empty<Bytes>>>;

impl<St: Store, B> Service<Request<B>> for IdempotencyStatus<St> {
    type Response = StatusResponse;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<StatusResponse, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        let (parts, _body) = req.into_parts();
        Box::pin(async move { Ok(this.answer(&parts).await) })
    }
}

impl<St: Store> IdempotencyStatus<St> {
    async fn answer(&self, parts: &http::request::Parts) -> StatusResponse {
        if parts.method != Method::GET && parts.method != Method::HEAD {
            let mut res = Problem::new(Reason::MethodNotAllowed, "use GET").into_response();
            res.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return with_outcome(res, Outcome::Queried);
        }
        let raw = parts
            .uri
            .path()
            .strip_prefix(&*self.prefix)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or("");
        let key = match percent_decode(raw)
            .ok_or(KeyRejection::Malformed)
            .and_then(|k| parse_key(&k))
        {
            Ok(key) => key,
            Err(r) => return crate::idempotency::key_problem(&r).into_response(),
        };
        let principal = match self.config.protection.principal.principal(parts) {
            Ok(p) => p,
            Err(r) => return principal_refused(&r).into_response(),
        };
        let scoped = ScopedKey::new(self.config.protection.scope_for(principal), key);
        let limit = self
            .config
            .engine_policy()
            .unwrap_or(self.engine.policy())
            .store_timeout();
        let Some(record) = read_record(self.engine.store(), &scoped, limit).await else {
            return store_unavailable(&self.config);
        };
        if wants_answer(parts.uri.query())
            && let Some(r) = &record
            && let RecordState::Completed { response, .. } = &r.state
        {
            // The stored answer exactly as a retry would get it, key echoed as sent here.
            let found = FoundKey {
                key: scoped.key.clone(),
                echo: HeaderValue::from_str(scoped.key.as_str())
                    .ok()
                    .map(|v| (IDEMPOTENCY_KEY, v)),
            };
            return replay(response.clone(), &found);
        }
        state_response(&scoped, record.as_ref())
    }
}

/// The JSON answer describing `record` (absent: 404), with `Retry-After` while it is in flight.
fn state_response(scoped: &ScopedKey, record: Option<&idem_core::Record>) -> StatusResponse {
    let mut body = StatusBody {
        key: scoped.key.as_str(),
        namespace: scoped.scope.namespace(),
        state: "absent",
        created_at: None,
        expires_at: None,
        lease_until: None,
        completed_at: None,
        status: None,
    };
    let mut in_flight = false;
    if let Some(r) = record {
        body.state = r.state.kind().as_str();
        body.created_at = Some(r.created_at.as_millis());
        body.expires_at = Some(r.expires_at.as_millis());
        match &r.state {
            RecordState::Processing { lease_until, .. } => {
                in_flight = true;
                body.lease_until = Some(lease_until.as_millis());
            }
            RecordState::Completed {
                response,
                completed_at,
            } => {
                body.completed_at = Some(completed_at.as_millis());
                body.status = Some(response.status);
            }
            _ => {}
        }
    }
    let json = serde_json::to_vec(&body).unwrap_or_default();
    let mut res = Response::new(ResponseBody::full(json));
    *res.status_mut() = if record.is_some() {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    };
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if in_flight {
        // Ask again shortly, as a duplicate request would be told to.
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    with_outcome(res, Outcome::Queried)
}

/// Whether the query asks for the stored answer: `answer=1` or `answer=true`.
fn wants_answer(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes())
            .any(|(k, v)| k == "answer" && matches!(&*v, "1" | "true"))
    })
}

fn store_unavailable(config: &IdempotencyConfig) -> StatusResponse {
    let res = Problem::new(
        Reason::StoreUnavailable,
        "the idempotency store failed or timed out",
    )
    .retry_after(config.protection.store_retry_after)
    .into_response();
    with_outcome(res, Outcome::StoreUnavailable)
}

/// Decodes `%XX` escapes; `None` on a broken escape (a `%` not followed by two hex digits),
/// so a mangled key is refused rather than looked up as something else.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let broken = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    (!broken).then(|| percent_encoding::percent_decode(bytes).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%2F").as_deref(), Some(&b"a b/"[..]));
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%zz"), None);
    }

    #[test]
    fn the_answer_is_asked_for_explicitly() {
        assert!(wants_answer(Some("answer=1")));
        assert!(wants_answer(Some("route=charge&answer=true")));
        assert!(!wants_answer(Some("answer=0")));
        assert!(!wants_answer(Some("answers=1")));
        assert!(!wants_answer(None));
    }
}
