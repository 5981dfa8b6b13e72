//! idem-client's gRPC layer through the real gateway: a tonic service behind `idem serve`
//! (h2c upstream, one protected method), the client asking the gateway's status endpoint
//! (`GatewayStatus`) after an ambiguous failure, with the HTTP/2 fault proxy
//! (`idem_testkit::h2_fault`) between client and gateway, on the memory, Redis and
//! PostgreSQL stores.
//!
//! Every scenario ends with exactly one execution (counted at the upstream when the handler
//! starts) and the client holding the first answer: the answer lost after the upstream
//! acted; the call reset before it reached the gateway; the call held until after its
//! retry; the upstream slower than the client waits; two callers sending one key at once
//! (the gateway's `ABORTED` with reason `IN_FLIGHT` and a `RetryInfo` is waited out). The
//! unsafe client (a new key per attempt) runs twice in the first of them.
//!
//! The client reads the gateway's own answers from their `ErrorInfo`, as it reads idem-grpc's:
//! an unknown outcome (`OUTCOME_UNKNOWN`) stops it, and a store outage (`STORE_UNAVAILABLE`
//! with a `RetryInfo`) is waited out and the charge runs once.

mod cleanup;
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cleanup::StoreGuard;
use common::{Gateway, POSTGRES, REDIS, configs, service_up};
use idem_client::grpc::{GrpcRetry, GrpcRetryLayer};
use idem_client::{ClientError, GatewayStatus, Jitter, RetryPolicy};
use idem_testkit::h2_fault::{H2Fault, H2FaultProxy};
use idem_testkit::redis_server::{Server, redis_server_available};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

mod ledger {
    #![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    tonic::include_proto!("idem.gwtest.v1");
}

use ledger::ledger_client::LedgerClient;
use ledger::ledger_server::{Ledger, LedgerServer};
use ledger::{ChargeReply, ChargeRequest};

const CHARGE: &str = "/idem.gwtest.v1.Ledger/Charge";
const API_KEY: &str = "alice-api-key";

/// Counts executions when they start, answers after `delay`.
struct Slow {
    executions: Arc<AtomicU64>,
    delay: Duration,
}

#[tonic::async_trait]
impl Ledger for Slow {
    async fn charge(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(ChargeReply {
            execution: n,
            amount: req.get_ref().amount,
        }))
    }

    async fn balance(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        self.charge(req).await
    }
}

/// The upstream, the gateway in front of it, and the store's teardown.
struct Setup {
    gw: Gateway,
    executions: Arc<AtomicU64>,
    upstream: tokio::task::JoinHandle<()>,
    _store: StoreGuard,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.upstream.abort();
    }
}

impl Setup {
    fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy)]
enum StoreKind {
    Memory,
    Redis,
    Postgres,
}

fn unique(tag: &str) -> String {
    format!("{tag}_{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// The upstream with a handler taking `delay`, behind a gateway on `kind`'s store; `None`
/// (skipped loudly outside CI) when that store's server is not running.
async fn setup(kind: StoreKind, delay: Duration) -> Option<Setup> {
    let (store, extra, guard) = match kind {
        StoreKind::Memory => ("memory:".to_owned(), String::new(), StoreGuard::Nothing),
        StoreKind::Redis => {
            if !service_up(REDIS, "Redis").await {
                return None;
            }
            let prefix = format!("{}:", unique("idem-grpc-client"));
            (
                "redis://127.0.0.1:6379".to_owned(),
                format!("store_prefix = \"{prefix}\""),
                StoreGuard::Redis(prefix),
            )
        }
        StoreKind::Postgres => {
            if !service_up(POSTGRES, "PostgreSQL").await {
                return None;
            }
            let table = unique("idem_grpc_client");
            (
                "postgres://postgres@127.0.0.1:5432/test".to_owned(),
                format!("store_table = \"{table}\""),
                StoreGuard::Postgres(table),
            )
        }
    };
    Some(start(&store, &extra, "", guard, delay).await)
}

/// The upstream with a handler taking `delay`, behind a gateway on `store` (with `extra`
/// top-level settings and `route_extra` settings of the charge route).
async fn start(
    store: &str,
    extra: &str,
    route_extra: &str,
    guard: StoreGuard,
    delay: Duration,
) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let executions = Arc::new(AtomicU64::new(0));
    let svc = Slow {
        executions: Arc::clone(&executions),
        delay,
    };
    let upstream = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(LedgerServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    let routes = format!(
        r#"{}

[[routes]]
name = "ledger"
path = "/idem.gwtest.v1.Ledger/*"
idempotency = false
"#,
        configs::grpc_charge(CHARGE, route_extra)
    );
    let config = configs::with_status(&format!("h2c://{addr}"), store, extra, &routes);
    let gw = Gateway::start(&config, &[]);
    Setup {
        gw,
        executions,
        upstream,
        _store: guard,
    }
}

fn channel_to(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_lazy()
}

type Client = LedgerClient<GrpcRetry<Channel, GatewayStatus<Channel>>>;

/// The client under test over `channel` (to the gateway, or to the proxy in front of it):
/// the retry layer asking the gateway's status endpoint over the same channel.
fn retrying(channel: Channel, attempt_timeout: Duration) -> Client {
    let policy = RetryPolicy::default()
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200))
        .attempt_timeout(attempt_timeout)
        .deadline(Duration::from_secs(15))
        .jitter(Jitter::Full);
    let status = GatewayStatus::new(channel.clone(), "/idem/status")
        .expect("path")
        .route("charge");
    LedgerClient::new(
        tower::ServiceBuilder::new()
            .layer(GrpcRetryLayer::new(policy).status(status))
            .service(channel),
    )
}

fn charge(key: Option<&str>) -> Request<ChargeRequest> {
    let mut req = Request::new(ChargeRequest {
        amount: 100,
        fail_code: 0,
    });
    req.metadata_mut()
        .insert("x-api-key", API_KEY.parse().expect("ascii"));
    if let Some(k) = key {
        req.metadata_mut()
            .insert("idempotency-key", k.parse().expect("ascii"));
    }
    req
}

async fn proxy(s: &Setup, plan: impl IntoIterator<Item = H2Fault>) -> H2FaultProxy {
    H2FaultProxy::start_matching(
        s.gw.addr,
        Arc::new(|p: &http::request::Parts| p.uri.path() == CHARGE),
        plan,
    )
    .await
    .expect("proxy")
}

fn replayed<T>(res: &Response<T>) -> bool {
    res.metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

fn assert_first_answer(reply: &Response<ChargeReply>, s: &Setup) {
    assert_eq!(reply.get_ref().execution, 1, "the first answer");
    assert_eq!(reply.get_ref().amount, 100);
    assert_eq!(s.executions(), 1, "exactly one execution");
}

/// One charge by the client under test over `channel`, waiting `wait` per attempt; checked
/// to be the first execution's answer and the only one.
async fn charge_once(s: &Setup, channel: Channel, wait: Duration) -> Response<ChargeReply> {
    let reply = retrying(channel, wait)
        .charge(charge(None))
        .await
        .expect("an answer");
    assert_first_answer(&reply, s);
    reply
}

/// A fresh setup on `kind` (handler taking no time) with a proxy holding `plan` in front of
/// its gateway; `None` where the store is not running.
async fn behind_proxy(
    kind: StoreKind,
    plan: impl IntoIterator<Item = H2Fault>,
) -> Option<(Setup, H2FaultProxy)> {
    let s = setup(kind, Duration::ZERO).await?;
    let p = proxy(&s, plan).await;
    Some((s, p))
}

async fn scenarios(kind: StoreKind) {
    // 1. The upstream answered; the answer is lost between gateway and client. The status
    //    endpoint returns the stored answer; nothing is sent again.
    let Some((s, p)) = behind_proxy(kind, [H2Fault::ResetAfterAnswer]).await else {
        return;
    };
    let reply = charge_once(&s, channel_to(p.addr()), Duration::from_secs(5)).await;
    assert!(
        replayed(&reply),
        "the stored answer, from the status endpoint"
    );
    assert_eq!(p.applied().await, [H2Fault::ResetAfterAnswer]);
    drop(s);

    // 2. Reset before it reached the gateway: found absent, sent again.
    let Some((s, p)) = behind_proxy(kind, [H2Fault::ResetBeforeSending]).await else {
        return;
    };
    let reply = charge_once(&s, channel_to(p.addr()), Duration::from_secs(5)).await;
    assert!(!replayed(&reply), "the answer of the one run");
    assert_eq!(
        p.applied().await,
        [H2Fault::ResetBeforeSending, H2Fault::Pass]
    );
    drop(s);

    // 3. Held past the client's wait, it reaches the gateway after the retry ran: answered
    //    from the record, not run.
    let held = H2Fault::Delay(Duration::from_millis(1500));
    let Some((s, p)) = behind_proxy(kind, [held]).await else {
        return;
    };
    charge_once(&s, channel_to(p.addr()), Duration::from_millis(400)).await;
    assert!(
        p.settled(Duration::from_secs(10)).await,
        "the late call was answered"
    );
    assert_eq!(
        p.applied().await,
        [held, H2Fault::Pass],
        "the late call and its retry (the status query passes unrecorded)"
    );
    assert_eq!(s.executions(), 1, "the late call did not run again");
    drop(s);

    // 4. The upstream is slower than the client waits (no proxy: the client's own reset of
    //    the attempt reaches the gateway): in flight, then the stored answer.
    let Some(s) = setup(kind, Duration::from_millis(1200)).await else {
        return;
    };
    let reply = charge_once(&s, channel_to(s.gw.addr), Duration::from_millis(300)).await;
    assert!(
        replayed(&reply),
        "the stored answer, from the status endpoint"
    );
    drop(s);

    // 5. Two callers send one operation (one key) at once: the gateway answers the second
    //    `ABORTED` with `retry-after`, which the client waits out, then gets the replay.
    let Some(s) = setup(kind, Duration::from_millis(800)).await else {
        return;
    };
    let key = uuid::Uuid::now_v7().to_string();
    let (mut a, mut b) = (
        retrying(channel_to(s.gw.addr), Duration::from_secs(5)),
        retrying(channel_to(s.gw.addr), Duration::from_secs(5)),
    );
    let (ra, rb) = tokio::join!(a.charge(charge(Some(&key))), b.charge(charge(Some(&key))));
    let (ra, rb) = (ra.expect("an answer"), rb.expect("an answer"));
    assert_first_answer(&ra, &s);
    assert_eq!(ra.get_ref(), rb.get_ref(), "both hold the one answer");
    assert!(replayed(&ra) != replayed(&rb), "one ran, one was replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_every_fault_ends_in_one_execution() {
    scenarios(StoreKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_every_fault_ends_in_one_execution() {
    scenarios(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_every_fault_ends_in_one_execution() {
    scenarios(StoreKind::Postgres).await;
}

/// The unsafe variant: a client that makes a new key per attempt turns the lost answer into
/// a second execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_fresh_key_runs_twice_through_the_gateway() {
    let s = setup(StoreKind::Memory, Duration::ZERO)
        .await
        .expect("memory");
    let p = proxy(&s, [H2Fault::ResetAfterAnswer]).await;
    let mut raw = LedgerClient::new(channel_to(p.addr()));
    let mut answer = None;
    for _ in 0..3 {
        let key = uuid::Uuid::now_v7().to_string();
        if let Ok(reply) = raw.charge(charge(Some(&key))).await {
            answer = Some(reply);
            break;
        }
    }
    let answer = answer.expect("the second attempt got through");
    assert_eq!(answer.get_ref().execution, 2, "the answer of a second run");
    assert_eq!(s.executions(), 2, "the fresh-key client charged twice");
}

/// The failed call carries the client's `OutcomeUnknown` as its source.
fn assert_outcome_unknown(status: &Status) {
    let source = std::error::Error::source(status).and_then(|e| e.downcast_ref::<ClientError>());
    assert!(
        matches!(source, Some(ClientError::OutcomeUnknown { .. })),
        "{status:?}"
    );
}

/// An upstream slower than the route's timeout leaves the key unknown. The client that sent
/// it hears `DEADLINE_EXCEEDED`, asks the status endpoint and stops; a client without a
/// status query that sends the key again stops on the gateway's `OUTCOME_UNKNOWN` reason.
/// Nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_stops_the_client_through_the_gateway() {
    let s = start(
        "memory:",
        "",
        r#"timeout = "300ms""#,
        StoreGuard::Nothing,
        Duration::from_secs(1),
    )
    .await;
    let key = uuid::Uuid::now_v7().to_string();
    let err = retrying(channel_to(s.gw.addr), Duration::from_secs(5))
        .charge(charge(Some(&key)))
        .await
        .expect_err("unknown");
    assert_outcome_unknown(&err);
    let blind = GrpcRetryLayer::new(
        RetryPolicy::default()
            .initial_backoff(Duration::from_millis(20))
            .deadline(Duration::from_secs(10)),
    );
    let channel = tower::ServiceBuilder::new()
        .layer(blind)
        .service(channel_to(s.gw.addr));
    let err = LedgerClient::new(channel)
        .charge(charge(Some(&key)))
        .await
        .expect_err("unknown");
    // Read as a final answer, it would be the gateway's bare FAILED_PRECONDITION.
    assert_outcome_unknown(&err);
    assert_eq!(s.executions(), 1, "not run again");
}

/// The store hangs when the call starts: the gateway answers `UNAVAILABLE`
/// (`STORE_UNAVAILABLE`, `RetryInfo`) and nothing runs; the client waits and retries the same
/// key, and once the store is back the charge runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_waited_out_and_the_charge_runs_once() {
    if !redis_server_available() {
        return;
    }
    let redis = Server::start(&[]);
    let s = start(
        &redis.url(),
        r#"store_timeout = "300ms""#,
        "",
        StoreGuard::Nothing,
        Duration::ZERO,
    )
    .await;
    let p = proxy(&s, []).await;
    redis.freeze();
    let pending = tokio::spawn({
        let mut client = retrying(channel_to(p.addr()), Duration::from_secs(5));
        async move { client.charge(charge(None)).await }
    });
    // Let the first attempts meet the outage, then bring the store back (empty: whatever
    // the frozen server held was never applied).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let redis = tokio::task::spawn_blocking(move || redis.restart_empty())
        .await
        .expect("restart redis");
    let reply = pending.await.expect("join").expect("an answer");
    assert_first_answer(&reply, &s);
    assert!(!replayed(&reply), "the answer of the one run");
    assert!(
        p.applied().await.len() >= 2,
        "the outage was met first: {:?}",
        p.applied().await
    );
    drop(s);
    drop(redis);
}
