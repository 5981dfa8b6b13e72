//! The gRPC client layer against a real tonic server with idem-grpc's layer, on loopback.
//!
//! The protected unary method is a small counting service; the status service shares the
//! layer's engine. Duplicates at once run once (the second is told `ABORTED` with retry info
//! and waits); a reset before sending is asked about, found absent and sent again; without a
//! status service the caller is told the outcome cannot be known; a client that makes a new
//! key per attempt runs twice.
#![cfg(feature = "grpc")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_client::grpc::GrpcRetryLayer;
use idem_client::{IdemStatus, Jitter, RetryPolicy};
use idem_core::{Engine, MemoryStore, Policy};
use idem_grpc::proto::status_client::StatusClient;
use idem_grpc::proto::status_server::{Status as StatusApi, StatusServer};
use idem_grpc::proto::{LookupRequest, LookupResponse};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, MethodConfig};
use idem_testkit::fault_proxy::{Fault, FaultProxy};
use tokio::net::TcpListener;
use tonic::transport::{Channel, Server};

/// The protected method (it reuses the status proto's shape: a request with a key-like
/// field and a reply with a number): it counts its executions and answers the count.
const METHOD: &str = "/idem.status.v1.Status/Lookup";

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

struct Servers {
    business: Channel,
    business_addr: std::net::SocketAddr,
    status: Channel,
    runs: Arc<AtomicU64>,
}

fn incoming(listener: TcpListener) -> tokio_stream::wrappers::TcpListenerStream {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

async fn listen() -> (TcpListener, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    (listener, addr)
}

async fn connect(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

/// The counting service behind the idempotency layer, and the layer's status service on a
/// second server (both services share one proto name, so they cannot share a server).
async fn start(delay: Duration) -> Servers {
    let engine = Engine::new(MemoryStore::new(10_000), Policy::default());
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
    let (listener, business_addr) = listen().await;
    tokio::spawn(
        Server::builder()
            .layer(layer.clone())
            .add_service(StatusServer::new(counter))
            .serve_with_incoming(incoming(listener)),
    );
    let (listener, status_addr) = listen().await;
    tokio::spawn(
        Server::builder()
            .add_service(layer.status_service())
            .serve_with_incoming(incoming(listener)),
    );
    let (business, status) = (connect(business_addr).await, connect(status_addr).await);
    Servers {
        business,
        business_addr,
        status,
        runs,
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200))
        .attempt_timeout(Duration::from_secs(5))
        .deadline(Duration::from_secs(15))
        .jitter(Jitter::Full)
}

fn request(key: Option<&str>) -> tonic::Request<LookupRequest> {
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

/// A channel to `addr` (through the fault proxy).
async fn channel_to(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_at_once_run_once_and_share_the_answer() {
    let s = start(Duration::from_millis(600)).await;
    let channel = tower::ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(policy()).status(IdemStatus::new(s.status.clone())))
        .service(s.business.clone());
    let key = uuid::Uuid::now_v7().to_string();
    let (mut a, mut b) = (
        StatusClient::new(channel.clone()),
        StatusClient::new(channel),
    );
    let (ra, rb) = tokio::join!(a.lookup(request(Some(&key))), b.lookup(request(Some(&key))));
    let (ra, rb) = (ra.expect("an answer"), rb.expect("an answer"));
    assert_eq!(ra.get_ref().created_at_ms, 1);
    assert_eq!(rb.get_ref().created_at_ms, 1, "the same first answer");
    assert_eq!(s.runs.load(Ordering::SeqCst), 1, "exactly one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_sending_is_asked_about_then_sent_again() {
    let s = start(Duration::ZERO).await;
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let channel = tower::ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(policy()).status(IdemStatus::new(s.status.clone())))
        .service(channel_to(proxy.addr()).await);
    let mut client = StatusClient::new(channel);
    let reply = client.lookup(request(None)).await.expect("an answer");
    assert_eq!(reply.get_ref().created_at_ms, 1);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1, "exactly one execution");
    assert_eq!(
        proxy.applied().await,
        [Fault::ResetBeforeSending, Fault::Pass]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_status_service_the_caller_is_told_it_cannot_be_known() {
    let s = start(Duration::ZERO).await;
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let channel = tower::ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(policy()))
        .service(channel_to(proxy.addr()).await);
    let mut client = StatusClient::new(channel);
    let err = client.lookup(request(None)).await.expect_err("ambiguous");
    let source = std::error::Error::source(&err).expect("the client error");
    assert!(
        matches!(
            source.downcast_ref::<idem_client::ClientError>(),
            Some(idem_client::ClientError::Ambiguous { .. })
        ),
        "{err}"
    );
    assert_eq!(s.runs.load(Ordering::SeqCst), 0, "not sent again");
}

/// The unsafe variant: a client that makes a new key for every attempt starts the call
/// again each time it gives up waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_key_per_attempt_runs_twice() {
    let s = start(Duration::from_millis(900)).await;
    let mut raw = StatusClient::new(s.business.clone());
    for _ in 0..2 {
        let mut req = request(Some(&uuid::Uuid::now_v7().to_string()));
        req.set_timeout(Duration::from_millis(300));
        let _ = raw.lookup(req).await;
    }
    assert_eq!(
        s.runs.load(Ordering::SeqCst),
        2,
        "the fresh-key client ran twice"
    );
}

/// A key that already completed, asked about after a reset: the stored answer comes back
/// from the status service, rebuilt as the response the generated client decodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_key_is_answered_from_the_status_service() {
    let s = start(Duration::ZERO).await;
    let key = uuid::Uuid::now_v7().to_string();
    let mut direct = StatusClient::new(s.business.clone());
    let first = direct.lookup(request(Some(&key))).await.expect("first");
    assert_eq!(first.get_ref().created_at_ms, 1);
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let channel = tower::ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(policy()).status(IdemStatus::new(s.status.clone())))
        .service(channel_to(proxy.addr()).await);
    let reply = StatusClient::new(channel)
        .lookup(request(Some(&key)))
        .await
        .expect("the stored answer");
    assert_eq!(reply.get_ref().created_at_ms, 1, "the first answer");
    assert_eq!(
        reply
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(proxy.applied().await, [Fault::ResetBeforeSending]);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1, "exactly one execution");
}
