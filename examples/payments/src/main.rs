//! A charge endpoint protected by `idem-http` over the in-memory store.
//!
//! `POST /charges` with an `Idempotency-Key` header and `Authorization` (the principal, kept
//! hashed) charges once per key; retries get the stored response with
//! `Idempotent-Replayed: true`. `GET /idempotency/{key}` tells a caller what became of its
//! key. See README.md.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::{Engine, JsonFields, MemoryStore, Policy};
use idem_http::{CanonicalJson, HeaderPrincipal, IdempotencyConfig, IdempotencyLayer};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    amount_cents: u64,
    currency: String,
}

#[derive(Debug, Serialize)]
struct Charge {
    id: String,
    amount_cents: u64,
    currency: String,
    status: &'static str,
}

#[derive(Debug, Default)]
struct Ledger {
    next_id: AtomicU64,
}

async fn charge(
    State(ledger): State<Arc<Ledger>>,
    Json(req): Json<ChargeRequest>,
) -> impl IntoResponse {
    if req.amount_cents == 0 {
        // A deterministic client error: stored and replayed like a success.
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(serde_json::json!({ "error": "amount must be positive" })),
        )
            .into_response();
    }
    let n = ledger.next_id.fetch_add(1, Ordering::SeqCst) + 1;
    let charge = Charge {
        id: format!("ch_{n:06}"),
        amount_cents: req.amount_cents,
        currency: req.currency,
        status: "succeeded",
    };
    let location = format!("/charges/{}", charge.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(charge),
    )
        .into_response()
}

/// The application: `/charges` behind the layer, the status endpoint, a health check.
fn app(engine: &Engine<MemoryStore>) -> Result<Router, Box<dyn std::error::Error>> {
    let config = IdempotencyConfig::new("payments.charge")?
        .principal(HeaderPrincipal::new(header::AUTHORIZATION).required())
        // A client timestamp in the body must not turn a retry into a mismatch.
        .fingerprint(CanonicalJson::new().fields(JsonFields::all().exclude(["client_sent_at"])));
    let layer = IdempotencyLayer::new(engine, config);
    let status = layer.status_service("/idempotency");
    Ok(Router::new()
        .route("/charges", post(charge).layer(layer))
        .route_service("/idempotency/{key}", status)
        .route("/health", get(|| async { "ok" }))
        .with_state(Arc::new(Ledger::default())))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("PAYMENTS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()?;
    let store = MemoryStore::new(100_000);
    let _sweeper = store.spawn_sweeper(std::time::Duration::from_secs(30));
    let engine = Engine::new(store, Policy::default());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "payments example listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app(&engine)?)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn call(
        router: &Router,
        req: Request<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, bytes::Bytes) {
        let res = router.clone().oneshot(req).await.expect("infallible");
        let (parts, body) = res.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.expect("body").to_bytes(),
        )
    }

    fn charge_req(key: &str, who: &str, body: &str) -> Request<Body> {
        Request::post("/charges")
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .header("authorization", who)
            .body(Body::from(body.to_owned()))
            .expect("request")
    }

    #[tokio::test]
    async fn a_retried_charge_is_charged_once() {
        let engine = Engine::new(MemoryStore::new(100), Policy::default());
        let router = app(&engine).expect("app");
        let body = r#"{"amount_cents":1250,"currency":"EUR","client_sent_at":"12:00:00"}"#;
        let (status, _, first) = call(&router, charge_req("order-42", "Bearer alice", body)).await;
        assert_eq!(status, StatusCode::CREATED);
        let retry_body = r#"{"currency":"EUR","amount_cents":1250,"client_sent_at":"12:00:05"}"#;
        let (status, headers, again) =
            call(&router, charge_req("order-42", "Bearer alice", retry_body)).await;
        assert_eq!((status, &again), (StatusCode::CREATED, &first));
        assert_eq!(headers["idempotent-replayed"], "true");
        assert!(
            headers["location"]
                .to_str()
                .expect("ascii")
                .starts_with("/charges/ch_000001")
        );
        let (status, _, _) = call(
            &router,
            charge_req(
                "order-42",
                "Bearer alice",
                r#"{"amount_cents":99,"currency":"EUR"}"#,
            ),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        let (status, _, _) = call(
            &router,
            Request::post("/charges")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let status_req = Request::get("/idempotency/order-42")
            .header("authorization", "Bearer alice")
            .body(Body::empty())
            .expect("r");
        let (status, _, body) = call(&router, status_req).await;
        assert_eq!(status, StatusCode::OK);
        assert!(String::from_utf8_lossy(&body).contains("\"state\":\"completed\""));
    }
}
