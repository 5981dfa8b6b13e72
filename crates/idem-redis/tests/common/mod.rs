//! Test support: the shared local Redis, and the private `redis-server` instances and cluster
//! of `idem_testkit::redis_server`, each torn down even if the test panics or the process dies.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;
use std::time::Duration;

use idem_redis::{RedisConfig, RedisStore};

/// The shared server every developer machine and CI run has.
pub const LOCAL_URL: &str = "redis://127.0.0.1:6379";

/// A key prefix no other test or store instance uses.
pub fn unique_prefix() -> String {
    format!("idem-test:{}:", uuid::Uuid::now_v7().simple())
}

/// A configuration for the private `server`: a fresh key prefix and a 2 s operation timeout.
pub fn private_config(server: &Server) -> RedisConfig {
    RedisConfig::from_url(&server.url())
        .and_then(|c| c.prefix(unique_prefix()))
        .and_then(|c| c.op_timeout(Duration::from_secs(2)))
        .expect("config")
}

/// True when the shared Redis answers. In CI a missing server fails the test; elsewhere the
/// caller skips with a loud message.
pub fn local_redis_up() -> bool {
    let up = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:6379".parse().expect("addr"),
        Duration::from_millis(300),
    )
    .is_ok();
    if !up {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: Redis is not running on 127.0.0.1:6379"
        );
        eprintln!("!!! SKIPPING: no Redis on 127.0.0.1:6379 (set CI=1 to make this a failure)");
    }
    up
}

/// A store on `url` with a fresh prefix and the given op timeout.
pub async fn store_at(url: &str, op_timeout: Duration) -> RedisStore {
    let config = RedisConfig::from_url(url)
        .expect("url")
        .prefix(unique_prefix())
        .expect("prefix")
        .op_timeout(op_timeout)
        .expect("timeout");
    RedisStore::connect(config).await.expect("connect")
}

#[allow(unused_imports)] // each test binary uses some of them
pub use idem_testkit::redis_server::{Cluster, Server, redis_server_available, spare_port};

/// One cluster for the whole test binary, created by the first caller; its keepers tear it
/// down when the process exits.
pub fn shared_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(Cluster::start)
}

/// The conformance harness: stores on one server (or cluster), each with its own key prefix,
/// sharing one connection. Time passes by sleeping; leases are judged by the server's clock.
pub struct RedisHarness {
    conn: idem_redis::script::Connection,
    url: String,
    lease: Duration,
}

impl RedisHarness {
    /// A harness on the shared local Redis, or `None` (skipped loudly) when it is missing.
    pub async fn local() -> Option<Self> {
        if !local_redis_up() {
            return None;
        }
        Some(Self::connect(LOCAL_URL).await)
    }

    /// A harness on the private cluster of this test binary, or `None` without redis-server.
    pub async fn cluster() -> Option<Self> {
        if !redis_server_available() {
            return None;
        }
        let url = tokio::task::spawn_blocking(|| shared_cluster().url())
            .await
            .expect("start cluster");
        Some(Self::connect(&url).await)
    }

    async fn connect(url: &str) -> Self {
        let store = store_at(url, Duration::from_millis(500)).await;
        Self {
            conn: store.connection().clone(),
            url: url.to_owned(),
            lease: Duration::from_millis(600),
        }
    }
}

impl idem_testkit::Harness for RedisHarness {
    type Store = RedisStore;

    fn store_at(
        &self,
        level: idem_core::AuditLevel,
    ) -> impl std::future::Future<Output = RedisStore> + Send {
        let config = RedisConfig::from_url(&self.url)
            .and_then(|c| c.prefix(unique_prefix()))
            .and_then(|c| c.op_timeout(Duration::from_millis(500)))
            .expect("config")
            .audit_level(level);
        std::future::ready(RedisStore::with_connection(self.conn.clone(), config))
    }

    fn advance(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
        idem_testkit::sleep_for(d)
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}
