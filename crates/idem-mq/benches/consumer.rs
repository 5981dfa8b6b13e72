//! Messages per second through the RabbitMQ consumer with dedup against the same consumer
//! without it, in one run: the Redis store (with the floor of any Redis dedup in between), and
//! same-transaction PostgreSQL (the inbox row and a ledger row in one transaction, against the
//! ledger row alone), at prefetch 1 and 64, over several rounds.
//!
//! ```text
//! IDEM_BENCH_ROUNDS=3 cargo bench -p idem-mq --bench consumer -- [messages per run, default 2000]
//! ```
//!
//! Needs RabbitMQ on 5672, Redis on 6379 and PostgreSQL on 5432. Every case runs the same
//! consumer loop (`RabbitConsumer`, `Processor`, acknowledgements) on a queue filled with
//! fresh message ids; only the `Work` differs:
//!
//! - `without`: runs the handler and reports it done, skipping the engine (the baseline);
//! - `floor`: a raw `SET NX PX` (the claim) and a `SET PX` (the completion) per message on
//!   the store's own connection, the least store work a Redis dedup does per message;
//! - `with`: `Handled` on the Redis store (a claim and a completion script per message,
//!   coalesced by the store's batching); the same with batching off, and with four batches
//!   in flight instead of one;
//! - PostgreSQL `without`: the ledger insert in its own transaction; `with`: `InTx`.
//!
//! Besides messages per second each row reports where the time goes: this process's CPU per
//! message (consumer, engine, client libraries), the Redis server's CPU per message, Redis
//! script calls per message (an `EVALSHA` of the batch script counts once however many
//! operations it carries) and Redis commands per message (those a script runs included). The
//! Redis figures are the server's: another client of the same server in the meantime counts
//! too.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use idem_core::key_source::KeySources;
use idem_core::{Answer, Engine, EngineError, Policy, Scope, Store, StoredResponse};
use idem_mq::rabbitmq::RabbitConsumer;
use idem_mq::{
    ConsumerConfig, Handled, HandlerError, InTx, Job, Message, Processor, RunResult, Stats, Work,
};
use idem_redis::{RedisConfig, RedisStore};
use idem_sql::PgStore;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use sqlx::{PgPool, Postgres, Transaction};

mod common;

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const REDIS: &str = "redis://127.0.0.1:6379";

/// Runs the handler and reports it as done without any claim: the consumer without dedup.
struct NoDedup<F>(F);

impl<S: Store, F> Work<S> for NoDedup<F>
where
    F: Fn(Message) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static,
{
    async fn run(&self, _: &Engine<S>, job: &Job<'_>) -> RunResult {
        match (self.0)(job.message.clone()).await {
            // `Replayed` is the answer the processor acknowledges without counting an execution.
            Ok(()) => Ok(Answer::Replayed(StoredResponse::new(0, ""))),
            Err(_) => Err(EngineError::HandlerPanicked),
        }
    }
}

/// The floor of a Redis dedup: a `SET NX PX` claim and a `SET PX` completion per message on
/// the store's own connection, no script, no fence, no record; then the no-op handler.
struct Floor(RedisStore, String);

impl Work<RedisStore> for Floor {
    async fn run(&self, _: &Engine<RedisStore>, job: &Job<'_>) -> RunResult {
        let k = format!("{}{}", self.1, job.key.key.as_str());
        let conn = self.0.connection();
        let claim = redis::cmd("SET")
            .arg(&k)
            .arg("p")
            .arg("NX")
            .arg("PX")
            .arg(60_000)
            .clone();
        conn.query(&claim).await.unwrap();
        let done = redis::cmd("SET")
            .arg(&k)
            .arg("d")
            .arg("PX")
            .arg(60_000)
            .clone();
        conn.query(&done).await.unwrap();
        Ok(Answer::Replayed(StoredResponse::new(0, "")))
    }
}

fn uid() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// A new queue holding `n` messages with fresh ids.
async fn fill(conn: &Connection, n: usize) -> String {
    let queue = format!("bench_mq_{}", uid());
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.clone(), format!("{queue}.dead")] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    for i in 0..n {
        let props = BasicProperties::default().with_message_id(format!("{queue}-{i}").into());
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            format!("order-{i}").as_bytes(),
            props,
        )
        .await
        .unwrap();
    }
    // A round trip after the publishes: the broker has them all.
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(queue.as_str().into(), passive, FieldTable::default())
        .await
        .unwrap();
    queue
}

/// This process's CPU time so far: the sum over its threads of `/proc/self/task/*/schedstat`
/// (nanoseconds on a CPU; the runtime's threads live for the whole run).
fn process_cpu() -> Duration {
    let ns: u64 = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// The Redis server's CPU time, the script calls it has run, and the commands (those run
/// inside scripts included, as `INFO commandstats` counts them), from `INFO`.
async fn redis_counters(store: &RedisStore) -> (Duration, u64, u64) {
    let cmd = redis::cmd("INFO").arg("ALL").clone();
    let info = match store.connection().query(&cmd).await {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        _ => String::new(),
    };
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let cpu = field("used_cpu_user") + field("used_cpu_sys");
    let calls = |l: &str| -> Option<(String, u64)> {
        let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
        Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
    };
    let all: Vec<(String, u64)> = info.lines().filter_map(calls).collect();
    let scripts = all
        .iter()
        .filter(|(n, _)| n == "evalsha" || n == "eval")
        .map(|(_, c)| c)
        .sum();
    let commands = all
        .iter()
        .filter(|(n, _)| n != "info")
        .map(|(_, c)| c)
        .sum();
    (Duration::from_secs_f64(cpu), scripts, commands)
}

/// One case's figures.
#[derive(Clone, Copy, Default)]
struct Run {
    per_sec: f64,
    /// This process's CPU per message, µs.
    cpu_us: f64,
    /// The Redis server's CPU per message, µs.
    redis_us: f64,
    /// Redis script calls (`EVALSHA`) per message.
    scripts: f64,
    /// Redis commands per message, those run inside scripts included.
    commands: f64,
}

/// Consumes `n` messages from a fresh queue through `processor`.
async fn drain<S: Store, W: Work<S>>(
    conn: &Arc<Connection>,
    redis: &RedisStore,
    n: usize,
    processor: Processor<S, W>,
) -> Run {
    let queue = fill(conn, n).await;
    let consumer = Arc::new(RabbitConsumer::new(processor, queue.as_str()));
    let stats = Arc::clone(consumer.processor().stats());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let c = Arc::clone(&consumer);
    let cn = Arc::clone(conn);
    let (cpu0, (rcpu0, scripts0, calls0)) = (process_cpu(), redis_counters(redis).await);
    let started = Instant::now();
    let task = tokio::spawn(async move {
        c.run(&cn, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    while Stats::get(&stats.acked) < n as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = started.elapsed();
    let (cpu1, (rcpu1, scripts1, calls1)) = (process_cpu(), redis_counters(redis).await);
    let _ = stop.send(());
    task.await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.clone(), format!("{queue}.dead")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Run {
        per_sec: n as f64 / took.as_secs_f64(),
        cpu_us: per(cpu1.saturating_sub(cpu0)),
        redis_us: per(rcpu1.saturating_sub(rcpu0)),
        scripts: scripts1.saturating_sub(scripts0) as f64 / n as f64,
        commands: calls1.saturating_sub(calls0) as f64 / n as f64,
    }
}

fn config(prefetch: u16) -> ConsumerConfig {
    ConsumerConfig {
        prefetch,
        concurrency: usize::from(prefetch),
        ..ConsumerConfig::default()
    }
}

fn noop() -> impl Fn(Message) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static
{
    |_m| Box::pin(async { Ok(()) })
}

async fn insert(
    tx: &mut Transaction<'static, Postgres>,
    ledger: &str,
    m: &Message,
) -> Result<(), HandlerError> {
    sqlx::query(&format!("INSERT INTO {ledger} (order_id) VALUES ($1)"))
        .bind(String::from_utf8_lossy(m.payload()).into_owned())
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| HandlerError::Retry(e.to_string()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `median [min–max]`.
fn spread(v: &[f64], digits: usize) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let m = median(v.to_vec());
    format!("{m:.digits$} [{lo:.digits$}–{hi:.digits$}]")
}

/// Prints one case: messages per second and the ratio to the baseline per round, then the
/// per-message costs (medians).
fn report(label: &str, runs: &[Run], base: &[Run]) {
    let ratios: Vec<f64> = runs
        .iter()
        .zip(base)
        .map(|(r, b)| r.per_sec / b.per_sec)
        .collect();
    let col = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    println!(
        "{label:<40} msg/s {:<22} ratio {:<17} cpu/msg µs {:>6.1}  redis: cpu/msg µs {:>5.1}, scripts/msg {:>4.2}, cmds/msg {:>5.2}",
        spread(&col(|r| r.per_sec), 0),
        spread(&ratios, 2),
        median(col(|r| r.cpu_us)),
        median(col(|r| r.redis_us)),
        median(col(|r| r.scripts)),
        median(col(|r| r.commands)),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (n, rounds) = common::messages_and_rounds();
    let rounds = rounds.max(1);
    let conn = Arc::new(
        Connection::connect(AMQP, ConnectionProperties::default())
            .await
            .unwrap(),
    );
    let pool = PgPool::connect(PG).await.unwrap();
    let ledger = format!("bench_ledger_{}", uid());
    sqlx::query(&format!(
        "CREATE TABLE {ledger} (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let records = format!("bench_inbox_{}", uid());
    let pg_store = PgStore::with_table(pool.clone(), &records).unwrap();
    pg_store.migrate().await.unwrap();
    let pg_engine = Engine::new(pg_store, Policy::default());
    let prefix = format!("bench_mq_{}:", uid());
    let store = RedisStore::connect(
        RedisConfig::from_url(REDIS)
            .unwrap()
            .prefix(prefix.clone())
            .unwrap(),
    )
    .await
    .unwrap();
    let redis = Engine::new(store.clone(), Policy::default());
    // The same store with its claim and completion batching off (each operation its own
    // script call, pipelined on the connection), and with four batches in flight.
    let variant = |config: RedisConfig| async {
        let s = RedisStore::connect(config.prefix(prefix.clone()).unwrap())
            .await
            .unwrap();
        Engine::new(s, Policy::default())
    };
    let unbatched = variant(RedisConfig::from_url(REDIS).unwrap().batching(false)).await;
    let four = variant(
        RedisConfig::from_url(REDIS)
            .unwrap()
            .batches_in_flight(4)
            .unwrap(),
    )
    .await;
    let keys = KeySources::parse(&["header:message-id"]).unwrap();
    let scope = Scope::new("bench.consumer").unwrap();

    println!(
        "{n} messages per run, {rounds} rounds; medians [min–max]; ratio = case ÷ without, same round"
    );
    for prefetch in [1u16, 64] {
        let (mut base, mut floor, mut with) = (Vec::new(), Vec::new(), Vec::new());
        let (mut with_unbatched, mut with_four) = (Vec::new(), Vec::new());
        let (mut pg_base, mut pg_with) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            macro_rules! case {
                ($engine:expr, $work:expr) => {
                    drain(
                        &conn,
                        &store,
                        n,
                        Processor::new(
                            $engine,
                            scope.clone(),
                            keys.clone(),
                            config(prefetch),
                            $work,
                        ),
                    )
                    .await
                };
            }
            base.push(case!(redis.clone(), NoDedup(noop())));
            let floor_prefix = format!("{prefix}floor:");
            floor.push(case!(redis.clone(), Floor(store.clone(), floor_prefix)));
            with.push(case!(redis.clone(), Handled(noop())));
            with_unbatched.push(case!(unbatched.clone(), Handled(noop())));
            with_four.push(case!(four.clone(), Handled(noop())));

            // Same-transaction PostgreSQL: the ledger insert alone, against it with the inbox.
            let (l, p) = (ledger.clone(), pool.clone());
            let plain = NoDedup(move |m: Message| {
                let (l, p) = (l.clone(), p.clone());
                Box::pin(async move {
                    let mut tx = p
                        .begin()
                        .await
                        .map_err(|e| HandlerError::Retry(e.to_string()))?;
                    insert(&mut tx, &l, &m).await?;
                    tx.commit()
                        .await
                        .map_err(|e| HandlerError::Retry(e.to_string()))
                }) as BoxFuture<'static, _>
            });
            pg_base.push(case!(pg_engine.clone(), plain));
            let l = ledger.clone();
            let in_tx = InTx::new(
                move |tx: &mut Transaction<'static, Postgres>, m: &Message| {
                    let l = l.clone();
                    let fut: BoxFuture<'_, _> = Box::pin(async move { insert(tx, &l, m).await });
                    fut
                },
            );
            pg_with.push(case!(pg_engine.clone(), in_tx));
        }
        println!("prefetch {prefetch}:");
        report("  redis without (baseline)", &base, &base);
        report("  redis floor (SET NX + SET)", &floor, &base);
        report("  redis with dedup", &with, &base);
        report("  redis with dedup, batching off", &with_unbatched, &base);
        report("  redis with dedup, 4 batches in flight", &with_four, &base);
        report("  postgres without", &pg_base, &pg_base);
        report("  postgres with (same tx)", &pg_with, &pg_base);
    }
    for t in [&ledger, &records] {
        let _ = sqlx::query(&format!("DROP TABLE {t}")).execute(&pool).await;
    }
}
