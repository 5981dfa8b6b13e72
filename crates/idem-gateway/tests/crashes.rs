//! At most once across crashes with the default configuration: real `idem serve` processes
//! on one Redis, an upstream that keeps a ledger of what it executed and answers a status
//! webhook from it, and gateways SIGKILLed or SIGSTOPped mid-request.
//!
//! - A killed gateway's request, which the upstream executed, is settled from the webhook
//!   when its short lease (4 s with a `status_url`) runs out: the retry through another
//!   gateway gets the upstream's first answer, and nothing runs twice. (Its unguarded
//!   variant, `takeover = "reexecute"`, runs it twice: `shared.rs`.)
//! - A gateway paused past its lease, whose record a retry marked unknown, completes it when
//!   it comes back: its answer is stored and replayed, no operator needed.
//! - Every forwarded request carries the key and the claim's fence; a client cannot forge or
//!   strip the fence header.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use common::{Gateway, Http, REDIS, key, service_up};
use http::{Method, StatusCode};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;

/// What the upstream executed: per key, how many times, with the answer it gave and the
/// fences it was sent; and which keys are executing right now.
#[derive(Default)]
struct Ledger {
    done: Mutex<HashMap<String, (u32, String)>>,
    running: Mutex<HashMap<String, u32>>,
    fences: Mutex<Vec<(String, Option<String>)>>,
}

impl Ledger {
    fn executions(&self, key: &str) -> u32 {
        self.done.lock().get(key).map_or(0, |d| d.0)
    }
}

#[derive(Deserialize)]
struct Pay {
    delay_ms: Option<u64>,
}

/// `POST /pay?delay_ms=N`: executes (after the delay), answers 201 with a body naming the
/// execution. The work is spawned, so a gateway that dies mid-request does not cancel it.
async fn pay(
    State(ledger): State<Arc<Ledger>>,
    Query(q): Query<Pay>,
    headers: HeaderMap,
) -> axum::response::Response {
    let key = common::idempotency_key(&headers);
    let fence = headers
        .get("idempotency-fence")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    ledger.fences.lock().push((key.clone(), fence));
    *ledger.running.lock().entry(key.clone()).or_default() += 1;
    let work = {
        let ledger = Arc::clone(&ledger);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(q.delay_ms.unwrap_or(0))).await;
            let mut done = ledger.done.lock();
            let entry = done.entry(key.clone()).or_insert((0, String::new()));
            entry.0 += 1;
            entry.1 = json!({"key": key, "execution": entry.0}).to_string();
            let body = entry.1.clone();
            drop(done);
            if let Some(n) = ledger.running.lock().get_mut(&key) {
                *n -= 1;
            }
            body
        })
    };
    match work.await {
        Ok(body) => (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[derive(Deserialize)]
struct Status {
    key: String,
}

/// The status webhook: executed (its answer), executing (cannot say), or never.
async fn status(
    State(ledger): State<Arc<Ledger>>,
    Query(q): Query<Status>,
) -> axum::response::Response {
    let answer = if let Some((_, body)) = ledger.done.lock().get(&q.key) {
        json!({"outcome": "complete", "status": 201,
               "headers": {"content-type": "application/json"}, "body": body})
    } else if ledger.running.lock().get(&q.key).is_some_and(|n| *n > 0) {
        json!({"outcome": "unknown"})
    } else {
        json!({"outcome": "release"})
    };
    ([("content-type", "application/json")], answer.to_string()).into_response()
}

/// What every test here starts from, on the shared Redis: the ledger upstream and a store
/// prefix of the test's own (`idem-{tag}-…`); `None` (said) when Redis is not running.
async fn on_redis(tag: &str) -> Option<(SocketAddr, Arc<Ledger>, String)> {
    if !service_up(REDIS, "Redis").await {
        return None;
    }
    let (up, ledger) = upstream().await;
    let prefix = format!("idem-{tag}-{}", uuid::Uuid::now_v7().simple());
    Some((up, ledger, prefix))
}

async fn upstream() -> (SocketAddr, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::default());
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(pay))
        .route("/status", axum::routing::get(status))
        .with_state(Arc::clone(&ledger));
    (common::serve_router(app).await, ledger)
}

/// The documented defaults but for what each test says: no `takeover` (so `hold`), Redis
/// under a prefix of its own.
fn config(upstream: SocketAddr, prefix: &str, route: &str) -> String {
    common::configs::anonymous(
        &format!("http://{upstream}"),
        &format!("redis://{REDIS}"),
        &format!(r#"store_prefix = "{prefix}:""#),
        r#"namespace = "crashes""#,
        &format!(
            r#"
[[routes]]
name = "pay"
method = "POST"
path = "/pay"
{route}
"#
        ),
    )
}

/// [`Http::try_post_keyed`] in the background, for a request the test kills or pauses its gateway under.
fn post_keyed_in_background(
    http: &Http,
    url: String,
    key: &str,
) -> tokio::task::JoinHandle<Result<common::Reply, String>> {
    let (http, key) = (http.clone(), key.to_owned());
    tokio::spawn(async move { http.try_post_keyed(&url, &key).await })
}

/// Waits (at most 5 s, then fails) until a request has reached the upstream, so that the
/// test can kill or pause the gateway while it is in flight.
async fn until_reached(ledger: &Ledger) {
    let reached = Instant::now();
    while ledger.fences.lock().is_empty() {
        assert!(
            reached.elapsed() < Duration::from_secs(5),
            "never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `key` to `url` until the answer is not `409 in-flight`, for at most `limit`.
async fn until_settled(http: &Http, url: &str, key: &str, limit: Duration) -> common::Reply {
    let start = Instant::now();
    loop {
        let r = http.post_keyed(url, key).await;
        if !(r.status == StatusCode::CONFLICT && r.problem_type() == "in-flight") {
            return r;
        }
        assert!(start.elapsed() < limit, "still in flight after {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// Guards the bug of "at most once across crashes by default": a gateway killed after its
// request reached the upstream, whose expired lease the next claim re-ran blind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_request_is_settled_from_the_webhook_never_run_twice() {
    let Some((up, ledger, prefix)) = on_redis("crash").await else {
        return;
    };
    let cfg = config(
        up,
        &prefix,
        "timeout = \"2s\"\nstatus_url = \"/status?key={key}\"",
    );
    let mut a = Gateway::start(&cfg, &[]);
    let b = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let k = key();

    let sent = post_keyed_in_background(&http, a.url("/pay?delay_ms=500"), &k);
    // The request reached the upstream; the gateway dies before it can answer.
    until_reached(&ledger).await;
    a.kill();
    assert!(
        sent.await.expect("join").is_err(),
        "the killed gateway answered"
    );

    let settled = until_settled(
        &http,
        &b.url("/pay?delay_ms=500"),
        &k,
        Duration::from_secs(20),
    )
    .await;
    settled.assert_status(StatusCode::CREATED);
    assert!(settled.replayed(), "the upstream's answer, replayed");
    assert_eq!(settled.json()["execution"], 1);
    assert_eq!(ledger.executions(&k), 1, "nothing ran twice");
    let again = http.post_keyed(&b.url("/pay?delay_ms=500"), &k).await;
    assert_eq!(again.body, settled.body);
    assert_eq!(ledger.executions(&k), 1);
}

// Guards point 3: a gateway paused past its lease (a retry marked its record unknown, and
// no webhook could settle it) finishes its own work when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_paused_past_its_lease_completes_its_own_request() {
    let Some((up, ledger, prefix)) = on_redis("pause").await else {
        return;
    };
    let cfg = config(up, &prefix, "timeout = \"10s\"\nlease = \"2s\"");
    let a = Gateway::start(&cfg, &[]);
    let b = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let k = key();
    let first = post_keyed_in_background(&http, a.url("/pay?delay_ms=300"), &k);
    until_reached(&ledger).await;
    a.signal("-STOP");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Past the lease: the retry marks the record unknown; without a webhook it says so.
    let meanwhile = http.post_keyed(&b.url("/pay?delay_ms=300"), &k).await;
    a.signal("-CONT");
    assert_eq!(
        (meanwhile.status, meanwhile.problem_type().as_str()),
        (StatusCode::CONFLICT, "outcome-unknown")
    );
    let first = first
        .await
        .expect("join")
        .expect("the paused gateway answered");
    first.assert_status(StatusCode::CREATED);
    assert!(!first.replayed());
    let after = http.post_keyed(&b.url("/pay?delay_ms=300"), &k).await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(after.replayed(), "the late holder's answer was stored");
    assert_eq!(after.body, first.body);
    assert_eq!(ledger.executions(&k), 1);
}

// Guards point 4: the upstream gets the key and the fence on every protected request, and a
// client can neither forge the fence (it is replaced) nor strip it (`Connection` names it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarded_request_carries_the_key_and_the_claims_fence() {
    let Some((up, ledger, prefix)) = on_redis("fence").await else {
        return;
    };
    let gw = Gateway::start(&config(up, &prefix, "timeout = \"2s\""), &[]);
    let http = Http::new();
    let k = key();
    let r = http
        .send(
            Method::POST,
            &gw.url("/pay"),
            &[
                ("idempotency-key", &k),
                ("idempotency-fence", "1"),
                ("connection", "idempotency-fence"),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let seen = ledger.fences.lock().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, k, "the key is forwarded");
    let fence: u64 = seen[0]
        .1
        .as_deref()
        .expect("a fence header")
        .parse()
        .expect("a number");
    assert!(fence > 1, "the claim's fence, not the client's: {fence}");
}
