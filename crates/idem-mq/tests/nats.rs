//! The consumer against the local NATS JetStream (4222): every test has its own stream
//! (deleted at the end). Each fault test first runs an unguarded consumer, written here, and
//! shows the property fails without idem; then the idem consumer keeps it.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use common::*;
use futures::StreamExt;
use idem_core::key_source::KeySources;
use idem_core::{Key, ScopedKey, StateKind, Store};
use idem_mq::nats::{NatsConsumer, NatsPublisher, default_keys};
use idem_mq::{Handled, HandlerError, Message, Processor, Stats, Work};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

struct Fixture {
    client: async_nats::Client,
    js: Context,
    name: String,
}

impl Fixture {
    async fn new(what: &str, window: Duration) -> Self {
        Self::with_ack_wait(what, window, Duration::from_secs(10)).await
    }

    async fn with_ack_wait(what: &str, window: Duration, ack_wait: Duration) -> Self {
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let js = jetstream::new(client.clone());
        let name = unique(what);
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            duplicate_window: window,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
        let f = Self { client, js, name };
        f.js.get_stream_no_info(&f.name)
            .await
            .unwrap()
            .create_consumer(pull::Config {
                durable_name: Some("work".into()),
                filter_subject: f.subject(),
                ack_policy: AckPolicy::Explicit,
                max_deliver: -1,
                max_ack_pending: 256,
                ack_wait,
                ..Default::default()
            })
            .await
            .unwrap();
        f
    }

    fn stream_name(&self) -> &str {
        &self.name
    }

    fn subject(&self) -> String {
        format!("{}.in", self.name)
    }

    fn dead(&self) -> String {
        format!("{}.dead", self.name)
    }

    async fn consumer(&self) -> PullConsumer {
        self.js
            .get_stream_no_info(&self.name)
            .await
            .unwrap()
            .get_consumer("work")
            .await
            .unwrap()
    }

    /// Publishes without `Nats-Msg-Id` (the server would drop the copies), the key in an
    /// `order-id` header.
    async fn publish_plain(&self, order: &str, payload: &str) {
        let mut h = HeaderMap::new();
        h.insert("order-id", order);
        self.js
            .publish_with_headers(self.subject(), h, Bytes::from(payload.to_owned()))
            .await
            .unwrap()
            .await
            .unwrap();
    }

    async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

struct Running<S, W> {
    consumer: Arc<NatsConsumer<S, W>>,
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

async fn start<S: Store, W: Work<S>>(f: &Fixture, processor: Processor<S, W>) -> Running<S, W> {
    let consumer = Arc::new(NatsConsumer::new(processor, f.dead()));
    let (stop, stopped) = oneshot::channel::<()>();
    let c = Arc::clone(&consumer);
    let js = f.js.clone();
    let pull = f.consumer().await;
    let task = tokio::spawn(async move {
        c.run(&js, &pull, async move {
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

fn counter(
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

/// Without idem: acks after running each message.
fn unguarded(pull: PullConsumer, count: Arc<AtomicU64>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut messages = pull.messages().await.unwrap();
        while let Some(Ok(m)) = messages.next().await {
            count.fetch_add(1, Ordering::SeqCst);
            m.ack().await.unwrap();
        }
    })
}

fn sum(stats: &[&Arc<Stats>], f: impl Fn(&Stats) -> &AtomicU64) -> u64 {
    stats.iter().map(|s| Stats::get(f(s))).sum()
}

/// The same message published 100 times, 4 consumers on one durable consumer: 1 effect
/// (unguarded: 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_copies_four_consumers_one_effect() {
    let plain = Fixture::new("n_plain", Duration::from_secs(1)).await;
    for _ in 0..100 {
        plain.publish_plain("order-1", "order-1").await;
    }
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(unguarded(plain.consumer().await, Arc::clone(&count)));
    }
    assert!(eventually(WAIT, || async { count.load(Ordering::SeqCst) == 100 }).await);
    tasks.iter().for_each(JoinHandle::abort);
    plain.cleanup().await;

    let f = Fixture::new("n_hundred", Duration::from_secs(1)).await;
    for _ in 0..100 {
        f.publish_plain("order-1", "order-1").await;
    }
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(f.stream_name()).await;
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let mut running = Vec::new();
    for _ in 0..4 {
        let p = Processor::new(
            engine.clone(),
            scope("orders.paid"),
            keys.clone(),
            fast(16, 8),
            counter(Arc::clone(&effects), Duration::from_millis(5)),
        );
        running.push(start(&f, p).await);
    }
    let stats: Vec<_> = running.iter().map(|r| r.stats()).collect();
    assert!(eventually(WAIT, || async { sum(&stats, |s| &s.acked) == 100 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&stats, |s| &s.replayed), 99);
    for r in running {
        r.stop().await;
    }
    f.cleanup().await;
}

/// `Nats-Msg-Id` dedup covers only the stream's window: a copy published after it is stored
/// again, and the consumer's engine skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_window_then_consumer_dedup() {
    let f = Fixture::new("n_window", Duration::from_millis(300)).await;
    let publisher = NatsPublisher::new(f.js.clone());
    let key = Key::new("order-77").unwrap();
    let first = publisher
        .publish(&f.subject(), &key, "order-77".into(), HeaderMap::new())
        .await
        .unwrap();
    let second = publisher
        .publish(&f.subject(), &key, "order-77".into(), HeaderMap::new())
        .await
        .unwrap();
    assert!(
        !first && second,
        "inside the window the server drops the repeat"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let third = publisher
        .publish(&f.subject(), &key, "order-77".into(), HeaderMap::new())
        .await
        .unwrap();
    assert!(!third, "after the window the server stores it again");

    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(f.stream_name()).await;
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        default_keys(),
        fast(4, 4),
        counter(Arc::clone(&effects), Duration::ZERO),
    );
    let running = start(&f, p).await;
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
    let plain = Fixture::new("n_conc_plain", Duration::from_secs(1)).await;
    plain.publish_plain("pay-7", "pay-7").await;
    plain.publish_plain("pay-7", "pay-7").await;
    let count = Arc::new(AtomicU64::new(0));
    let t = [
        unguarded(plain.consumer().await, Arc::clone(&count)),
        unguarded(plain.consumer().await, Arc::clone(&count)),
    ];
    assert!(eventually(WAIT, || async { count.load(Ordering::SeqCst) == 2 }).await);
    t.iter().for_each(JoinHandle::abort);
    plain.cleanup().await;

    let f = Fixture::new("n_conc", Duration::from_secs(1)).await;
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(f.stream_name()).await;
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let mut running = Vec::new();
    for _ in 0..2 {
        let p = Processor::new(
            engine.clone(),
            scope("orders.paid"),
            keys.clone(),
            fast(1, 1),
            counter(Arc::clone(&effects), Duration::from_millis(300)),
        );
        running.push(start(&f, p).await);
    }
    f.publish_plain("pay-7", "pay-7").await;
    f.publish_plain("pay-7", "pay-7").await;
    let stats: Vec<_> = running.iter().map(|r| r.stats()).collect();
    assert!(eventually(WAIT, || async { sum(&stats, |s| &s.acked) == 2 }).await);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(sum(&stats, |s| &s.replayed), 1);
    for r in running {
        r.stop().await;
    }
    f.cleanup().await;
}

/// A poison message goes to the dead-letter subject after `max_attempts` deliveries, with
/// its record left unknown; the others keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_dead_lettered_others_flow() {
    let f = Fixture::new("n_poison", Duration::from_secs(1)).await;
    let mut dead = f.client.subscribe(f.dead()).await.unwrap();
    let engine = redis_engine(f.stream_name()).await;
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
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let p = Processor::new(
        engine.clone(),
        scope("orders.paid"),
        keys,
        fast(1, 1),
        handler,
    );
    let running = start(&f, p).await;
    f.publish_plain("poison", "poison").await;
    for i in 0..5 {
        f.publish_plain(&format!("ok-{i}"), &format!("ok-{i}"))
            .await;
    }
    let letter = match tokio::time::timeout(WAIT, dead.next()).await {
        Ok(l) => l.unwrap(),
        Err(_) => {
            let s = running.stats();
            panic!(
                "no dead letter: attempts {}, ok {}, retried {}, dead {}, in flight {}, store {}, acked {}",
                attempts.load(Ordering::SeqCst),
                ok.load(Ordering::SeqCst),
                Stats::get(&s.retried),
                Stats::get(&s.dead_lettered),
                Stats::get(&s.in_flight),
                Stats::get(&s.store_unavailable),
                Stats::get(&s.acked)
            )
        }
    };
    let reason = letter
        .headers
        .as_ref()
        .and_then(|h| h.get("x-idem-reason"))
        .map(|v| v.as_str().to_owned());
    assert_eq!(reason.as_deref(), Some("exhausted"));
    assert!(eventually(WAIT, || async { ok.load(Ordering::SeqCst) == 5 }).await);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
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
    running.stop().await;
    f.cleanup().await;
}

/// The store down while messages arrive: nothing runs, nothing is acknowledged; after it
/// comes back each message takes effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_no_effect_no_ack_then_once_each() {
    let mut redis = PrivateRedis::start();
    let f = Fixture::new("n_down", Duration::from_secs(1)).await;
    let engine = redis_engine_at(&redis.url(), f.stream_name()).await;
    redis.kill();
    let effects = Arc::new(AtomicU64::new(0));
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        keys,
        fast(4, 4),
        counter(Arc::clone(&effects), Duration::ZERO),
    );
    let running = start(&f, p).await;
    for i in 0..3 {
        f.publish_plain(&format!("m-{i}"), &format!("m-{i}")).await;
    }
    f.publish_plain("m-0", "m-0").await;
    assert!(
        eventually(WAIT, || async {
            Stats::get(&running.stats().store_unavailable) >= 8
        })
        .await
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert_eq!(Stats::get(&running.stats().acked), 0);
    redis.restart();
    // The store's connection comes back on its own reconnect schedule.
    let recovered = eventually(Duration::from_secs(60), || async {
        Stats::get(&running.stats().acked) >= 4
    })
    .await;
    assert!(
        recovered,
        "acked {} of 4",
        Stats::get(&running.stats().acked)
    );
    assert_eq!(effects.load(Ordering::SeqCst), 3);
    running.stop().await;
    f.cleanup().await;
}

// ---- Kill scenarios, in process: the consumer task is aborted at the chosen point, with no
// clean shutdown and no ack; the server redelivers after the consumer's `ack_wait` (2 s).
// (The RabbitMQ tests kill a child process instead.)

/// Runs the inner work, then reports and never returns (so never acks).
struct HangAfter<W>(W, Arc<tokio::sync::Notify>);

impl<S: Store, W: Work<S>> Work<S> for HangAfter<W> {
    async fn run(
        &self,
        engine: &idem_core::Engine<S>,
        key: &ScopedKey,
        fingerprint: &idem_core::Fingerprint,
        message: &Message,
    ) -> idem_mq::RunResult {
        let _ = self.0.run(engine, key, fingerprint, message).await;
        self.1.notify_one();
        futures::future::pending().await
    }
}

fn in_tx(ledger: &Ledger) -> idem_mq::InTx<idem_sql::PgStore> {
    let l = ledger.ledger.clone();
    idem_mq::InTx::new(tx_handler(move |tx, m| {
        let l = l.clone();
        Box::pin(async move { credit(tx, &l, m).await })
    }))
}

async fn insert_plain(ledger: &Ledger, payload: &[u8]) {
    sqlx::query(&format!(
        "INSERT INTO {} (order_id, amount) VALUES ($1, 100)",
        ledger.ledger
    ))
    .bind(String::from_utf8_lossy(payload).into_owned())
    .execute(&ledger.pool)
    .await
    .unwrap();
}

/// Aborted after the commit and before the ack: the redelivery is skipped, 1 effect
/// (unguarded: the redelivery credits again, 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_after_commit_before_ack_redelivery_skipped() {
    let plain = Ledger::create("n_after_plain").await;
    let f = Fixture::with_ack_wait(
        "n_after_plain",
        Duration::from_secs(1),
        Duration::from_secs(2),
    )
    .await;
    f.publish_plain("order-5", "order-5").await;
    let pull = f.consumer().await;
    let mut messages = pull.messages().await.unwrap();
    let m = messages.next().await.unwrap().unwrap();
    insert_plain(&plain, &m.payload).await;
    drop(messages); // "killed": no ack
    let mut messages = pull.messages().await.unwrap();
    let m = tokio::time::timeout(WAIT, messages.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    insert_plain(&plain, &m.payload).await;
    m.ack().await.unwrap();
    assert_eq!(
        plain.rows().await,
        2,
        "unguarded: the redelivery credits twice"
    );
    drop(messages);
    plain.drop_all().await;
    f.cleanup().await;

    let ledger = Ledger::create("n_after").await;
    let f = Fixture::with_ack_wait("n_after", Duration::from_secs(1), Duration::from_secs(2)).await;
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let engine = idem_core::Engine::new(ledger.store().await, idem_core::Policy::default());
    let reached = Arc::new(tokio::sync::Notify::new());
    let p = Processor::new(
        engine.clone(),
        scope("orders.paid"),
        keys.clone(),
        fast(1, 1),
        HangAfter(in_tx(&ledger), Arc::clone(&reached)),
    );
    let doomed = start(&f, p).await;
    f.publish_plain("order-5", "order-5").await;
    tokio::time::timeout(WAIT, reached.notified())
        .await
        .unwrap();
    doomed.task.abort();
    assert_eq!(ledger.rows().await, 1, "committed before the abort");
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        keys,
        fast(1, 1),
        in_tx(&ledger),
    );
    let running = start(&f, p).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 1 }).await);
    assert_eq!(
        Stats::get(&running.stats().replayed),
        1,
        "the redelivery was skipped"
    );
    assert_eq!(ledger.rows().await, 1);
    running.stop().await;
    ledger.drop_all().await;
    f.cleanup().await;
}

/// Aborted after the write and before the commit: the transaction rolls back and the
/// redelivery credits, 1 effect (unguarded, acking first: the message is gone, 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_before_commit_redelivery_runs() {
    let plain = Ledger::create("n_before_plain").await;
    let f = Fixture::with_ack_wait(
        "n_before_plain",
        Duration::from_secs(1),
        Duration::from_secs(2),
    )
    .await;
    f.publish_plain("order-6", "order-6").await;
    let pull = f.consumer().await;
    let mut messages = pull.messages().await.unwrap();
    let m = messages.next().await.unwrap().unwrap();
    m.double_ack().await.unwrap(); // acked first, then "killed" before the effect
    drop(messages);
    let mut messages = pull.messages().await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(4), messages.next()).await;
    assert!(again.is_err(), "unguarded: nothing is redelivered");
    assert_eq!(
        plain.rows().await,
        0,
        "unguarded: acked before the effect, then lost"
    );
    drop(messages);
    plain.drop_all().await;
    f.cleanup().await;

    let ledger = Ledger::create("n_before").await;
    let f =
        Fixture::with_ack_wait("n_before", Duration::from_secs(1), Duration::from_secs(2)).await;
    let keys = KeySources::parse(&["header:order-id"]).unwrap();
    let engine = idem_core::Engine::new(ledger.store().await, idem_core::Policy::default());
    let reached = Arc::new(tokio::sync::Notify::new());
    let (l, r) = (ledger.ledger.clone(), Arc::clone(&reached));
    let hang = idem_mq::InTx::new(tx_handler(move |tx, m| {
        let (l, r) = (l.clone(), Arc::clone(&r));
        Box::pin(async move {
            credit(tx, &l, m).await?;
            r.notify_one();
            futures::future::pending::<()>().await;
            Ok(())
        })
    }));
    let p = Processor::new(
        engine.clone(),
        scope("orders.paid"),
        keys.clone(),
        fast(1, 1),
        hang,
    );
    let doomed = start(&f, p).await;
    f.publish_plain("order-6", "order-6").await;
    tokio::time::timeout(WAIT, reached.notified())
        .await
        .unwrap();
    doomed.task.abort();
    let p = Processor::new(
        engine,
        scope("orders.paid"),
        keys,
        fast(1, 1),
        in_tx(&ledger),
    );
    let running = start(&f, p).await;
    assert!(eventually(WAIT, || async { Stats::get(&running.stats().acked) == 1 }).await);
    assert_eq!(
        Stats::get(&running.stats().executed),
        1,
        "the redelivery ran"
    );
    assert_eq!(ledger.rows().await, 1);
    running.stop().await;
    ledger.drop_all().await;
    f.cleanup().await;
}
