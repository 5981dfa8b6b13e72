//! What a run answers: a crashed holder taken over, `hold` turning an expired lease unknown,
//! executed then replayed then mismatch, in flight, unknown, waiting for an in-flight holder,
//! and `call_json`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use idem_core::store::{Completion, Hold};
use idem_core::{
    Answer, ClaimOutcome, EngineError, Key, Policy, ReleaseKind, Reply, Scope, ScopedKey,
    SettleOutcome, Settled, Settlement, StateKind, Store, StoredResponse, TakeoverPolicy,
};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------
// Takeover
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn crashed_holder_is_taken_over_with_a_higher_fence() {
    // Guards: an expired lease blocking retries for the whole record TTL, or a takeover that
    // reuses the crashed holder's fence.
    let rig = Rig::new();
    let k = key("crashed");
    let crashed = rig
        .claim_elsewhere(&k, secs(45), TakeoverPolicy::Reexecute)
        .await;
    let ClaimOutcome::Claimed { lease: old, .. } = crashed else {
        panic!("got {crashed:?}")
    };
    // Re-running an expired lease is an explicit choice (the default holds it).
    let engine = rig.engine(common::policy_with(|b| {
        b.takeover(TakeoverPolicy::Reexecute)
    }));
    let busy = engine
        .run(&k, &fp(b"x"), |_| async { ok("too early") })
        .await
        .expect("run");
    assert!(
        matches!(busy, Answer::InFlight { retry_after } if retry_after == secs(45)),
        "got {busy:?}"
    );
    rig.clock.jump(secs(46));
    let outcome = engine
        .run(&k, &fp(b"x"), |_| async { ok("again") })
        .await
        .expect("run");
    match outcome {
        Answer::Executed {
            output: "again",
            lease,
            takeover: true,
            settled: Settled::Stored,
        } => {
            assert!(
                lease.fence > old.fence,
                "takeover fence {} must exceed {}",
                lease.fence,
                old.fence
            );
        }
        other => panic!("expected a takeover execution, got {other:?}"),
    }
    let late = rig
        .memory
        .complete(&Completion::new(
            Hold::of(&k, &old),
            &StoredResponse::new(200, "stale"),
            secs(60),
        ))
        .await
        .expect("complete");
    assert_eq!(
        late,
        SettleOutcome::Fenced,
        "the crashed holder's late result is refused"
    );
}

#[tokio::test(start_paused = true)]
async fn hold_policy_turns_an_expired_lease_into_unknown() {
    // Guards: `hold` silently re-running a handler whose first run may have had its effect.
    let rig = Rig::new();
    let k = key("held");
    rig.claim_elsewhere(&k, secs(45), TakeoverPolicy::Hold)
        .await;
    rig.clock.jump(secs(46));
    let engine = rig.engine(common::policy_with(|b| b.takeover(TakeoverPolicy::Hold)));
    let ran = Arc::new(AtomicBool::new(false));
    let outcome = engine
        .run(&k, &fp(b"x"), |_| {
            ran.store(true, Ordering::SeqCst);
            async { ok("must not run") }
        })
        .await
        .expect("run");
    assert!(matches!(outcome, Answer::Unknown), "got {outcome:?}");
    assert!(!ran.load(Ordering::SeqCst), "nothing runs under hold");
    assert_eq!(
        rig.record(&k).await.expect("record").state.kind(),
        StateKind::Unknown
    );
    let again = engine
        .run(&k, &fp(b"x"), |_| async { ok("still not") })
        .await
        .expect("run");
    assert!(matches!(again, Answer::Unknown));
}

// ---------------------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn executed_then_replayed_then_mismatch() {
    // Guards: a retry re-running the handler instead of replaying, a different request under
    // the same key replaying the first one's response, and keys of two principals meeting.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("order-42");
    let runs = AtomicUsize::new(0);
    let handler = |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { ok("charged") }
    };
    let first = engine
        .run(&k, &fp(b"amount=100"), handler)
        .await
        .expect("run");
    assert!(
        matches!(
            first,
            Answer::Executed {
                output: "charged",
                settled: Settled::Stored,
                takeover: false,
                ..
            }
        ),
        "{first:?}"
    );
    let second = engine
        .run(&k, &fp(b"amount=100"), handler)
        .await
        .expect("run");
    assert!(
        matches!(&second, Answer::Replayed(r) if r.body == "charged" && r.status == 200),
        "{second:?}"
    );
    let other = engine
        .run(&k, &fp(b"amount=999"), handler)
        .await
        .expect("run");
    assert!(matches!(other, Answer::Mismatch), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    // Another scope with the same key is another record.
    let elsewhere = ScopedKey::new(
        Scope::new("tests.engine")
            .expect("ns")
            .with_principal("user-2"),
        Key::new("order-42").expect("key"),
    );
    let mine = engine
        .run(&elsewhere, &fp(b"amount=999"), handler)
        .await
        .expect("run");
    assert!(matches!(mine, Answer::Executed { .. }), "{mine:?}");
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_makes_duplicates_in_flight() {
    // Guards: a duplicate running beside a live holder, or a retry hint that ignores the lease.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("busy");
    rig.claim_elsewhere(&k, secs(45), TakeoverPolicy::Reexecute)
        .await;
    tokio::time::advance(secs(5)).await;
    let outcome = engine
        .run(&k, &fp(b"x"), |_| async { ok("dup") })
        .await
        .expect("run");
    assert!(
        matches!(outcome, Answer::InFlight { retry_after } if retry_after == secs(40)),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn released_unknown_answers_unknown() {
    // Guards: an ambiguous outcome (release as unknown) being silently re-run by a retry.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("ambiguous");
    let first = engine
        .run(&k, &fp(b"x"), |_| async {
            Settlement::release("upstream timed out", ReleaseKind::Unknown)
        })
        .await;
    assert!(
        matches!(
            first,
            Ok(Answer::Executed {
                settled: Settled::Released(ReleaseKind::Unknown),
                ..
            })
        ),
        "{first:?}"
    );
    let retry = engine
        .run(&k, &fp(b"x"), |_| async { ok("no") })
        .await
        .expect("run");
    assert!(matches!(retry, Answer::Unknown), "{retry:?}");
}

#[tokio::test(start_paused = true)]
async fn in_flight_wait_replays_the_first_result() {
    // Guards: a waiting duplicate that runs the handler itself or answers 409 although the
    // first result arrived within its wait.
    let rig = Rig::new();
    let k = key("waited");
    let lease = rig.lease_elsewhere(&k).await;
    let engine = rig.engine(common::policy_with(|b| b.in_flight_wait(Some(secs(5)))));
    let start = Instant::now();
    let (memory, x, k2) = (rig.memory.clone(), fp(b"x"), k.clone());
    let (waiter, ()) = tokio::join!(
        engine.run(&k, &x, |_| async { ok("must not run") }),
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let done = memory
                .complete(&Completion::new(
                    Hold::of(&k2, &lease),
                    &StoredResponse::new(201, "first"),
                    secs(60),
                ))
                .await;
            assert_eq!(done.expect("complete"), SettleOutcome::Settled);
        }
    );
    assert!(
        matches!(&waiter, Ok(Answer::Replayed(r)) if r.body == "first"),
        "{waiter:?}"
    );
    assert!(
        start.elapsed() < secs(1),
        "replayed soon after the first result: {:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn in_flight_wait_gives_up_after_its_budget() {
    // Guards: a waiting duplicate that waits past its budget (or forever) on a stuck holder.
    let rig = Rig::new();
    let k = key("waited-out");
    rig.claim_elsewhere(&k, secs(45), TakeoverPolicy::Reexecute)
        .await;
    let engine = rig.engine(common::policy_with(|b| b.in_flight_wait(Some(secs(2)))));
    let start = Instant::now();
    let outcome = engine
        .run(&k, &fp(b"x"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(matches!(outcome, Answer::InFlight { .. }), "{outcome:?}");
    let waited = start.elapsed();
    assert!(waited >= secs(2) && waited < secs(3), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn in_flight_wait_runs_when_the_first_releases() {
    // Guards: a waiter that keeps answering "in flight" after the holder released the key.
    let rig = Rig::new();
    let k = key("waited-release");
    let lease = rig.lease_elsewhere(&k).await;
    let engine = rig.engine(common::policy_with(|b| b.in_flight_wait(Some(secs(5)))));
    let (memory, x, k2) = (rig.memory.clone(), fp(b"x"), k.clone());
    let (waiter, ()) = tokio::join!(engine.run(&k, &x, |_| async { ok("second") }), async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        memory
            .release(&Hold::of(&k2, &lease), ReleaseKind::Retryable)
            .await
            .expect("release");
    });
    assert!(
        matches!(
            waiter,
            Ok(Answer::Executed {
                output: "second",
                ..
            })
        ),
        "{waiter:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn call_json_executes_replays_and_retries_after_failure() {
    // Guards: a failed call stored for replay (a retry could never succeed), a replay that
    // calls the closure again, and a stored value decoded into the wrong type silently.
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let k = key("json");
    let calls = AtomicUsize::new(0);
    let failing = engine
        .call_json(&k, &fp(b"args"), |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<Vec<u32>, _>("card declined")
        })
        .await
        .expect("call");
    assert_eq!(failing, Reply::Failed("card declined"));
    assert!(
        rig.record(&k).await.is_none(),
        "a failure releases the claim"
    );
    let executed = engine
        .call_json(&k, &fp(b"args"), |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, &str>(vec![1_u32, 2, 3])
        })
        .await
        .expect("call");
    assert_eq!(executed, Reply::Executed(vec![1, 2, 3]));
    let replayed = engine
        .call_json(&k, &fp(b"args"), |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, &str>(vec![9_u32])
        })
        .await
        .expect("call");
    assert_eq!(
        replayed,
        Reply::Replayed(vec![1, 2, 3]),
        "the stored value decodes"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the replay did not call the closure"
    );
    let wrong_type = engine
        .call_json(&k, &fp(b"args"), |_| async { Ok::<String, ()>("x".into()) })
        .await;
    assert!(
        matches!(wrong_type, Err(EngineError::Decode(_))),
        "{wrong_type:?}"
    );
    let mismatch = engine
        .call_json(&k, &fp(b"other"), |_| async { Ok::<u8, ()>(0) })
        .await
        .expect("call");
    assert_eq!(mismatch, Reply::Mismatch);
}
