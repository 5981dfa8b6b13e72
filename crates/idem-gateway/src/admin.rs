//! The admin listener: records by key, stuck and unknown records, resolve and delete,
//! Prometheus metrics, health and readiness, and the dashboard. Served on its own address,
//! never on the data listener. `/healthz`, `/readyz` and the dashboard's page need no token;
//! `/metrics` takes the admin token or the read-only metrics token (see [`crate::health`]);
//! everything else requires the admin token.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers, else 503 |
//! | `GET /metrics` | Prometheus text |
//! | `GET /ui` | the dashboard (see [`crate::ui`]); its data comes from the guarded paths |
//! | `GET /admin/records?state=&older_than=&namespace=&principal=&limit=` | lists records, oldest first |
//! | `GET /admin/record?namespace=&principal=&key=` | one record |
//! | `POST /admin/record/resolve?namespace=&principal=&key=` | settles an unknown (or expired processing) record |
//! | `DELETE /admin/record?namespace=&principal=&key=` | deletes a record |
//! | `POST /admin/reload` | reloads routes, policies and certificates (as SIGHUP does) |
//! | `GET /admin/audit?namespace=&scope=&key=&state=&since=&until=&limit=` | the audit trail, newest first, with the store's audit level (and the key's record, for one key) |
//!
//! Resolves and deletes are recorded in the audit trail with the actor `admin:<name>`, where
//! `<name>` is the request's `X-Idem-Actor` header (printable ASCII, at most 64 bytes;
//! `api` without one). The name is what the caller says: every holder of the admin token may
//! use any name.
//!
//! `principal` is the stored principal (`h:…` for a header credential, the claim for JWTs);
//! `credential` instead derives it from a credential with
//! [`credential_principal`], exactly as the data plane does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_core::audit::{self, AuditEvent, AuditKind, AuditLevel, AuditQuery};
use idem_core::key::credential_principal;
use idem_core::{
    Key, ListFilter, Record, RecordState, ResolveOutcome, Scope, ScopedKey, StateKind, Store,
    Timestamp,
};
use serde_json::{Value, json};

use crate::config::Dur;
use crate::health::{self, Health, Scrape};
use crate::reload::Live;
use crate::shared::GatewayStore;
use crate::webhook::resolution;

/// The header naming who makes a change through the admin API (see the module docs).
pub const ACTOR_HEADER: &str = "x-idem-actor";

/// Largest resolve body accepted.
const MAX_RESOLVE_BODY: usize = 4 << 20;

/// What the admin API works on.
pub struct Admin {
    store: GatewayStore,
    token: String,
    health: Arc<Health>,
    store_timeout: Duration,
    live: Option<Arc<Live>>,
    audit_level: AuditLevel,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

type Params = Query<HashMap<String, String>>;

impl Admin {
    /// An admin API over `store`, guarded by `token`; `metrics` is what `/metrics` serves;
    /// `live` enables `POST /admin/reload`.
    pub fn new(
        store: GatewayStore,
        token: String,
        metrics: Option<Scrape>,
        store_timeout: Duration,
        live: Option<Arc<Live>>,
    ) -> Self {
        let health = Arc::new(Health::new(
            store.clone(),
            store_timeout,
            token.clone(),
            metrics,
        ));
        Self {
            store,
            token,
            health,
            store_timeout,
            live,
            audit_level: AuditLevel::default(),
        }
    }

    /// Says in `GET /admin/audit` answers that the store records the changes `level`
    /// names (the default level: no fresh claim or completion).
    #[must_use]
    pub fn with_audit_level(mut self, level: AuditLevel) -> Self {
        self.audit_level = level;
        self
    }

    /// The admin API as a router: health, readiness and the dashboard's page open, metrics
    /// for either token, everything else behind the admin token (an unknown path without
    /// the token answers 401, not 404).
    pub fn router(self: Arc<Self>) -> Router {
        let guarded = Router::new()
            .route("/admin/records", get(list))
            .route("/admin/record", get(get_record).delete(delete))
            .route("/admin/record/resolve", post(resolve))
            .route("/admin/reload", post(reload))
            .route("/admin/audit", get(audit_trail))
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(Arc::clone(&self), authorize));
        // The API's description is open, as `/healthz` is: it holds no data.
        let described = Router::new().route(
            "/openapi.json",
            get(|| async {
                (
                    [(http::header::CONTENT_TYPE, "application/json")],
                    crate::openapi::pretty(),
                )
            }),
        );
        Arc::clone(&self.health)
            .router()
            .merge(crate::ui::router())
            .merge(described)
            .merge(guarded.with_state(self))
    }

    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, idem_core::StoreError>>,
    ) -> Result<T, Response> {
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

async fn authorize(State(admin): State<Arc<Admin>>, req: Request, next: Next) -> Response {
    if health::bearer_is(req.headers(), &admin.token) {
        return next.run(req).await;
    }
    health::unauthorized()
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such admin endpoint; see docs/gateway.md",
    )
}

async fn reload(State(admin): State<Arc<Admin>>) -> Response {
    let Some(live) = &admin.live else {
        return error(StatusCode::NOT_FOUND, "reload is not available here");
    };
    match live.reload().await {
        Ok(summary) => {
            tracing::info!(%summary, "admin: configuration reloaded");
            json_answer(
                StatusCode::OK,
                &json!({"reloaded": true, "summary": summary}),
            )
        }
        Err(e) => {
            let reason = format!("{e:#}");
            tracing::error!(error = %reason, "admin: reload refused; the running configuration is kept");
            error(StatusCode::UNPROCESSABLE_ENTITY, &reason)
        }
    }
}

async fn list(State(admin): State<Arc<Admin>>, Query(q): Params) -> Response {
    let state = match q.get("state").map(String::as_str) {
        None | Some("" | "any") => None,
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
    let principal = match principal_param(&q) {
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
    match admin.timed(admin.store.list(&filter)).await {
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

async fn get_record(State(admin): State<Arc<Admin>>, Query(q): Params) -> Response {
    let key = match scoped_key(&q) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    match admin.timed(admin.store.get(&key)).await {
        Ok(Some(record)) => json_answer(StatusCode::OK, &record_json(&record)),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such record"),
        Err(res) => res,
    }
}

async fn delete(State(admin): State<Arc<Admin>>, headers: HeaderMap, Query(q): Params) -> Response {
    let key = match scoped_key(&q) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let actor = match actor(&headers) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let deleted = audit::acting_as(actor, || admin.timed(admin.store.delete(&key))).await;
    match deleted {
        Ok(true) => json_answer(StatusCode::OK, &json!({"deleted": true})),
        Ok(false) => error(StatusCode::NOT_FOUND, "no such record"),
        Err(res) => res,
    }
}

async fn resolve(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    Query(q): Params,
    body: Body,
) -> Response {
    let Ok(body) = axum::body::to_bytes(body, MAX_RESOLVE_BODY).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "body larger than 4 MiB");
    };
    let key = match scoped_key(&q) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let resolution = match resolution(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let fence = match expected_fence(&body) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let actor = match actor(&headers) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let resolved = audit::acting_as(actor, || {
        admin.timed(admin.store.resolve(&key, &resolution, fence))
    })
    .await;
    match resolved {
        Ok(ResolveOutcome::Resolved) => json_answer(StatusCode::OK, &json!({"resolved": true})),
        Ok(ResolveOutcome::NotFound) => error(StatusCode::NOT_FOUND, "no such record"),
        Ok(ResolveOutcome::Fenced { fence }) => error(
            StatusCode::CONFLICT,
            &format!("the record's fence is now {fence}: another attempt claimed the key since"),
        ),
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

/// Who the trail names for a change made through this request: `admin:<X-Idem-Actor>`.
fn actor(headers: &HeaderMap) -> Result<String, String> {
    match headers.get(ACTOR_HEADER) {
        None => Ok("admin:api".to_owned()),
        Some(v) => match v.to_str() {
            Ok(name)
                if !name.is_empty()
                    && name.len() <= 64
                    && name.bytes().all(|b| (0x21..=0x7e).contains(&b)) =>
            {
                Ok(format!("admin:{name}"))
            }
            _ => Err(format!(
                "`{ACTOR_HEADER}` must be 1-64 printable ASCII characters without spaces"
            )),
        },
    }
}

async fn audit_trail(State(admin): State<Arc<Admin>>, Query(q): Params) -> Response {
    let query = match audit_query(&q) {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let events = match admin.timed(admin.store.audit(&query)).await {
        Ok(events) => events,
        Err(res) => return res,
    };
    let events: Vec<Value> = events.iter().map(event_json).collect();
    let mut body = json!({ "events": events, "level": admin.audit_level.as_str() });
    // At the default level a key's trail leaves out its fresh claim and completion, which
    // its record tells: a query for one key answers the record too.
    if let Some(key) = named_key(&query) {
        body["record"] = match admin.timed(admin.store.get(&key)).await {
            Ok(record) => record.as_ref().map_or(Value::Null, record_summary),
            Err(res) => return res,
        };
    }
    json_answer(StatusCode::OK, &body)
}

/// The scoped key an audit query names by namespace and key (with its `scope`, or none).
fn named_key(q: &AuditQuery) -> Option<ScopedKey> {
    let scope = Scope::new(q.namespace.clone()?).ok()?;
    let scope = match q.scope.as_deref() {
        Some(p) if !p.is_empty() => scope.with_principal(p),
        _ => scope,
    };
    Some(ScopedKey::new(scope, Key::new(q.key.clone()?).ok()?))
}

/// What a record tells of its attempt, for an audit answer: [`record_json`] without the
/// key's names, fingerprint, owner and stored response, only the response's status.
fn record_summary(r: &Record) -> Value {
    let mut v = record_json(r);
    if let Some(fields) = v.as_object_mut() {
        let status = fields
            .remove("response")
            .and_then(|resp| resp.get("status").cloned());
        for name in ["namespace", "principal", "key", "fingerprint", "owner"] {
            fields.remove(name);
        }
        if let Some(status) = status {
            fields.insert("status".into(), status);
        }
    }
    v
}

/// The query of `GET /admin/audit`. `scope` is the stored principal (empty for keys
/// without one); `credential` instead derives it as the data plane does.
fn audit_query(q: &HashMap<String, String>) -> Result<AuditQuery, String> {
    let ms = |name: &str| -> Result<Option<Timestamp>, String> {
        q.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>()
                    .map(Timestamp)
                    .map_err(|_| format!("`{name}` must be milliseconds since the epoch"))
            })
            .transpose()
    };
    let scope = match (q.get("scope"), q.get("credential")) {
        (Some(_), Some(_)) => return Err("give `scope` or `credential`, not both".into()),
        (Some(s), None) => Some(s.clone()),
        (None, Some(c)) => Some(credential_principal(c.as_bytes())),
        (None, None) => None,
    };
    let kind = match q.get("state").map(String::as_str) {
        None | Some("" | "any") => None,
        Some(name) => Some(name.parse::<AuditKind>().map_err(|e| e.to_string())?),
    };
    let limit = match q.get("limit").map(|s| s.parse::<usize>()) {
        None => 100,
        Some(Ok(n)) => n,
        Some(Err(_)) => return Err("limit must be a number".into()),
    };
    let nonempty = |name: &str| q.get(name).filter(|v| !v.is_empty()).cloned();
    Ok(AuditQuery {
        namespace: nonempty("namespace"),
        scope,
        key: nonempty("key"),
        kind,
        since: ms("since")?,
        until: ms("until")?,
        limit,
    })
}

/// One event as the admin API answers it.
pub(crate) fn event_json(e: &AuditEvent) -> Value {
    json!({
        "at_ms": e.at.as_millis(),
        "namespace": e.namespace,
        "scope": e.scope,
        "key": e.key,
        "event": e.kind.as_str(),
        "fence": e.fence,
        "request_id": e.request_id,
        "outcome": e.outcome,
        "status": e.status,
        "instance": e.instance,
        "actor": e.actor,
    })
}

fn principal_param(q: &HashMap<String, String>) -> Result<Option<String>, String> {
    match (q.get("principal"), q.get("credential")) {
        (Some(_), Some(_)) => Err("give `principal` or `credential`, not both".into()),
        (Some(p), None) if p.is_empty() || p == "-" => Ok(None),
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(c)) => Ok(Some(credential_principal(c.as_bytes()))),
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

/// The `fence` a resolve body names, if any: the record is resolved only while it has it.
fn expected_fence(body: &[u8]) -> Result<Option<u64>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body must be JSON: {e}"))?;
    match v.get("fence") {
        None | Some(Value::Null) => Ok(None),
        Some(f) => f
            .as_u64()
            .map(Some)
            .ok_or_else(|| "`fence` must be a whole number".to_owned()),
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
                Err(_) => resp["body_hex"] = hex::encode(&response.body).into(),
            }
            v["response"] = resp;
        }
        RecordState::Unknown { since, owner } => {
            v["state"] = "unknown".into();
            v["unknown_since_ms"] = since.as_millis().into();
            // Marked on an expired lease: the holder that may still complete it.
            if let Some(owner) = owner {
                v["owner"] = owner.to_string().into();
            }
        }
        _ => v["state"] = "other".into(),
    }
    v
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    let mut res = (status, Bytes::from(body.to_string())).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn error(status: StatusCode, detail: &str) -> Response {
    json_answer(status, &json!({"error": detail, "status": status.as_u16()}))
}
