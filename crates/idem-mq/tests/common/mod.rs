//! Shared by the broker tests: the broker fixtures (from idem-testkit), stores, a PostgreSQL
//! ledger, a private `redis-server`, a consumer running in the background, counting handlers,
//! the consumers without idem that each fault test first shows failing, and the child
//! processes the kill tests SIGKILL.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

pub mod kill;
pub mod outage;
pub mod unguarded;

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use idem_core::{Engine, Policy, Scope, Store};
use idem_mq::nats::NatsConsumer;
use idem_mq::rabbitmq::RabbitConsumer;
use idem_mq::{
    ConsumerConfig, Handled, HandlerError, InTx, Job, Message, Processor, RunResult, Stats, Work,
};
use idem_redis::{RedisConfig, RedisStore};
use idem_sql::PgStore;
#[allow(unused_imports)] // Each test file uses its broker's.
pub use idem_testkit::brokers::{
    JsStream, amqp, declare_queue, eventually, publish_with_id, queue_ready,
};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
/// How long a test waits for what it expects.
pub const WAIT: Duration = Duration::from_secs(20);

/// A name no other test (or run) uses.
pub fn unique(what: &str) -> String {
    idem_testkit::brokers::unique("mq", what)
}

/// Short delays so a test takes seconds.
pub fn fast(prefetch: u16, concurrency: usize) -> ConsumerConfig {
    ConsumerConfig {
        max_attempts: 3,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        in_flight_delay: Duration::from_millis(100),
        store_retry_delay: Duration::from_millis(100),
        prefetch,
        concurrency,
        ..ConsumerConfig::default()
    }
}

pub fn scope(name: &str) -> Scope {
    Scope::new(name).unwrap()
}

pub async fn redis_engine(prefix: &str) -> Engine<RedisStore> {
    redis_engine_at(REDIS_URL, prefix).await
}

pub async fn redis_engine_at(url: &str, prefix: &str) -> Engine<RedisStore> {
    redis_engine_with(url, prefix, Policy::default()).await
}

pub async fn redis_engine_with(url: &str, prefix: &str, policy: Policy) -> Engine<RedisStore> {
    let config = RedisConfig::from_url(url)
        .unwrap()
        .prefix(format!("{prefix}:"))
        .unwrap();
    let store = RedisStore::connect(config).await.unwrap();
    Engine::new(store, policy)
}

/// A processor in scope `orders.paid` with the given key sources.
pub fn processor<S: Store, W: Work<S>>(
    engine: Engine<S>,
    keys: idem_core::key_source::KeySources,
    config: ConsumerConfig,
    work: W,
) -> Processor<S, W> {
    Processor::new(engine, scope("orders.paid"), keys, config, work)
}

/// The state of `key`'s record in scope `orders.paid`, if there is one.
pub async fn state_of<S: Store>(engine: &Engine<S>, key: &str) -> Option<idem_core::StateKind> {
    let key = idem_core::ScopedKey::new(scope("orders.paid"), idem_core::Key::new(key).unwrap());
    engine
        .store()
        .get(&key)
        .await
        .unwrap()
        .map(|r| r.state.kind())
}

/// A consumer running in a task of this process.
pub struct Running {
    stats: Arc<Stats>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Graceful shutdown: finishes what is in progress.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

/// Runs `processor` on `queue` until stopped.
pub fn start_rabbit<S: Store, W: Work<S>>(
    conn: &Arc<lapin::Connection>,
    processor: Processor<S, W>,
    queue: &str,
) -> Running {
    let consumer = RabbitConsumer::new(processor, queue);
    let stats = Arc::clone(consumer.processor().stats());
    let (stop, stopped) = oneshot::channel::<()>();
    let conn = Arc::clone(conn);
    let task = tokio::spawn(async move {
        consumer
            .run(&conn, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Running { stats, stop, task }
}

/// An idem consumer of `queue` with `keys` and `config`, on a Redis engine prefixed with the
/// queue's name, whose handler counts each run after `pause`: the count and the consumer.
pub async fn counting_rabbit(
    conn: &Arc<lapin::Connection>,
    queue: &str,
    keys: idem_core::key_source::KeySources,
    config: ConsumerConfig,
    pause: Duration,
) -> (Arc<AtomicU64>, Running) {
    let (effects, mut running) = counting_rabbits(conn, queue, 1, keys, config, pause).await;
    (effects, running.remove(0))
}

/// `n` idem consumers of `queue` as [`counting_rabbit`] starts one, sharing one engine and
/// one count.
pub async fn counting_rabbits(
    conn: &Arc<lapin::Connection>,
    queue: &str,
    n: usize,
    keys: idem_core::key_source::KeySources,
    config: ConsumerConfig,
    pause: Duration,
) -> (Arc<AtomicU64>, Vec<Running>) {
    counting_consumers(queue, n, keys, config, pause, |p| {
        std::future::ready(start_rabbit(conn, p, queue))
    })
    .await
}

/// `n` idem consumers of the stream with `keys` and `config`, sharing a Redis engine
/// prefixed with the stream's name, whose handlers count each run after `pause`: the count
/// and the consumers.
pub async fn counting_nats(
    f: &JsStream,
    n: usize,
    keys: idem_core::key_source::KeySources,
    config: ConsumerConfig,
    pause: Duration,
) -> (Arc<AtomicU64>, Vec<Running>) {
    counting_consumers(&f.name, n, keys, config, pause, |p| start_nats(f, p)).await
}

/// `n` processors with `keys` and `config` on one Redis engine prefixed with `prefix`, whose
/// handlers count each run after `pause`, each handed to `start`: the count and the
/// consumers.
async fn counting_consumers<F, Fut>(
    prefix: &str,
    n: usize,
    keys: idem_core::key_source::KeySources,
    config: ConsumerConfig,
    pause: Duration,
    mut start: F,
) -> (Arc<AtomicU64>, Vec<Running>)
where
    F: FnMut(Processor<RedisStore, Handled<BoxHandler>>) -> Fut,
    Fut: Future<Output = Running>,
{
    let effects = Arc::new(AtomicU64::new(0));
    let engine = redis_engine(prefix).await;
    let mut running = Vec::with_capacity(n);
    for _ in 0..n {
        let work = counting(Arc::clone(&effects), pause);
        let processor = processor(engine.clone(), keys.clone(), config.clone(), work);
        running.push(start(processor).await);
    }
    (effects, running)
}

/// Runs `processor` on the stream's `work` consumer until stopped; dead letters go to the
/// stream's dead subject.
pub async fn start_nats<S: Store, W: Work<S>>(f: &JsStream, processor: Processor<S, W>) -> Running {
    let consumer = NatsConsumer::new(processor, f.dead());
    let stats = Arc::clone(consumer.processor().stats());
    let (stop, stopped) = oneshot::channel::<()>();
    let js = f.js.clone();
    let pull = f.consumer().await;
    let task = tokio::spawn(async move {
        consumer
            .run(&js, &pull, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Running { stats, stop, task }
}

/// The sum of one counter over several consumers.
pub fn sum(running: &[Running], f: impl Fn(&Stats) -> &AtomicU64) -> u64 {
    running.iter().map(|r| Stats::get(f(r.stats()))).sum()
}

/// Work that runs `W`, then hands what it answered to `A`, whose answer the processor sees:
/// the kill tests hang there, the outage tests paper over store failures there.
pub struct Then<W, A>(pub W, pub A);

/// What [`Then`] does once its inner work `W` answered.
pub trait After<W>: Send + Sync + 'static {
    /// What the processor is told `message` came to, given that `inner` answered `result`.
    fn after(
        &self,
        inner: &W,
        result: RunResult,
        message: &Message,
    ) -> impl Future<Output = RunResult> + Send;
}

impl<S: Store, W: Work<S>, A: After<W>> Work<S> for Then<W, A> {
    async fn run(&self, engine: &Engine<S>, job: &Job<'_>) -> RunResult {
        let result = self.0.run(engine, job).await;
        self.1.after(&self.0, result, job.message).await
    }
}

/// A boxed message handler, as `Handled` takes it.
pub type BoxHandler =
    Box<dyn Fn(Message) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync>;

/// Counts each run in `count` after `pause`.
pub fn counting(count: Arc<AtomicU64>, pause: Duration) -> Handled<BoxHandler> {
    Handled(Box::new(move |_m: Message| {
        let count = Arc::clone(&count);
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }))
}

/// Fails every run of the payload `poison` (retryable), counting it in `attempts`; counts
/// every other run in `ok`.
pub fn poison_aware(ok: Arc<AtomicU64>, attempts: Arc<AtomicU64>) -> Handled<BoxHandler> {
    Handled(Box::new(move |m: Message| {
        let (ok, attempts) = (Arc::clone(&ok), Arc::clone(&attempts));
        Box::pin(async move {
            if m.payload().as_ref() == b"poison" {
                attempts.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::Retry("cannot parse".into()))
            } else {
                ok.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    }))
}

/// The records' table and the ledger the handlers credit, both unique to the test.
pub struct Ledger {
    pub pool: PgPool,
    pub records: String,
    pub ledger: String,
}

impl Ledger {
    pub async fn create(what: &str) -> Self {
        let pool = PgPool::connect(PG_URL).await.unwrap();
        let ledger = unique(&format!("{what}_l"));
        sqlx::query(&format!(
            "CREATE TABLE {ledger} (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, amount BIGINT NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let me = Self {
            pool,
            records: unique("rec"),
            ledger,
        };
        me.store().await; // migrated before any child process uses the table
        me
    }

    pub async fn store(&self) -> PgStore {
        let store = PgStore::with_table(self.pool.clone(), &self.records).unwrap();
        store.migrate().await.unwrap();
        store
    }

    pub async fn engine(&self) -> Engine<PgStore> {
        Engine::new(self.store().await, Policy::default())
    }

    pub async fn rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.ledger))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Credits `payload` outside any inbox: what a consumer without idem does.
    pub async fn credit_plain(&self, payload: &[u8]) {
        sqlx::query(&format!(
            "INSERT INTO {} (order_id, amount) VALUES ($1, 100)",
            self.ledger
        ))
        .bind(String::from_utf8_lossy(payload).into_owned())
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Same-transaction work: one ledger row per message, in the inbox's transaction.
    pub fn in_tx(&self) -> InTx<PgStore> {
        let l = self.ledger.clone();
        InTx::new(tx_handler(move |tx, m| {
            let l = l.clone();
            Box::pin(async move { credit(tx, &l, m).await })
        }))
    }

    pub async fn drop_all(&self) {
        // The store keeps its audit trail in `<records>_audit`.
        let audit = format!("{}_audit", self.records);
        for t in [&self.ledger, &self.records, &audit] {
            let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(&self.pool)
                .await;
        }
    }
}

/// Inserts one ledger row for the message's payload on `tx`.
pub async fn credit(
    tx: &mut Transaction<'static, Postgres>,
    ledger: &str,
    message: &Message,
) -> Result<(), HandlerError> {
    let order = String::from_utf8_lossy(message.payload()).into_owned();
    sqlx::query(&format!(
        "INSERT INTO {ledger} (order_id, amount) VALUES ($1, 100)"
    ))
    .bind(order)
    .execute(&mut **tx)
    .await
    .map(drop)
    .map_err(|e| HandlerError::Retry(e.to_string()))
}

/// Pins a closure to the higher-ranked signature `InTx` wants.
pub fn tx_handler<F>(f: F) -> F
where
    F: for<'c> Fn(
            &'c mut Transaction<'static, Postgres>,
            &'c Message,
        ) -> BoxFuture<'c, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    f
}

/// A private `redis-server` (no persistence) on a spare loopback port that can be stopped
/// and started again on the same port (empty); killed on drop.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        let mut me = Self {
            port: idem_testkit::redis_server::spare_port(),
            child: None,
        };
        me.restart();
        me
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it again on the same port (empty).
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < until, "private redis did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs per payload, shared with the test.
pub type PerKey = Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>;

/// Counts each run per payload in `seen`.
pub fn per_payload(seen: &PerKey) -> Handled<BoxHandler> {
    let seen = Arc::clone(seen);
    Handled(Box::new(move |m: Message| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let k = String::from_utf8_lossy(m.payload()).into_owned();
            *seen.lock().unwrap().entry(k).or_default() += 1;
            Ok(())
        })
    }))
}
