//! Messages per second through the RabbitMQ consumer with dedup against the same consumer
//! without it, in one run: the Redis store, and same-transaction PostgreSQL (the inbox row
//! and a ledger row in one transaction, against the ledger row alone), at prefetch 1 and 64.
//!
//! ```text
//! cargo bench -p idem-mq --bench consumer -- [messages per run, default 3000]
//! ```
//!
//! Needs RabbitMQ on 5672, Redis on 6379 and PostgreSQL on 5432. The baseline is the same
//! consumer loop (`RabbitConsumer`, `Processor`, acknowledgements) with a `Work` that runs the
//! handler and skips the engine, so the ratio is the price of the dedup alone.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use idem_core::key_source::KeySources;
use idem_core::{
    Answer, Engine, EngineError, Fingerprint, Policy, Scope, ScopedKey, Store, StoredResponse,
};
use idem_mq::rabbitmq::RabbitConsumer;
use idem_mq::{
    ConsumerConfig, Handled, HandlerError, InTx, Message, Processor, RunResult, Stats, Work,
};
use idem_redis::{RedisConfig, RedisStore};
use idem_sql::PgStore;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use sqlx::{PgPool, Postgres, Transaction};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Runs the handler and reports it as done without any claim: the consumer without dedup.
struct NoDedup<F>(F);

impl<S: Store, F> Work<S> for NoDedup<F>
where
    F: Fn(Message) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static,
{
    async fn run(&self, _: &Engine<S>, _: &ScopedKey, _: &Fingerprint, m: &Message) -> RunResult {
        match (self.0)(m.clone()).await {
            // `Replayed` is the answer the processor acknowledges without counting an execution.
            Ok(()) => Ok(Answer::Replayed(StoredResponse::new(0, ""))),
            Err(_) => Err(EngineError::HandlerPanicked),
        }
    }
}

fn uid() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

async fn fill(conn: &Connection, queue: &str, n: usize) {
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        format!("{queue}.dead").as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    for i in 0..n {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            format!("order-{i}").as_bytes(),
            props,
        )
        .await
        .unwrap();
    }
    // A round trip after the publishes: the broker has them all.
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
}

async fn drain<S: Store, W: Work<S>>(
    conn: &Arc<Connection>,
    queue: &str,
    n: usize,
    processor: Processor<S, W>,
) -> f64 {
    let consumer = Arc::new(RabbitConsumer::new(processor, queue));
    let stats = Arc::clone(consumer.processor().stats());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let c = Arc::clone(&consumer);
    let cn = Arc::clone(conn);
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
    let _ = stop.send(());
    task.await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.to_owned(), format!("{queue}.dead")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    n as f64 / took.as_secs_f64()
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3000);
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
    let keys = KeySources::parse(&["header:message-id"]).unwrap();
    let scope = Scope::new("bench.consumer").unwrap();

    println!("{n} messages per run; messages/s (ratio = with dedup / without)");
    for prefetch in [1u16, 64] {
        // Redis store.
        let q = format!("bench_mq_{}", uid());
        fill(&conn, &q, n).await;
        let redis = Engine::new(
            RedisStore::connect(
                RedisConfig::from_url("redis://127.0.0.1:6379")
                    .unwrap()
                    .prefix(format!("{q}:"))
                    .unwrap(),
            )
            .await
            .unwrap(),
            Policy::default(),
        );
        let base = drain(
            &conn,
            &q,
            n,
            Processor::new(
                redis.clone(),
                scope.clone(),
                keys.clone(),
                config(prefetch),
                NoDedup(noop()),
            ),
        )
        .await;
        let q = format!("bench_mq_{}", uid());
        fill(&conn, &q, n).await;
        let dedup = drain(
            &conn,
            &q,
            n,
            Processor::new(
                redis,
                scope.clone(),
                keys.clone(),
                config(prefetch),
                Handled(noop()),
            ),
        )
        .await;
        println!(
            "redis     prefetch {prefetch:>2}: without {base:>8.0}  with {dedup:>8.0}  ratio {:.2}",
            dedup / base
        );

        // Same-transaction PostgreSQL: the ledger insert alone, against it with the inbox.
        let q = format!("bench_mq_{}", uid());
        fill(&conn, &q, n).await;
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
        let base = drain(
            &conn,
            &q,
            n,
            Processor::new(
                pg_engine.clone(),
                scope.clone(),
                keys.clone(),
                config(prefetch),
                plain,
            ),
        )
        .await;
        let q = format!("bench_mq_{}", uid());
        fill(&conn, &q, n).await;
        let l = ledger.clone();
        let in_tx = InTx::new(
            move |tx: &mut Transaction<'static, Postgres>, m: &Message| {
                let l = l.clone();
                let fut: BoxFuture<'_, _> = Box::pin(async move { insert(tx, &l, m).await });
                fut
            },
        );
        let dedup = drain(
            &conn,
            &q,
            n,
            Processor::new(
                pg_engine.clone(),
                scope.clone(),
                keys.clone(),
                config(prefetch),
                in_tx,
            ),
        )
        .await;
        println!(
            "postgres  prefetch {prefetch:>2}: without {base:>8.0}  with {dedup:>8.0}  ratio {:.2}",
            dedup / base
        );
    }
    for t in [&ledger, &records] {
        let _ = sqlx::query(&format!("DROP TABLE {t}")).execute(&pool).await;
    }
}
