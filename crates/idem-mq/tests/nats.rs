//! The consumer against the local NATS JetStream (4222): every test has its own stream
//! (deleted at the end). Each fault test first runs a consumer without idem's guard (in
//! `common::unguarded`, or a child process below) and shows the property fails; then the idem
//! consumer keeps it.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use common::kill::{ChildArgs, hang_here, run_child_until_point};
use common::outage::{Broker, store_outage};
use common::unguarded;
use common::*;
use futures::StreamExt;
use idem_core::key_source::KeySources;
use idem_core::{Key, StateKind};
use idem_mq::nats::{NatsConsumer, NatsPublisher, default_keys};
use idem_mq::{Processor, Stats, Work};
use idem_redis::RedisStore;
use tokio::task::JoinHandle;

const WINDOW: Duration = Duration::from_secs(1);
/// Unacknowledged deliveries come back after this (the kill tests wait for it).
const ACK_WAIT: Duration = Duration::from_secs(2);

async fn stream(what: &str) -> JsStream {
    JsStream::create(what, WINDOW, Duration::from_secs(10)).await
}

/// The key in an `order-id` header: copies published without `Nats-Msg-Id` are all kept.
fn order_id() -> KeySources {
    KeySources::parse(&["header:order-id"]).unwrap()
}

/// Publishes `order` `times` times with no message id, its key in `order-id`.
async fn publish_order(f: &JsStream, order: &str, times: usize) {
    for _ in 0..times {
        f.publish_header("order-id", order, order).await;
    }
}

/// The same message published 100 times, 4 consumers on one durable consumer: 1 effect
/// (unguarded: 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_copies_four_consumers_one_effect() {
    let plain = stream("n_plain").await;
    publish_order(&plain, "order-1", 100).await;
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(unguarded::nats(plain.consumer().await, &count));
    }
    assert!(eventually(WAIT, || async { count.load(Ordering::SeqCst) == 100 }).await);
    tasks.iter().for_each(JoinHandle::abort);
    plain.cleanup().await;

    let f = stream("n_hundred").await;
    publish_order(&f, "order-1", 100).await;
    let (effects, running) =
        counting_nats(&f, 4, order_id(), fast(16, 8), Duration::from_millis(5)).await;
    assert!(eventually(WAIT, || async { sum(&running, |s| &s.acked) == 100 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&running, |s| &s.replayed), 99);
    for r in running {
        r.stop().await;
    }
    f.cleanup().await;
}

/// `Nats-Msg-Id` dedup covers only the stream's window: a copy published after it is stored
/// again, and the consumer's engine skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_window_then_consumer_dedup() {
    let f = JsStream::create(
        "n_window",
        Duration::from_millis(300),
        Duration::from_secs(10),
    )
    .await;
    let publisher = NatsPublisher::new(f.js.clone());
    let key = Key::new("order-77").unwrap();
    let subject = f.subject();
    let publish = || publisher.publish(&subject, &key, "order-77".into(), HeaderMap::new());
    let first = publish().await.unwrap();
    let second = publish().await.unwrap();
    assert!(
        !first && second,
        "inside the window the server drops the repeat"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        !publish().await.unwrap(),
        "after the window the server stores it again"
    );

    let (effects, mut running) =
        counting_nats(&f, 1, default_keys(), fast(4, 4), Duration::ZERO).await;
    let running = running.remove(0);
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(Stats::get(&running.stats().replayed), 1);
    running.stop().await;
    f.cleanup().await;
}

/// Two consumers get the same key at once while the first runs: 1 effect; the other copy is
/// nak'd with a delay and acknowledged as a replay later (unguarded: 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_same_id_concurrently_one_effect() {
    let plain = stream("n_conc_plain").await;
    publish_order(&plain, "pay-7", 2).await;
    let count = Arc::new(AtomicU64::new(0));
    let t = [
        unguarded::nats(plain.consumer().await, &count),
        unguarded::nats(plain.consumer().await, &count),
    ];
    assert!(eventually(WAIT, || async { count.load(Ordering::SeqCst) == 2 }).await);
    t.iter().for_each(JoinHandle::abort);
    plain.cleanup().await;

    let f = stream("n_conc").await;
    let (effects, running) =
        counting_nats(&f, 2, order_id(), fast(1, 1), Duration::from_millis(300)).await;
    publish_order(&f, "pay-7", 2).await;
    assert!(eventually(WAIT, || async { sum(&running, |s| &s.acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&running, |s| &s.replayed), 1);
    for r in running {
        r.stop().await;
    }
    f.cleanup().await;
}

/// A poison message goes to the dead-letter subject after `max_attempts` deliveries, with
/// its record left unknown; the others keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_dead_lettered_others_flow() {
    let f = stream("n_poison").await;
    let engine = redis_engine(&f.name).await;
    let ok = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let work = poison_aware(Arc::clone(&ok), Arc::clone(&attempts));
    let running = start_nats(&f, processor(engine.clone(), order_id(), fast(1, 1), work)).await;
    publish_order(&f, "poison", 1).await;
    for i in 0..5 {
        publish_order(&f, &format!("ok-{i}"), 1).await;
    }
    assert!(
        eventually(WAIT, || async { f.count_on(&f.dead()).await == 1 }).await,
        "no dead letter: attempts {}, ok {}",
        attempts.load(Ordering::SeqCst),
        ok.load(Ordering::SeqCst),
    );
    let letters = f.dead_letters().await;
    let reason = letters[0]
        .get("x-idem-reason")
        .map(|v| v.as_str().to_owned());
    assert_eq!(reason.as_deref(), Some("exhausted"));
    assert!(eventually(WAIT, || async { ok.load(Ordering::SeqCst) == 5 }).await);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!(
        state_of(&engine, "poison").await,
        Some(StateKind::Unknown),
        "kept for an operator"
    );
    running.stop().await;
    f.cleanup().await;
}

/// JetStream streams for the store-outage scenario.
struct Nats;

impl Broker for Nats {
    type Source = JsStream;

    async fn source(&self, what: &str) -> (JsStream, String) {
        let f = stream(what).await;
        let name = f.name.clone();
        (f, name)
    }

    async fn publish(&self, f: &JsStream, id: &str) {
        publish_order(f, id, 1).await;
    }

    fn keys(&self) -> KeySources {
        order_id()
    }

    async fn start<W: Work<RedisStore>>(
        &self,
        f: &JsStream,
        p: Processor<RedisStore, W>,
    ) -> Running {
        start_nats(f, p).await
    }

    async fn left(&self, f: &JsStream) -> u64 {
        let mut consumer = f.consumer().await;
        let info = consumer.info().await.unwrap();
        info.num_pending + info.num_ack_pending as u64
    }

    async fn cleanup(&self, f: JsStream) {
        f.cleanup().await;
    }
}

/// The store down while messages arrive: nothing runs, nothing is acknowledged; after it
/// comes back each message takes effect once (papering over the store's failures instead
/// runs the duplicate twice, or loses every message: `common::outage`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_no_effect_no_ack_then_once_each() {
    store_outage(&Nats).await;
}

// ---- Kill scenarios: the consumer runs in a child process (`common::kill`), SIGKILLed at a
// chosen point; the server redelivers after the consumer's `ack_wait` (2 s).

/// The stream's pull consumer, from a process that did not create it.
async fn attach(stream: &str) -> (async_nats::jetstream::Context, PullConsumer) {
    let client = async_nats::connect(idem_testkit::brokers::NATS_URL)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let pull = js
        .get_stream(stream)
        .await
        .unwrap()
        .get_consumer(JsStream::CONSUMER)
        .await
        .unwrap();
    (js, pull)
}

/// Runs only when a kill test starts it as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the kill tests"]
async fn child_consumer() {
    let args = ChildArgs::from_env();
    let (js, pull) = attach(&args.source).await;
    let pool = sqlx::PgPool::connect(PG_URL).await.unwrap();
    match args.mode.as_str() {
        // Without idem: the effect commits, the process dies before the ack.
        "plain_after_effect" => {
            let mut messages = pull.messages().await.unwrap();
            let m = messages.next().await.unwrap().unwrap();
            args.credit_plain(&pool, &m.payload).await;
            hang_here::<()>().await;
        }
        // Without idem: ack first (confirmed by the server), the process dies before the
        // effect.
        "plain_ack_first" => {
            let mut messages = pull.messages().await.unwrap();
            let m = messages.next().await.unwrap().unwrap();
            m.double_ack().await.unwrap();
            hang_here::<()>().await;
        }
        // idem, same transaction: dies after the commit, before the ack.
        "idem_after_commit" => {
            let consumer = NatsConsumer::new(
                args.processor(&pool, order_id(), args.after_commit()),
                format!("{}.dead", args.source),
            );
            consumer
                .run(&js, &pull, futures::future::pending())
                .await
                .unwrap();
        }
        // idem, same transaction: dies after the write, before the commit.
        "idem_before_commit" => {
            let consumer = NatsConsumer::new(
                args.processor(&pool, order_id(), args.before_commit()),
                format!("{}.dead", args.source),
            );
            consumer
                .run(&js, &pull, futures::future::pending())
                .await
                .unwrap();
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// A stream (redelivering after 2 s) holding one message, `order`, and a ledger.
async fn one_message(what: &str, order: &str) -> (JsStream, Ledger) {
    let f = JsStream::create(what, WINDOW, ACK_WAIT).await;
    publish_order(&f, order, 1).await;
    (f, Ledger::create(what).await)
}

/// The idem consumer (same transaction) in this process, after the child died.
async fn guarded(f: &JsStream, ledger: &Ledger) -> Running {
    start_nats(
        f,
        processor(
            ledger.engine().await,
            order_id(),
            fast(1, 1),
            ledger.in_tx(),
        ),
    )
    .await
}

/// Killed after the effect committed and before the ack: the redelivery is skipped, 1 effect
/// (unguarded: the redelivery credits again, 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_commit_before_ack_redelivery_skipped() {
    let (plain_f, plain) = one_message("n_kill_after_plain", "order-5").await;
    run_child_until_point("plain_after_effect", &plain_f.name, &plain).await;
    common::kill::assert_effects(&plain, 1, "the child credited before it was killed").await;
    let mut messages = plain_f.consumer().await.messages().await.unwrap();
    let m = tokio::time::timeout(WAIT, messages.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    plain.credit_plain(&m.payload).await;
    m.ack().await.unwrap();
    assert_eq!(
        plain.rows().await,
        2,
        "unguarded: the redelivery credits twice"
    );
    drop(messages);
    plain.drop_all().await;
    plain_f.cleanup().await;

    let (f, ledger) = one_message("n_kill_after", "order-5").await;
    run_child_until_point("idem_after_commit", &f.name, &ledger).await;
    common::kill::assert_effects(&ledger, 1, "the child committed before it was killed").await;
    common::kill::assert_redelivery_skipped(guarded(&f, &ledger).await, &ledger).await;
    f.cleanup().await;
}

/// Killed after the write and before the commit: the transaction dies with the process and
/// the redelivery credits, 1 effect (unguarded, acking first: the message is gone, 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_commit_redelivery_runs() {
    let (plain_f, plain) = one_message("n_kill_before_plain", "order-6").await;
    run_child_until_point("plain_ack_first", &plain_f.name, &plain).await;
    let mut messages = plain_f.consumer().await.messages().await.unwrap();
    // Twice the ack wait: an unacknowledged message would be back by then.
    let again = tokio::time::timeout(ACK_WAIT * 2, messages.next()).await;
    assert!(again.is_err(), "unguarded: nothing is redelivered");
    common::kill::assert_effects(&plain, 0, "unguarded: acked before the effect, then lost").await;
    drop(messages);
    plain.drop_all().await;
    plain_f.cleanup().await;

    let (f, ledger) = one_message("n_kill_before", "order-6").await;
    run_child_until_point("idem_before_commit", &f.name, &ledger).await;
    common::kill::assert_redelivery_ran(guarded(&f, &ledger).await, &ledger).await;
    f.cleanup().await;
}
