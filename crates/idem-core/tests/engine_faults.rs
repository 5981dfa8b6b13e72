//! Handler and store faults: panics, handler timeouts, cancellation (dropping `run`), and a
//! failing or hanging store.
//!
//! How these were shown to bite: the engine fix calling the handler closure inside the panic
//! guard failed `a_handler_that_panics_before…` first. Against a scratch copy of the engine,
//! each of these mutations failed the tests named: a panic path that does not release (both
//! panic tests), a drop guard that never releases (dropping_run_mid_handler…,
//! dropping_run_under_hold…), and no store timeout (a_hanging_store…).

mod common;

use std::future::pending;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use idem_core::{
    Answer, EngineError, ListFilter, Policy, Settlement, StateKind, Store, StoreError, StoreOp,
    TakeoverPolicy,
};
use idem_testkit::Fault;
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------
// Panics and handler timeouts
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_releases_its_claim_and_poisons_nothing() {
    // Guards: a panic that leaves the key processing until the lease runs out (retries get
    // 409 for 45 s), or that poisons the store's lock for every other key.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("panics");
    let result = engine.run(&k, &fp(b"x"), |_| async { explode() }).await;
    assert!(
        matches!(result, Err(EngineError::HandlerPanicked)),
        "{result:?}"
    );
    assert!(rig.record(&k).await.is_none(), "the claim was released");
    let retry = engine
        .run(&k, &fp(b"x"), |_| async { ok("fixed") })
        .await
        .expect("run");
    assert!(
        matches!(
            retry,
            Answer::Executed {
                output: "fixed",
                ..
            }
        ),
        "a retry runs the handler again: {retry:?}"
    );
    let other = engine
        .run(&key("unrelated"), &fp(b"y"), |_| async { ok("fine") })
        .await
        .expect("run");
    assert!(
        matches!(other, Answer::Executed { output: "fine", .. }),
        "{other:?}"
    );
    assert_eq!(
        rig.memory
            .list(&ListFilter::default())
            .await
            .expect("list")
            .len(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_panics_before_returning_its_future_is_caught_too() {
    // Guards: calling the handler closure outside the panic guard, so a panic in the closure
    // body (before its async block) escaped `run` as a panic instead of HandlerPanicked.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("panics-early");
    let result = engine
        .run(&k, &fp(b"x"), |_| {
            // The closure body panics before it builds its future.
            let settlement = explode();
            async move { settlement }
        })
        .await;
    assert!(
        matches!(result, Err(EngineError::HandlerPanicked)),
        "{result:?}"
    );
    assert!(rig.record(&k).await.is_none(), "the claim was released");
}

#[tokio::test(start_paused = true)]
async fn handler_timeout_releases_per_policy() {
    // Guards: a timed-out handler leaving its claim processing, or `hold` letting a retry
    // re-run an operation whose outcome is ambiguous.
    let rig = Rig::new();
    let k = key("slow");
    let reexecute = rig.engine(policy(secs(5), secs(5)));
    let start = Instant::now();
    let timed_out = reexecute
        .run(&k, &fp(b"x"), |_| pending::<Settlement<()>>())
        .await;
    assert!(
        matches!(timed_out, Err(EngineError::HandlerTimedOut(d)) if d == secs(5)),
        "{timed_out:?}"
    );
    assert_eq!(start.elapsed(), secs(5));
    assert!(
        rig.record(&k).await.is_none(),
        "reexecute: released as retryable"
    );
    let retry = reexecute
        .run(&k, &fp(b"x"), |_| async { ok("quick") })
        .await
        .expect("run");
    assert!(matches!(retry, Answer::Executed { .. }), "{retry:?}");

    let k = key("slow-held");
    let hold = rig.engine(common::policy_with(|b| {
        b.handler_timeout(secs(5))
            .lease(secs(20))
            .takeover(TakeoverPolicy::Hold)
    }));
    let timed_out = hold
        .run(&k, &fp(b"x"), |_| pending::<Settlement<()>>())
        .await;
    assert!(
        matches!(timed_out, Err(EngineError::HandlerTimedOut(_))),
        "{timed_out:?}"
    );
    assert_eq!(
        rig.record(&k).await.expect("record").state.kind(),
        StateKind::Unknown,
        "hold: released as unknown"
    );
    let retry = hold
        .run(&k, &fp(b"x"), |_| async { ok("no") })
        .await
        .expect("run");
    assert!(matches!(retry, Answer::Unknown), "{retry:?}");
}

// ---------------------------------------------------------------------------------------
// Cancellation and store faults
// ---------------------------------------------------------------------------------------

async fn drop_mid_handler(takeover: TakeoverPolicy) -> Rig {
    let rig = Rig::new();
    let engine = rig.engine(common::policy_with(|b| b.takeover(takeover)));
    let k = key("dropped");
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let x = fp(b"x");
    let run = engine.run(&k, &x, |_| {
        let flag = DropFlag(Arc::clone(&dropped));
        async move {
            let _flag = flag;
            started_tx.send(()).expect("test waits");
            pending::<()>().await;
            ok("never")
        }
    });
    // The caller gives up (e.g. the client disconnected) once the handler is running.
    tokio::select! {
        _ = run => panic!("the handler never finishes"),
        _ = started => {}
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "dropping run drops the handler"
    );
    rig.wait_calls(|c| c[StoreOp::Release] >= 1).await;
    rig
}

#[tokio::test(start_paused = true)]
async fn dropping_run_mid_handler_releases_the_claim() {
    // Guards: an abandoned run leaving an orphaned lease that blocks retries until expiry.
    let rig = drop_mid_handler(TakeoverPolicy::Reexecute).await;
    assert!(
        rig.record(&key("dropped")).await.is_none(),
        "released in the background"
    );
    let engine = rig.engine(Policy::default());
    let retry = engine
        .run(&key("dropped"), &fp(b"x"), |_| async { ok("retried") })
        .await
        .expect("run");
    assert!(
        matches!(
            retry,
            Answer::Executed {
                takeover: false,
                ..
            }
        ),
        "the retry runs at once: {retry:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_run_under_hold_leaves_unknown() {
    // Guards: an abandoned run under `hold` being released as retryable (its effect may have
    // happened, so a retry must not re-run it).
    let rig = drop_mid_handler(TakeoverPolicy::Hold).await;
    assert_eq!(
        rig.record(&key("dropped"))
            .await
            .expect("record")
            .state
            .kind(),
        StateKind::Unknown
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_fails_closed_before_the_claim() {
    // Guards: failing open (running the handler without a durable claim) when the store is
    // down.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Claim, Fault::Error);
    let engine = rig.engine(Policy::default());
    let ran = AtomicBool::new(false);
    let result = engine
        .run(&key("down"), &fp(b"x"), |_| {
            ran.store(true, Ordering::SeqCst);
            async { ok("must not run") }
        })
        .await;
    assert!(
        matches!(result, Err(EngineError::Store(StoreError::Unavailable(_)))),
        "{result:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_times_out_before_the_claim() {
    // Guards: a request hanging forever on an unresponsive store instead of a prompt 503.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Claim, Fault::Hang);
    let engine = rig.engine(common::policy_with(|b| {
        b.store_timeout(Duration::from_millis(250))
    }));
    let ran = AtomicBool::new(false);
    let start = Instant::now();
    let result = bounded(engine.run(&key("slow-store"), &fp(b"x"), |_| {
        ran.store(true, Ordering::SeqCst);
        async { ok("must not run") }
    }))
    .await;
    assert!(
        matches!(result, Err(EngineError::Store(StoreError::Timeout(d))) if d == Duration::from_millis(250)),
        "{result:?}"
    );
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert!(!ran.load(Ordering::SeqCst));
    assert!(rig.memory.is_empty());
}
