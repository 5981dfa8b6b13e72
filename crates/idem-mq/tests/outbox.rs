//! The outbox dispatcher between a PostgreSQL outbox and the local brokers: every enqueued
//! message reaches an idem consumer and takes effect once, with several dispatchers at once,
//! and when a dispatcher dies between the publish and the mark (its rows go out again after
//! the lease). Each crash test first shows the consumer without idem's guard acting twice.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::unguarded;
use common::*;
use idem_core::outbox::{Claimed, Failure, OutboxMessage, OutboxStats, OutboxStore};
use idem_core::{Key, OwnerId, StoreError};
use idem_mq::Stats;
use idem_mq::nats::NatsPublisher;
use idem_mq::outbox::{Dispatcher, DispatcherConfig, NatsOutbox, RabbitOutbox};
use idem_mq::rabbitmq::{RabbitPublisher, default_keys};
use idem_sql::SqlOutbox;
use sqlx::{PgPool, Postgres};
use tokio::task::JoinHandle;

/// Short lease and delays so a test takes seconds.
fn quick() -> DispatcherConfig {
    DispatcherConfig {
        batch: 16,
        lease: Duration::from_secs(1),
        publish_timeout: Duration::from_millis(800),
        idle: Duration::from_millis(50),
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(500),
        ..DispatcherConfig::default()
    }
}

/// A fresh outbox table on the test database.
async fn outbox() -> SqlOutbox<Postgres> {
    let pool = PgPool::connect(PG_URL).await.unwrap();
    let outbox = SqlOutbox::with_table(pool, &unique("outbox").replace(['.', '-'], "_")).unwrap();
    outbox.migrate().await.unwrap();
    outbox
}

/// Enqueues `n` messages `order-<i>` for `destination`, each in its own transaction, as a
/// service does per request.
async fn enqueue(outbox: &SqlOutbox<Postgres>, pool: &PgPool, destination: &str, n: usize) {
    for i in 0..n {
        let mut tx = pool.begin().await.unwrap();
        let id = Key::new(format!("order-{i}")).unwrap();
        let m = OutboxMessage::with_id(id, destination, format!("{{\"order\":{i}}}"));
        assert!(outbox.enqueue(&mut tx, &m).await.unwrap());
        tx.commit().await.unwrap();
    }
}

/// An outbox whose dispatcher dies after publishing and before marking anything sent: the
/// marks are lost, as they are when the process is killed at that point.
struct DiesBeforeTheMark<O>(O);

impl<O: OutboxStore> OutboxStore for DiesBeforeTheMark<O> {
    async fn claim(
        &self,
        owner: OwnerId,
        limit: u32,
        lease: Duration,
    ) -> Result<Claimed, StoreError> {
        self.0.claim(owner, limit, lease).await
    }
    async fn sent(&self, _owner: OwnerId, _seqs: &[i64]) -> Result<u64, StoreError> {
        Err(StoreError::unavailable("killed before the mark"))
    }
    async fn failed(&self, failure: &Failure<'_>) -> Result<(), StoreError> {
        self.0.failed(failure).await
    }
    async fn purge(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        self.0.purge(retention, limit).await
    }
    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.0.stats().await
    }
}

/// Runs `dispatcher` in the background until aborted.
fn spawn<O: OutboxStore, P: idem_mq::outbox::Publish>(
    dispatcher: Dispatcher<O, P>,
) -> JoinHandle<()> {
    tokio::spawn(async move { dispatcher.run(std::future::pending()).await })
}

async fn rabbit_dispatcher<O: OutboxStore>(
    conn: &lapin::Connection,
    outbox: O,
) -> Dispatcher<O, RabbitOutbox> {
    let publisher = RabbitPublisher::new(conn).await.unwrap();
    Dispatcher::new(outbox, RabbitOutbox::new(publisher, ""), quick())
}

/// The crash: one round of a dispatcher that dies before its mark, then a healthy one that
/// takes the rows over after the lease. Returns once the outbox is empty.
async fn crash_then_take_over<P: idem_mq::outbox::Publish>(
    outbox: &SqlOutbox<Postgres>,
    dying: Dispatcher<DiesBeforeTheMark<SqlOutbox<Postgres>>, P>,
    healthy: Dispatcher<SqlOutbox<Postgres>, P>,
    n: u64,
) {
    let round = dying.round().await.unwrap();
    assert_eq!(
        (round.published, round.marked),
        (n, 0),
        "published, then killed"
    );
    let healthy = spawn(healthy);
    assert!(
        eventually(WAIT, || async { outbox.stats().await.unwrap().sent == n }).await,
        "the rows go out again after the lease"
    );
    healthy.abort();
}

/// A fresh queue named after `what` and an outbox of 10 messages for it, taken through
/// [`crash_then_take_over`]: every message has been published on the queue twice.
async fn rabbit_republished(conn: &lapin::Connection, what: &str) -> (String, SqlOutbox<Postgres>) {
    let q = unique(what);
    declare_queue(conn, &q).await;
    let outbox = outbox().await;
    enqueue(&outbox, outbox.pool(), &q, 10).await;
    let dying = rabbit_dispatcher(conn, DiesBeforeTheMark(outbox.clone())).await;
    let healthy = rabbit_dispatcher(conn, outbox.clone()).await;
    crash_then_take_over(&outbox, dying, healthy, 10).await;
    (q, outbox)
}

/// 60 orders, three dispatchers at once, two idem consumers: each order takes effect once and
/// every row is marked sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_three_dispatchers_every_message_once() {
    let conn = Arc::new(amqp().await);
    let q = unique("outbox_many");
    declare_queue(&conn, &q).await;
    let outbox = outbox().await;
    enqueue(&outbox, outbox.pool(), &q, 60).await;

    let mut dispatchers = Vec::new();
    for _ in 0..3 {
        dispatchers.push(spawn(rabbit_dispatcher(&conn, outbox.clone()).await));
    }
    let (effects, running) =
        counting_rabbits(&conn, &q, 2, default_keys(), fast(8, 8), Duration::ZERO).await;
    assert!(eventually(WAIT, || async { effects.load(Ordering::SeqCst) >= 60 }).await);
    assert!(eventually(WAIT, || async { outbox.stats().await.unwrap().sent == 60 }).await);
    dispatchers.iter().for_each(JoinHandle::abort);
    assert_eq!(effects.load(Ordering::SeqCst), 60);
    assert_eq!(sum(&running, |s| &s.executed), 60);
    for r in running {
        r.stop().await;
    }
    outbox.drop_table().await.unwrap();
}

/// A dispatcher killed between the publish and the mark: its 10 messages are published again
/// after the lease. Without idem the consumer acts 20 times; with it, 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_killed_before_the_mark_each_effect_once() {
    let conn = Arc::new(amqp().await);

    let (plain_q, plain_box) = rabbit_republished(&conn, "outbox_kill_plain").await;
    let plain = Arc::new(AtomicU64::new(0));
    let task = unguarded::rabbit_counting(&conn, &plain_q, 8, &plain, Duration::ZERO);
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 20 }).await);
    task.abort();
    assert_eq!(
        plain.load(Ordering::SeqCst),
        20,
        "without idem each republished order acts twice"
    );
    plain_box.drop_table().await.unwrap();

    let (q, outbox) = rabbit_republished(&conn, "outbox_kill").await;
    let (effects, running) =
        counting_rabbit(&conn, &q, default_keys(), fast(8, 8), Duration::ZERO).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 20 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 10);
    assert_eq!(Stats::get(&running.stats().replayed), 10);
    running.stop().await;
    outbox.drop_table().await.unwrap();
}

/// JetStream: the republish after a dispatcher died before its mark falls inside the
/// stream's duplicate window, so the stream keeps each message once (the server says
/// `duplicate`), and the idem consumer acts once per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_killed_before_the_mark_each_effect_once() {
    let f = JsStream::create(
        "outbox_kill",
        Duration::from_secs(60),
        Duration::from_secs(10),
    )
    .await;
    let outbox = outbox().await;
    enqueue(&outbox, outbox.pool(), &f.subject(), 10).await;
    let nats = || NatsOutbox::new(NatsPublisher::new(f.js.clone()));
    let dying = Dispatcher::new(DiesBeforeTheMark(outbox.clone()), nats(), quick());
    let healthy = Dispatcher::new(outbox.clone(), nats(), quick());
    crash_then_take_over(&outbox, dying, healthy, 10).await;
    assert_eq!(
        f.count_on(&f.subject()).await,
        10,
        "the stream dropped the republished copies"
    );

    let (effects, mut running) = counting_nats(
        &f,
        1,
        idem_mq::nats::default_keys(),
        fast(8, 8),
        Duration::ZERO,
    )
    .await;
    let running = running.remove(0);
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 10 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 10);
    running.stop().await;
    outbox.drop_table().await.unwrap();
    f.cleanup().await;
}

/// A broker that refuses: the row backs off and, after `max_attempts`, is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_back_off_then_park() {
    let conn = Arc::new(amqp().await);
    let outbox = outbox().await;
    // No queue is bound to this routing key: the mandatory publish comes back unroutable.
    enqueue(&outbox, outbox.pool(), &unique("nowhere"), 1).await;
    let mut config = quick();
    config.max_attempts = 3;
    config.backoff = Duration::from_millis(50);
    let publisher = RabbitPublisher::new(&conn).await.unwrap();
    let d = Dispatcher::new(outbox.clone(), RabbitOutbox::new(publisher, ""), config);
    let first = d.round().await.unwrap();
    assert_eq!((first.published, first.retried, first.parked), (0, 1, 0));
    assert!(
        eventually(WAIT, || async {
            let _ = d.round().await.unwrap();
            outbox.stats().await.unwrap().parked == 1
        })
        .await
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent), (0, 0));
    outbox.drop_table().await.unwrap();
}
