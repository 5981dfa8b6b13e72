//! In-process cost per request: the same trivial axum handler called through `oneshot`
//! with and without the layer (no sockets), interleaved in rounds so load drift hits both.
//!
//! `cargo run --release -p idem-http --example bench_inproc [requests-per-round] [rounds]`
//!
//! `UNIQUE_PATH=/floor` (or `/floor-json`) measures the bench-only floor layer
//! (`bench_server/floor.rs`) in place of idem on fresh keys; `THRASH=<bytes>` (see `drive`)
//! starts every request with cold caches.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use idem_core::{Engine, MemoryStore, Policy};
use tower::ServiceExt;

#[path = "bench_server/app.rs"]
mod app;
#[path = "bench_server/floor.rs"]
mod floor;

const BODY: &str = r#"{"amount_cents":1250,"currency":"EUR","note":"bench"}"#;

async fn drive(
    app: &Router,
    path: &str,
    key: impl Fn(usize) -> Option<String>,
    n: usize,
) -> Duration {
    // THRASH=<bytes>: writes that many bytes between requests (untimed), so each request
    // starts with cold caches, as it does in a server where the kernel and the network stack
    // run in between.
    let thrash: usize = std::env::var("THRASH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut junk = vec![0u64; thrash / 8 + 1];
    let mut spent = Duration::ZERO;
    for i in 0..n {
        for (j, w) in junk.iter_mut().enumerate().step_by(8) {
            *w = w.wrapping_add(j as u64);
        }
        std::hint::black_box(&junk);
        let t0 = Instant::now();
        let mut req = Request::post(path).header("content-type", "application/json");
        if let Some(k) = key(i) {
            req = req.header("idempotency-key", k);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from(BODY)).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(res.status(), 200);
        let _ = res.into_body().collect().await.expect("body");
        spent += t0.elapsed();
    }
    spent / n as u32
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let engine = Engine::new(MemoryStore::new(4_000_000), Policy::default());
    let app = app::router(&engine)?;
    let unique_path = std::env::var("UNIQUE_PATH").unwrap_or_else(|_| "/idem".into());
    drive(&app, "/plain", |_| None, n).await;
    if std::env::var_os("ONLY_UNIQUE").is_none() {
        drive(&app, "/idem", |_| Some("warm".into()), n).await;
    }
    println!("round plain_ns unique_ns replay_ns unique_ratio replay_ratio");
    let mut offset = 0;
    for r in 0..rounds {
        let plain = drive(&app, "/plain", |_| None, n).await;
        let unique = if std::env::var_os("ONLY_REPLAY").is_some() {
            plain
        } else {
            drive(&app, &unique_path, |i| Some(format!("u-{}", offset + i)), n).await
        };
        offset += n;
        let replay = if std::env::var_os("ONLY_UNIQUE").is_some() {
            plain
        } else {
            drive(&app, "/idem", |_| Some("warm".into()), n).await
        };
        let (p, u, rp) = (
            plain.as_nanos() as f64,
            unique.as_nanos() as f64,
            replay.as_nanos() as f64,
        );
        println!("{r} {p:.0} {u:.0} {rp:.0} {:.2} {:.2}", u / p, rp / p);
    }
    Ok(())
}
