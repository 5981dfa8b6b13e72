//! A gRPC service behind `idem serve` over h2c: a protected unary method runs once and its
//! replay returns the same message and `grpc-status`; an unprotected method passes through
//! with its trailers; the gateway's own refusals are the statuses idem-grpc answers for the
//! same situation (code, `ErrorInfo` reason, `RetryInfo`); a call whose message stalls is cut
//! off at the body pace; an upstream answering in idem's own words (a problem body naming one
//! of idem's types) reaches the caller as the upstream's answer. Client and server are tonic
//! (a raw hyper client for the stalled call), the service is compiled from tests/proto with
//! protox.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Gateway, key};
use idem_grpc::{LayerDetails, Reason};
use idem_testkit::redis_server::{Server, redis_server_available};
use tonic::{Code, Request, Response, Status};

mod ledger {
    #![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    tonic::include_proto!("idem.gwtest.v1");
}

use ledger::ledger_client::LedgerClient;
use ledger::ledger_server::{Ledger, LedgerServer};
use ledger::{ChargeReply, ChargeRequest};

/// Counts executions when they start and answers after `delay`; `fail_code` makes the
/// handler answer that status.
#[derive(Default)]
struct Service {
    executions: Arc<AtomicU64>,
    delay: Duration,
}

impl Service {
    async fn run(&self, req: &ChargeRequest) -> Result<Response<ChargeReply>, Status> {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        if req.fail_code != 0 {
            return Err(Status::new(
                Code::from_i32(req.fail_code),
                format!("refused at execution {n}"),
            ));
        }
        Ok(Response::new(ChargeReply {
            execution: n,
            amount: req.amount,
        }))
    }
}

#[tonic::async_trait]
impl Ledger for Service {
    async fn charge(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        self.run(req.get_ref()).await
    }

    async fn balance(&self, req: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        self.run(req.get_ref()).await
    }
}

/// A tonic server on a loopback port; returns its address and execution count.
async fn upstream() -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    upstream_with(Duration::ZERO).await
}

/// A tonic server whose handler takes `delay`.
async fn upstream_with(
    delay: Duration,
) -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let svc = Service {
        delay,
        ..Service::default()
    };
    let executions = Arc::clone(&svc.executions);
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(LedgerServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    (addr, executions, task)
}

/// The protected Charge route on the memory store, followed by `more` routes.
fn charge_then(upstream: SocketAddr, more: &str) -> String {
    common::configs::anonymous(
        &format!("h2c://{upstream}"),
        "memory:",
        "",
        "",
        &common::configs::grpc_charge("/idem.gwtest.v1.Ledger/Charge", more),
    )
}

/// Charge is protected; every other Ledger method passes through.
fn config(upstream: SocketAddr) -> String {
    charge_then(
        upstream,
        r#"[[routes]]
name = "ledger"
path = "/idem.gwtest.v1.Ledger/*"
idempotency = false
"#,
    )
}

async fn client(gw: &Gateway) -> LedgerClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gw.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the gateway");
    LedgerClient::new(channel)
}

/// A gateway running `config` and a Ledger client connected through it.
async fn gateway(config: &str) -> (Gateway, LedgerClient<tonic::transport::Channel>) {
    let gw = Gateway::start(config, &[]);
    let ledger = client(&gw).await;
    (gw, ledger)
}

/// A call for `amount` that the handler fails with `fail` (`Code::Ok`: it succeeds).
fn request(amount: i64, fail: Code) -> ChargeRequest {
    ChargeRequest {
        amount,
        fail_code: fail as i32,
    }
}

fn with_key(req: ChargeRequest, key: &str) -> Request<ChargeRequest> {
    let mut req = Request::new(req);
    req.metadata_mut()
        .insert("idempotency-key", key.parse().expect("metadata"));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_passes_through_an_unprotected_route_with_its_trailers() {
    let (addr, executions, task) = upstream().await;
    let (_gw, mut ledger) = gateway(&config(addr)).await;
    // tonic reads `grpc-status` from the trailers: a call only succeeds if they arrived.
    for amount in [5, 5] {
        let reply = ledger
            .balance(request(amount, Code::Ok))
            .await
            .expect("balance through the gateway");
        assert_eq!(reply.get_ref().amount, amount);
    }
    let failed = ledger
        .balance(request(1, Code::NotFound))
        .await
        .expect_err("a failing call");
    assert_eq!(failed.code(), Code::NotFound);
    assert_eq!(failed.message(), "refused at execution 3");
    assert_eq!(
        executions.load(Ordering::SeqCst),
        3,
        "unprotected: every call runs"
    );
    task.abort();
}

/// The `idempotent-replayed` header of a gRPC answer (or refusal), as text: the gateway says
/// `true` there when it replayed a stored answer.
fn replayed_header(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_through_a_protected_route_runs_once_and_replays() {
    let (addr, executions, task) = upstream().await;
    let (_gw, mut ledger) = gateway(&config(addr)).await;

    let k = key();
    let req = request(100, Code::Ok);
    let first = ledger.charge(with_key(req, &k)).await.expect("first call");
    assert_eq!(first.get_ref().execution, 1);
    let again = ledger.charge(with_key(req, &k)).await.expect("retry");
    assert_eq!(again.get_ref(), first.get_ref(), "the same message");
    assert_eq!(replayed_header(again.metadata()), Some("true"));
    assert_eq!(executions.load(Ordering::SeqCst), 1, "ran once");

    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_status_decides_the_record_and_refusals_are_grpc_statuses() {
    let (addr, executions, task) = upstream().await;
    let (_gw, mut ledger) = gateway(&config(addr)).await;

    // A definite failure (trailers-only answer) is stored: the retry gets the same status
    // without running.
    let stored = key();
    let failing = request(1, Code::FailedPrecondition);
    let first = ledger
        .charge(with_key(failing, &stored))
        .await
        .expect_err("a failing call");
    assert_eq!(first.code(), Code::FailedPrecondition);
    let again = ledger
        .charge(with_key(failing, &stored))
        .await
        .expect_err("its replay");
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert_eq!(again.message(), first.message());
    assert_eq!(replayed_header(again.metadata()), Some("true"));
    assert_eq!(executions.load(Ordering::SeqCst), 1, "the failure ran once");

    // UNAVAILABLE means "not done, retry": the key is released and the retry runs.
    let k = key();
    let unavailable = request(2, Code::Unavailable);
    for n in [2, 3] {
        let err = ledger
            .charge(with_key(unavailable, &k))
            .await
            .expect_err("unavailable");
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(err.message(), format!("refused at execution {n}"));
    }
    assert_eq!(executions.load(Ordering::SeqCst), 3, "each retry ran");

    // The gateway's own refusal is a gRPC status a gRPC client can read.
    let missing = ledger
        .charge(request(3, Code::Ok))
        .await
        .expect_err("no key");
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("key-missing"), "{missing:?}");
    assert_idem(&missing, Reason::KeyMissing, None);
    // The stored key sent with another request: FAILED_PRECONDITION, nothing runs.
    let reused = ledger
        .charge(with_key(request(999, Code::Ok), &stored))
        .await
        .expect_err("key reused");
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert!(reused.message().contains("key-reused"), "{reused:?}");
    assert_idem(&reused, Reason::KeyReused, None);
    let details = LayerDetails::of(&reused).expect("idem details");
    assert_eq!(
        details.key.as_deref(),
        Some(stored.as_str()),
        "the key named"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 3, "nothing more ran");
    task.abort();
}

/// `status` is idem-grpc's answer for `reason`: its code, its `ErrorInfo` (domain
/// `idem.dev`), and a `RetryInfo` of `retry_after` or none.
fn assert_idem(status: &Status, reason: Reason, retry_after: Option<Duration>) {
    assert_eq!(status.code(), reason.code(), "{status:?}");
    let details =
        LayerDetails::of(status).unwrap_or_else(|| panic!("no idem ErrorInfo: {status:?}"));
    assert_eq!(details.reason(), Some(reason), "{status:?}");
    assert_eq!(details.retry_after, retry_after, "{status:?}");
}

/// Charge is protected with the default upstream timeout; Balance is protected with a
/// timeout shorter than the handler, so its calls leave the key unknown.
fn timing_config(upstream: SocketAddr) -> String {
    charge_then(
        upstream,
        r#"[[routes]]
name = "balance"
method = "POST"
path = "/idem.gwtest.v1.Ledger/Balance"
key_header = "idempotency-key"
fingerprint = { body = "raw" }
timeout = "300ms"
"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_and_unknown_are_idem_grpc_statuses_with_retry_info() {
    let (addr, executions, task) = upstream_with(Duration::from_millis(800)).await;
    let (_gw, ledger) = gateway(&timing_config(addr)).await;
    let req = request(7, Code::Ok);

    // A second call while the first runs: ABORTED, IN_FLIGHT, retry after the gateway's
    // Retry-After (the holder's lease, capped at 1 s, in whole seconds).
    let k = key();
    let first = tokio::spawn({
        let (mut ledger, k) = (ledger.clone(), k.clone());
        async move { ledger.charge(with_key(req, &k)).await }
    });
    while executions.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = ledger
        .clone()
        .charge(with_key(req, &k))
        .await
        .expect_err("in flight");
    assert_idem(&busy, Reason::InFlight, Some(Duration::from_secs(1)));
    assert_eq!(
        LayerDetails::of(&busy).and_then(|d| d.key).as_deref(),
        Some(k.as_str())
    );
    let ran = first.await.expect("join").expect("the first call's answer");
    assert_eq!(ran.get_ref().execution, 1);

    // The upstream outlives the route's timeout: the caller hears DEADLINE_EXCEEDED
    // (UPSTREAM_TIMEOUT, the gateway's own reason), the key is held unknown, and a retry
    // gets FAILED_PRECONDITION, OUTCOME_UNKNOWN, without running.
    let u = key();
    let timed_out = ledger
        .clone()
        .balance(with_key(req, &u))
        .await
        .expect_err("upstream timeout");
    assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out:?}");
    let details = LayerDetails::of(&timed_out).expect("idem details");
    assert_eq!(details.reason, "UPSTREAM_TIMEOUT");
    let unknown = ledger
        .clone()
        .balance(with_key(req, &u))
        .await
        .expect_err("outcome unknown");
    assert_idem(&unknown, Reason::OutcomeUnknown, None);
    assert_eq!(
        executions.load(Ordering::SeqCst),
        2,
        "one charge, one balance"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_unavailable_with_store_unavailable_and_retry_info() {
    if !redis_server_available() {
        return;
    }
    let redis = Server::start(&[]);
    let (addr, executions, task) = upstream().await;
    let config = config(addr).replace(
        r#"store = "memory:""#,
        &format!("store = \"{}\"\nstore_timeout = \"300ms\"", redis.url()),
    );
    let (_gw, mut ledger) = gateway(&config).await;
    let req = request(9, Code::Ok);
    let ok = ledger
        .charge(with_key(req, &key()))
        .await
        .expect("store up");
    assert_eq!(ok.get_ref().execution, 1);
    redis.kill();
    let down = ledger
        .charge(with_key(req, &key()))
        .await
        .expect_err("store down");
    // The gateway's `store_retry_after` (1 s by default) as the RetryInfo delay.
    assert_idem(
        &down,
        Reason::StoreUnavailable,
        Some(Duration::from_secs(1)),
    );
    assert_eq!(executions.load(Ordering::SeqCst), 1, "nothing ran");
    task.abort();
}

// A gRPC call's message is a protected request body like any other: one that stalls over
// HTTP/2 is cut off at `limits.body_timeout` with DEADLINE_EXCEEDED (`BODY_TIMEOUT`), frees
// its request slot, and claims nothing, so its key runs when the call is sent in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_grpc_message_is_deadline_exceeded_and_claims_nothing() {
    let (addr, executions, task) = upstream().await;
    let config = config(addr).replace(
        "[defaults]",
        "[limits]\nmax_concurrent_requests = 1\nbody_timeout = \"2s\"\n[defaults]",
    );
    let gw = Gateway::start(&config, &[]);
    let tcp = tokio::net::TcpStream::connect(gw.addr)
        .await
        .expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(conn);
    let stalled_key = key();
    // A gRPC frame announcing a 100-byte message, then 1 byte of it; the rest never comes.
    let first = http_body::Frame::data(bytes::Bytes::from_static(b"\0\0\0\0\x64\x08"));
    let stalling = futures::StreamExt::chain(
        futures::stream::iter([Ok::<_, std::convert::Infallible>(first)]),
        futures::stream::pending(),
    );
    let req = http::Request::post(format!("http://{}/idem.gwtest.v1.Ledger/Charge", gw.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", stalled_key.as_str())
        .body(http_body_util::StreamBody::new(stalling))
        .expect("request");
    let started = std::time::Instant::now();
    let stalled = tokio::spawn(send.send_request(req));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The stalled call holds the only request slot.
    let mut ledger = client(&gw).await;
    let req = request(5, Code::Ok);
    let refused = ledger
        .charge(with_key(req, &key()))
        .await
        .expect_err("overloaded while the stalled call holds the slot");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let details = LayerDetails::of(&refused).expect("idem details");
    assert_eq!(details.reason, "OVERLOADED", "{refused:?}");
    assert_eq!(details.retry_after, Some(Duration::from_secs(1)));

    // Cut off at the body timeout: a trailers-only answer, DEADLINE_EXCEEDED, BODY_TIMEOUT.
    let res = tokio::time::timeout(Duration::from_secs(6), stalled)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer to the stalled call after {:?}",
                started.elapsed()
            )
        })
        .expect("join")
        .expect("an answer");
    assert_eq!(res.status(), http::StatusCode::OK);
    let status = Status::from_header_map(res.headers())
        .unwrap_or_else(|| panic!("no grpc-status in the head: {:?}", res.headers()));
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(
        LayerDetails::of(&status).map(|d| d.reason).as_deref(),
        Some("BODY_TIMEOUT"),
        "{status:?}"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 0, "nothing ran");

    // The slot is free, and nothing was claimed: the key runs when the call is sent whole.
    let ran = ledger
        .charge(with_key(req, &stalled_key))
        .await
        .expect("the key runs");
    assert_eq!(ran.get_ref().execution, 1);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    task.abort();
}

/// What the posing upstream answers every call with: HTTP 422 (an answer the gateway keeps)
/// and a problem body in idem's own words (its `outcome-unknown` type).
const POSING_PROBLEM: &str = r#"{"type":"https://idem.dev/problems/outcome-unknown","title":"Outcome unknown","status":422,"detail":"the upstream's own words","key":"k"}"#;

/// An h2c upstream that answers every request with [`POSING_PROBLEM`]; returns its address
/// and how many requests it answered.
async fn posing_upstream() -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let answered = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&answered);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    count.fetch_add(1, Ordering::SeqCst);
                    async {
                        http::Response::builder()
                            .status(http::StatusCode::UNPROCESSABLE_ENTITY)
                            .header("content-type", "application/problem+json")
                            .body(Full::new(bytes::Bytes::from_static(
                                POSING_PROBLEM.as_bytes(),
                            )))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, answered, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_in_idems_words_reaches_the_caller_as_its_own_answer() {
    // Only answers idem made carry an idem ErrorInfo: an upstream's problem body that names
    // `outcome-unknown` must not tell a client idem holds the key (idem-client stops
    // retrying on OUTCOME_UNKNOWN), whether it is the first answer or its replay.
    let (addr, answered, task) = posing_upstream().await;
    let (_gw, mut ledger) = gateway(&config(addr)).await;
    let k = key();
    let req = request(7, Code::Ok);
    for attempt in ["first", "replay"] {
        let status = ledger
            .charge(with_key(req, &k))
            .await
            .expect_err("the upstream's 422");
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "{attempt}: {status:?}"
        );
        assert_eq!(status.message(), "the upstream's own words", "{attempt}");
        assert_eq!(
            LayerDetails::of(&status),
            None,
            "{attempt}: no idem ErrorInfo on the upstream's answer: {status:?}"
        );
    }
    assert_eq!(
        answered.load(Ordering::SeqCst),
        1,
        "a 422 is kept and replayed"
    );
    task.abort();
}
