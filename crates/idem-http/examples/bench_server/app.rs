//! The router both bench targets drive: `bench_server` over TCP and `bench_inproc` in
//! process. One trivial handler, mounted bare and behind each layer measured.

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use idem_core::{Engine, MemoryStore};
use idem_http::{IdempotencyConfig, IdempotencyLayer};

use crate::floor::FloorLayer;

/// Reads the body and answers a small JSON document.
async fn trivial(body: Bytes) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "application/json")],
        format!("{{\"ok\":true,\"len\":{}}}", body.len()),
    )
}

/// `POST /plain` (no layer), `/idem` (idem's layer over `engine`, default config), `/floor`
/// and `/floor-json` (the bench-only floor layer, see `floor.rs`).
pub(crate) fn router(engine: &Engine<MemoryStore>) -> Result<Router, Box<dyn std::error::Error>> {
    let layer = IdempotencyLayer::new(engine, IdempotencyConfig::new("bench")?);
    Ok(Router::new()
        .route("/plain", post(trivial))
        .route("/idem", post(trivial).layer(layer))
        .route("/floor", post(trivial).layer(FloorLayer::default()))
        .route(
            "/floor-json",
            post(trivial).layer(FloorLayer::canonical_json()),
        ))
}
