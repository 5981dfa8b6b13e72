//! The retrying client against the real gateway, with a fault proxy between them, on the
//! memory, Redis and PostgreSQL stores: the answer is lost after the server acted, the
//! request is reset before it reaches the server, it arrives after the client gave up, the
//! upstream is slower than the client waits. Every scenario ends with exactly one execution
//! (counted at the upstream) and the client holding the first answer.
//!
//! The unsafe clients live here, not in the library, and are shown to fail the same
//! scenarios: one that retries with a fresh key executes twice; one that retries with the
//! same key but never asks the status endpoint ends without the answer of a charge that ran.

mod cleanup;
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use cleanup::StoreGuard;
use common::{Gateway, Http, Upstream, ci, configs, reachable};
use http::{Method, StatusCode};
use idem_client::{
    Call, ClientError, HttpClient, Jitter, Reply, RetryPolicy, StatusEndpoint, reqwest,
};
use idem_testkit::fault_proxy::{Fault, FaultProxy};

const API_KEY: &str = "alice-api-key";

fn config(upstream: &str, store: &str, extra: &str) -> String {
    configs::with_status(
        upstream,
        store,
        extra,
        r#"[[routes]]
name = "charge"
method = "POST"
path = "/charge/*"
"#,
    )
}

/// The client under test: a new connection per request (so the proxy's plan meets each
/// attempt), short waits, and the gateway's status endpoint behind the same proxy.
fn client(proxy: &FaultProxy, attempt_timeout: Duration) -> HttpClient {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest");
    let policy = RetryPolicy::default()
        .max_attempts(5)
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(200))
        .attempt_timeout(attempt_timeout)
        .deadline(Duration::from_secs(20))
        .jitter(Jitter::Full);
    let status = StatusEndpoint::new(&format!("http://{}/idem/status", proxy.addr()))
        .expect("url")
        .route("charge");
    HttpClient::with_reqwest(http, policy).status_endpoint(status)
}

fn charge(proxy: &FaultProxy, path: &str) -> Call {
    Call::post(&format!("http://{}{path}", proxy.addr()))
        .expect("url")
        .header("x-api-key", API_KEY)
        .expect("header")
        .json(r#"{"amount":100}"#)
}

/// The charge at `path` sent through `proxy` by the client under test (waiting
/// `attempt_timeout` per attempt), which must end with an answer.
async fn send_charge(proxy: &FaultProxy, path: &str, attempt_timeout: Duration) -> Reply {
    client(proxy, attempt_timeout)
        .send(charge(proxy, path))
        .await
        .expect("an answer")
}

/// The answer of the one execution of `path`: the upstream's own answer for that path (it
/// echoes the path and numbers its executions), with `path` run exactly once.
fn assert_first_answer(reply: &Reply, up: &Upstream, path: &str) {
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(body["path"], path, "{body}");
    assert!(body["n"].as_u64().is_some(), "an upstream answer: {body}");
    assert_eq!(up.seen.count(path), 1, "exactly one execution of {path}");
}

/// Runs every scenario against a gateway on `store`.
async fn scenarios(store: &str, extra: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), store, extra), &[]);

    // 1. The server answered; the answer is lost on its way back. The status query returns
    //    the stored answer; nothing is sent again.
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer]).await;
    let path = "/charge/dropped";
    let reply = send_charge(&proxy, path, Duration::from_secs(5)).await;
    assert!(reply.from_status, "{reply:?}");
    assert_eq!(reply.attempts, 1);
    assert_first_answer(&reply, &up, path);
    assert_eq!(proxy.applied().await, [Fault::DropAfterAnswer]);

    // 2. Reset before sending: the status says absent, the same key is sent again.
    let proxy = common::posts_proxy(&gw, [Fault::ResetBeforeSending]).await;
    let path = "/charge/reset-before";
    let reply = send_charge(&proxy, path, Duration::from_secs(5)).await;
    assert_eq!(reply.attempts, 2);
    assert_first_answer(&reply, &up, path);
    assert_eq!(
        proxy.applied().await,
        [Fault::ResetBeforeSending, Fault::Pass]
    );

    // 3. The first attempt is held past the client's timeout and arrives after the retry:
    //    the late one is answered from the record, never run.
    let proxy = common::posts_proxy(&gw, [Fault::Delay(Duration::from_millis(1500))]).await;
    let path = "/charge/late";
    let reply = send_charge(&proxy, path, Duration::from_millis(400)).await;
    assert_first_answer(&reply, &up, path);
    assert!(
        proxy.settled(Duration::from_secs(10)).await,
        "the late request was answered"
    );
    assert_eq!(up.seen.count(path), 1, "the late request did not run again");

    // 4. The upstream is slower than the client waits: in flight, then the stored answer.
    let proxy = common::posts_proxy(&gw, []).await;
    let path = "/charge/slow";
    let reply = send_charge(
        &proxy,
        &format!("{path}?delay_ms=1200"),
        Duration::from_millis(300),
    )
    .await;
    assert!(reply.from_status, "{reply:?}");
    assert_eq!(reply.attempts, 1);
    assert_first_answer(&reply, &up, path);

    // 5. Every answer to a POST is lost: the status endpoint still gives the first answer.
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer; 5]).await;
    let path = "/charge/always-dropped";
    let reply = send_charge(&proxy, path, Duration::from_secs(5)).await;
    assert!(reply.from_status);
    assert_first_answer(&reply, &up, path);

    // 7. Two callers send one operation (one key) at once: one runs, the other is told it is
    //    in flight, waits, and gets the same answer.
    let proxy = common::posts_proxy(&gw, []).await;
    let path = "/charge/twice-at-once";
    let key = common::key();
    let call = charge(&proxy, &format!("{path}?delay_ms=800")).key(key.clone());
    let (first, second) = (
        client(&proxy, Duration::from_secs(5)),
        client(&proxy, Duration::from_secs(5)),
    );
    let (a, b) = tokio::join!(first.send(call.clone()), second.send(call));
    let (a, b) = (a.expect("an answer"), b.expect("an answer"));
    assert_first_answer(&a, &up, path);
    assert_eq!(a.body, b.body, "both hold the one answer");
    assert!(a.replayed() != b.replayed(), "one ran, one was replayed");
    assert!(
        a.attempts + b.attempts >= 3,
        "the duplicate was refused in flight first"
    );

    // 6. An upstream reset after sending leaves the key unknown: a typed error, no rerun.
    let proxy = common::posts_proxy(&gw, []).await;
    let err = client(&proxy, Duration::from_secs(5))
        .send(charge(&proxy, "/charge/x/reset"))
        .await
        .expect_err("unknown");
    assert!(matches!(err, ClientError::OutcomeUnknown { .. }), "{err}");
    assert_eq!(up.seen.count("/charge/x/reset"), 1, "not run again");
}

/// The unsafe variants, each on the scenario it gets wrong.
async fn unsafe_variants(store: &str, extra: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), store, extra), &[]);
    let http = Http::new();

    // A client that makes a new key for every attempt: the lost answer becomes a second
    // charge.
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer]).await;
    let path = "/charge/fresh-key";
    let url = format!("http://{}{path}", proxy.addr());
    let mut answer = None;
    for _ in 0..3 {
        let key = common::key();
        let headers = [("idempotency-key", key.as_str()), ("x-api-key", API_KEY)];
        if let Ok(r) = http.try_send(Method::POST, &url, &headers, "{}").await {
            answer = Some(r);
            break;
        }
    }
    let answer = answer.expect("the second attempt got through");
    assert_eq!(
        answer.json()["n"].as_u64(),
        Some(2),
        "a second execution answered"
    );
    assert_eq!(up.seen.count(path), 2, "the fresh-key client charged twice");

    // A client that keeps its key but retries without asking the status endpoint: when
    // every answer is lost it gives up, though the charge ran; the caller is told it failed.
    let proxy = common::posts_proxy(&gw, [Fault::DropAfterAnswer; 5]).await;
    let path = "/charge/no-status-query";
    let url = format!("http://{}{path}", proxy.addr());
    let key = common::key();
    let headers = [("idempotency-key", key.as_str()), ("x-api-key", API_KEY)];
    let mut answer = None;
    for _ in 0..5 {
        if let Ok(r) = http.try_send(Method::POST, &url, &headers, "{}").await {
            answer = Some(r);
            break;
        }
    }
    assert!(answer.is_none(), "no answer reached the client");
    assert_eq!(up.seen.count(path), 1, "yet the charge ran");
}

async fn service_up(addr: &str, name: &str) -> bool {
    if reachable(addr).await {
        return true;
    }
    assert!(!ci(), "{name} is not running on {addr}");
    eprintln!("SKIPPED: {name} is not running on {addr}");
    false
}

fn unique(tag: &str) -> String {
    format!("{tag}_{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_every_fault_ends_in_one_execution() {
    scenarios("memory:", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_every_fault_ends_in_one_execution() {
    if !service_up("127.0.0.1:6379", "Redis").await {
        return;
    }
    let prefix = format!("{}:", unique("idem-client-faults"));
    // The records and audit streams under the test's prefix go, pass or fail.
    let _cleanup = StoreGuard::Redis(prefix.clone());
    scenarios(
        "redis://127.0.0.1:6379",
        &format!("store_prefix = \"{prefix}\""),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_every_fault_ends_in_one_execution() {
    if !service_up("127.0.0.1:5432", "PostgreSQL").await {
        return;
    }
    let table = unique("idem_client_faults");
    // The table and its audit table go, pass or fail.
    let _cleanup = StoreGuard::Postgres(table.clone());
    scenarios(
        "postgres://postgres@127.0.0.1:5432/test",
        &format!("store_table = \"{table}\""),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_clients_charge_twice_or_lose_the_answer() {
    unsafe_variants("memory:", "").await;
}

/// A Redis server of this test's own on a spare port; killed on drop.
struct PrivateRedis {
    child: std::process::Child,
    port: u16,
    dir: common::TempDir,
}

impl PrivateRedis {
    fn spawn(port: u16, dir: &std::path::Path) -> std::io::Result<std::process::Child> {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    async fn start() -> Option<Self> {
        let port = common::spare_port();
        let dir = common::TempDir::new("client-redis");
        let child = match Self::spawn(port, &dir.0) {
            Ok(c) => c,
            Err(e) => {
                assert!(!ci(), "redis-server cannot start: {e}");
                eprintln!("SKIPPED: redis-server cannot start: {e}");
                return None;
            }
        };
        let me = Self { child, port, dir };
        me.wait_up().await;
        Some(me)
    }

    async fn wait_up(&self) {
        for _ in 0..500 {
            if reachable(&format!("127.0.0.1:{}", self.port)).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("private redis did not start");
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.port, &self.dir.0).expect("restart redis-server");
        self.wait_up().await;
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The store is down when the call starts: the gateway refuses with 503 and `Retry-After`
/// (nothing runs), the client waits and retries the same key, and once the store is back
/// the charge runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_waited_out_and_the_charge_runs_once() {
    let Some(mut redis) = PrivateRedis::start().await else {
        return;
    };
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &config(
            &up.url(),
            &format!("redis://127.0.0.1:{}", redis.port),
            "store_timeout = \"300ms\"",
        ),
        &[],
    );
    let proxy = common::posts_proxy(&gw, []).await;
    redis.stop();
    let path = "/charge/store-outage";
    let client = client(&proxy, Duration::from_secs(5));
    let pending = tokio::spawn({
        let call = charge(&proxy, path);
        async move { client.send(call).await }
    });
    // Let the first attempts meet the outage, then bring the store back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    redis.restart().await;
    let reply = pending.await.expect("join").expect("an answer");
    assert!(reply.attempts >= 2, "the outage was met first: {reply:?}");
    assert_first_answer(&reply, &up, path);
}
