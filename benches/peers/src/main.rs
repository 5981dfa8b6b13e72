//! idem beside the published `idempotent` crate (0.3.0 and 2.0.0), in memory and on one Redis,
//! in one harness with the same knobs: the bench every performance claim against a peer in
//! docs/BENCHMARKS.md comes from.
//!
//! ```text
//! scripts/bench-peers.sh                   # builds in release (--ignore-rust-version) and runs
//! PEERS_SECS=3 PEERS_ROUNDS=5 scripts/bench-peers.sh --csv > peers.csv
//! ```
//!
//! Knobs (environment):
//! - `PEERS_SECS` (default 3): seconds per measurement;
//! - `PEERS_ROUNDS` (default 5): rounds; every line is measured once per round;
//! - `PEERS_TASKS` (default `"1 64"`): concurrent tasks, one measurement set per level;
//! - `PEERS_STORES` (default `"memory redis"`): which backends;
//! - `PEERS_IMPLS` (default: all): which implementations to measure, by name (`floor`,
//!   `idempotent03`, `idempotent2`, `idem`), for profiling one of them; the ratios need idem
//!   and a peer;
//! - `PEERS_COMMANDSTATS=1`: after each Redis measurement, print the server's `INFO
//!   commandstats` for it (calls and µs per call of each command) to stderr;
//! - `PEERS_REDIS_URL` (default: none): a Redis to use, e.g. `redis://127.0.0.1:6379/13`;
//!   without it the bench starts its own `redis-server` on a spare loopback port (no
//!   persistence) and stops it at the end. On a given server, every key the run writes starts
//!   with `peers<pid>` and is deleted at the end.
//!
//! Flags: `--csv` prints every sample as CSV instead of the Markdown tables.
//!
//! What is measured: in every round, for each concurrency, backend and row, each
//! implementation in turn, the order rotating by one each round so that drift on a shared
//! machine hits all alike. One measurement is N tokio tasks (a 2-worker runtime) each calling
//! one operation in a loop for S seconds:
//! - `first request`: one call on a fresh key: claim, a trivial handler, complete;
//! - `replay`: the same call on one of 1 000 keys completed (untimed) just before.
//!
//! Implementations, each through its ordinary API (see `subjects.rs`): `idem`
//! (`Engine::run` over `MemoryStore` / `RedisStore`), `idempotent 2.0.0`
//! (`claim(..).fingerprint(..).execute_or_replay(..)` over its `MemoryStore` / `ValkeyStore`),
//! `idempotent 0.3.0` (`try_insert`, handler, `complete` over its `MemoryStore` /
//! `ValkeyStore`), and `floor`: the least the contract needs with no library (an
//! insert-if-absent under a `Mutex<HashMap>`; on Redis `SET NX GET PX` then `SET PX`).
//! Memory stores are made fresh for each measurement; each Redis implementation keeps one
//! redis-rs `ConnectionManager` for the whole run.
//!
//! The report: per-round rates, medians with their [min–max] over the rounds, and two ratios
//! taken within each round, then their median and range: idem ÷ the better peer of that round,
//! and idem ÷ floor. Then the CPU per operation of this process (and of the bench's own
//! redis-server).

mod harness;
mod server;
mod subjects;

use std::time::Duration;

use harness::Sample;
use subjects::{Backend, Impl, RedisSubjects, Row};

fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match env_text(name) {
        Some(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        None => default,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(other) = args.iter().find(|a| *a != "--csv") {
        eprintln!(
            "usage: idem-peers-bench [--csv] (knobs: PEERS_SECS, PEERS_ROUNDS, PEERS_TASKS, PEERS_STORES, PEERS_REDIS_URL; see src/main.rs); got {other:?}"
        );
        std::process::exit(2);
    }
    let csv = !args.is_empty();
    let secs = Duration::from_secs_f64(env_number("PEERS_SECS", 3.0));
    let rounds = env_number("PEERS_ROUNDS", 5usize).max(1);
    let levels: Vec<usize> = env_text("PEERS_TASKS")
        .unwrap_or_else(|| "1 64".to_owned())
        .split_whitespace()
        .map(|c| c.parse().expect("PEERS_TASKS: numbers separated by spaces"))
        .collect();
    let backends: Vec<Backend> = env_text("PEERS_STORES")
        .unwrap_or_else(|| "memory redis".to_owned())
        .split_whitespace()
        .map(|s| match s {
            "memory" => Backend::Memory,
            "redis" => Backend::Redis,
            other => panic!("PEERS_STORES: {other:?} is neither memory nor redis"),
        })
        .collect();

    let impls: Vec<Impl> = match env_text("PEERS_IMPLS") {
        None => Impl::ALL.to_vec(),
        Some(list) => list
            .split_whitespace()
            .map(|s| match s {
                "floor" => Impl::Floor,
                "idempotent03" => Impl::V03,
                "idempotent2" => Impl::V2,
                "idem" => Impl::Idem,
                other => panic!("PEERS_IMPLS: unknown implementation {other:?}"),
            })
            .collect(),
    };
    let commandstats = env_text("PEERS_COMMANDSTATS").as_deref() == Some("1");

    let wants_redis = backends.contains(&Backend::Redis);
    let given_url = env_text("PEERS_REDIS_URL");
    let private = (wants_redis && given_url.is_none()).then(server::Server::start);
    let url = match (&given_url, &private) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => format!("redis://127.0.0.1:{}", server.port),
        (None, None) => String::new(),
    };
    let prefix = format!("peers{}", std::process::id());
    let redis = if wants_redis {
        Some(RedisSubjects::connect(&url, &prefix).await)
    } else {
        None
    };
    let server_pid = private.as_ref().map(server::Server::pid);
    eprintln!(
        "peers bench: {rounds} rounds of {:.1} s, tasks {levels:?}, stores {:?}, redis {}",
        secs.as_secs_f64(),
        backends.iter().map(|b| b.label()).collect::<Vec<_>>(),
        match (&given_url, &private) {
            (Some(url), _) => url.clone(),
            (None, Some(s)) => format!("private redis-server on port {}", s.port),
            (None, None) => "not used".to_owned(),
        }
    );

    let mut samples = Vec::new();
    for round in 1..=rounds {
        for &tasks in &levels {
            for &backend in &backends {
                for row in Row::ALL {
                    for k in 0..impls.len() {
                        let which = impls[(k + round - 1) % impls.len()];
                        let tag = format!("r{round}c{tasks}");
                        let tasks_before = tokio::runtime::Handle::current()
                            .metrics()
                            .num_alive_tasks();
                        let op = subjects::prepare(which, backend, row, redis.as_ref(), tag).await;
                        let server = (backend == Backend::Redis).then_some(server_pid).flatten();
                        let stats = match &redis {
                            Some(r) if commandstats && backend == Backend::Redis => Some(r),
                            _ => None,
                        };
                        if let Some(r) = stats {
                            r.reset_stats().await;
                        }
                        let (rate, client_cpu_us, server_cpu_us) =
                            harness::measure(tasks, secs, op, server).await;
                        if let Some(r) = stats {
                            eprintln!(
                                "commandstats of {} {} c={tasks}:\n{}",
                                which.label(),
                                row.label(),
                                r.stats().await
                            );
                        }
                        let settled = harness::settle(tasks_before).await;
                        eprintln!(
                            "round {round}/{rounds} {} {} c={tasks} {}: {rate:.0}/s, CPU {client_cpu_us:.1} µs/op{}; settled in {} ms",
                            backend.label(),
                            row.label(),
                            which.label(),
                            server_cpu_us
                                .map_or(String::new(), |s| format!(", server {s:.1} µs/op")),
                            settled.as_millis(),
                        );
                        samples.push(Sample {
                            backend,
                            row,
                            tasks,
                            round,
                            which,
                            rate,
                            client_cpu_us,
                            server_cpu_us,
                        });
                    }
                }
            }
        }
    }

    if csv {
        harness::print_csv(&samples);
    } else {
        harness::print_tables(&samples, &backends, &levels);
    }
    if let (Some(redis), None) = (&redis, &private) {
        let removed = redis.clean_up().await;
        eprintln!("removed {removed} keys under {prefix}* from {url}");
    }
}
