//! The engine's lease: renewal across intervals, a renewal answered `Lost`, takeover by a
//! competitor, and the local deadline when renewals fail or hang.
//!
//! How these were shown to bite: `renewal_check_bites_when_renewals_never_reach_the_store`
//! keeps an unguarded variant as a test; the engine fix bounding a renewal by the local
//! deadline (not only the store timeout) failed `a_hanging_renewal…` first. Against a scratch
//! copy of the engine, each of these mutations failed the tests named: ignoring a `Lost`
//! renewal (renew_answered_lost…, takeover_by_a_competitor…), the local deadline counted from
//! the claim's answer (failing_renewals…, a_hanging_renewal…), and no store timeout
//! (a_hanging_renewal…).

mod common;

use std::future::pending;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idem_core::{
    Answer, ClaimOutcome, EngineError, Policy, RecordState, Settled, Settlement, Store, StoreOp,
    TakeoverPolicy, Timestamp,
};
use idem_testkit::Fault;
use tokio::time::Instant;

/// One check inside a long handler: our lease deadline on the store (if the record is still
/// ours), then what a competing claim got after the store clock jumped ahead.
#[derive(Clone, Debug)]
struct Check {
    our_lease_until: Option<Timestamp>,
    competitor: ClaimOutcome,
}

/// Runs a handler for five renew intervals while the store clock races ahead 40 s per
/// interval (far past the first 75 s lease). Returns the run's outcome, the first lease's
/// deadline and one [`Check`] per interval.
async fn run_across_renewals(rig: &Rig) -> (Answer<&'static str>, Timestamp, Vec<Check>) {
    let engine = rig.engine(policy(secs(60), secs(10)));
    let k = key("renewed");
    let checks = Arc::new(Mutex::new(Vec::new()));
    let first_deadline = Arc::new(Mutex::new(Timestamp(0)));
    let outcome = engine
        .run(&k, &fp(b"r"), |lease| {
            *first_deadline.lock().expect("lock") = lease.deadline;
            let (memory, clock, checks, k) = (
                rig.memory.clone(),
                rig.clock.clone(),
                Arc::clone(&checks),
                k.clone(),
            );
            async move {
                // Offset by 1 ms so each check runs just after the watchdog's renewal.
                tokio::time::sleep(Duration::from_millis(1)).await;
                for _ in 0..5 {
                    tokio::time::sleep(secs(10)).await;
                    let record = memory.get(&k).await.expect("get").expect("record");
                    let our_lease_until = match record.state {
                        RecordState::Processing { lease_until, owner } if owner == lease.owner => {
                            Some(lease_until)
                        }
                        _ => None,
                    };
                    clock.jump(secs(40));
                    let competitor = memory
                        .claim(&claim_request(
                            &k,
                            b"r",
                            secs(75),
                            TakeoverPolicy::Reexecute,
                        ))
                        .await
                        .expect("claim");
                    checks.lock().expect("lock").push(Check {
                        our_lease_until,
                        competitor,
                    });
                }
                ok("done")
            }
        })
        .await
        .expect("run");
    let checks = checks.lock().expect("lock").clone();
    let first = *first_deadline.lock().expect("lock");
    (outcome, first, checks)
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_the_lease_across_intervals() {
    // Guards: a watchdog that never renews (or renews with the wrong fence), letting a retry
    // take over a live handler once the first lease runs out.
    let rig = Rig::new();
    let (outcome, first_deadline, checks) = run_across_renewals(&rig).await;
    assert_eq!(checks.len(), 5);
    let mut last = first_deadline;
    for c in &checks {
        let until = c.our_lease_until.expect("the record stays ours");
        assert!(
            until > last,
            "each renewal moves the store's lease forward: {checks:?}"
        );
        last = until;
        assert!(
            matches!(c.competitor, ClaimOutcome::Busy { .. }),
            "a competing claim must stay busy: {checks:?}"
        );
    }
    assert!(
        rig.store.calls()[StoreOp::Renew] >= 5,
        "renewed every interval: {:?}",
        rig.store.calls()
    );
    match outcome {
        Answer::Executed {
            output,
            settled: Settled::Stored,
            takeover: false,
            ..
        } => assert_eq!(output, "done"),
        other => panic!("expected a stored execution, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renewal_check_bites_when_renewals_never_reach_the_store() {
    // The unguarded variant of the test above: renewals that answer "renewed" without
    // extending the store's lease. The deadline never moves, the competitor takes the key
    // over, and the stale holder's result is fenced off instead of overwriting the new
    // holder's record.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Renew, Fault::RenewPretend);
    let (outcome, first_deadline, checks) = run_across_renewals(&rig).await;
    assert_eq!(
        checks[0].our_lease_until,
        Some(first_deadline),
        "the lease did not move"
    );
    let takeover = checks
        .iter()
        .any(|c| matches!(c.competitor, ClaimOutcome::Claimed { takeover: true, .. }));
    assert!(
        takeover,
        "without real renewals the lease must run out: {checks:?}"
    );
    assert!(
        matches!(
            outcome,
            Answer::Executed {
                settled: Settled::Fenced,
                ..
            }
        ),
        "got {outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn renew_answered_lost_cancels_the_handler() {
    // Guards: a watchdog that ignores `Lost` and lets the handler finish (two holders run).
    let rig = Rig::new();
    rig.faults.set(StoreOp::Renew, Fault::RenewLost);
    let engine = rig.engine(policy(secs(30), secs(10)));
    let (dropped, finished) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let start = Instant::now();
    let result = engine
        .run(&key("lost"), &fp(b"x"), |_| {
            let (flag, finished) = (DropFlag(Arc::clone(&dropped)), Arc::clone(&finished));
            async move {
                let _flag = flag;
                tokio::time::sleep(secs(25)).await;
                finished.store(true, Ordering::SeqCst);
                ok("late")
            }
        })
        .await;
    assert!(
        matches!(result, Err(EngineError::LeaseLost)),
        "got {result:?}"
    );
    assert_eq!(start.elapsed(), secs(10), "cancelled at the first renewal");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler future must be dropped"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler must not run to its end"
    );
    assert_eq!(rig.store.calls()[StoreOp::Complete], 0);
    assert_eq!(
        rig.store.calls()[StoreOp::Release],
        0,
        "a lost lease is not ours to release"
    );
}

#[tokio::test(start_paused = true)]
async fn takeover_by_a_competitor_cancels_the_old_holder() {
    // Guards: a holder that keeps running after its record was taken over (two holders).
    let rig = Rig::new();
    let engine = rig.engine(policy(secs(30), secs(10)));
    let k = key("taken");
    let dropped = Arc::new(AtomicBool::new(false));
    let new_fence = Arc::new(Mutex::new(None));
    let (memory, clock, k2, flag, fence_out) = (
        rig.memory.clone(),
        rig.clock.clone(),
        k.clone(),
        DropFlag(Arc::clone(&dropped)),
        Arc::clone(&new_fence),
    );
    let result = engine
        .run(&k, &fp(b"x"), |lease| async move {
            let _flag = flag;
            tokio::time::sleep(secs(1)).await;
            // The store clock jumps past the lease (the holder's process was paused, say),
            // and a retry takes the key over.
            clock.jump(secs(46));
            let taken = memory
                .claim(&claim_request(
                    &k2,
                    b"x",
                    secs(45),
                    TakeoverPolicy::Reexecute,
                ))
                .await
                .expect("claim");
            let ClaimOutcome::Claimed {
                lease: new,
                takeover: true,
            } = taken
            else {
                panic!("expected a takeover, got {taken:?}")
            };
            assert!(
                new.fence > lease.fence,
                "the new holder's fence must be higher"
            );
            *fence_out.lock().expect("lock") = Some(new.fence);
            pending::<()>().await;
            ok("never")
        })
        .await;
    assert!(
        matches!(result, Err(EngineError::LeaseLost)),
        "got {result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the old holder's handler is dropped"
    );
    let record = rig.record(&k).await.expect("record");
    assert_eq!(
        Some(record.fence),
        *new_fence.lock().expect("lock"),
        "the new holder keeps the key"
    );
    assert_eq!(
        rig.store.calls()[StoreOp::Release],
        0,
        "the old holder releases nothing"
    );
}

/// A policy whose store timeout allows a claim answer slower than the lease margin: the only
/// way the local lease deadline can come before the handler timeout.
fn slow_store_policy() -> Policy {
    Policy::builder()
        .takeover(TakeoverPolicy::Reexecute)
        .handler_timeout(secs(30))
        .lease(secs(45))
        .renew_every(secs(15))
        .store_timeout(secs(20))
        .build()
        .expect("valid policy")
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_cancel_at_the_local_deadline() {
    // Guards: a handler whose time is counted from when the claim *answered* rather than when
    // it was sent, which would outlive the store's lease. The claim is applied at t=0 (store
    // lease until t=45) but answers at t=16; renewals then fail. Counted from the send, the
    // handler is cancelled at t=30, before the store's lease ends (t=45) and before a
    // handler timeout counted from the answer (t=46) would have come.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Claim, Fault::SlowAnswer(secs(16)));
    rig.faults.set(StoreOp::Renew, Fault::Error);
    let engine = rig.engine(slow_store_policy());
    let dropped = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let k = key("expiring");
    let result = bounded(engine.run(&k, &fp(b"x"), |_| {
        let flag = DropFlag(Arc::clone(&dropped));
        async move {
            let _flag = flag;
            pending::<()>().await;
            ok("never")
        }
    }))
    .await;
    assert!(
        matches!(result, Err(EngineError::HandlerTimedOut(d)) if d == secs(30)),
        "got {result:?}"
    );
    assert_eq!(start.elapsed(), secs(30));
    assert!(dropped.load(Ordering::SeqCst));
    // Released as retryable (`reexecute`): a competitor claims it at once.
    let competitor = rig
        .claim_elsewhere(&k, secs(45), TakeoverPolicy::Reexecute)
        .await;
    assert!(
        matches!(competitor, ClaimOutcome::Claimed { .. }),
        "got {competitor:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_does_not_outlive_the_local_deadline() {
    // Guards: a run bounded only by its store calls. The claim answers at t=16, a renewal
    // sent at t=31 hangs for the 20 s store timeout: bounded by the store timeout alone it
    // would keep the handler running until t=51, while the store's lease ended at t=45 and a
    // retry could already run: two holders at once. The handler's own time, counted from the
    // claim's send, ends it at t=30.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Claim, Fault::SlowAnswer(secs(16)));
    rig.faults.set(StoreOp::Renew, Fault::Hang);
    let engine = rig.engine(slow_store_policy());
    let start = Instant::now();
    let result =
        bounded(engine.run(&key("hanging"), &fp(b"x"), |_| pending::<Settlement<()>>())).await;
    assert!(
        matches!(result, Err(EngineError::HandlerTimedOut(_))),
        "got {result:?}"
    );
    assert!(
        start.elapsed() < secs(45),
        "cancelled before the store's lease ends: {:?}",
        start.elapsed()
    );
}
