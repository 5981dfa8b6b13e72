//! Shared by the broker tests: connections to the local servers, unique names, stores, a
//! PostgreSQL ledger, a private `redis-server`, and waiting for a condition.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::future::Future;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use idem_core::{Engine, Policy, Scope};
use idem_mq::{ConsumerConfig, HandlerError, Message};
use idem_redis::{RedisConfig, RedisStore};
use idem_sql::PgStore;
use sqlx::{PgPool, Postgres, Transaction};

pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const NATS_URL: &str = "127.0.0.1:4222";
pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// A name no other test (or run) uses.
pub fn unique(what: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("mq_{what}_{}", &id[..16])
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
    let config = RedisConfig::from_url(url)
        .unwrap()
        .prefix(format!("{prefix}:"))
        .unwrap();
    let store = RedisStore::connect(config).await.unwrap();
    Engine::new(store, Policy::default())
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
        Self {
            pool,
            records: unique("rec"),
            ledger,
        }
    }

    pub async fn store(&self) -> PgStore {
        let store = PgStore::with_table(self.pool.clone(), &self.records).unwrap();
        store.migrate().await.unwrap();
        store
    }

    pub async fn rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.ledger))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn drop_all(&self) {
        for t in [&self.ledger, &self.records] {
            let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(&self.pool)
                .await;
        }
    }
}

/// Inserts one ledger row for the message's `order` field (or its payload) on `tx`.
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

/// Waits until `check` holds, for at most `limit`; returns whether it did.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spare_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private `redis-server` (no persistence) on a spare loopback port; killed on drop.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        let mut me = Self {
            port: spare_port(),
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
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
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
