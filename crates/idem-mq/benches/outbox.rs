//! Messages per second through the outbox dispatcher against a plain publisher loop, in one
//! run, to the local RabbitMQ with publisher confirms, from a PostgreSQL outbox.
//!
//! ```text
//! IDEM_BENCH_ROUNDS=5 cargo bench -p idem-mq --bench outbox -- [messages per run, default 2000]
//! ```
//!
//! Needs RabbitMQ on 5672 and PostgreSQL on 5432. Each case publishes the same number of
//! messages of the same size to a fresh queue, `batch` at a time (all of a batch in flight,
//! then every confirm awaited), and reports messages per second:
//!
//! - `plain`: the publisher loop alone, messages from memory (the baseline: what publishing
//!   costs without any outbox);
//! - `floor`: the least a database outbox must add, one statement per batch that takes the
//!   batch out of the table (`DELETE … FOR UPDATE SKIP LOCKED … RETURNING`), then the plain
//!   publish: at most once, no retry, no order, no record of what was sent;
//! - `dispatcher`: idem-mq's [`Dispatcher`] rounds over an outbox filled beforehand (a claim
//!   transaction, the publishes, one mark per batch), until the outbox is drained.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use idem_core::Key;
use idem_core::outbox::OutboxMessage;
use idem_mq::outbox::{Dispatcher, DispatcherConfig, RabbitOutbox};
use idem_mq::rabbitmq::RabbitPublisher;
use idem_sql::SqlOutbox;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sqlx::{PgPool, Postgres};

mod common;

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const PAYLOAD: &str = "{\"type\":\"order-paid\",\"order_id\":\"order-000000\",\"amount\":100}";

fn unique(what: &str) -> String {
    format!("bench_outbox_{what}_{:x}", idem_core::OwnerId::random().0)
}

async fn queue(publisher: &RabbitPublisher, name: &str) {
    publisher
        .channel()
        .queue_declare(
            name.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

async fn drop_queue(publisher: &RabbitPublisher, name: &str) {
    let _ = publisher
        .channel()
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await;
}

/// Fills a fresh outbox with `n` messages to `q` (not timed).
async fn filled(pool: &PgPool, q: &str, n: usize) -> SqlOutbox<Postgres> {
    let outbox = SqlOutbox::with_table(pool.clone(), &unique("t")).unwrap();
    outbox.migrate().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..n {
        let m = OutboxMessage::with_id(Key::new(format!("m-{i}")).unwrap(), q, PAYLOAD);
        outbox.enqueue(&mut tx, &m).await.unwrap();
    }
    tx.commit().await.unwrap();
    outbox
}

async fn plain(publisher: &RabbitPublisher, n: usize, batch: usize) -> f64 {
    let q = unique("plain");
    queue(publisher, &q).await;
    let keys: Vec<Key> = (0..n)
        .map(|i| Key::new(format!("m-{i}")).unwrap())
        .collect();
    let started = Instant::now();
    for chunk in keys.chunks(batch) {
        let sends = chunk
            .iter()
            .map(|k| publisher.publish("", &q, k, PAYLOAD.as_bytes(), FieldTable::default()));
        for r in futures::future::join_all(sends).await {
            r.unwrap();
        }
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop_queue(publisher, &q).await;
    rate
}

async fn floor(publisher: &RabbitPublisher, pool: &PgPool, n: usize, batch: usize) -> f64 {
    let q = unique("floor");
    queue(publisher, &q).await;
    let outbox = filled(pool, &q, n).await;
    let take = format!(
        "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} ORDER BY seq LIMIT {batch} \
         FOR UPDATE SKIP LOCKED) RETURNING message_id, payload",
        t = outbox.table()
    );
    let started = Instant::now();
    loop {
        let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(&take).fetch_all(pool).await.unwrap();
        if rows.is_empty() {
            break;
        }
        let q = q.as_str();
        let sends = rows.iter().map(|(id, payload)| {
            let key = Key::new(id.as_str()).unwrap();
            async move {
                publisher
                    .publish("", q, &key, payload, FieldTable::default())
                    .await
            }
        });
        for r in futures::future::join_all(sends).await {
            r.unwrap();
        }
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    outbox.drop_table().await.unwrap();
    drop_queue(publisher, &q).await;
    rate
}

async fn dispatcher(publisher: &RabbitPublisher, pool: &PgPool, n: usize, batch: usize) -> f64 {
    let q = unique("dispatch");
    queue(publisher, &q).await;
    let outbox = filled(pool, &q, n).await;
    let config = DispatcherConfig {
        batch: u32::try_from(batch).unwrap(),
        ..DispatcherConfig::default()
    };
    let d = Dispatcher::new(
        outbox.clone(),
        RabbitOutbox::new(publisher.clone(), ""),
        config,
    );
    let started = Instant::now();
    let mut sent = 0;
    while sent < n as u64 {
        let round = d.round().await.unwrap();
        assert_eq!(round.retried + round.parked, 0);
        sent += round.marked;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    outbox.drop_table().await.unwrap();
    drop_queue(publisher, &q).await;
    rate
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (n, rounds) = common::messages_and_rounds();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = Connection::connect(AMQP, ConnectionProperties::default())
            .await
            .unwrap();
        let publisher = RabbitPublisher::new(&conn).await.unwrap();
        let pool = PgPool::connect(PG).await.unwrap();
        println!(
            "outbox dispatcher, {n} messages per run, {rounds} rounds (medians; ratio to plain)"
        );
        println!(
            "| batch | plain msg/s | floor msg/s (÷ plain) | dispatcher msg/s (÷ plain, ÷ floor) |"
        );
        println!("|---|---|---|---|");
        for batch in [16, 100] {
            let (mut p, mut f, mut d) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                // Alternated within each round, so drift in the machine's load hits all three.
                p.push(plain(&publisher, n, batch).await);
                f.push(floor(&publisher, &pool, n, batch).await);
                d.push(dispatcher(&publisher, &pool, n, batch).await);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let ratios =
                |a: &[f64], b: &[f64]| median(a.iter().zip(b).map(|(x, y)| x / y).collect());
            println!(
                "| {batch} | {:.0} | {:.0} ({:.2}) | {:.0} ({:.2}, {:.2}) |",
                median(p.clone()),
                median(f.clone()),
                ratios(&f, &p),
                median(d.clone()),
                ratios(&d, &p),
                ratios(&d, &f),
            );
        }
    });
}
