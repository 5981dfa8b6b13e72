//! Probes and the Prometheus scrape on the admin listener: `/healthz` (the process answers)
//! and `/readyz` (the store answers) need no token, so an orchestrator can probe them;
//! `/metrics` takes the admin token or, if configured, the read-only metrics token, which
//! opens nothing else.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::cache::CacheStats;
use idem_core::{Key, Scope, ScopedKey, Store as _};
use metrics::{Counter, Gauge};
use metrics_exporter_prometheus::PrometheusHandle;
use subtle::ConstantTimeEq as _;

use crate::app::GatewayStore;

/// What `/metrics` serves and who may read it.
pub struct Scrape {
    handle: PrometheusHandle,
    token: Option<String>,
    cache: Option<Box<dyn Fn() -> CacheStats + Send + Sync>>,
    held: Gauge,
    hits: Counter,
    misses: Counter,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Scrape {
    /// Serves what `handle` renders, to holders of the admin token.
    pub fn new(handle: PrometheusHandle) -> Self {
        Self {
            handle,
            token: None,
            cache: None,
            held: metrics::gauge!("idem_claims_held"),
            hits: metrics::counter!("idem_cache_hits_total"),
            misses: metrics::counter!("idem_cache_misses_total"),
        }
    }

    /// Also lets `token` read `/metrics` (and nothing else).
    pub fn read_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Reports the local cache's hits and misses from `stats` at every scrape.
    pub fn cache(mut self, stats: impl Fn() -> CacheStats + Send + Sync + 'static) -> Self {
        self.cache = Some(Box::new(stats));
        self
    }

    /// The current values of what is read rather than counted, then the whole text.
    fn render(&self, held: usize) -> String {
        // A count of claims fits an f64 exactly far beyond any real number in flight.
        #[allow(clippy::cast_precision_loss)]
        self.held.set(held as f64);
        if let Some(stats) = &self.cache {
            let s = stats();
            self.hits.absolute(s.hits);
            self.misses.absolute(s.misses);
        }
        self.handle.render()
    }
}

/// The probes and the scrape.
pub struct Health {
    store: GatewayStore,
    store_timeout: Duration,
    probe: ScopedKey,
    admin_token: String,
    scrape: Option<Scrape>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    /// Probes `store`; `/metrics` serves `scrape` (404 without one) to `admin_token` and to
    /// the scrape's own read token.
    pub fn new(
        store: GatewayStore,
        store_timeout: Duration,
        admin_token: String,
        scrape: Option<Scrape>,
    ) -> Self {
        let probe = ScopedKey::new(
            Scope::new("idem.readyz").expect("a constant, valid namespace"),
            Key::new("probe").expect("a constant, valid key"),
        );
        Self {
            store,
            store_timeout,
            probe,
            admin_token,
            scrape,
        }
    }

    /// `/healthz`, `/readyz` and `/metrics`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", get(|| async { text(StatusCode::OK, "ok\n") }))
            .route("/readyz", get(ready))
            .route("/metrics", get(metrics))
            .with_state(self)
    }

    fn may_scrape(&self, headers: &HeaderMap) -> bool {
        bearer_is(headers, &self.admin_token)
            || self
                .scrape
                .as_ref()
                .and_then(|s| s.token.as_deref())
                .is_some_and(|t| bearer_is(headers, t))
    }
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub fn bearer_is(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && bool::from(given.trim().as_bytes().ct_eq(token.as_bytes()))
}

/// 401 with the challenge a client needs to know which token to send.
pub fn unauthorized() -> Response {
    let mut res = json_error(
        StatusCode::UNAUTHORIZED,
        "a valid `Authorization: Bearer <token>` header is required",
    );
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"idem-admin\""),
    );
    res
}

async fn ready(State(health): State<Arc<Health>>) -> Response {
    match tokio::time::timeout(health.store_timeout, health.store.get(&health.probe)).await {
        Ok(Ok(_)) => text(StatusCode::OK, "ready\n"),
        Ok(Err(e)) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("store unavailable: {e}\n"),
        ),
        Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "store timed out\n"),
    }
}

async fn metrics(State(health): State<Arc<Health>>, headers: HeaderMap) -> Response {
    if !health.may_scrape(&headers) {
        return unauthorized();
    }
    match &health.scrape {
        Some(scrape) => {
            let mut res = text(StatusCode::OK, &scrape.render(health.store.held()));
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            res
        }
        None => json_error(StatusCode::NOT_FOUND, "metrics are not enabled"),
    }
}

fn json_error(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({"error": detail, "status": status.as_u16()}).to_string();
    let mut res = (status, body).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn text(status: StatusCode, body: &str) -> Response {
    let mut res = (status, body.to_owned()).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}
