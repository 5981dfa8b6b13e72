//! Throughput bench target: the same trivial handler with and without the layer.
//!
//! `POST /plain` (no layer), `POST /idem` (layer over `MemoryStore`), `POST /floor` (the
//! bench-only [`floor`] layer: the least any idempotency layer must do) and `POST /floor-json`
//! (the floor with idem's default canonical-JSON fingerprint). Driven by `wrk` from
//! `bench/run.sh`; see docs/BENCHMARKS.md.

mod app;
mod floor;

use std::net::SocketAddr;

use idem_core::{Engine, MemoryStore, Policy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("BENCH_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3999".into())
        .parse()?;
    // BENCH_CAPACITY bounds the store. A full memory store refuses new keys (503) rather than
    // drop a live record, so size it above the fresh keys a run sends.
    let capacity = match std::env::var("BENCH_CAPACITY") {
        Ok(v) => v.parse()?,
        Err(_) => 4_000_000,
    };
    let engine = Engine::new(MemoryStore::new(capacity), Policy::default());
    let app = app::router(&engine)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("bench server on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
