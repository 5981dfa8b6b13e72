//! Probes and the Prometheus scrape on the admin listener: `/healthz` (the process answers)
//! and `/readyz` (the store answers) need no token, so an orchestrator can probe them;
//! `/metrics` takes the admin token or, if configured, the read-only metrics token, which
//! opens nothing else ([`metrics_only`] serves it, with the same tokens, where there is no
//! admin listener).

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

use crate::shared::GatewayStore;

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
pub(crate) struct Health {
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
    pub(crate) fn new(
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
    pub(crate) fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", get(|| async { text(StatusCode::OK, "ok\n") }))
            .route("/readyz", get(ready))
            .route("/metrics", get(metrics))
            .with_state(self)
    }

    fn may_scrape(&self, headers: &HeaderMap) -> bool {
        may_scrape(
            headers,
            &self.admin_token,
            self.scrape.as_ref().and_then(|s| s.token.as_deref()),
        )
    }
}

/// Whether `headers` carry the admin token or the read-only metrics token.
fn may_scrape(headers: &HeaderMap, admin_token: &str, read_token: Option<&str>) -> bool {
    bearer_is(headers, admin_token) || read_token.is_some_and(|t| bearer_is(headers, t))
}

/// `/metrics` alone, for a process without an admin listener (`idem relay
/// --metrics-listen`): it takes the same tokens as the admin listener's `/metrics`, the
/// admin token or the read-only `read_token`, and answers `401` without one.
pub(crate) fn metrics_only(
    handle: PrometheusHandle,
    admin_token: String,
    read_token: Option<String>,
) -> Router {
    let tokens = Arc::new((admin_token, read_token));
    Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let (handle, tokens) = (handle.clone(), Arc::clone(&tokens));
            async move {
                if may_scrape(&headers, &tokens.0, tokens.1.as_deref()) {
                    prometheus(&handle.render())
                } else {
                    unauthorized()
                }
            }
        }),
    )
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub(crate) fn bearer_is(headers: &HeaderMap, token: &str) -> bool {
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
pub(crate) fn unauthorized() -> Response {
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

/// Readiness. Anyone may ask, so a failing store is answered with a generic reason; the
/// store's own error (addresses, driver messages) is logged, and shown to a caller with the
/// admin token.
async fn ready(State(health): State<Arc<Health>>, headers: HeaderMap) -> Response {
    match tokio::time::timeout(health.store_timeout, health.store.get(&health.probe)).await {
        Ok(Ok(_)) => text(StatusCode::OK, "ready\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness probe: store unavailable");
            let body = if bearer_is(&headers, &health.admin_token) {
                format!("store unavailable: {e}\n")
            } else {
                "store unavailable\n".to_owned()
            };
            text(StatusCode::SERVICE_UNAVAILABLE, &body)
        }
        Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "store timed out\n"),
    }
}

async fn metrics(State(health): State<Arc<Health>>, headers: HeaderMap) -> Response {
    if !health.may_scrape(&headers) {
        return unauthorized();
    }
    match &health.scrape {
        Some(scrape) => prometheus(&scrape.render(health.store.held())),
        None => json_error(StatusCode::NOT_FOUND, "metrics are not enabled"),
    }
}

fn prometheus(body: &str) -> Response {
    let mut res = text(StatusCode::OK, body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res
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

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use idem_core::{BoxStore, MemoryStore};
    use idem_testkit::doubles::{Fault, FaultyStore};
    use tower::ServiceExt as _;

    use super::*;
    use crate::claims::TrackedStore;

    async fn readyz(health: &Arc<Health>, token: Option<&str>) -> (StatusCode, String) {
        let mut req = axum::http::Request::get("/readyz");
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(axum::body::Body::empty()).expect("request");
        let res = Arc::clone(health)
            .router()
            .oneshot(req)
            .await
            .expect("answer");
        let status = res.status();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Regression: `/readyz` needs no token, and answered the store's raw error (addresses,
    /// driver messages) to anyone who asked.
    #[tokio::test]
    async fn readiness_tells_the_public_a_generic_reason() {
        let store = FaultyStore::new(MemoryStore::new(16)).with_all(Fault::Error);
        let health = Arc::new(Health::new(
            TrackedStore::new(BoxStore::new(store)),
            Duration::from_secs(1),
            "admin-token-0123456789".into(),
            None,
        ));
        let (status, public) = readyz(&health, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(public, "store unavailable\n");
        let (status, admin) = readyz(&health, Some("admin-token-0123456789")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(admin.starts_with("store unavailable: "), "{admin}");
        assert!(
            admin.len() > public.len(),
            "the admin sees the detail: {admin}"
        );
    }
}
