//! Throughput bench target: the same trivial handler with and without the layer.
//!
//! `POST /plain` (no layer), `POST /idem` (layer over `MemoryStore`), `POST /floor` (the
//! bench-only [`floor`] layer: the least any idempotency layer must do) and `POST /floor-json`
//! (the floor with idem's default canonical-JSON fingerprint). Driven by `wrk` from
//! `bench/run.sh`; see docs/BENCHMARKS.md.

mod floor;

use std::net::SocketAddr;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use idem_core::{Engine, MemoryStore, Policy};
use idem_http::{IdempotencyConfig, IdempotencyLayer};

async fn trivial(body: Bytes) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "application/json")],
        format!("{{\"ok\":true,\"len\":{}}}", body.len()),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("BENCH_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3999".into())
        .parse()?;
    // BENCH_CAPACITY bounds the store, to measure it at capacity (evicting) instead of growing.
    let capacity = match std::env::var("BENCH_CAPACITY") {
        Ok(v) => v.parse()?,
        Err(_) => 4_000_000,
    };
    let engine = Engine::new(MemoryStore::new(capacity), Policy::default())?;
    let layer = IdempotencyLayer::new(&engine, IdempotencyConfig::new("bench")?);
    let app = Router::new()
        .route("/plain", post(trivial))
        .route("/idem", post(trivial).layer(layer))
        .route("/floor", post(trivial).layer(floor::FloorLayer::default()))
        .route(
            "/floor-json",
            post(trivial).layer(floor::FloorLayer::canonical_json()),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("bench server on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
