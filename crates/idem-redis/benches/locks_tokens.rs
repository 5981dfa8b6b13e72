//! Throughput of the lease lock and the one-time tokens against the raw Redis commands they
//! stand for, measured in one run on one private `redis-server`, at concurrency 64 (tasks
//! sharing one multiplexed connection, as the lock and token stores do).
//!
//! `cargo bench -p idem-redis --bench locks_tokens` (`IDEM_BENCH_SECS`, default 2 s per
//! measurement; `IDEM_BENCH_ROUNDS`, default 3). Each round measures every row once, and each
//! ratio is taken within a round; prints one line per round and the medians.
//!
//! - lock pair: `RedisLock::try_acquire` + `RedisLock::release` (two scripts, the first also
//!   handing out a fence) vs raw `SET key v NX PX 10000` + `DEL key`;
//! - token pair: `TokenStore::issue` + `TokenStore::consume` (two scripts) vs raw
//!   `SET key v PX 60000` + `GETDEL key` on a fresh key.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::Scope;
use idem_core::token::{ConsumeOutcome, IssueRequest, TokenStore};
use idem_redis::{RedisConfig, RedisLock, RedisTokens};

const CONCURRENCY: usize = 64;

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
    let dir = std::env::temp_dir().join(format!("idem-lock-bench-{port}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let give_up = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < give_up, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Server { child, port, dir }
}

/// Server time per operation pair since the last reset, in µs: the sum of `usec=` over
/// `INFO commandstats`, divided by `ops`.
async fn server_us(c: &mut redis::aio::MultiplexedConnection, ops: f64) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap_or_default();
    let usec: f64 = info
        .lines()
        .filter(|l| !l.starts_with("cmdstat_info") && !l.starts_with("cmdstat_config"))
        .filter_map(|l| {
            l.split(",usec=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum();
    usec / ops.max(1.0)
}

/// Runs `op(worker, i)` in [`CONCURRENCY`] tasks for `secs`; operations per second, and
/// the server's µs per operation (from `INFO commandstats`).
async fn measure<F, Fut>(
    stats: &mut redis::aio::MultiplexedConnection,
    secs: Duration,
    op: F,
) -> (f64, f64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(stats)
        .await
        .expect("CONFIG RESETSTAT");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|w| {
            let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
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
    let rate = ops / started.elapsed().as_secs_f64();
    (rate, server_us(stats, ops).await)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let secs = Duration::from_secs_f64(
        std::env::var("IDEM_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let rounds: usize = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let server = start_server();
    let url = format!("redis://127.0.0.1:{}", server.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let config = RedisConfig::from_url(&url)
            .and_then(|c| c.prefix("bench:"))
            .and_then(|c| c.op_timeout(Duration::from_secs(2)))
            .expect("config");
        let lock = RedisLock::connect(config.clone(), Duration::from_secs(10))
            .await
            .expect("lock");
        let tokens = RedisTokens::connect(config).await.expect("tokens");
        let raw = redis::Client::open(url.as_str())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        let mut stats = raw.clone();
        let names: Arc<Vec<String>> = Arc::new((0..CONCURRENCY).map(|w| format!("w{w}")).collect());
        let scope = Scope::new("bench.tokens").expect("scope");
        let (mut lock_r, mut token_r) = (Vec::new(), Vec::new());
        println!("| round | raw SET NX PX + DEL /s (server µs) | lock acquire + release /s (server µs) | ratio | raw SET + GETDEL /s (server µs) | token issue + consume /s (server µs) | ratio |");
        println!("|---|---|---|---|---|---|---|");
        for round in 1..=rounds {
            let c = raw.clone();
            let raw_lock = measure(&mut stats, secs, move |w, _| {
                let mut c = c.clone();
                async move {
                    let key = format!("raw:lock:{{w{w}}}");
                    let _: Option<String> = redis::cmd("SET").arg(&key).arg("owner|1").arg("NX").arg("PX").arg(10_000)
                        .query_async(&mut c).await.expect("SET NX PX");
                    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut c).await.expect("DEL");
                }
            })
            .await;
            let (l, n) = (lock.clone(), names.clone());
            let ours_lock = measure(&mut stats, secs, move |w, _| {
                let (l, n) = (l.clone(), n.clone());
                async move {
                    let held = l.try_acquire(&n[w]).await.expect("acquire");
                    assert!(l.release(held).await.expect("release"));
                }
            })
            .await;
            let c = raw.clone();
            let raw_token = measure(&mut stats, secs, move |w, i| {
                let mut c = c.clone();
                async move {
                    let key = format!("raw:tok:{{{w}:{i}}}");
                    let _: () = redis::cmd("SET").arg(&key).arg("L|1767225600000|0|0|").arg("PX").arg(60_000)
                        .query_async(&mut c).await.expect("SET");
                    let _: Option<Vec<u8>> = redis::cmd("GETDEL").arg(&key).query_async(&mut c).await.expect("GETDEL");
                }
            })
            .await;
            let (t, s) = (tokens.clone(), scope.clone());
            let ours_token = measure(&mut stats, secs, move |_, _| {
                let (t, s) = (t.clone(), s.clone());
                async move {
                    let req = IssueRequest::new(s.clone(), Duration::from_secs(60)).expect("req");
                    let issued = t.issue(&req).await.expect("issue");
                    let out = t.consume(&s, &issued.token, None).await.expect("consume");
                    assert!(matches!(out, ConsumeOutcome::Consumed { .. }));
                }
            })
            .await;
            let ((raw_lock, raw_lock_us), (ours_lock, ours_lock_us)) = (raw_lock, ours_lock);
            let ((raw_token, raw_token_us), (ours_token, ours_token_us)) = (raw_token, ours_token);
            lock_r.push((raw_lock, ours_lock));
            token_r.push((raw_token, ours_token));
            println!(
                "| {round} | {raw_lock:.0} ({raw_lock_us:.1}) | {ours_lock:.0} ({ours_lock_us:.1}) | {:.2} | {raw_token:.0} ({raw_token_us:.1}) | {ours_token:.0} ({ours_token_us:.1}) | {:.2} |",
                ours_lock / raw_lock,
                ours_token / raw_token
            );
        }
        let ratios = |r: &[(f64, f64)]| r.iter().map(|(a, b)| b / a).collect::<Vec<_>>();
        let (lr, tr) = (ratios(&lock_r), ratios(&token_r));
        println!(
            "\nmedians at c={CONCURRENCY}: lock {:.2} [{:.2}-{:.2}] ({:.0}/s vs raw {:.0}/s); token {:.2} [{:.2}-{:.2}] ({:.0}/s vs raw {:.0}/s)",
            median(lr.clone()),
            lr.iter().copied().fold(f64::MAX, f64::min),
            lr.iter().copied().fold(0.0, f64::max),
            median(lock_r.iter().map(|r| r.1).collect()),
            median(lock_r.iter().map(|r| r.0).collect()),
            median(tr.clone()),
            tr.iter().copied().fold(f64::MAX, f64::min),
            tr.iter().copied().fold(0.0, f64::max),
            median(token_r.iter().map(|r| r.1).collect()),
            median(token_r.iter().map(|r| r.0).collect()),
        );
    });
    drop(server);
}
