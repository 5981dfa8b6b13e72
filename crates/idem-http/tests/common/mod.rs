//! A test app: axum routes behind the layer, counting handler executions.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use idem_core::{Engine, Policy, Store};
use idem_http::{HeaderPrincipal, IdempotencyConfig, IdempotencyLayer};
use tower::ServiceExt;

pub use idem_testkit::hits::Hits;

/// `/respond`: answers with the status named in the JSON body (`{"status": 201}`), a body
/// naming the execution number, the principal's header and the request body; sets
/// content-type, set-cookie, www-authenticate and x-custom.
async fn respond(State(hits): State<Arc<Hits>>, headers: HeaderMap, body: Bytes) -> Response {
    let n = hits.started.fetch_add(1, Ordering::SeqCst) + 1;
    hits.on_start.notify_waiters();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let status = v
        .get("status")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(201) as u16;
    let who = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let out = serde_json::json!({ "execution": n, "principal": who, "request": v });
    hits.finished.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::from_u16(status).expect("status"),
        [
            ("content-type", "application/json"),
            ("set-cookie", "session=secret"),
            ("www-authenticate", "Bearer"),
            ("x-custom", "not-replayed"),
        ],
        out.to_string(),
    )
        .into_response()
}

/// `/gated`: counts a start, then waits for the gate before answering 201.
async fn gated(State(hits): State<Arc<Hits>>, body: Bytes) -> Response {
    let n = hits.started.fetch_add(1, Ordering::SeqCst) + 1;
    let wait = hits.gate.notified();
    hits.on_start.notify_waiters();
    wait.await;
    hits.finished.fetch_add(1, Ordering::SeqCst);
    hits.on_finish.notify_waiters();
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"execution\":{n},\"len\":{}}}", body.len()),
    )
        .into_response()
}

/// `/panic`: the first execution panics, later ones answer 200.
async fn panics(State(hits): State<Arc<Hits>>) -> &'static str {
    let n = hits.started.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        panic!("handler blew up (test)");
    }
    "recovered"
}

/// `/big`: a 4 KiB body with a known length.
async fn big(State(hits): State<Arc<Hits>>) -> Vec<u8> {
    hits.started.fetch_add(1, Ordering::SeqCst);
    vec![b'x'; 4096]
}

/// `/sse`: an event stream without a known length.
async fn sse(State(hits): State<Arc<Hits>>) -> Response {
    let n = hits.started.fetch_add(1, Ordering::SeqCst) + 1;
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from(format!("data: {n}\n\n"))),
        Ok(Bytes::from_static(b"data: end\n\n")),
    ];
    let body = Body::from_stream(futures::stream::iter(chunks));
    (
        StatusCode::OK,
        [("content-type", "text/event-stream")],
        body,
    )
        .into_response()
}

/// Route configs used by [`app`].
pub fn config(namespace: &str) -> IdempotencyConfig {
    IdempotencyConfig::new(namespace)
        .expect("namespace")
        .principal(HeaderPrincipal::new(http::header::AUTHORIZATION))
}

/// The app over `engine`; `tweak` adjusts every route's config.
pub fn app_with<S: Store>(
    engine: &Engine<S>,
    hits: Arc<Hits>,
    tweak: impl Fn(IdempotencyConfig) -> IdempotencyConfig,
) -> Router {
    let layer = |ns: &str| IdempotencyLayer::new(engine, tweak(config(ns)));
    let waiting = Policy::builder()
        .in_flight_wait(Some(std::time::Duration::from_secs(10)))
        .build()
        .expect("policy");
    Router::new()
        .route("/respond", post(respond).layer(layer("test.respond")))
        .route(
            "/respond-optional",
            post(respond).layer(IdempotencyLayer::new(
                engine,
                tweak(config("test.opt")).key_required(false),
            )),
        )
        .route("/gated", post(gated).layer(layer("test.gated")))
        .route(
            "/gated-wait",
            post(gated).layer(IdempotencyLayer::new(
                engine,
                tweak(config("test.gated-wait")).policy(waiting),
            )),
        )
        .route("/panic", post(panics).layer(layer("test.panic")))
        .route(
            "/big",
            post(big).layer(IdempotencyLayer::new(
                engine,
                tweak(config("test.big")).max_stored_response(1024),
            )),
        )
        .route(
            "/small-body",
            post(respond).layer(IdempotencyLayer::new(
                engine,
                tweak(config("test.small")).max_request_body(64),
            )),
        )
        .route("/sse", post(sse).layer(layer("test.sse")))
        .route(
            "/plain",
            get(|| async { "plain" }).post(|| async { "plain" }),
        )
        .route_service(
            "/idempotency/{key}",
            layer("test.respond").status_service("/idempotency"),
        )
        .route_service(
            "/idempotency-gated/{key}",
            layer("test.gated").status_service("/idempotency-gated"),
        )
        .with_state(hits)
}

/// The app with default configs.
pub fn app<S: Store>(engine: &Engine<S>, hits: Arc<Hits>) -> Router {
    app_with(engine, hits, |c| c)
}

/// A POST with an optional key and principal.
pub fn post_req(path: &str, key: Option<&str>, who: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    if let Some(w) = who {
        b = b.header("authorization", w);
    }
    b.body(Body::from(body.to_owned())).expect("request")
}

/// A collected response.
#[derive(Debug, Clone)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }

    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{self:?}"
        );
        self.json()["type"].as_str().expect("type").to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

/// Sends one request through the router.
pub async fn send(router: &Router, req: Request<Body>) -> Got {
    let res = router.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends a POST of `body` to `path` with an optional key and no principal.
pub async fn send_post(router: &Router, path: &str, key: Option<&str>, body: &str) -> Got {
    send(router, post_req(path, key, None, body)).await
}
