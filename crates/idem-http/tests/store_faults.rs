//! Store down or slow ⇒ fail closed: 503 + Retry-After within the store timeout, and the
//! handler never runs.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{Hits, app_with, post_req, send};
use idem_core::{BoxStore, Engine, MemoryStore, Policy};
use idem_testkit::{Fault, FaultyStore};

/// A store whose every operation suffers `fault`: `Error` is a store that is down, `Hang` one
/// that never answers.
fn broken(fault: Fault) -> BoxStore {
    BoxStore::new(FaultyStore::new(MemoryStore::new(16)).with_all(fault))
}

const STORE_TIMEOUT: Duration = Duration::from_millis(200);

fn policy(store_timeout: Duration) -> Policy {
    Policy::builder()
        .store_timeout(store_timeout)
        .build()
        .expect("policy")
}

async fn assert_fails_closed(store: BoxStore) {
    let engine = Engine::new(store, Policy::default());
    let hits = Arc::new(Hits::default());
    let router = app_with(&engine, Arc::clone(&hits), |c| {
        c.policy(policy(STORE_TIMEOUT))
            .store_retry_after(Duration::from_secs(2))
    });
    let t0 = Instant::now();
    let got = send(&router, post_req("/respond", Some("k"), None, "{}")).await;
    let took = t0.elapsed();
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{got:?}");
    assert_eq!(
        got.problem_type(),
        "https://idem.dev/problems/store-unavailable"
    );
    assert_eq!(got.headers["retry-after"], "2");
    assert_eq!(got.json()["retry_after"], 2);
    assert!(
        took < STORE_TIMEOUT + Duration::from_millis(300),
        "answered after {took:?}"
    );
    assert_eq!(
        hits.started(),
        0,
        "the handler must never run without a claim"
    );
    // The status endpoint fails closed too.
    let status = send(
        &router,
        axum::http::Request::get("/idempotency/k")
            .body(axum::body::Body::empty())
            .expect("req"),
    )
    .await;
    assert_eq!(status.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn an_erroring_store_is_503_and_nothing_runs() {
    assert_fails_closed(broken(Fault::Error)).await;
}

#[tokio::test]
async fn a_hanging_store_is_503_within_its_timeout_and_nothing_runs() {
    assert_fails_closed(broken(Fault::Hang)).await;
}

/// The guard is the store timeout: with it pushed out to a minute, the same hanging store
/// holds the request far past the bound the test above checks (the unguarded variant).
#[tokio::test]
async fn without_the_store_timeout_a_hanging_store_holds_the_request() {
    let engine = Engine::new(broken(Fault::Hang), Policy::default());
    let hits = Arc::new(Hits::default());
    let router = app_with(&engine, Arc::clone(&hits), |c| {
        c.policy(policy(Duration::from_secs(60)))
    });
    let waited = tokio::time::timeout(
        STORE_TIMEOUT + Duration::from_millis(300),
        send(&router, post_req("/respond", Some("k"), None, "{}")),
    )
    .await;
    assert!(
        waited.is_err(),
        "without the timeout nothing bounds the wait"
    );
    assert_eq!(hits.started(), 0);
}

// Guards the bug the fault suite found: the store failed while recording the handler's
// answer and the layer still handed that answer out, so a retry sent after it found the key
// in flight, then unknown. Now the client is told the answer is not recorded yet (503,
// retry with the same key), and once the store is back the retry replays the first answer;
// the handler ran once.
#[tokio::test(start_paused = true)]
async fn an_answer_the_store_could_not_record_is_not_handed_out() {
    use idem_core::StoreOp;
    let store = FaultyStore::new(MemoryStore::new(16));
    let engine = Engine::new(BoxStore::new(store.clone()), Policy::default());
    let hits = Arc::new(Hits::default());
    let router = app_with(&engine, Arc::clone(&hits), |c| {
        c.store_retry_after(Duration::from_secs(1))
    });
    store.set(StoreOp::Complete, Fault::Error);
    let got = send(&router, post_req("/respond", Some("k"), None, "{}")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{got:?}");
    assert_eq!(
        got.problem_type(),
        "https://idem.dev/problems/answer-not-recorded"
    );
    assert_eq!(got.headers["retry-after"], "1");
    assert_eq!(hits.started(), 1, "it ran");
    store.clear(StoreOp::Complete);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let again = send(&router, post_req("/respond", Some("k"), None, "{}")).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(hits.started(), 1, "the retry replayed, nothing ran again");
}
