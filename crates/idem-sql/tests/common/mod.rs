//! Harnesses for the conformance suite and helpers shared by the integration tests: each
//! harness works in its own table (random suffix) and drops it when dropped.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use idem_core::AuditLevel;
use idem_sql::{MySqlStore, PgStore, SqliteStore};
use idem_testkit::{Harness, sleep_for};
use sqlx::Connection as _;

/// Lease used against real servers: long enough for a few round trips on a loaded 2-core box.
/// (At 600 ms the list-age rule, whose margin is half a lease, failed once in about ten runs
/// while 31 conformance tests shared the two cores.)
pub const LEASE: Duration = Duration::from_secs(1);

/// The model test's time step: its tolerance is half a step, which must cover a case's round
/// trips on a busy machine.
pub const MODEL_STEP: Duration = Duration::from_millis(300);

pub fn pg_url() -> String {
    std::env::var("IDEM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub fn mysql_url() -> String {
    std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A table name nobody else uses: the whole owner id, whose high half is random per process
/// (its low half alone is a per-process counter, which two test processes share).
pub fn unique_table(prefix: &str) -> String {
    format!("{prefix}_{:032x}", idem_core::OwnerId::random().0)
}

pub use idem_testkit::services::missing;

/// Runs `f` to completion on a private runtime in another thread (for teardown in `Drop`).
fn blocking<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(f());
        }
    })
    .join();
}

/// `Harness` for a harness type whose `store` field is a `$store`: stores at other audit
/// levels are copies of it, time passes for real, with [`LEASE`] and [`MODEL_STEP`].
macro_rules! real_time_harness {
    ($harness:ty, $store:ty) => {
        impl Harness for $harness {
            type Store = $store;
            fn store_at(&self, level: AuditLevel) -> impl Future<Output = $store> + Send {
                std::future::ready(self.store.clone().with_audit_level(level))
            }
            fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
                sleep_for(d)
            }
            fn lease(&self) -> Duration {
                LEASE
            }
            fn model_step(&self) -> Duration {
                MODEL_STEP
            }
        }
    };
}

/// A PostgreSQL store on its own table.
#[derive(Debug)]
pub struct PgHarness {
    pub store: PgStore,
    url: String,
}

impl PgHarness {
    pub async fn connect() -> Option<Self> {
        Self::with_connections(16).await
    }

    /// A harness whose store has `n` connections: with few of them, concurrent operations
    /// wait for one and are committed in groups.
    pub async fn with_connections(n: u32) -> Option<Self> {
        let url = pg_url();
        let store = match PgStore::connect(&url, n).await {
            Ok(s) => s,
            Err(e) => {
                missing("PostgreSQL", &e);
                return None;
            }
        };
        let store =
            PgStore::with_table(store.pool().clone(), &unique_table("idem_t")).expect("table name");
        store.migrate().await.expect("migrate");
        Some(Self { store, url })
    }
}

impl Drop for PgHarness {
    fn drop(&mut self) {
        let (url, table) = (self.url.clone(), self.store.table().to_string());
        blocking(move || async move {
            if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                // The audit table and its trigger function go with the records, and so does the
                // ledger of the same-transaction tests (`<table>_ledger`). The wait for
                // locks is bounded: this runs from `Drop`, blocking the test's thread, and a
                // lock held by a connection of that runtime would otherwise never be freed.
                let _ = sqlx::raw_sql(&format!(
                    "SET lock_timeout = '10s'; \
                     DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_audit; \
                     DROP TABLE IF EXISTS {table}_ledger; \
                     DROP FUNCTION IF EXISTS {table}_audit_fn()"
                ))
                .execute(&mut c)
                .await;
            }
        });
    }
}

real_time_harness!(PgHarness, PgStore);

/// A MySQL/MariaDB store on its own table.
#[derive(Debug)]
pub struct MySqlHarness {
    pub store: MySqlStore,
    url: String,
}

impl MySqlHarness {
    /// A harness whose store claims with the portable upsert-then-read transaction (MySQL 8's
    /// path), forced on a server that would take the one-statement claim.
    pub async fn connect_then_read() -> Option<Self> {
        let mut h = Self::connect().await?;
        h.store = h.store.clone().with_claim_then_read();
        Some(h)
    }

    pub async fn connect() -> Option<Self> {
        let url = mysql_url();
        let store = match MySqlStore::connect(&url, 16).await {
            Ok(s) => s,
            Err(e) => {
                missing("MariaDB/MySQL", &e);
                return None;
            }
        };
        let store = MySqlStore::with_table(store.pool().clone(), &unique_table("idem_t"))
            .expect("table name");
        store.migrate().await.expect("migrate");
        Some(Self { store, url })
    }
}

impl Drop for MySqlHarness {
    fn drop(&mut self) {
        let (url, table) = (self.url.clone(), self.store.table().to_string());
        blocking(move || async move {
            if let Ok(mut c) = sqlx::MySqlConnection::connect(&url).await {
                // Bounded wait for locks, as for PostgreSQL above.
                let _ = sqlx::raw_sql(&format!(
                    "SET SESSION lock_wait_timeout = 10; \
                     DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_audit"
                ))
                .execute(&mut c)
                .await;
            }
        });
    }
}

real_time_harness!(MySqlHarness, MySqlStore);

/// A SQLite store in its own temporary file.
#[derive(Debug)]
pub struct SqliteHarness {
    pub store: SqliteStore,
    pub path: std::path::PathBuf,
}

impl SqliteHarness {
    pub async fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}.db", unique_table("idem_sqlite_test")));
        let store = SqliteStore::open(&path).await.expect("open sqlite");
        store.migrate().await.expect("migrate");
        Self { store, path }
    }
}

impl Drop for SqliteHarness {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

real_time_harness!(SqliteHarness, SqliteStore);

/// A pool of `n` connections to the test PostgreSQL server; `None` when it is unreachable
/// (reported by [`missing`]).
pub async fn pg_pool(n: u32) -> Option<sqlx::PgPool> {
    match sqlx::postgres::PgPoolOptions::new()
        .max_connections(n)
        .connect(&pg_url())
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            missing("PostgreSQL", &e);
            None
        }
    }
}

/// A pool of `n` connections to the test MariaDB server; `None` when it is unreachable
/// (reported by [`missing`]).
pub async fn mysql_pool(n: u32) -> Option<sqlx::MySqlPool> {
    match sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(n)
        .connect(&mysql_url())
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            missing("MariaDB", &e);
            None
        }
    }
}

/// A claim of `key` in namespace `ns` by a fresh owner, fingerprint of `"x"`, no request id.
pub fn claim_req(
    ns: &str,
    key: &str,
    lease: Duration,
    ttl: Duration,
    takeover: idem_core::TakeoverPolicy,
) -> idem_core::ClaimRequest {
    idem_core::ClaimRequest {
        key: idem_core::ScopedKey::new(
            idem_core::Scope::new(ns).expect("ns"),
            idem_core::Key::new(key).expect("key"),
        ),
        fingerprint: idem_core::Fingerprint::of_bytes(1, b"x"),
        owner: idem_core::OwnerId::random(),
        lease,
        ttl,
        takeover,
        request_id: None,
    }
}
