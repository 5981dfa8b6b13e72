//! A test Payments service behind the layer on a real tonic server on loopback, with a
//! generated client; the stores the tests run against.
#![allow(dead_code, unreachable_pub)]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{Engine, MemoryStore, Policy, Store};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, MethodConfig};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/idem.test.v1.rs"));
}

use pb::payments_client::PaymentsClient;
use pb::payments_server::{Payments, PaymentsServer};
use pb::{ChargeReply, ChargeRequest, Order};

/// A `fail_code` that makes the handler panic.
pub const PANIC: i32 = 99;

pub const CHARGE: &str = "/idem.test.v1.Payments/Charge";
pub const WATCH: &str = "/idem.test.v1.Payments/Watch";
pub const ECHO: &str = "/idem.test.v1.Payments/Echo";

pub use idem_testkit::hits::Hits;

pub struct App(pub Arc<Hits>);

async fn run(hits: &Hits, req: &ChargeRequest) -> Result<ChargeReply, Status> {
    let n = hits.started.fetch_add(1, Ordering::SeqCst) + 1;
    let gate = hits.gate.notified();
    hits.on_start.notify_waiters();
    if req.gated {
        gate.await;
    }
    if req.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(req.sleep_ms))).await;
    }
    hits.finished.fetch_add(1, Ordering::SeqCst);
    assert!(req.fail_code != PANIC, "the handler panics (test)");
    if req.fail_code != 0 {
        let details = ErrorDetails::with_bad_request_violation("amount", format!("execution {n}"));
        return Err(Status::with_error_details(
            Code::from_i32(req.fail_code),
            format!("failed on execution {n}"),
            details,
        ));
    }
    Ok(ChargeReply {
        execution: n as u64,
        amount: req.amount,
        padding: vec![7; req.reply_bytes as usize],
    })
}

#[tonic::async_trait]
impl Payments for App {
    async fn charge(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        let reply = run(&self.0, req.get_ref()).await?;
        let id = format!("ch-{}", reply.execution);
        let mut res = Response::new(reply);
        res.metadata_mut()
            .insert("x-charge-id", id.parse().expect("ascii"));
        Ok(res)
    }

    async fn echo(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        Ok(Response::new(ChargeReply {
            execution: 0,
            amount: req.get_ref().amount,
            padding: Vec::new(),
        }))
    }

    type WatchStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<ChargeReply, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        req: Request<ChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let first = run(&self.0, req.get_ref()).await?;
        let n = first.execution;
        let items = (0..3).map(move |i| {
            Ok(ChargeReply {
                execution: n,
                amount: i,
                padding: Vec::new(),
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

/// A running server; dropped, it shuts down.
pub struct Running {
    pub client: PaymentsClient<Channel>,
    pub status: idem_grpc::proto::status_client::StatusClient<Channel>,
    pub channel: Channel,
    pub hits: Arc<Hits>,
    _stop: oneshot::Sender<()>,
}

/// A method config with the tests' defaults: principal from `x-api-key`.
pub fn method(namespace: &str) -> MethodConfig {
    MethodConfig::new(namespace)
        .expect("namespace")
        .principal(idem_http::HeaderPrincipal::new(
            http::HeaderName::from_static("x-api-key"),
        ))
}

/// `Charge` and the buffered `Watch` are protected; `Echo` is not.
pub fn default_config(ns: &str) -> GrpcIdempotencyConfig {
    GrpcIdempotencyConfig::new()
        .method(CHARGE, method(&format!("{ns}.charge")))
        .expect("path")
}

/// Starts the test service behind the layer (server-wide, with the status service) on a
/// loopback port.
pub async fn serve<St: Store>(engine: &Engine<St>, config: GrpcIdempotencyConfig) -> Running {
    let layer = GrpcIdempotencyLayer::new(engine, config);
    let hits = Arc::new(Hits::default());
    let router = Server::builder()
        .layer(layer.clone())
        .add_service(PaymentsServer::new(App(Arc::clone(&hits))))
        .add_service(layer.status_service());
    start(router, hits).await
}

/// Starts the test service with the layer around that one service only.
pub async fn serve_per_service<St: Store>(
    engine: &Engine<St>,
    config: GrpcIdempotencyConfig,
) -> Running {
    use tower::Layer;
    let layer = GrpcIdempotencyLayer::new(engine, config);
    let hits = Arc::new(Hits::default());
    let router = Server::builder()
        .add_service(layer.layer(PaymentsServer::new(App(Arc::clone(&hits)))))
        .add_service(layer.status_service());
    start(router, hits).await
}

async fn start<L, ResBody>(router: tonic::transport::server::Router<L>, hits: Arc<Hits>) -> Running
where
    L: tower::Layer<tonic::service::Routes> + Send + 'static,
    L::Service: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    Running {
        client: PaymentsClient::new(channel.clone()),
        status: idem_grpc::proto::status_client::StatusClient::new(channel.clone()),
        channel,
        hits,
        _stop: stop,
    }
}

/// A memory store engine with the default policy.
pub fn memory() -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(10_000), Policy::default())
}

/// A charge request for order `id`.
pub fn charge(id: &str, amount: i64) -> ChargeRequest {
    ChargeRequest {
        order: Some(Order {
            id: id.to_owned(),
            version: 1,
        }),
        amount,
        ..ChargeRequest::default()
    }
}

/// `msg` with the key (and the principal, when given) in its metadata.
pub fn keyed<T>(msg: T, key: &str, who: Option<&str>) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("idempotency-key", key.parse().expect("ascii key"));
    if let Some(w) = who {
        req.metadata_mut()
            .insert("x-api-key", w.parse().expect("ascii"));
    }
    req
}

/// The `ErrorInfo.reason` of a status the layer answered.
pub fn reason(s: &Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_else(|| panic!("no ErrorInfo in {s:?}"))
}

/// A unique key.
pub fn key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Redis store on the shared local server under its own prefix; `None` (skipped loudly)
/// when the server is missing outside CI.
pub async fn redis() -> Option<idem_redis::RedisStore> {
    let config = idem_redis::RedisConfig::from_url("redis://127.0.0.1:6379")
        .expect("url")
        .prefix(format!("idem-grpc-test:{}:", uuid::Uuid::now_v7().simple()))
        .expect("prefix");
    match idem_redis::RedisStore::connect(config).await {
        Ok(s) => Some(s),
        Err(e) => {
            missing("Redis", &e);
            None
        }
    }
}

/// A PostgreSQL store on a table of its own, dropped with the guard.
pub struct Pg {
    pub store: idem_sql::PgStore,
}

impl Drop for Pg {
    fn drop(&mut self) {
        let table = self.store.table().to_string();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                use sqlx::Connection as _;
                if let Ok(mut c) = sqlx::PgConnection::connect(PG_URL).await {
                    // The store's audit table and trigger function go with its table.
                    let _ = sqlx::raw_sql(&format!(
                        "SET lock_timeout = '10s'; DROP TABLE IF EXISTS {table}; \
                         DROP TABLE IF EXISTS {table}_audit; \
                         DROP FUNCTION IF EXISTS {table}_audit_fn()"
                    ))
                    .execute(&mut c)
                    .await;
                }
            });
        })
        .join();
    }
}

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub async fn postgres() -> Option<Pg> {
    let store = match idem_sql::PgStore::connect(PG_URL, 8).await {
        Ok(s) => s,
        Err(e) => {
            missing("PostgreSQL", &e);
            return None;
        }
    };
    let table = format!("idem_grpc_{:016x}", idem_core::OwnerId::random().0 as u64);
    let store = idem_sql::PgStore::with_table(store.pool().clone(), &table).expect("table");
    store.migrate().await.expect("migrate");
    Some(Pg { store })
}

pub use idem_testkit::services::missing;

/// An HTTP/2 call made by hand, to see exactly what comes back.
pub struct Raw {
    pub headers: http::HeaderMap,
    pub trailers: http::HeaderMap,
}

/// `msg` as one gRPC frame (uncompressed).
pub fn frame(msg: &ChargeRequest) -> Vec<u8> {
    use prost::Message;
    let bytes = msg.encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    body.extend_from_slice(&bytes);
    body
}

/// Sends `body` (gRPC frames) to `path` with `key`, and reads the answer's head and trailers.
pub async fn raw_call(channel: &Channel, path: &str, key: &str, body: &[u8]) -> Raw {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let req = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", key)
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::copy_from_slice(body),
        )))
        .expect("request");
    let res = channel.clone().oneshot(req).await.expect("call");
    let headers = res.headers().clone();
    let collected = res.into_body().collect().await.expect("body");
    Raw {
        headers,
        trailers: collected.trailers().cloned().unwrap_or_default(),
    }
}

/// Calls `Charge` with `req`, expecting a refusal (`why` says which).
pub async fn charge_err(
    client: &mut PaymentsClient<Channel>,
    req: impl tonic::IntoRequest<ChargeRequest>,
    why: &str,
) -> Status {
    client.charge(req).await.expect_err(why)
}

/// Calls `Charge` with `req`, expecting an answer (`why` says which).
pub async fn charge_ok(
    client: &mut PaymentsClient<Channel>,
    req: impl tonic::IntoRequest<ChargeRequest>,
    why: &str,
) -> Response<ChargeReply> {
    client.charge(req).await.expect(why)
}

/// Asserts that `status` has `code` and the `ErrorInfo.reason` `want`.
#[track_caller]
pub fn assert_refused(status: &Status, code: Code, want: &str) {
    assert_eq!((status.code(), reason(status)), (code, want.to_owned()));
}

/// Asks the status service about `req`, expecting an answer.
pub async fn lookup(
    status: &mut idem_grpc::proto::status_client::StatusClient<Channel>,
    req: Request<idem_grpc::proto::LookupRequest>,
) -> idem_grpc::proto::LookupResponse {
    status.lookup(req).await.expect("lookup").into_inner()
}

/// A status-service question about `key` on `method`, with no principal.
pub fn ask(method: &str, key: &str) -> Request<idem_grpc::proto::LookupRequest> {
    Request::new(idem_grpc::proto::LookupRequest {
        method: method.into(),
        key: key.into(),
    })
}

/// A config protecting `Charge` with `m`.
pub fn charge_config(m: MethodConfig) -> GrpcIdempotencyConfig {
    GrpcIdempotencyConfig::new()
        .method(CHARGE, m)
        .expect("path")
}

/// Starts `n` concurrent `Charge` calls of `msg` with `key`, all as `alice`.
pub fn spawn_charges(
    s: &Running,
    msg: &ChargeRequest,
    key: &str,
    n: usize,
) -> tokio::task::JoinSet<Result<Response<ChargeReply>, Status>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut client = s.client.clone();
        let (msg, key) = (msg.clone(), key.to_owned());
        tasks.spawn(async move { client.charge(keyed(msg, &key, Some("alice"))).await });
    }
    tasks
}

/// A charge for order `id` that waits at the gate before it answers.
pub fn gated(id: &str, amount: i64) -> ChargeRequest {
    ChargeRequest {
        gated: true,
        ..charge(id, amount)
    }
}

/// The next of `tasks` to answer, with what it answered.
pub async fn next_answer(
    tasks: &mut tokio::task::JoinSet<Result<Response<ChargeReply>, Status>>,
) -> Result<Response<ChargeReply>, Status> {
    tasks.join_next().await.expect("task").expect("join")
}

/// A memory store engine, the test service behind the layer with `default_config(ns)`, and a
/// client of it.
pub async fn serve_memory(ns: &str) -> (Engine<MemoryStore>, Running, PaymentsClient<Channel>) {
    serve_engine(memory(), ns).await
}

/// `engine`, the test service behind the layer with `default_config(ns)`, and a client of it.
pub async fn serve_engine<St: Store>(
    engine: Engine<St>,
    ns: &str,
) -> (Engine<St>, Running, PaymentsClient<Channel>) {
    let s = serve(&engine, default_config(ns)).await;
    let client = s.client.clone();
    (engine, s, client)
}

/// A charge whose handler sleeps `ms` before it answers.
pub fn sleeping(ms: u32) -> ChargeRequest {
    ChargeRequest {
        sleep_ms: ms,
        ..charge("o", 1)
    }
}

/// Starts `n` concurrent gated calls of `msg` with `key` (see [`spawn_charges`]) and returns
/// the tasks with the `n - 1` refusals that must come while the winner waits at the gate
/// (`why` says what they are).
pub async fn duplicates_refused(
    s: &Running,
    msg: &ChargeRequest,
    key: &str,
    n: usize,
    why: &str,
) -> (
    tokio::task::JoinSet<Result<Response<ChargeReply>, Status>>,
    Vec<Status>,
) {
    let mut tasks = spawn_charges(s, msg, key, n);
    let mut refused = Vec::new();
    for _ in 1..n {
        refused.push(next_answer(&mut tasks).await.expect_err(why));
    }
    (tasks, refused)
}

/// A `Charge` request for order `o` with a fresh key and no principal.
pub fn fresh_call() -> Request<ChargeRequest> {
    keyed(charge("o", 1), &key(), None)
}
