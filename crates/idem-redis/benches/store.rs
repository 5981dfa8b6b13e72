//! Throughput of the engine over `RedisStore`, against a raw `SET NX PX` baseline, measured in
//! one run on one private `redis-server`.
//!
//! `cargo bench -p idem-redis --bench store` (set `IDEM_BENCH_SECS` to change the 2 s per
//! measurement). Prints a Markdown table for docs/BENCHMARKS.md.
//!
//! Rows, each at concurrency 1 and 64 (tasks sharing one multiplexed connection, as the store
//! does):
//! - `raw SET NX PX`: a redis-rs loop of `SET key v NX PX 60000` on fresh keys (the baseline);
//! - `redis-benchmark SET NX PX`: the same command from redis-benchmark (`-c` connections,
//!   `-P 1`), for reference;
//! - `first request`: `Engine::run` on fresh keys: claim + complete (two scripts);
//! - `replay`: `Engine::run` on completed keys: one claim script that finds the response.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::store::{ClaimOutcome, ClaimRequest};
use idem_core::{
    Engine, Fingerprint, Key, OwnerId, Policy, Scope, ScopedKey, Settlement, Store, StoredResponse,
    TakeoverPolicy,
};
use idem_redis::{RedisConfig, RedisStore};

struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("spare port");
    let dir = std::env::temp_dir().join(format!("idem-redis-bench-{port}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    SERVER_PID.store(u64::from(child.id()), Ordering::Relaxed);
    SERVER_PORT.store(u64::from(port), Ordering::Relaxed);
    let server = Server { child, port, dir };
    let give_up = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < give_up, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

/// CPU seconds (user, system) a process has used so far, from /proc.
fn cpu_split(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 100.0
    };
    (ticks(11), ticks(12))
}

/// CPU seconds (user + system) a process has used so far, from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let (user, system) = cpu_split(pid);
    user + system
}

/// Runs `op(worker, i)` in `concurrency` tasks for `secs`; returns operations per second.
async fn measure<F, Fut>(concurrency: usize, secs: Duration, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    server_stats(&["CONFIG", "RESETSTAT"]);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let (me, server) = (
        std::process::id(),
        SERVER_PID.load(Ordering::Relaxed) as u32,
    );
    let (me0, server0) = (cpu_split(me), cpu_secs(server));
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let (op, stop, done) = (Arc::clone(&op), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    op(w, i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    let ops = done.load(Ordering::Relaxed) as f64;
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
    let engine = Engine::new(store.clone(), policy).expect("engine");
    let conn = store.connection().clone();
    let fp = Fingerprint::of_bytes(1, b"{\"amount\":100}");
    let body = StoredResponse::new(200, "{\"id\":\"ch_1\",\"status\":\"succeeded\"}")
        .with_header("content-type", "application/json");

    println!(
        "| concurrency | raw SET NX PX (redis-rs) | redis-benchmark SET NX PX | first request | ratio | replay | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut direct = Vec::new();
    // `IDEM_BENCH_CONCURRENCY=64` measures one level only (for profiling).
    let levels: Vec<usize> = std::env::var("IDEM_BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or_else(|| vec![1, 64], |c| vec![c]);
    for &c in &levels {
        eprintln!("raw SET NX PX");
        let raw = {
            let conn = conn.clone();
            measure(c, secs, move |w, i| {
                let conn = conn.clone();
                async move {
                    let cmd = redis::cmd("SET")
                        .arg(format!("raw:{c}:{w}:{i}"))
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
        let rb = redis_benchmark(server.port, c, if c == 1 { 50_000 } else { 200_000 });
        eprintln!("first request");
        let first = {
            let (engine, body) = (engine.clone(), body.clone());
            measure(c, secs, move |w, i| {
                let (engine, body) = (engine.clone(), body.clone());
                async move {
                    let k = key(&format!("first{c}"), w, i);
                    engine
                        .run(&k, &fp, |_| async move { Settlement::complete((), body) })
                        .await
                        .expect("run");
                }
            })
            .await
        };
        // Replays: a fixed set of keys completed beforehand, replayed round-robin.
        let ns = format!("replay{c}");
        for i in 0..1000 {
            let body = body.clone();
            engine
                .run(&key(&ns, 0, i), &fp, |_| async move {
                    Settlement::complete((), body)
                })
                .await
                .expect("seed");
        }
        eprintln!("replay");
        let replay = {
            let engine = engine.clone();
            measure(c, secs, move |w, i| {
                let (engine, ns) = (engine.clone(), ns.clone());
                async move {
                    let k = key(&ns, 0, (i * 64 + w as u64) % 1000);
                    let out = engine
                        .run(&k, &fp, |_| async {
                            Settlement::complete((), StoredResponse::default())
                        })
                        .await
                        .expect("run");
                    assert!(matches!(out, idem_core::Outcome::Replayed(_)));
                }
            })
            .await
        };
        // The same two paths straight on the store, without the engine around them.
        eprintln!("store claim + complete");
        let store_first = {
            let (store, body) = (store.clone(), body.clone());
            measure(c, secs, move |w, i| {
                let (store, body) = (store.clone(), body.clone());
                async move {
                    let req = claim_request(key(&format!("direct{c}"), w, i), fp);
                    let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&req).await else {
                        panic!("claim")
                    };
                    let ttl = Duration::from_secs(300);
                    store
                        .complete(&req.key, lease.owner, lease.fence, &body, ttl)
                        .await
                        .expect("complete");
                }
            })
            .await
        };
        eprintln!("store replay claim");
        let ns = format!("replay{c}");
        let store_replay = {
            let store = store.clone();
            measure(c, secs, move |w, i| {
                let (store, ns) = (store.clone(), ns.clone());
                async move {
                    let req = claim_request(key(&ns, 0, (i * 64 + w as u64) % 1000), fp);
                    let out = store.claim(&req).await.expect("claim");
                    assert!(matches!(out, ClaimOutcome::Done { .. }));
                }
            })
            .await
        };
        println!(
            "| {c} | {raw:.0} | {rb:.0} | {first:.0} | {:.2} | {replay:.0} | {:.2} |",
            first / raw,
            replay / raw
        );
        direct.push(format!(
            "| {c} | {raw:.0} | {store_first:.0} | {:.2} | {store_replay:.0} | {:.2} |",
            store_first / raw,
            store_replay / raw
        ));
    }
    println!();
    println!(
        "| concurrency | raw SET NX PX (redis-rs) | store claim + complete | ratio | store claim (replay) | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for row in direct {
        println!("{row}");
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
