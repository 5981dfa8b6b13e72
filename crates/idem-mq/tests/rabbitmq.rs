//! The consumer against the local RabbitMQ (5672): every test has its own queues (which expire
//! unused), records and ledgers. Each fault test first runs a consumer without idem's guard
//! (in `common::unguarded`, or a child process below) and shows the property fails; then the
//! idem consumer keeps it.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::kill::{ChildArgs, hang_here, run_child_until_point};
use common::outage::{Broker, store_outage};
use common::unguarded;
use common::*;
use futures::StreamExt;
use idem_core::StateKind;
use idem_core::key_source::KeySources;
use idem_mq::rabbitmq::{RabbitConsumer, default_keys};
use idem_mq::{Processor, Stats, Work};
use idem_redis::RedisStore;
use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::AMQPValue;
use tokio::task::JoinHandle;

async fn connect() -> Arc<Connection> {
    Arc::new(amqp().await)
}

/// A fresh queue (and its `.dead`).
async fn queue(conn: &Connection, what: &str) -> String {
    let q = unique(what);
    declare_queue(conn, &q).await;
    q
}

/// Publishes each of `ids` once, the payload being the id.
async fn publish_each(conn: &Connection, q: &str, ids: &[&str]) {
    for id in ids {
        publish_with_id(conn, q, id, id, 1).await;
    }
}

/// The same message published 100 times, 4 consumers: 1 effect (unguarded: 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_copies_four_consumers_one_effect() {
    let conn = connect().await;

    let plain_q = queue(&conn, "hundred_plain").await;
    publish_with_id(&conn, &plain_q, "order-1", "order-1", 100).await;
    let plain = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| unguarded::rabbit_counting(&conn, &plain_q, 8, &plain, Duration::ZERO))
        .collect();
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 100 }).await);
    tasks.iter().for_each(JoinHandle::abort);
    assert_eq!(
        plain.load(Ordering::SeqCst),
        100,
        "without idem every copy takes effect"
    );

    let q = queue(&conn, "hundred").await;
    publish_with_id(&conn, &q, "order-1", "order-1", 100).await;
    let (effects, running) = counting_rabbits(
        &conn,
        &q,
        4,
        default_keys(),
        fast(8, 8),
        Duration::from_millis(5),
    )
    .await;
    assert!(eventually(WAIT, || async { sum(&running, |s| &s.acked) == 100 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&running, |s| &s.executed), 1);
    assert_eq!(sum(&running, |s| &s.replayed), 99);
    assert_eq!(queue_ready(&conn, &q).await, 0);
    for r in running {
        r.stop().await;
    }
}

/// Two consumers receive the same id at once while the first is still running: 1 effect; the
/// second copy comes back later and is acknowledged as a replay (unguarded: 2 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_same_id_concurrently_one_effect() {
    let conn = connect().await;
    let pause = Duration::from_millis(300);

    let plain_q = queue(&conn, "concurrent_plain").await;
    publish_with_id(&conn, &plain_q, "pay-7", "pay-7", 2).await;
    let plain = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..2)
        .map(|_| unguarded::rabbit_counting(&conn, &plain_q, 1, &plain, pause))
        .collect();
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 2 }).await);
    tasks.iter().for_each(JoinHandle::abort);

    let q = queue(&conn, "concurrent").await;
    let (effects, running) =
        counting_rabbits(&conn, &q, 2, default_keys(), fast(1, 1), pause).await;
    publish_with_id(&conn, &q, "pay-7", "pay-7", 2).await;
    assert!(eventually(WAIT, || async { sum(&running, |s| &s.acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert!(
        sum(&running, |s| &s.in_flight) >= 1,
        "the second copy met the first in flight"
    );
    assert_eq!(sum(&running, |s| &s.replayed), 1);
    for r in running {
        r.stop().await;
    }
}

/// A poison message is dead-lettered after `max_attempts` with its record left unknown, while
/// the other messages keep flowing (unguarded, requeueing the failure: the poison message
/// returns to the head of the queue and the others starve behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_dead_lettered_others_flow() {
    let conn = connect().await;
    let ids = ["poison", "ok-0", "ok-1", "ok-2", "ok-3", "ok-4"];

    let plain_q = queue(&conn, "poison_plain").await;
    publish_each(&conn, &plain_q, &ids).await;
    let plain_ok = Arc::new(AtomicU64::new(0));
    let (p, c2, q2) = (Arc::clone(&plain_ok), Arc::clone(&conn), plain_q.clone());
    let plain_task = tokio::spawn(async move {
        let (_ch, mut consumer) = unguarded::rabbit_consumer(&c2, &q2, Some(1)).await;
        while let Some(Ok(d)) = consumer.next().await {
            if d.data == b"poison" {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                d.nack(requeue).await.unwrap();
            } else {
                p.fetch_add(1, Ordering::SeqCst);
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
        }
    });
    let flowed = eventually(Duration::from_secs(2), || async {
        plain_ok.load(Ordering::SeqCst) == 5
    })
    .await;
    plain_task.abort();
    assert!(
        !flowed,
        "unguarded: the others should starve behind the requeued poison message"
    );

    let q = queue(&conn, "poison").await;
    let engine = redis_engine(&q).await;
    let ok = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let work = poison_aware(Arc::clone(&ok), Arc::clone(&attempts));
    let running = start_rabbit(
        &conn,
        processor(engine.clone(), default_keys(), fast(1, 1), work),
        &q,
    );
    publish_each(&conn, &q, &ids).await;
    let dead = format!("{q}.dead");
    assert!(
        eventually(WAIT, || async {
            ok.load(Ordering::SeqCst) == 5 && queue_ready(&conn, &dead).await == 1
        })
        .await
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "max_attempts = 3");
    assert_eq!(Stats::get(&running.stats().dead_lettered), 1);
    assert_eq!(
        state_of(&engine, "poison").await,
        Some(StateKind::Unknown),
        "kept for an operator"
    );
    // The dead letter says why.
    let ch = conn.create_channel().await.unwrap();
    let got = ch
        .basic_get(
            dead.as_str().into(),
            lapin::options::BasicGetOptions::default(),
        )
        .await
        .unwrap()
        .expect("dead letter");
    let headers = got.delivery.properties.headers().clone().unwrap();
    let reason = headers.inner().get("x-idem-reason").cloned();
    assert_eq!(reason, Some(AMQPValue::LongString("exhausted".into())));
    got.delivery.ack(BasicAckOptions::default()).await.unwrap();
    running.stop().await;
}

/// The same id with another payload is a mismatch: dead-lettered and counted, not run; a
/// message with no key is dead-lettered and not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatch_and_missing_key_are_dead_lettered() {
    let conn = connect().await;
    let q = queue(&conn, "mismatch").await;
    let (effects, running) =
        counting_rabbit(&conn, &q, default_keys(), fast(1, 1), Duration::ZERO).await;
    publish_with_id(&conn, &q, "order-9", "amount=100", 1).await;
    publish_with_id(&conn, &q, "order-9", "amount=200", 1).await;
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        "".into(),
        q.as_str().into(),
        Default::default(),
        b"no id",
        lapin::BasicProperties::default(),
    )
    .await
    .unwrap();
    let dead = format!("{q}.dead");
    assert!(eventually(WAIT, || async { queue_ready(&conn, &dead).await == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&running.stats().mismatched), 1);
    assert_eq!(Stats::get(&running.stats().dead_lettered), 2);
    running.stop().await;
}

/// The key taken from the payload (`{json.order.id}:pay`, a business key) instead of the
/// message id: two ids for one order take effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_from_payload_field() {
    let conn = connect().await;
    let q = queue(&conn, "payload_key").await;
    let keys = KeySources::parse(&["{json.order.id}:pay"]).unwrap();
    let (effects, running) = counting_rabbit(&conn, &q, keys, fast(4, 4), Duration::ZERO).await;
    let body = r#"{"order":{"id":42},"amount":100}"#;
    publish_with_id(&conn, &q, "id-a", body, 1).await;
    publish_with_id(&conn, &q, "id-b", body, 1).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&running.stats().replayed), 1);
    running.stop().await;
}

/// RabbitMQ queues for the store-outage scenario.
struct Rabbit(Arc<Connection>);

impl Broker for Rabbit {
    type Source = String;

    async fn source(&self, what: &str) -> (String, String) {
        let q = queue(&self.0, what).await;
        (q.clone(), q)
    }

    async fn publish(&self, q: &String, id: &str) {
        publish_with_id(&self.0, q, id, id, 1).await;
    }

    fn keys(&self) -> KeySources {
        default_keys()
    }

    async fn start<W: Work<RedisStore>>(&self, q: &String, p: Processor<RedisStore, W>) -> Running {
        start_rabbit(&self.0, p, q)
    }

    async fn left(&self, q: &String) -> u64 {
        u64::from(queue_ready(&self.0, q).await)
    }

    async fn cleanup(&self, _: String) {} // the queues expire unused
}

/// The store down while messages arrive: nothing runs and nothing is acknowledged; after it
/// comes back every message takes effect once (papering over the store's failures instead
/// runs the duplicate twice, or loses every message: `common::outage`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_no_effect_no_ack_then_once_each() {
    store_outage(&Rabbit(connect().await)).await;
}

/// Graceful shutdown: stop consuming, finish the message in progress and acknowledge it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_and_acks() {
    let conn = connect().await;
    let q = queue(&conn, "shutdown").await;
    let (effects, running) = counting_rabbit(
        &conn,
        &q,
        default_keys(),
        fast(1, 1),
        Duration::from_millis(500),
    )
    .await;
    publish_each(&conn, &q, &["s-1", "s-2"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats = Arc::clone(running.stats());
    running.stop().await;
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the one in progress finished"
    );
    assert_eq!(Stats::get(&stats.acked), 1, "and was acknowledged");
    assert!(
        eventually(WAIT, || async { queue_ready(&conn, &q).await == 1 }).await,
        "the other is back in the queue"
    );
}

// ---- Kill scenarios: the consumer runs in a child process (`common::kill`), SIGKILLed at a
// chosen point.

/// Runs only when a kill test starts it as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the kill tests"]
async fn child_consumer() {
    let args = ChildArgs::from_env();
    let conn = amqp().await;
    let pool = sqlx::PgPool::connect(PG_URL).await.unwrap();
    match args.mode.as_str() {
        // Without idem: the effect commits, the process dies before the ack.
        "plain_after_effect" => {
            let (_ch, d) = first_delivery(&conn, &args.source).await;
            args.credit_plain(&pool, &d.data).await;
            hang_here::<()>().await;
        }
        // Without idem: ack first, the process dies before the effect.
        "plain_ack_first" => {
            let (_ch, d) = first_delivery(&conn, &args.source).await;
            d.ack(BasicAckOptions::default()).await.unwrap();
            hang_here::<()>().await;
        }
        // idem, same transaction: dies after the commit, before the ack.
        "idem_after_commit" => {
            let consumer = RabbitConsumer::new(
                args.processor(&pool, default_keys(), args.after_commit()),
                args.source.as_str(),
            );
            consumer
                .run(&conn, futures::future::pending())
                .await
                .unwrap();
        }
        // idem, same transaction: dies after the write, before the commit.
        "idem_before_commit" => {
            let consumer = RabbitConsumer::new(
                args.processor(&pool, default_keys(), args.before_commit()),
                args.source.as_str(),
            );
            consumer
                .run(&conn, futures::future::pending())
                .await
                .unwrap();
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// The first delivery of `queue` without idem (and its channel, kept open).
async fn first_delivery(
    conn: &Connection,
    queue: &str,
) -> (lapin::Channel, lapin::message::Delivery) {
    let (ch, mut c) = unguarded::rabbit_consumer(conn, queue, None).await;
    let d = c.next().await.unwrap().unwrap();
    (ch, d)
}

/// A queue holding one message, `order`, and a ledger, for a kill scenario.
async fn one_message(conn: &Connection, what: &str, order: &str) -> (String, Ledger) {
    let q = queue(conn, what).await;
    publish_with_id(conn, &q, order, order, 1).await;
    (q, Ledger::create(what).await)
}

/// The idem consumer (same transaction) in this process, after the child died.
async fn guarded(conn: &Arc<Connection>, ledger: &Ledger, q: &str) -> Running {
    let p = processor(
        ledger.engine().await,
        default_keys(),
        fast(1, 1),
        ledger.in_tx(),
    );
    start_rabbit(conn, p, q)
}

/// Killed after the effect committed and before the ack: the redelivery is skipped, 1 effect
/// (unguarded: the redelivery runs again, 2 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_commit_before_ack_redelivery_skipped() {
    let conn = connect().await;

    let (plain_q, plain) = one_message(&conn, "kill_after_plain", "order-5").await;
    run_child_until_point("plain_after_effect", &plain_q, &plain).await;
    common::kill::assert_effects(&plain, 1, "the child credited before it was killed").await;
    let (pl, pool) = (plain.ledger.clone(), plain.pool.clone());
    let t = unguarded::rabbit(&conn, &plain_q, 1, false, move |data| {
        let (pl, pool) = (pl.clone(), pool.clone());
        async move {
            sqlx::query(&format!(
                "INSERT INTO {pl} (order_id, amount) VALUES ($1, 100)"
            ))
            .bind(String::from_utf8_lossy(&data).into_owned())
            .execute(&pool)
            .await
            .unwrap();
        }
    });
    assert!(
        eventually(WAIT, || async { plain.rows().await == 2 }).await,
        "unguarded: the redelivery credits twice"
    );
    t.abort();
    plain.drop_all().await;

    let (q, ledger) = one_message(&conn, "kill_after", "order-5").await;
    run_child_until_point("idem_after_commit", &q, &ledger).await;
    common::kill::assert_effects(&ledger, 1, "the child committed before it was killed").await;
    common::kill::assert_redelivery_skipped(guarded(&conn, &ledger, &q).await, &ledger).await;
}

/// Killed after the write and before the commit: the redelivery runs, 1 effect (unguarded,
/// acking first: the message is lost, 0 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_commit_redelivery_runs() {
    let conn = connect().await;

    let (plain_q, plain) = one_message(&conn, "kill_before_plain", "order-6").await;
    run_child_until_point("plain_ack_first", &plain_q, &plain).await;
    // Nothing is left to redeliver: the acknowledged message is gone and never took effect.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(queue_ready(&conn, &plain_q).await, 0);
    common::kill::assert_effects(&plain, 0, "unguarded: acked before the effect, then lost").await;
    plain.drop_all().await;

    let (q, ledger) = one_message(&conn, "kill_before", "order-6").await;
    run_child_until_point("idem_before_commit", &q, &ledger).await;
    common::kill::assert_redelivery_ran(guarded(&conn, &ledger, &q).await, &ledger).await;
}
