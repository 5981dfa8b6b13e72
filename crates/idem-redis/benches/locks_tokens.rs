//! Throughput of the lease lock and the one-time tokens against the raw Redis commands they
//! stand for, measured in one run on one private `redis-server`, at concurrency 64 (tasks
//! sharing one multiplexed connection, as the lock and token stores do).
//!
//! `cargo bench -p idem-redis --bench locks_tokens` (`IDEM_BENCH_SECS`, default 2 s per
//! measurement; `IDEM_BENCH_ROUNDS`, default 3). Each round measures every row once, and each
//! ratio is taken within a round; prints one line per round and the medians.
//!
//! - lock pair: `RedisLock::try_acquire` + `RedisLock::release` (a script each, the first
//!   also handing out a fence; concurrent calls share script calls) vs raw
//!   `SET key v NX PX 10000` + `DEL key`;
//! - token pair: `TokenStore::issue` + `TokenStore::consume` (a script each, shared the same
//!   way) vs raw `SET key v PX 60000` + `GETDEL key` on a fresh key.
//!
//! Each pair also has a **floor** row: the least an implementation of the same contract with
//! one script call per operation must do, through the same client stack as the lock and the
//! tokens (`script::Connection`, `EVALSHA`). Lock floor: a script holding only `SET NX PX` and `INCR` of a fence counter,
//! then a compare-and-delete script. Token floor: a plain `SET NX PX` (no expiry or payload
//! to read back), then a script holding only `SET <marker> KEEPTTL GET` (and `DEL` when
//! there was nothing), which is the least that tells a consumed token from an unknown one.
//!
//! For every row it also prints the CPU time per pair of the Redis server and of this
//! process (the client), from `/proc`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::Scope;
use idem_core::token::{ConsumeOutcome, IssueRequest, TokenStore};
use idem_redis::script::{Connection, NamedScript, Timeouts};
use idem_redis::{RedisConfig, RedisLock, RedisTokens};
use redis::Value;

const CONCURRENCY: usize = 64;

use idem_testkit::redis_server::Server;

mod common;
use common::{cpu_secs, run_workers};

/// A private `redis-server` for the bench.
fn start_server() -> Server {
    Server::start(&[])
}

/// One row's figures: pairs per second, and server and client CPU µs per pair.
#[derive(Clone, Copy)]
struct Row {
    rate: f64,
    server_us: f64,
    client_us: f64,
}

/// Runs `op(worker, i)` in [`CONCURRENCY`] tasks for `secs`.
async fn measure<F, Fut>(server_pid: &str, secs: Duration, op: F) -> Row
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (server0, client0) = (cpu_secs(server_pid), cpu_secs("self"));
    let started = Instant::now();
    let pairs = run_workers(CONCURRENCY, secs, op).await as f64;
    let per_pair = |cpu: f64| cpu * 1e6 / pairs.max(1.0);
    Row {
        rate: pairs / started.elapsed().as_secs_f64(),
        server_us: per_pair(cpu_secs(server_pid) - server0),
        client_us: per_pair(cpu_secs("self") - client0),
    }
}

/// The lock floor's acquire: the lock and a fence from a counter, nothing else.
const FLOOR_ACQUIRE: &str =
    "if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return redis.call('INCR', KEYS[2])";
/// The lock floor's release: compare-and-delete.
const FLOOR_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";
/// The token floor's consume: mark consumed and read what was there, in one command.
const FLOOR_CONSUME: &str = "local v = redis.call('SET', KEYS[1], 'C', 'KEEPTTL', 'GET')
if not v then redis.call('DEL', KEYS[1]) return 0 end
if v == 'C' then return 1 end
return v";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `median [min–max]` of `v`.
fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::MAX, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{:.2} [{lo:.2}–{hi:.2}]", median(v.to_vec()))
}

fn cell(r: Row) -> String {
    format!("{:.0} ({:.1} / {:.1})", r.rate, r.server_us, r.client_us)
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
    let server_pid = server.pid().to_string();
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
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
        };
        let floor_conn = Connection::single(&url, timeouts, None)
            .await
            .expect("floor connection");
        let floor = Arc::new((
            NamedScript::new("floor_acquire", FLOOR_ACQUIRE),
            NamedScript::new("floor_release", FLOOR_RELEASE),
            NamedScript::new("floor_consume", FLOOR_CONSUME),
        ));
        let names: Arc<Vec<String>> = Arc::new((0..CONCURRENCY).map(|w| format!("w{w}")).collect());
        let scope = Scope::new("bench.tokens").expect("scope");
        let mut rows: Vec<[Row; 6]> = Vec::new();
        println!("pairs/s (server CPU µs / client CPU µs per pair), c={CONCURRENCY}; load average {}",
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
        println!();
        println!("| round | raw SET NX PX + DEL | lock acquire + release | ratio | lock floor | ratio | raw SET + GETDEL | token issue + consume | ratio | token floor | ratio |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for round in 1..=rounds {
            let c = raw.clone();
            let raw_lock = measure(&server_pid, secs, move |w, _| {
                let mut c = c.clone();
                async move {
                    let key = format!("raw:lock:{{w{w}}}");
                    let _: Option<String> = redis::cmd("SET").arg(&key).arg("owner").arg("NX").arg("PX").arg(10_000)
                        .query_async(&mut c).await.expect("SET NX PX");
                    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut c).await.expect("DEL");
                }
            })
            .await;
            let (l, n) = (lock.clone(), names.clone());
            let ours_lock = measure(&server_pid, secs, move |w, _| {
                let (l, n) = (l.clone(), n.clone());
                async move {
                    let held = l.try_acquire(&n[w]).await.expect("acquire");
                    assert!(l.release(held).await.expect("release"));
                }
            })
            .await;
            let (c, f) = (floor_conn.clone(), floor.clone());
            let floor_lock = measure(&server_pid, secs, move |w, i| {
                let (c, f) = (c.clone(), f.clone());
                async move {
                    let key = format!("floor:lock:{{w{w}}}");
                    let fence = format!("{key}:fence");
                    let owner = format!("{w}:{i}");
                    let got = f.0.run(&c, &[key.as_bytes(), fence.as_bytes()], &[owner.as_bytes(), b"10000"]).await.expect("acquire");
                    assert!(matches!(got, Value::Int(n) if n > 0));
                    let gone = f.1.run(&c, &[key.as_bytes()], &[owner.as_bytes()]).await.expect("release");
                    assert!(matches!(gone, Value::Int(1)));
                }
            })
            .await;
            let c = raw.clone();
            let raw_token = measure(&server_pid, secs, move |w, i| {
                let mut c = c.clone();
                async move {
                    let key = format!("raw:tok:{{{round}:{w}:{i}}}");
                    let _: () = redis::cmd("SET").arg(&key).arg("L01767225600000").arg("PX").arg(60_000)
                        .query_async(&mut c).await.expect("SET");
                    let _: Option<Vec<u8>> = redis::cmd("GETDEL").arg(&key).query_async(&mut c).await.expect("GETDEL");
                }
            })
            .await;
            let (t, s) = (tokens.clone(), scope.clone());
            let ours_token = measure(&server_pid, secs, move |_, _| {
                let (t, s) = (t.clone(), s.clone());
                async move {
                    let req = IssueRequest::new(s.clone(), Duration::from_secs(60)).expect("req");
                    let issued = t.issue(&req).await.expect("issue");
                    let out = t.consume(&s, &issued.token, None).await.expect("consume");
                    assert!(matches!(out, ConsumeOutcome::Consumed { .. }));
                }
            })
            .await;
            let (c, f) = (floor_conn.clone(), floor.clone());
            let floor_token = measure(&server_pid, secs, move |w, i| {
                let (mut c, f) = (c.clone(), f.clone());
                async move {
                    let key = format!("floor:tok:{{{round}:{w}:{i}}}");
                    let set: Option<String> = redis::cmd("SET").arg(&key).arg("L01767225600000").arg("NX").arg("PX").arg(60_000)
                        .query_async(&mut c).await.expect("SET NX PX");
                    assert!(set.is_some());
                    let got = f.2.run(&c, &[key.as_bytes()], &[]).await.expect("consume");
                    assert!(matches!(got, Value::BulkString(_)));
                }
            })
            .await;
            let row = [raw_lock, ours_lock, floor_lock, raw_token, ours_token, floor_token];
            rows.push(row);
            println!(
                "| {round} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {:.2} | {} | {:.2} |",
                cell(raw_lock), cell(ours_lock), ours_lock.rate / raw_lock.rate,
                cell(floor_lock), floor_lock.rate / raw_lock.rate,
                cell(raw_token), cell(ours_token), ours_token.rate / raw_token.rate,
                cell(floor_token), floor_token.rate / raw_token.rate,
            );
        }
        let ratio = |a: usize, b: usize| rows.iter().map(|r| r[a].rate / r[b].rate).collect::<Vec<_>>();
        let rate = |a: usize| median(rows.iter().map(|r| r[a].rate).collect());
        println!();
        println!(
            "medians at c={CONCURRENCY}: lock {} ({:.0}/s vs raw {:.0}/s), lock floor {}; \
             token {} ({:.0}/s vs raw {:.0}/s), token floor {}; ours ÷ floor: lock {}, token {}",
            spread(&ratio(1, 0)), rate(1), rate(0), spread(&ratio(2, 0)),
            spread(&ratio(4, 3)), rate(4), rate(3), spread(&ratio(5, 3)),
            spread(&ratio(1, 2)), spread(&ratio(4, 5)),
        );
        println!("load average after: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    });
    drop(server);
}
