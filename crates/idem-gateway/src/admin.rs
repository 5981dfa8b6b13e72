//! The admin listener: records by key, stuck and unknown records, resolve and delete,
//! Prometheus metrics, health and readiness. Served on its own address, never on the data
//! listener, and every path but `/healthz` and `/readyz` requires the bearer token.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers, else 503 |
//! | `GET /metrics` | Prometheus text |
//! | `GET /admin/records?state=&older_than=&namespace=&principal=&limit=` | lists records, oldest first |
//! | `GET /admin/record?namespace=&principal=&key=` | one record |
//! | `POST /admin/record/resolve?namespace=&principal=&key=` | settles an unknown (or expired processing) record |
//! | `DELETE /admin/record?namespace=&principal=&key=` | deletes a record |
//!
//! `principal` is the stored principal (`h:…` for hashed headers, the claim for JWTs);
//! `credential` instead hashes a header value the way the data plane does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use idem_core::{
    Key, ListFilter, Record, RecordState, Resolution, ResolveOutcome, Scope, ScopedKey, StateKind,
    Store, StoredResponse,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use crate::app::GatewayStore;
use crate::config::Dur;
use crate::principal::hash_credential;
use crate::proxy::{ResBody, full};

/// What the admin API works on.
pub struct Admin {
    store: GatewayStore,
    token: String,
    metrics: Option<PrometheusHandle>,
    store_timeout: Duration,
    probe: ScopedKey,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

type Answer = Response<ResBody>;

impl Admin {
    /// An admin API over `store`, guarded by `token`.
    pub fn new(
        store: GatewayStore,
        token: String,
        metrics: Option<PrometheusHandle>,
        store_timeout: Duration,
    ) -> Self {
        let probe = ScopedKey::new(
            Scope::new("idem.readyz").expect("a constant, valid namespace"),
            Key::new("probe").expect("a constant, valid key"),
        );
        Self {
            store,
            token,
            metrics,
            store_timeout,
            probe,
        }
    }

    /// Handles one admin request.
    pub async fn handle(&self, req: Request<Incoming>) -> Answer {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        match (&method, path.as_str()) {
            (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok\n"),
            (&Method::GET, "/readyz") => return self.ready().await,
            _ => {}
        }
        if !self.authorized(req.headers()) {
            let mut res = error(
                StatusCode::UNAUTHORIZED,
                "a valid `Authorization: Bearer <token>` header is required",
            );
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idem-admin\""),
            );
            return res;
        }
        let query = parse_query(req.uri().query().unwrap_or(""));
        match (&method, path.as_str()) {
            (&Method::GET, "/metrics") => match &self.metrics {
                Some(h) => {
                    let mut res = text(StatusCode::OK, &h.render());
                    res.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    res
                }
                None => error(StatusCode::NOT_FOUND, "metrics are not enabled"),
            },
            (&Method::GET, "/admin/records") => self.list(&query).await,
            (&Method::GET, "/admin/record") => self.get(&query).await,
            (&Method::DELETE, "/admin/record") => self.delete(&query).await,
            (&Method::POST, "/admin/record/resolve") => {
                let body = match Limited::new(req.into_body(), 4 << 20).collect().await {
                    Ok(c) => c.to_bytes(),
                    Err(_) => {
                        return error(StatusCode::PAYLOAD_TOO_LARGE, "body larger than 4 MiB");
                    }
                };
                self.resolve(&query, &body).await
            }
            _ => error(
                StatusCode::NOT_FOUND,
                "no such admin endpoint; see docs/gateway.md",
            ),
        }
    }

    fn authorized(&self, headers: &http::HeaderMap) -> bool {
        let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some((scheme, token)) = value.trim().split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer")
            && constant_time_eq(token.trim().as_bytes(), self.token.as_bytes())
    }

    async fn ready(&self) -> Answer {
        match tokio::time::timeout(self.store_timeout, self.store.get(&self.probe)).await {
            Ok(Ok(_)) => text(StatusCode::OK, "ready\n"),
            Ok(Err(e)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("store unavailable: {e}\n"),
            ),
            Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "store timed out\n"),
        }
    }

    async fn list(&self, q: &HashMap<String, String>) -> Answer {
        let state = match q.get("state").map(String::as_str) {
            None | Some("") | Some("any") => None,
            Some("processing") => Some(StateKind::Processing),
            Some("completed") => Some(StateKind::Completed),
            Some("unknown") => Some(StateKind::Unknown),
            Some(other) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("state `{other}` is not processing, completed or unknown"),
                );
            }
        };
        let older_than = match q.get("older_than").map(|s| Dur::parse(s)) {
            None => None,
            Some(Ok(d)) => Some(d.0),
            Some(Err(e)) => return error(StatusCode::BAD_REQUEST, &e),
        };
        let limit = match q.get("limit").map(|s| s.parse::<usize>()) {
            None => 100,
            Some(Ok(n)) => n,
            Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "limit must be a number"),
        };
        let principal = match principal_param(q) {
            Ok(p) => p,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e),
        };
        let filter = ListFilter {
            namespace: q.get("namespace").cloned(),
            principal,
            state,
            older_than,
            limit,
        };
        match self.timed(self.store.list(&filter)).await {
            Ok(records) => {
                let items: Vec<Value> = records.iter().map(record_json).collect();
                json_answer(
                    StatusCode::OK,
                    &json!({"count": items.len(), "records": items}),
                )
            }
            Err(res) => res,
        }
    }

    async fn get(&self, q: &HashMap<String, String>) -> Answer {
        let key = match scoped_key(q) {
            Ok(k) => k,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e),
        };
        match self.timed(self.store.get(&key)).await {
            Ok(Some(record)) => json_answer(StatusCode::OK, &record_json(&record)),
            Ok(None) => error(StatusCode::NOT_FOUND, "no such record"),
            Err(res) => res,
        }
    }

    async fn delete(&self, q: &HashMap<String, String>) -> Answer {
        let key = match scoped_key(q) {
            Ok(k) => k,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e),
        };
        match self.timed(self.store.delete(&key)).await {
            Ok(true) => json_answer(StatusCode::OK, &json!({"deleted": true})),
            Ok(false) => error(StatusCode::NOT_FOUND, "no such record"),
            Err(res) => res,
        }
    }

    async fn resolve(&self, q: &HashMap<String, String>, body: &Bytes) -> Answer {
        let key = match scoped_key(q) {
            Ok(k) => k,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e),
        };
        let resolution = match resolution(body) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, &e),
        };
        match self.timed(self.store.resolve(&key, &resolution)).await {
            Ok(ResolveOutcome::Resolved) => json_answer(StatusCode::OK, &json!({"resolved": true})),
            Ok(ResolveOutcome::NotFound) => error(StatusCode::NOT_FOUND, "no such record"),
            Ok(ResolveOutcome::NotResolvable { state }) => error(
                StatusCode::CONFLICT,
                &format!(
                    "the record is {} and cannot be resolved (only unknown records, or processing ones whose lease expired)",
                    state.as_str()
                ),
            ),
            Ok(_) => error(StatusCode::CONFLICT, "not resolvable"),
            Err(res) => res,
        }
    }

    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, idem_core::StoreError>>,
    ) -> Result<T, Answer> {
        match tokio::time::timeout(self.store_timeout * 5, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("store failed: {e}"),
            )),
            Err(_) => Err(error(StatusCode::SERVICE_UNAVAILABLE, "store timed out")),
        }
    }
}

fn principal_param(q: &HashMap<String, String>) -> Result<Option<String>, String> {
    match (q.get("principal"), q.get("credential")) {
        (Some(_), Some(_)) => Err("give `principal` or `credential`, not both".into()),
        (Some(p), None) if p.is_empty() || p == "-" => Ok(None),
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(c)) => Ok(Some(hash_credential(c.as_bytes()))),
        (None, None) => Ok(None),
    }
}

fn scoped_key(q: &HashMap<String, String>) -> Result<ScopedKey, String> {
    let ns = q.get("namespace").ok_or("`namespace` is required")?;
    let key = q.get("key").ok_or("`key` is required")?;
    let scope = Scope::new(ns.clone()).map_err(|e| e.to_string())?;
    let scope = match principal_param(q)? {
        Some(p) => scope.with_principal(p),
        None => scope,
    };
    Ok(ScopedKey::new(
        scope,
        Key::new(key.clone()).map_err(|e| e.to_string())?,
    ))
}

fn resolution(body: &[u8]) -> Result<Resolution, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body must be JSON: {e}"))?;
    match v.get("outcome").and_then(Value::as_str) {
        Some("release") => Ok(Resolution::Release),
        Some("complete") => {
            let status = v
                .get("status")
                .and_then(Value::as_u64)
                .ok_or("`status` is required to complete")?;
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (200..=599).contains(s))
                .ok_or("`status` must be 200-599")?;
            let mut response = StoredResponse::new(status, Bytes::new());
            if let Some(b) = v.get("body") {
                response.body = match b {
                    Value::String(s) => Bytes::from(s.clone()),
                    other => Bytes::from(other.to_string()),
                };
            }
            if let Some(headers) = v.get("headers") {
                let obj = headers
                    .as_object()
                    .ok_or("`headers` must be an object of strings")?;
                for (name, value) in obj {
                    let value = value.as_str().ok_or("`headers` values must be strings")?;
                    response = response
                        .with_header(name.to_ascii_lowercase(), Bytes::from(value.to_owned()));
                }
            }
            let ttl = match v.get("ttl").and_then(Value::as_str) {
                Some(t) => Dur::parse(t)?.0,
                None => Duration::from_secs(24 * 3600),
            };
            Ok(Resolution::Complete { response, ttl })
        }
        _ => Err("`outcome` must be \"complete\" or \"release\"".into()),
    }
}

fn record_json(r: &Record) -> Value {
    let mut v = json!({
        "namespace": r.key.scope.namespace(),
        "principal": r.key.scope.principal(),
        "key": r.key.key.as_str(),
        "fence": r.fence,
        "fingerprint": r.fingerprint.to_string(),
        "request_id": r.request_id,
        "created_at_ms": r.created_at.as_millis(),
        "expires_at_ms": r.expires_at.as_millis(),
    });
    match &r.state {
        RecordState::Processing { owner, lease_until } => {
            v["state"] = "processing".into();
            v["owner"] = owner.to_string().into();
            v["lease_until_ms"] = lease_until.as_millis().into();
        }
        RecordState::Completed {
            response,
            completed_at,
        } => {
            v["state"] = "completed".into();
            v["completed_at_ms"] = completed_at.as_millis().into();
            let headers: serde_json::Map<String, Value> = response
                .headers
                .iter()
                .map(|(n, val)| {
                    (
                        n.clone(),
                        Value::String(String::from_utf8_lossy(val).into_owned()),
                    )
                })
                .collect();
            let mut resp = json!({"status": response.status, "headers": headers, "body_omitted": response.body_omitted});
            match std::str::from_utf8(&response.body) {
                Ok(text) => resp["body"] = text.into(),
                Err(_) => {
                    resp["body_hex"] = response
                        .body
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                        .into()
                }
            }
            v["response"] = resp;
        }
        RecordState::Unknown { since } => {
            v["state"] = "unknown".into();
            v["unknown_since_ms"] = since.as_millis().into();
        }
        _ => v["state"] = "other".into(),
    }
    v
}

/// Decodes `a=b&c=d` with percent-escapes and `+` as space.
fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(status: StatusCode, body: &str) -> Answer {
    let mut res = Response::new(full(body.to_owned()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

fn json_answer(status: StatusCode, body: &Value) -> Answer {
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn error(status: StatusCode, detail: &str) -> Answer {
    json_answer(status, &json!({"error": detail, "status": status.as_u16()}))
}

/// Answers every request with `admin`, for hyper.
pub fn service(
    admin: Arc<Admin>,
) -> impl hyper::service::Service<Request<Incoming>, Response = Answer, Error = Infallible, Future: Send>
+ Clone {
    hyper::service::service_fn(move |req| {
        let admin = Arc::clone(&admin);
        async move { Ok::<_, Infallible>(admin.handle(req).await) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        let q =
            parse_query("namespace=pay.charge&key=order%2F42+x&principal=h%3Aab&bad=%zz&end=%4");
        assert_eq!(q["key"], "order/42 x");
        assert_eq!(q["principal"], "h:ab");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(q["end"], "%4");
    }

    #[test]
    fn resolutions_parse() {
        assert_eq!(
            resolution(br#"{"outcome":"release"}"#),
            Ok(Resolution::Release)
        );
        let r = resolution(br#"{"outcome":"complete","status":201,"headers":{"Content-Type":"application/json"},"body":"{}","ttl":"1h"}"#)
            .expect("valid");
        let Resolution::Complete { response, ttl } = r else {
            panic!("not complete")
        };
        assert_eq!((response.status, ttl), (201, Duration::from_secs(3600)));
        assert_eq!(response.headers[0].0, "content-type");
        assert!(resolution(br#"{"outcome":"complete"}"#).is_err());
        assert!(resolution(br#"{"outcome":"maybe"}"#).is_err());
        assert!(resolution(b"garbage").is_err());
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
