//! The consumer against the local RabbitMQ (5672): every test has its own queues (which expire
//! unused), records and ledgers. Each fault test first runs an unguarded consumer, written
//! here, and shows the property fails without idem; then the idem consumer keeps it.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use idem_core::key_source::KeySources;
use idem_core::{Engine, Key, Policy, ScopedKey, StateKind, Store};
use idem_mq::rabbitmq::{RabbitConsumer, RabbitPublisher, default_keys};
use idem_mq::{Handled, HandlerError, InTx, Message, Processor, Stats, Work};
use idem_sql::PgStore;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

async fn connect() -> Connection {
    Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .unwrap()
}

/// Declares `queue` and `queue.dead`; both vanish a minute after their last use.
async fn declare(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    for q in [queue.to_owned(), format!("{queue}.dead")] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            args.clone(),
        )
        .await
        .unwrap();
    }
}

async fn ready(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .unwrap();
    let _ = ch.close(200, "".into()).await;
    q.message_count()
}

async fn publish(conn: &Connection, queue: &str, key: &str, payload: &str, times: usize) {
    let publisher = RabbitPublisher::new(conn).await.unwrap();
    let key = Key::new(key).unwrap();
    for _ in 0..times {
        publisher
            .publish("", queue, &key, payload.as_bytes(), FieldTable::default())
            .await
            .unwrap();
    }
}

struct Running<S, W> {
    consumer: Arc<RabbitConsumer<S, W>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl<S: Store, W: Work<S>> Running<S, W> {
    fn stats(&self) -> &Arc<Stats> {
        self.consumer.processor().stats()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn start<S: Store, W: Work<S>>(
    conn: Arc<Connection>,
    processor: Processor<S, W>,
    queue: &str,
) -> Running<S, W> {
    let consumer = Arc::new(RabbitConsumer::new(processor, queue));
    let (stop, stopped) = oneshot::channel::<()>();
    let c = Arc::clone(&consumer);
    let task = tokio::spawn(async move {
        c.run(&conn, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        consumer,
        stop,
        task,
    }
}

fn sum(running: &[&Arc<Stats>], f: impl Fn(&Stats) -> &AtomicU64) -> u64 {
    running.iter().map(|s| Stats::get(f(s))).sum()
}

/// A consumer without idem: runs `effect` per delivery and acks after it, or before it when
/// `ack_first`.
fn unguarded<F, Fut>(
    conn: Arc<Connection>,
    queue: String,
    prefetch: u16,
    ack_first: bool,
    effect: F,
) -> JoinHandle<()>
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let ch = conn.create_channel().await.unwrap();
        ch.basic_qos(prefetch, BasicQosOptions::default())
            .await
            .unwrap();
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        while let Some(Ok(d)) = consumer.next().await {
            if ack_first {
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
            effect(d.data.clone()).await;
            if !ack_first {
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
        }
    })
}

fn counting_handler(
    count: Arc<AtomicU64>,
    pause: Duration,
) -> Handled<
    impl Fn(Message) -> futures::future::BoxFuture<'static, Result<(), HandlerError>>
    + Send
    + Sync
    + 'static,
> {
    Handled(move |_m: Message| {
        let count = Arc::clone(&count);
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }) as futures::future::BoxFuture<'static, _>
    })
}

/// The same message published 100 times, 4 consumers: 1 effect (unguarded: 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_copies_four_consumers_one_effect() {
    let conn = Arc::new(connect().await);

    // Unguarded: every copy takes effect.
    let plain_q = unique("hundred_plain");
    declare(&conn, &plain_q).await;
    publish(&conn, &plain_q, "order-1", "order-1", 100).await;
    let plain = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let p = Arc::clone(&plain);
            unguarded(Arc::clone(&conn), plain_q.clone(), 8, false, move |_| {
                let p = Arc::clone(&p);
                async move {
                    p.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 100 }).await);
    tasks.iter().for_each(JoinHandle::abort);
    assert_eq!(
        plain.load(Ordering::SeqCst),
        100,
        "without idem every copy takes effect"
    );

    // Guarded: one effect, every copy acknowledged.
    let q = unique("hundred");
    declare(&conn, &q).await;
    publish(&conn, &q, "order-1", "order-1", 100).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(&q).await;
    let running: Vec<_> = (0..4)
        .map(|_| {
            let p = Processor::new(
                engine.clone(),
                scope("orders.paid"),
                default_keys(),
                fast(8, 8),
                counting_handler(Arc::clone(&effects), Duration::from_millis(5)),
            );
            start(Arc::clone(&conn), p, &q)
        })
        .collect();
    let stats: Vec<_> = running.iter().map(|r| r.stats()).collect();
    assert!(eventually(WAIT, || async { sum(&stats, |s| &s.acked) == 100 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&stats, |s| &s.executed), 1);
    assert_eq!(
        sum(&stats, |s| &s.executed) + sum(&stats, |s| &s.replayed),
        100
    );
    assert_eq!(ready(&conn, &q).await, 0);
    for r in running {
        r.stop().await;
    }
}

/// Two consumers receive the same id at once while the first is still running: 1 effect; the
/// second copy comes back later and is acknowledged as a replay (unguarded: 2 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_same_id_concurrently_one_effect() {
    let conn = Arc::new(connect().await);

    let plain_q = unique("concurrent_plain");
    declare(&conn, &plain_q).await;
    publish(&conn, &plain_q, "pay-7", "pay-7", 2).await;
    let plain = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let p = Arc::clone(&plain);
            unguarded(Arc::clone(&conn), plain_q.clone(), 1, false, move |_| {
                let p = Arc::clone(&p);
                async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    p.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 2 }).await);
    tasks.iter().for_each(JoinHandle::abort);

    let q = unique("concurrent");
    declare(&conn, &q).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(&q).await;
    let running: Vec<_> = (0..2)
        .map(|_| {
            let p = Processor::new(
                engine.clone(),
                scope("orders.paid"),
                default_keys(),
                fast(1, 1),
                counting_handler(Arc::clone(&effects), Duration::from_millis(300)),
            );
            start(Arc::clone(&conn), p, &q)
        })
        .collect();
    publish(&conn, &q, "pay-7", "pay-7", 2).await;
    let stats: Vec<_> = running.iter().map(|r| r.stats()).collect();
    assert!(eventually(WAIT, || async { sum(&stats, |s| &s.acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert!(
        sum(&stats, |s| &s.in_flight) >= 1,
        "the second copy met the first in flight"
    );
    assert_eq!(sum(&stats, |s| &s.replayed), 1);
    for r in running {
        r.stop().await;
    }
}

/// A poison message is dead-lettered after `max_attempts` with its record left unknown, while
/// the other messages keep flowing (unguarded, requeueing the failure: the poison message
/// returns to the head of the queue and the others starve behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_dead_lettered_others_flow() {
    let conn = Arc::new(connect().await);
    let poison_first = |conn: Arc<Connection>, q: String| async move {
        publish(&conn, &q, "poison", "poison", 1).await;
        for i in 0..5 {
            publish(&conn, &q, &format!("ok-{i}"), &format!("ok-{i}"), 1).await;
        }
    };

    let plain_q = unique("poison_plain");
    declare(&conn, &plain_q).await;
    poison_first(Arc::clone(&conn), plain_q.clone()).await;
    let plain_ok = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&plain_ok);
    let c2 = Arc::clone(&conn);
    let q2 = plain_q.clone();
    let plain_task = tokio::spawn(async move {
        let ch = c2.create_channel().await.unwrap();
        ch.basic_qos(1, BasicQosOptions::default()).await.unwrap();
        let mut consumer = ch
            .basic_consume(
                q2.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        while let Some(Ok(d)) = consumer.next().await {
            if d.data == b"poison" {
                d.nack(lapin::options::BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .unwrap();
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

    let q = unique("poison");
    declare(&conn, &q).await;
    let engine = redis_engine(&q).await;
    let ok = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let (o, a) = (Arc::clone(&ok), Arc::clone(&attempts));
    let handler = Handled(move |m: Message| {
        let (o, a) = (Arc::clone(&o), Arc::clone(&a));
        async move {
            if m.payload().as_ref() == b"poison" {
                a.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::Retry("cannot parse".into()))
            } else {
                o.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    });
    let p = Processor::new(
        engine.clone(),
        scope("orders.paid"),
        default_keys(),
        fast(1, 1),
        handler,
    );
    let running = start(Arc::clone(&conn), p, &q);
    poison_first(Arc::clone(&conn), q.clone()).await;
    let dead = format!("{q}.dead");
    assert!(
        eventually(WAIT, || async {
            ok.load(Ordering::SeqCst) == 5 && ready(&conn, &dead).await == 1
        })
        .await
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "max_attempts = 3");
    assert_eq!(Stats::get(&running.stats().dead_lettered), 1);
    let record = engine
        .store()
        .get(&ScopedKey::new(
            scope("orders.paid"),
            Key::new("poison").unwrap(),
        ))
        .await
        .unwrap()
        .expect("record kept for an operator");
    assert_eq!(record.state.kind(), StateKind::Unknown);
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
    let reason = got
        .delivery
        .properties
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .get("x-idem-reason")
        .cloned();
    assert_eq!(reason, Some(AMQPValue::LongString("exhausted".into())));
    got.delivery.ack(BasicAckOptions::default()).await.unwrap();
    running.stop().await;
}

/// The same id with another payload is a mismatch: dead-lettered and counted, not run; a
/// message with no key is dead-lettered and not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatch_and_missing_key_are_dead_lettered() {
    let conn = Arc::new(connect().await);
    let q = unique("mismatch");
    declare(&conn, &q).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(&q).await;
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        default_keys(),
        fast(1, 1),
        counting_handler(Arc::clone(&effects), Duration::ZERO),
    );
    let running = start(Arc::clone(&conn), p, &q);
    publish(&conn, &q, "order-9", "amount=100", 1).await;
    publish(&conn, &q, "order-9", "amount=200", 1).await;
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
    assert!(eventually(WAIT, || async { ready(&conn, &dead).await == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&running.stats().mismatched), 1);
    assert_eq!(Stats::get(&running.stats().dead_lettered), 2);
    running.stop().await;
}

/// The key taken from the payload (`{json.order.id}:pay`, a business key) instead of the
/// message id: two ids for one order take effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_from_payload_field() {
    let conn = Arc::new(connect().await);
    let q = unique("payload_key");
    declare(&conn, &q).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(&q).await;
    let keys = KeySources::parse(&["{json.order.id}:pay"]).unwrap();
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        keys,
        fast(4, 4),
        counting_handler(Arc::clone(&effects), Duration::ZERO),
    );
    let running = start(Arc::clone(&conn), p, &q);
    let body = r#"{"order":{"id":42},"amount":100}"#;
    publish(&conn, &q, "id-a", body, 1).await;
    publish(&conn, &q, "id-b", body, 1).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&running.stats().replayed), 1);
    running.stop().await;
}

/// The store down while messages arrive: nothing runs and nothing is acknowledged; after it
/// comes back every message takes effect once (unguarded, with no inbox: the effects run
/// during the outage with nothing to stop a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_no_effect_no_ack_then_once_each() {
    let conn = Arc::new(connect().await);
    let mut redis = PrivateRedis::start();
    let q = unique("store_down");
    declare(&conn, &q).await;

    // Unguarded: no store to consult, so the duplicate runs too.
    let plain_q = unique("store_down_plain");
    declare(&conn, &plain_q).await;
    for i in 0..5 {
        publish(&conn, &plain_q, &format!("m-{i}"), &format!("m-{i}"), 1).await;
    }
    publish(&conn, &plain_q, "m-0", "m-0", 1).await;
    let plain = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&plain);
    let t = unguarded(Arc::clone(&conn), plain_q.clone(), 4, false, move |_| {
        let p = Arc::clone(&p);
        async move {
            p.fetch_add(1, Ordering::SeqCst);
        }
    });
    assert!(eventually(WAIT, || async { plain.load(Ordering::SeqCst) == 6 }).await);
    t.abort();

    let engine = redis_engine_at(&redis.url(), &q).await;
    redis.kill();
    let per_key = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let pk = Arc::clone(&per_key);
    let handler = Handled(move |m: Message| {
        let pk = Arc::clone(&pk);
        async move {
            let k = String::from_utf8_lossy(m.payload()).into_owned();
            *pk.lock().unwrap().entry(k).or_default() += 1;
            Ok(())
        }
    });
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        default_keys(),
        fast(4, 4),
        handler,
    );
    let running = start(Arc::clone(&conn), p, &q);
    for i in 0..5 {
        publish(&conn, &q, &format!("m-{i}"), &format!("m-{i}"), 1).await;
    }
    publish(&conn, &q, "m-0", "m-0", 1).await;
    assert!(
        eventually(WAIT, || async {
            Stats::get(&running.stats().store_unavailable) >= 12
        })
        .await
    );
    assert!(
        per_key.lock().unwrap().is_empty(),
        "nothing runs while the store is down"
    );
    assert_eq!(
        Stats::get(&running.stats().acked),
        0,
        "nothing is acknowledged"
    );

    redis.restart();
    // The store's connection comes back on its own reconnect schedule.
    let recovered = eventually(Duration::from_secs(60), || async {
        Stats::get(&running.stats().acked) >= 6
    })
    .await;
    assert!(
        recovered,
        "acked {} of 6",
        Stats::get(&running.stats().acked)
    );
    let seen = per_key.lock().unwrap().clone();
    assert_eq!(seen.len(), 5);
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert_eq!(ready(&conn, &q).await, 0);
    running.stop().await;
}

/// Graceful shutdown: stop consuming, finish the message in progress and acknowledge it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_and_acks() {
    let conn = Arc::new(connect().await);
    let q = unique("shutdown");
    declare(&conn, &q).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(&q).await;
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        default_keys(),
        fast(1, 1),
        counting_handler(Arc::clone(&effects), Duration::from_millis(500)),
    );
    let running = start(Arc::clone(&conn), p, &q);
    publish(&conn, &q, "s-1", "s-1", 1).await;
    publish(&conn, &q, "s-2", "s-2", 1).await;
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
        eventually(WAIT, || async { ready(&conn, &q).await == 1 }).await,
        "the other is back in the queue"
    );
}

// ---- Kill scenarios: the consumer runs in a child process (this test binary, re-executed to
// run `child_consumer`) and is killed with SIGKILL at a chosen point.

const CHILD_MODE: &str = "IDEM_MQ_CHILD";
const POINT: &str = "IDEM-MQ-POINT";

/// Runs only when a kill test starts it as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the kill tests"]
async fn child_consumer() {
    let mode = std::env::var(CHILD_MODE).unwrap();
    let queue = std::env::var("IDEM_MQ_QUEUE").unwrap();
    let ledger = std::env::var("IDEM_MQ_LEDGER").unwrap();
    let records = std::env::var("IDEM_MQ_RECORDS").unwrap();
    let conn = Arc::new(connect().await);
    let pool = sqlx::PgPool::connect(PG_URL).await.unwrap();
    let hang = || async {
        println!("{POINT}");
        futures::future::pending::<()>().await;
    };
    match mode.as_str() {
        // Without idem: the effect commits, the process dies before the ack.
        "plain_after_effect" => {
            let ch = conn.create_channel().await.unwrap();
            let mut c = ch
                .basic_consume(
                    queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            if let Some(Ok(d)) = c.next().await {
                sqlx::query(&format!(
                    "INSERT INTO {ledger} (order_id, amount) VALUES ($1, 100)"
                ))
                .bind(String::from_utf8_lossy(&d.data).into_owned())
                .execute(&pool)
                .await
                .unwrap();
                hang().await;
            }
        }
        // Without idem: ack first, the process dies before the effect.
        "plain_ack_first" => {
            let ch = conn.create_channel().await.unwrap();
            let mut c = ch
                .basic_consume(
                    queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            if let Some(Ok(d)) = c.next().await {
                d.ack(BasicAckOptions::default()).await.unwrap();
                hang().await;
            }
        }
        // idem, same transaction: dies after the commit, before the ack.
        "idem_after_commit" => {
            let store = PgStore::with_table(pool.clone(), &records).unwrap();
            let engine = Engine::new(store, Policy::default());
            let l = ledger.clone();
            let inner = InTx::new(tx_handler(move |tx, m| {
                let l = l.clone();
                Box::pin(async move { credit(tx, &l, m).await })
            }));
            let p = Processor::new(
                engine,
                scope("orders.paid"),
                default_keys(),
                fast(1, 1),
                HangAfter(inner),
            );
            let consumer = RabbitConsumer::new(p, queue.as_str());
            consumer
                .run(&conn, futures::future::pending())
                .await
                .unwrap();
        }
        // idem, same transaction: dies after the write, before the commit.
        "idem_before_commit" => {
            let store = PgStore::with_table(pool.clone(), &records).unwrap();
            let engine = Engine::new(store, Policy::default());
            let l = ledger.clone();
            let inner = InTx::new(tx_handler(move |tx, m| {
                let l = l.clone();
                Box::pin(async move {
                    credit(tx, &l, m).await?;
                    println!("{POINT}");
                    futures::future::pending::<()>().await;
                    Ok(())
                })
            }));
            let p = Processor::new(
                engine,
                scope("orders.paid"),
                default_keys(),
                fast(1, 1),
                inner,
            );
            let consumer = RabbitConsumer::new(p, queue.as_str());
            consumer
                .run(&conn, futures::future::pending())
                .await
                .unwrap();
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Runs the inner work, then reports the kill point and never returns (so never acks).
struct HangAfter<W>(W);

impl<S: Store, W: Work<S>> Work<S> for HangAfter<W> {
    async fn run(
        &self,
        engine: &Engine<S>,
        key: &ScopedKey,
        fingerprint: &idem_core::Fingerprint,
        message: &Message,
    ) -> idem_mq::RunResult {
        let _ = self.0.run(engine, key, fingerprint, message).await;
        println!("{POINT}");
        futures::future::pending().await
    }
}

/// Starts the child in `mode`, waits until it reports the kill point, and kills it.
async fn run_child_until_point(mode: &str, queue: &str, ledger: &Ledger) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_consumer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MODE, mode)
        .env("IDEM_MQ_QUEUE", queue)
        .env("IDEM_MQ_LEDGER", &ledger.ledger)
        .env("IDEM_MQ_RECORDS", &ledger.records)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let reached = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(POINT) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    // SIGKILL: no clean shutdown, no ack, the broker connection just drops.
    child.kill().await.unwrap();
    assert!(reached, "child {mode} did not reach its kill point");
}

async fn guarded_in_process(
    conn: &Arc<Connection>,
    ledger: &Ledger,
    queue: &str,
) -> Running<PgStore, InTx<PgStore>> {
    let engine = Engine::new(ledger.store().await, Policy::default());
    let l = ledger.ledger.clone();
    let work = InTx::new(tx_handler(move |tx, m| {
        let l = l.clone();
        Box::pin(async move { credit(tx, &l, m).await })
    }));
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        default_keys(),
        fast(1, 1),
        work,
    );
    start(Arc::clone(conn), p, queue)
}

/// Killed after the effect committed and before the ack: the redelivery is skipped, 1 effect
/// (unguarded: the redelivery runs again, 2 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_commit_before_ack_redelivery_skipped() {
    let conn = Arc::new(connect().await);

    let plain = Ledger::create("kill_after_plain").await;
    let plain_q = unique("kill_after_plain");
    declare(&conn, &plain_q).await;
    publish(&conn, &plain_q, "order-5", "order-5", 1).await;
    run_child_until_point("plain_after_effect", &plain_q, &plain).await;
    let pl = plain.ledger.clone();
    let pool = plain.pool.clone();
    let t = unguarded(Arc::clone(&conn), plain_q.clone(), 1, false, move |data| {
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

    let ledger = Ledger::create("kill_after").await;
    ledger.store().await; // migrate before the child uses the table
    let q = unique("kill_after");
    declare(&conn, &q).await;
    publish(&conn, &q, "order-5", "order-5", 1).await;
    run_child_until_point("idem_after_commit", &q, &ledger).await;
    assert_eq!(
        ledger.rows().await,
        1,
        "the child committed before it was killed"
    );
    let running = guarded_in_process(&conn, &ledger, &q).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 1 }).await);
    assert_eq!(
        Stats::get(&running.stats().replayed),
        1,
        "the redelivery was skipped"
    );
    assert_eq!(ledger.rows().await, 1);
    running.stop().await;
    ledger.drop_all().await;
}

/// Killed after the write and before the commit: the redelivery runs, 1 effect (unguarded,
/// acking first: the message is lost, 0 effects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_commit_redelivery_runs() {
    let conn = Arc::new(connect().await);

    let plain = Ledger::create("kill_before_plain").await;
    let plain_q = unique("kill_before_plain");
    declare(&conn, &plain_q).await;
    publish(&conn, &plain_q, "order-6", "order-6", 1).await;
    run_child_until_point("plain_ack_first", &plain_q, &plain).await;
    // Nothing is left to redeliver: the acknowledged message is gone and never took effect.
    assert!(eventually(WAIT, || async { ready(&conn, &plain_q).await == 0 }).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready(&conn, &plain_q).await, 0);
    assert_eq!(
        plain.rows().await,
        0,
        "unguarded: acked before the effect, then lost"
    );
    plain.drop_all().await;

    let ledger = Ledger::create("kill_before").await;
    ledger.store().await;
    let q = unique("kill_before");
    declare(&conn, &q).await;
    publish(&conn, &q, "order-6", "order-6", 1).await;
    run_child_until_point("idem_before_commit", &q, &ledger).await;
    let running = guarded_in_process(&conn, &ledger, &q).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 1 }).await);
    assert_eq!(
        Stats::get(&running.stats().executed),
        1,
        "the redelivery ran"
    );
    assert_eq!(ledger.rows().await, 1);
    running.stop().await;
    ledger.drop_all().await;
}
