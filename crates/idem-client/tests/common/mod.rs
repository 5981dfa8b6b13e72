//! A counting gRPC service behind idem-grpc's layer on a real tonic server over loopback, on
//! the store a test picks (memory; Redis under a prefix of its own; PostgreSQL on a table of
//! its own, both removed when the servers are dropped), and the idem status service on a
//! second server of the same engine.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_client::grpc::GrpcRetryLayer;
use idem_client::{IdemStatus, Jitter, RetryPolicy};
use idem_core::{Engine, MemoryStore, Policy, Store};
use idem_grpc::proto::status_server::{Status as StatusApi, StatusServer};
use idem_grpc::proto::{LookupRequest, LookupResponse};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, MethodConfig};
use tokio::net::TcpListener;
use tonic::transport::{Channel, Server};

/// The protected method. It reuses the status proto's shape (a request with two strings, a
/// reply with numbers), so these tests need no proto of their own.
pub const METHOD: &str = "/idem.status.v1.Status/Lookup";

const REDIS_URL: &str = "redis://127.0.0.1:6379";
const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Counts its executions when they start (the strictest count: a run cancelled half-way is
/// still a run) and answers the count in `created_at_ms`, after `delay`.
struct Counter {
    runs: Arc<AtomicU64>,
    delay: Duration,
}

#[tonic::async_trait]
impl StatusApi for Counter {
    async fn lookup(
        &self,
        _: tonic::Request<LookupRequest>,
    ) -> Result<tonic::Response<LookupResponse>, tonic::Status> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        Ok(tonic::Response::new(LookupResponse {
            created_at_ms: n,
            ..LookupResponse::default()
        }))
    }
}

/// Which store the layer's engine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Redis,
    Postgres,
}

/// The two servers; dropped, they stop and the store's records go.
pub struct Servers {
    pub business: Channel,
    pub business_addr: std::net::SocketAddr,
    pub status: Channel,
    pub runs: Arc<AtomicU64>,
    _cleanup: Cleanup,
    _stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Servers {
    /// Executions of the protected method started so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Runs a teardown on its own thread and runtime when dropped (also when a test panics).
#[derive(Default)]
struct Cleanup(Option<Box<dyn FnOnce() + Send>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            let _ = std::thread::spawn(f).join();
        }
    }
}

fn on_own_runtime<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) {
    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        rt.block_on(f());
    }
}

fn policy() -> Policy {
    Policy::builder()
        .store_timeout(Duration::from_secs(2))
        // A backstop for a run whose teardown did not happen: the records go by themselves.
        .record_ttl(Duration::from_secs(600))
        .build()
        .expect("policy")
}

use idem_testkit::services::missing;

fn redis_config(prefix: &str) -> idem_redis::RedisConfig {
    idem_redis::RedisConfig::from_url(REDIS_URL)
        .expect("url")
        .prefix(prefix)
        .expect("prefix")
}

/// Deletes every key under `prefix`: records, tombstones and audit streams.
async fn purge_redis(prefix: String) {
    let Ok(client) = redis::Client::open(REDIS_URL) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<u64> =
                redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

async fn drop_pg_table(table: String) {
    if let Ok(pg) = idem_sql::PgStore::connect(PG_URL, 1).await
        && let Ok(store) = idem_sql::PgStore::with_table(pg.pool().clone(), &table)
    {
        let _ = store.drop_table().await;
    }
}

/// The servers on `kind`'s store with a handler taking `delay`; `None` (skipped loudly
/// outside CI) when that store's server is not running.
pub async fn start(kind: StoreKind, delay: Duration) -> Option<Servers> {
    let tag = uuid::Uuid::now_v7().simple().to_string();
    match kind {
        StoreKind::Memory => Some(
            start_on(
                Engine::new(MemoryStore::new(10_000), policy()),
                delay,
                Cleanup::default(),
            )
            .await,
        ),
        StoreKind::Redis => {
            let prefix = format!("idem-client-test:{tag}:");
            let store = match idem_redis::RedisStore::connect(redis_config(&prefix)).await {
                Ok(s) => s,
                Err(e) => {
                    missing("Redis", &e);
                    return None;
                }
            };
            let cleanup = Cleanup(Some(Box::new(move || {
                on_own_runtime(|| purge_redis(prefix))
            })));
            Some(start_on(Engine::new(store, policy()), delay, cleanup).await)
        }
        StoreKind::Postgres => {
            let pg = match idem_sql::PgStore::connect(PG_URL, 8).await {
                Ok(s) => s,
                Err(e) => {
                    missing("PostgreSQL", &e);
                    return None;
                }
            };
            let table = format!("idem_client_{}", &tag[16..]);
            let store = idem_sql::PgStore::with_table(pg.pool().clone(), &table).expect("table");
            store.migrate().await.expect("migrate");
            let cleanup = Cleanup(Some(Box::new(move || {
                on_own_runtime(|| drop_pg_table(table));
            })));
            Some(start_on(Engine::new(store, policy()), delay, cleanup).await)
        }
    }
}

async fn listen() -> (TcpListener, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    (listener, addr)
}

/// A lazy channel to `addr` (a server, or a fault proxy in front of one).
pub fn channel_to(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_lazy()
}

/// The counting service behind the idempotency layer, and the layer's status service on a
/// second server (both services share one proto name, so they cannot share a server).
async fn start_on<St: Store>(engine: Engine<St>, delay: Duration, cleanup: Cleanup) -> Servers {
    let method = MethodConfig::new("counter").expect("namespace").principal(
        idem_http::HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")),
    );
    let config = GrpcIdempotencyConfig::new()
        .method(METHOD, method)
        .expect("method");
    let layer = GrpcIdempotencyLayer::new(&engine, config);
    let runs = Arc::new(AtomicU64::new(0));
    let counter = Counter {
        runs: Arc::clone(&runs),
        delay,
    };
    let mut stop = Vec::new();
    let (listener, business_addr) = listen().await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stop.push(tx);
    tokio::spawn(
        Server::builder()
            .layer(layer.clone())
            .add_service(StatusServer::new(counter))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = rx.await;
                },
            ),
    );
    let (listener, status_addr) = listen().await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stop.push(tx);
    tokio::spawn(
        Server::builder()
            .add_service(layer.status_service())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = rx.await;
                },
            ),
    );
    Servers {
        business: channel_to(business_addr),
        business_addr,
        status: channel_to(status_addr),
        runs,
        _cleanup: cleanup,
        _stop: stop,
    }
}

/// The client's policy: short backoffs, `attempt_timeout` per attempt, 15 s overall.
pub fn retry_policy(attempt_timeout: Duration) -> RetryPolicy {
    RetryPolicy::default()
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200))
        .attempt_timeout(attempt_timeout)
        .deadline(Duration::from_secs(15))
        .jitter(Jitter::Full)
}

/// The client under test: the retry layer over `channel`, asking `s`'s status service.
pub fn retrying(
    s: &Servers,
    channel: Channel,
    attempt_timeout: Duration,
) -> idem_grpc::proto::status_client::StatusClient<
    idem_client::grpc::GrpcRetry<Channel, IdemStatus<Channel>>,
> {
    let channel = tower::ServiceBuilder::new()
        .layer(
            GrpcRetryLayer::new(retry_policy(attempt_timeout))
                .status(IdemStatus::new(s.status.clone())),
        )
        .service(channel);
    idem_grpc::proto::status_client::StatusClient::new(channel)
}

/// A call of the protected method by principal `alice`, with `key` when given.
pub fn request(key: Option<&str>) -> tonic::Request<LookupRequest> {
    let mut req = tonic::Request::new(LookupRequest {
        method: "charge".into(),
        key: "unused".into(),
    });
    req.metadata_mut()
        .insert("x-api-key", "alice".parse().expect("ascii"));
    if let Some(k) = key {
        req.metadata_mut()
            .insert("idempotency-key", k.parse().expect("ascii"));
    }
    req
}

/// Whether the server marked the answer as a replay of a stored one.
pub fn replayed<T>(res: &tonic::Response<T>) -> bool {
    res.metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes() == b"true")
}

/// A unique key.
pub fn key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// One test per scenario and store: `scenario(kind: StoreKind)` functions of the including
/// file, run on memory, Redis and PostgreSQL.
#[macro_export]
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::common::StoreKind::Memory).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::common::StoreKind::Redis).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::common::StoreKind::Postgres).await;
                }
            )*
        }
    };
}
