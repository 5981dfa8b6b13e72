//! Throughput of the engine over `RedisStore`, against a raw `SET NX PX` baseline, measured in
//! one run on one private `redis-server`.
//!
//! `cargo bench -p idem-redis --bench store` (set `IDEM_BENCH_SECS` to change the 2 s per
//! measurement, `IDEM_BENCH_ROUNDS` the 3 rounds). Every row is measured once per round, so
//! drift on a shared machine hits the baseline and the store alike; ratios are taken within a
//! round. Prints Markdown tables for docs/BENCHMARKS.md: every round, then the medians with
//! the range of the per-round ratios.
//!
//! Rows, each at concurrency 1 and 64 (tasks sharing one multiplexed connection, as the store
//! does):
//! - `raw SET NX PX`: a redis-rs loop of `SET key v NX PX 60000` on fresh keys (the baseline);
//! - `redis-benchmark SET NX PX`: the same command from redis-benchmark (`-c` connections,
//!   `-P 1`), for reference;
//! - `first request`: `Engine::run` on fresh keys: claim + complete (two scripts);
//! - `replay`: `Engine::run` on completed keys: one claim script that finds the response.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::store::{ClaimOutcome, ClaimRequest};
use idem_core::store::{Completion, Hold};
use idem_core::{
    Engine, Fingerprint, Key, OwnerId, Policy, Scope, ScopedKey, Settlement, Store, StoredResponse,
    TakeoverPolicy,
};
use idem_redis::{RedisConfig, RedisStore};

use idem_testkit::redis_server::Server;

mod common;
use common::{cpu_secs, cpu_split, run_workers};

/// A private `redis-server` for the bench, its pid and port kept for [`server_stats`] and the
/// CPU readings.
fn start_server() -> Server {
    let server = Server::start(&[]);
    SERVER_PID.store(u64::from(server.pid()), Ordering::Relaxed);
    SERVER_PORT.store(u64::from(server.port), Ordering::Relaxed);
    server
}

/// Runs `op(worker, i)` in `concurrency` tasks for `secs`; returns operations per second.
async fn measure<F, Fut>(concurrency: usize, secs: Duration, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    server_stats(&["CONFIG", "RESETSTAT"]);
    let started = Instant::now();
    let (me, server) = (
        std::process::id(),
        SERVER_PID.load(Ordering::Relaxed) as u32,
    );
    let (me0, server0) = (cpu_split(me), cpu_secs(server));
    let ops = run_workers(concurrency, secs, op).await as f64;
    let me1 = cpu_split(me);
    eprintln!(
        "  c={concurrency}: {ops} ops; CPU per op: client {:.1} µs (user {:.1}, system {:.1}), server {:.1} µs",
        (me1.0 + me1.1 - me0.0 - me0.1) / ops * 1e6,
        (me1.0 - me0.0) / ops * 1e6,
        (me1.1 - me0.1) / ops * 1e6,
        (cpu_secs(server) - server0) / ops * 1e6
    );
    // Time the server spent executing commands (scripts included), per operation and per
    // call: the rest of its CPU is reading requests and writing replies.
    let stats = server_stats(&["INFO", "commandstats"]);
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        let field = |name: &str| {
            line.split([':', ','])
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (calls, usec) = (field("calls="), field("usec="));
        if calls > 0.0 && !line.starts_with("cmdstat_config") {
            eprintln!(
                "    {}: {calls} calls, {:.2} ops per call, {:.2} µs per op",
                line.split(':').next().unwrap_or(""),
                ops / calls,
                usec / ops
            );
        }
    }
    ops / started.elapsed().as_secs_f64()
}

static SERVER_PID: AtomicU64 = AtomicU64::new(0);
static SERVER_PORT: AtomicU64 = AtomicU64::new(0);

/// `redis-cli` against the bench's server; its output.
fn server_stats(args: &[&str]) -> String {
    let port = SERVER_PORT.load(Ordering::Relaxed).to_string();
    Command::new("redis-cli")
        .args(["-p", &port])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn redis_benchmark(port: u16, clients: usize, requests: u64) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            &clients.to_string(),
            "-n",
            &requests.to_string(),
            "-P",
            "1",
            "-r",
            "100000000",
            "-q",
        ])
        .args(["SET", "rb:__rand_int__", "v", "NX", "PX", "60000"])
        .output()
        .expect("redis-benchmark");
    // "SET rb:__rand_int__ v NX PX 60000: 41152.26 requests per second, p50=..."
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit(':')
        .find_map(|part| {
            part.split_whitespace()
                .next()
                .and_then(|n| n.parse::<f64>().ok())
                .filter(|_| part.contains("requests per second"))
        })
        .unwrap_or_else(|| panic!("cannot parse redis-benchmark output: {text}"))
}

fn claim_request(key: ScopedKey, fingerprint: Fingerprint) -> ClaimRequest {
    ClaimRequest {
        key,
        fingerprint,
        owner: OwnerId::random(),
        lease: Duration::from_secs(45),
        ttl: Duration::from_secs(300),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

fn key(ns: &str, w: usize, i: u64) -> ScopedKey {
    ScopedKey::new(
        Scope::new(ns).expect("ns"),
        Key::new(format!("k-{w}-{i}")).expect("key"),
    )
}

/// What one round measures, all at one concurrency.
struct RoundResult {
    c: usize,
    round: usize,
    raw: f64,
    redis_benchmark: f64,
    first: f64,
    replay: f64,
    store_first: f64,
    store_replay: f64,
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// "median (min–max)" of per-round ratios.
fn summary(ratios: &[f64]) -> String {
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("**{:.2}** ({lo:.2}–{hi:.2})", median(ratios))
}

/// The parts every measurement uses.
struct Bench {
    engine: Engine<RedisStore>,
    store: RedisStore,
    fp: Fingerprint,
    body: StoredResponse,
    secs: Duration,
    port: u16,
}

impl Bench {
    /// The replay rows replay a fixed set of 1000 keys, completed here once per level.
    async fn seed_replays(&self, c: usize) {
        let ns = format!("replay{c}");
        for i in 0..1000 {
            let body = self.body.clone();
            self.engine
                .run(&key(&ns, 0, i), &self.fp, |_| async move {
                    Settlement::complete((), body)
                })
                .await
                .expect("seed");
        }
    }

    /// Every row once at concurrency `c`. Keys written in this round are new to the server
    /// (their names carry the round), so first requests and raw `SET NX` never meet old keys.
    async fn round(&self, c: usize, round: usize) -> RoundResult {
        let (secs, fp) = (self.secs, self.fp);
        eprintln!("raw SET NX PX");
        let raw = {
            let conn = self.store.connection().clone();
            measure(c, secs, move |w, i| {
                let conn = conn.clone();
                async move {
                    let cmd = redis::cmd("SET")
                        .arg(format!("raw:{c}:{round}:{w}:{i}"))
                        .arg("v")
                        .arg("NX")
                        .arg("PX")
                        .arg(60_000)
                        .clone();
                    conn.query(&cmd).await.expect("SET");
                }
            })
            .await
        };
        let redis_benchmark = redis_benchmark(self.port, c, if c == 1 { 50_000 } else { 200_000 });
        eprintln!("first request");
        let first = {
            let (engine, body) = (self.engine.clone(), self.body.clone());
            measure(c, secs, move |w, i| {
                let (engine, body) = (engine.clone(), body.clone());
                async move {
                    let k = key(&format!("first{c}r{round}"), w, i);
                    engine
                        .run(&k, &fp, |_| async move { Settlement::complete((), body) })
                        .await
                        .expect("run");
                }
            })
            .await
        };
        eprintln!("replay");
        let replay = {
            let engine = self.engine.clone();
            measure(c, secs, move |w, i| {
                let engine = engine.clone();
                async move {
                    let k = key(&format!("replay{c}"), 0, (i * 64 + w as u64) % 1000);
                    let out = engine
                        .run(&k, &fp, |_| async {
                            Settlement::complete((), StoredResponse::default())
                        })
                        .await
                        .expect("run");
                    assert!(matches!(out, idem_core::Answer::Replayed(_)));
                }
            })
            .await
        };
        // The same two paths straight on the store, without the engine around them.
        eprintln!("store claim + complete");
        let store_first = {
            let (store, body) = (self.store.clone(), self.body.clone());
            measure(c, secs, move |w, i| {
                let (store, body) = (store.clone(), body.clone());
                async move {
                    let req = claim_request(key(&format!("direct{c}r{round}"), w, i), fp);
                    let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&req).await else {
                        panic!("claim")
                    };
                    let ttl = Duration::from_secs(300);
                    store
                        .complete(&Completion::new(Hold::of(&req.key, &lease), &body, ttl))
                        .await
                        .expect("complete");
                }
            })
            .await
        };
        eprintln!("store replay claim");
        let store_replay = {
            let store = self.store.clone();
            measure(c, secs, move |w, i| {
                let store = store.clone();
                async move {
                    let k = key(&format!("replay{c}"), 0, (i * 64 + w as u64) % 1000);
                    let out = store.claim(&claim_request(k, fp)).await.expect("claim");
                    assert!(matches!(out, ClaimOutcome::Done { .. }));
                }
            })
            .await
        };
        RoundResult {
            c,
            round,
            raw,
            redis_benchmark,
            first,
            replay,
            store_first,
            store_replay,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo test --all-targets` runs this binary without `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("idem-redis store bench: run with `cargo bench -p idem-redis --bench store`");
        return;
    }
    let secs = Duration::from_secs_f64(
        std::env::var("IDEM_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let server = start_server();
    let url = format!("redis://127.0.0.1:{}", server.port);
    // `IDEM_BENCH_BATCHING=0` turns coalescing off; `IDEM_BENCH_IN_FLIGHT=n` sets
    // `batches_in_flight`.
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
    };
    let config = RedisConfig::from_url(&url)
        .and_then(|c| c.prefix("bench:"))
        .and_then(|c| c.op_timeout(Duration::from_secs(2)))
        .and_then(|c| match env("IDEM_BENCH_IN_FLIGHT") {
            Some(n) => c.batches_in_flight(n),
            None => Ok(c),
        })
        .map(|c| c.batching(env("IDEM_BENCH_BATCHING") != Some(0)))
        .expect("config");
    eprintln!("store: {config:?}");
    let store = RedisStore::connect(config).await.expect("connect");
    let policy = Policy::builder()
        .record_ttl(Duration::from_secs(300))
        .store_timeout(Duration::from_secs(2))
        .build()
        .expect("policy");
    let engine = Engine::new(store.clone(), policy);
    let fp = Fingerprint::of_bytes(1, b"{\"amount\":100}");
    let body = StoredResponse::new(200, "{\"id\":\"ch_1\",\"status\":\"succeeded\"}")
        .with_header("content-type", "application/json");

    // `IDEM_BENCH_CONCURRENCY=64` measures one level only (for profiling).
    let levels: Vec<usize> = std::env::var("IDEM_BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or_else(|| vec![1, 64], |c| vec![c]);
    // Every row is measured once per round, the rounds one after another, so drift on a
    // shared machine hits the baseline and the store alike; ratios are taken per round.
    let rounds = env("IDEM_BENCH_ROUNDS").unwrap_or(3).max(1);
    let bench = Bench {
        engine,
        store,
        fp,
        body,
        secs,
        port: server.port,
    };
    let mut results = Vec::new();
    for &c in &levels {
        bench.seed_replays(c).await;
        for round in 1..=rounds {
            eprintln!("== c={c}, round {round} of {rounds}");
            results.push(bench.round(c, round).await);
        }
    }
    println!("Per round (ratios against the raw loop of the same round):");
    println!();
    println!(
        "| concurrency | round | raw SET NX PX (redis-rs) | redis-benchmark SET NX PX | first request | ratio | replay | ratio | store claim + complete | ratio | store claim (replay) | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} |",
            r.c,
            r.round,
            r.raw,
            r.redis_benchmark,
            r.first,
            r.first / r.raw,
            r.replay,
            r.replay / r.raw,
            r.store_first,
            r.store_first / r.raw,
            r.store_replay,
            r.store_replay / r.raw
        );
    }
    println!();
    println!("Median over the rounds (ratio: median of the per-round ratios, with their range):");
    println!();
    println!(
        "| concurrency | raw SET NX PX (redis-rs) | first request | ratio | replay | ratio | store claim + complete | ratio | store claim (replay) | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &c in &levels {
        let rows: Vec<&RoundResult> = results.iter().filter(|r| r.c == c).collect();
        let pick = |f: &dyn Fn(&RoundResult) -> f64| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
        let ratio = |f: &dyn Fn(&RoundResult) -> f64| summary(&pick(&|r| f(r) / r.raw));
        println!(
            "| {c} | {:.0} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {:.0} | {} |",
            median(&pick(&|r| r.raw)),
            median(&pick(&|r| r.first)),
            ratio(&|r| r.first),
            median(&pick(&|r| r.replay)),
            ratio(&|r| r.replay),
            median(&pick(&|r| r.store_first)),
            ratio(&|r| r.store_first),
            median(&pick(&|r| r.store_replay)),
            ratio(&|r| r.store_replay),
        );
    }
    let stats = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    for line in String::from_utf8_lossy(&stats.stdout)
        .lines()
        .filter(|l| l.starts_with("cmdstat_"))
    {
        eprintln!("  {line}");
    }
    drop(server);
}
