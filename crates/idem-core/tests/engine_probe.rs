//! At most once across crashes by default: `hold` never runs an expired lease again blind, a
//! probe settles an unknown key from what the downstream system did (believing "not done"
//! only once the attempt is over), a probe's answer about one attempt never settles the next,
//! and a holder paused past its lease finishes its own work.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idem_core::store::Hold;
use idem_core::{
    Answer, ClaimOutcome, Engine, Policy, Probe, ProbeAnswer, ProbeFn, RecordState, ReleaseKind,
    Resolution, ScopedKey, Settled, Settlement, Store, StoredResponse, TakeoverPolicy,
};
use idem_testkit::broken::{BrokenStore, Bug};
use tokio::time::Instant;

/// The downstream system a handler acts on: effects per key, each with the answer it gave,
/// and a status query over that ledger (what a status webhook answers).
#[derive(Clone, Default)]
struct Downstream {
    ledger: Arc<Mutex<HashMap<String, (u32, StoredResponse)>>>,
    probes: Arc<AtomicUsize>,
}

impl Downstream {
    /// Performs the effect for `key` and answers it.
    fn act(&self, key: &ScopedKey) -> StoredResponse {
        let mut ledger = self.ledger.lock().expect("ledger");
        let entry = ledger
            .entry(key.key.as_str().to_owned())
            .or_insert((0, StoredResponse::new(0, "")));
        entry.0 += 1;
        entry.1 = StoredResponse::new(201, format!("charged #{}", entry.0));
        entry.1.clone()
    }

    fn effects(&self, key: &ScopedKey) -> u32 {
        self.ledger
            .lock()
            .expect("ledger")
            .get(key.key.as_str())
            .map_or(0, |e| e.0)
    }

    /// Answers from the ledger: done with its answer, or not done.
    fn probe(&self) -> Arc<dyn Probe> {
        let me = self.clone();
        Arc::new(ProbeFn(move |key: ScopedKey, _fence| {
            let me = me.clone();
            async move {
                me.probes.fetch_add(1, Ordering::SeqCst);
                match me.ledger.lock().expect("ledger").get(key.key.as_str()) {
                    Some((_, answer)) => ProbeAnswer::Done(answer.clone()),
                    None => ProbeAnswer::NotDone,
                }
            }
        }))
    }

    /// A handler that performs the effect and stores its answer.
    fn handler(
        &self,
        key: &ScopedKey,
    ) -> impl FnOnce(idem_core::Lease) -> std::future::Ready<Settlement<StoredResponse>> {
        let (me, key) = (self.clone(), key.clone());
        move |_| {
            let answer = me.act(&key);
            std::future::ready(Settlement::complete(answer.clone(), answer))
        }
    }
}

fn reexecute() -> Policy {
    common::policy_with(|b| b.takeover(TakeoverPolicy::Reexecute))
}

/// A holder elsewhere claimed `k`, performed the effect, and died before completing.
async fn crashed_after_the_effect(rig: &Rig, down: &Downstream, k: &ScopedKey, lease: Duration) {
    let claimed = rig.claim_elsewhere(k, lease, TakeoverPolicy::Hold).await;
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
    down.act(k);
}

// Guards the bug of "at most once across crashes by default": a gateway killed after its
// request reached the upstream, whose expired lease the next claim re-ran blind. The
// unguarded variant (`reexecute`, the old default) runs the effect twice; the default holds.
#[tokio::test(start_paused = true)]
async fn a_crash_after_the_effect_runs_twice_only_when_reexecute_is_chosen() {
    let rig = Rig::new();
    let down = Downstream::default();

    let blind = key("blind");
    crashed_after_the_effect(&rig, &down, &blind, secs(45)).await;
    rig.clock.jump(secs(46));
    let again = rig
        .engine(reexecute())
        .run(&blind, &fp(b"x"), down.handler(&blind))
        .await
        .expect("run");
    assert!(
        matches!(again, Answer::Executed { takeover: true, .. }),
        "{again:?}"
    );
    assert_eq!(
        down.effects(&blind),
        2,
        "reexecute runs a crashed effect again"
    );

    let held = key("held");
    let engine = rig.engine(Policy::default());
    crashed_after_the_effect(&rig, &down, &held, engine.policy().lease()).await;
    rig.clock.jump(engine.policy().lease() + secs(1));
    for _ in 0..2 {
        let answer = engine
            .run(&held, &fp(b"x"), down.handler(&held))
            .await
            .expect("run");
        assert!(matches!(answer, Answer::Unknown), "{answer:?}");
    }
    assert_eq!(down.effects(&held), 1, "the default holds an expired lease");
    assert_eq!(
        rig.record(&held).await.map(|r| r.state.kind()),
        Some(idem_core::StateKind::Unknown)
    );
}

// Guards point 2: the key settles from the downstream system's answer, without an operator,
// and is replayed from then on.
#[tokio::test(start_paused = true)]
async fn a_probe_stores_what_the_downstream_system_did() {
    let rig = Rig::new();
    let down = Downstream::default();
    let engine = rig.engine(Policy::default()).with_probe(down.probe());
    let k = key("settled");
    crashed_after_the_effect(&rig, &down, &k, engine.policy().lease()).await;
    // Past the lease, still inside the attempt's time: a "done" answer is believed at once.
    rig.clock.jump(engine.policy().lease() + secs(1));
    let answer = engine
        .run(&k, &fp(b"x"), down.handler(&k))
        .await
        .expect("run");
    let Answer::Replayed(replayed) = answer else {
        panic!("expected the downstream answer replayed, got {answer:?}");
    };
    assert_eq!(replayed.body, "charged #1");
    let again = engine
        .run(&k, &fp(b"x"), down.handler(&k))
        .await
        .expect("run");
    assert!(
        matches!(again, Answer::Replayed(ref r) if r.body == "charged #1"),
        "{again:?}"
    );
    assert_eq!(down.effects(&k), 1);
    assert_eq!(
        down.probes.load(Ordering::SeqCst),
        1,
        "settled once, then replayed"
    );
    let trail = rig
        .memory
        .audit(&idem_core::AuditQuery::for_key(&k))
        .await
        .expect("audit");
    assert_eq!(
        trail[0].actor.as_deref(),
        Some(idem_core::engine::PROBE_ACTOR),
        "the settlement names the probe: {trail:?}"
    );
}

// Guards point 2's condition: "not done" is believed only once the attempt can no longer be
// running. A request still on its way (sent by a holder that then died) lands inside the
// attempt's time; releasing the key on an early "not done" would have run it twice.
#[tokio::test(start_paused = true)]
async fn not_done_is_believed_only_once_the_attempt_is_over() {
    let rig = Rig::new();
    let down = Downstream::default();
    let engine = rig.engine(Policy::default()).with_probe(down.probe());
    let policy = engine.policy().clone();
    let k = key("in-transit");
    let claimed = rig
        .claim_elsewhere(&k, policy.lease(), TakeoverPolicy::Hold)
        .await;
    assert!(matches!(claimed, ClaimOutcome::Claimed { .. }));
    rig.clock.jump(policy.lease() + secs(1));
    let early = engine
        .run(&k, &fp(b"x"), down.handler(&k))
        .await
        .expect("run");
    let Answer::InFlight { retry_after } = early else {
        panic!("inside the attempt's time, not done means wait: {early:?}");
    };
    assert_eq!(
        retry_after,
        policy.handler_timeout() - policy.lease() - secs(1),
        "retry once the attempt is over"
    );
    assert_eq!(down.effects(&k), 0);
    // The dead holder's request arrives and acts.
    down.act(&k);
    rig.clock.jump(retry_after);
    let late = engine
        .run(&k, &fp(b"x"), down.handler(&k))
        .await
        .expect("run");
    assert!(
        matches!(late, Answer::Replayed(ref r) if r.body == "charged #1"),
        "{late:?}"
    );
    assert_eq!(down.effects(&k), 1);

    // Nothing arrived by the end of the attempt: the key is released and runs, once.
    let idle = key("never-sent");
    let claimed = rig
        .claim_elsewhere(&idle, policy.lease(), TakeoverPolicy::Hold)
        .await;
    let ClaimOutcome::Claimed { lease: old, .. } = claimed else {
        panic!("{claimed:?}");
    };
    rig.clock.jump(policy.handler_timeout());
    let ran = engine
        .run(&idle, &fp(b"x"), down.handler(&idle))
        .await
        .expect("run");
    let Answer::Executed {
        lease,
        settled: Settled::Stored,
        ..
    } = ran
    else {
        panic!("released and run: {ran:?}");
    };
    assert!(lease.fence > old.fence);
    assert_eq!(down.effects(&idle), 1);
}

// Guards the bound on point 2: a probe that cannot say, or does not answer within the probe
// timeout, leaves the key unknown.
#[tokio::test(start_paused = true)]
async fn a_probe_that_cannot_say_leaves_the_key_unknown_within_its_timeout() {
    let rig = Rig::new();
    let down = Downstream::default();
    let base = rig.engine(Policy::default());
    let cases: [(&str, Arc<dyn Probe>); 2] = [
        (
            "cannot-say",
            Arc::new(ProbeFn(|_: ScopedKey, _| async {
                ProbeAnswer::Unknown("no such charge yet".into())
            })),
        ),
        (
            "hangs",
            Arc::new(ProbeFn(|_: ScopedKey, _| {
                std::future::pending::<ProbeAnswer>()
            })),
        ),
    ];
    for (name, probe) in cases {
        let engine = base.with_probe(probe);
        let k = key(name);
        crashed_after_the_effect(&rig, &down, &k, engine.policy().lease()).await;
        rig.clock.jump(engine.policy().handler_timeout());
        let start = Instant::now();
        let answer = bounded(engine.run(&k, &fp(b"x"), down.handler(&k)))
            .await
            .expect("run");
        assert!(matches!(answer, Answer::Unknown), "{name}: {answer:?}");
        assert!(
            start.elapsed() <= engine.policy().probe_timeout(),
            "{name}: answered within the probe timeout"
        );
        assert_eq!(down.effects(&k), 1, "{name}");
    }
}

// Guards the fence on every settlement: a probe's "not done" about one attempt must not
// release the key's next attempt, which may have acted since. The store that ignores the
// fence it is named (the unguarded variant) runs the effect twice.
#[tokio::test(start_paused = true)]
async fn a_probe_answer_about_one_attempt_never_settles_the_next() {
    async fn scenario<S: Store + Clone>(store: S, jump: impl Fn(Duration)) -> u32 {
        let down = Downstream::default();
        let k = key("two-attempts");
        let policy = Policy::default();
        let first = store
            .claim(&claim_request(
                &k,
                b"x",
                policy.lease(),
                TakeoverPolicy::Hold,
            ))
            .await
            .expect("claim");
        let ClaimOutcome::Claimed { lease: a, .. } = first else {
            panic!("{first:?}");
        };
        store
            .release(&Hold::of(&k, &a), ReleaseKind::Unknown)
            .await
            .expect("release");
        jump(policy.handler_timeout() + secs(1));
        // While the probe is asked about attempt `a`, an operator releases the key, attempt
        // `b` runs (acts) and ends unknown, and the probe's answer about `a` is "not done".
        let (racer, down2, k2) = (store.clone(), down.clone(), k.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let probe = ProbeFn(move |key: ScopedKey, fence| {
            let (racer, down, k, calls) =
                (racer.clone(), down2.clone(), k2.clone(), Arc::clone(&calls));
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    racer
                        .resolve(&k, &Resolution::Release, Some(fence))
                        .await
                        .expect("resolve");
                    let b = racer
                        .claim(&claim_request(&k, b"x", secs(10), TakeoverPolicy::Hold))
                        .await
                        .expect("claim");
                    let ClaimOutcome::Claimed { lease: b, .. } = b else {
                        panic!("{b:?}");
                    };
                    down.act(&k);
                    racer
                        .release(&Hold::of(&k, &b), ReleaseKind::Unknown)
                        .await
                        .expect("release");
                    return ProbeAnswer::NotDone;
                }
                match down.ledger.lock().expect("ledger").get(key.key.as_str()) {
                    Some((_, answer)) => ProbeAnswer::Done(answer.clone()),
                    None => ProbeAnswer::NotDone,
                }
            }
        });
        let engine = Engine::new(store, policy).with_probe(Arc::new(probe));
        let _ = engine.run(&k, &fp(b"x"), down.handler(&k)).await;
        down.effects(&k)
    }

    let rig = Rig::new();
    let clock = rig.clock.clone();
    assert_eq!(
        scenario(rig.memory.clone(), move |d| clock.jump(d)).await,
        1,
        "the fenced resolve refuses the stale answer; the next claim settles from the truth"
    );
    let broken = BrokenStore::new(
        Bug::ResolveIgnoresFence,
        idem_core::ManualClock::new(idem_core::Timestamp(1_000_000)),
    );
    let clock = broken.clock().clone();
    assert_eq!(
        scenario(broken, move |d| clock.advance(d)).await,
        2,
        "a resolve that ignores the fence releases the next attempt: it runs again"
    );
}

// Guards point 3: a holder paused past its lease (a retry marked its record unknown) that then
// gets its answer completes the record: stored, replayed, no operator needed.
#[tokio::test(start_paused = true)]
async fn a_holder_paused_past_its_lease_finishes_its_own_work() {
    let rig = Rig::new();
    let down = Downstream::default();
    let engine = rig.engine(Policy::default());
    let k = key("paused");
    let (memory, clock, down2, k2) = (
        rig.memory.clone(),
        rig.clock.clone(),
        down.clone(),
        k.clone(),
    );
    let lease = engine.policy().lease();
    let first = engine
        .run(&k, &fp(b"x"), move |_| async move {
            // Paused past the lease; a retry elsewhere marks the record unknown.
            clock.jump(lease + secs(1));
            let retry = memory
                .claim(&claim_request(&k2, b"x", lease, TakeoverPolicy::Hold))
                .await
                .expect("claim");
            assert!(matches!(retry, ClaimOutcome::Unknown { .. }), "{retry:?}");
            let answer = down2.act(&k2);
            Settlement::complete(answer.clone(), answer)
        })
        .await
        .expect("run");
    assert!(
        matches!(
            first,
            Answer::Executed {
                settled: Settled::Stored,
                ..
            }
        ),
        "the late holder's answer is stored: {first:?}"
    );
    let retry = engine
        .run(&k, &fp(b"x"), down.handler(&k))
        .await
        .expect("run");
    assert!(
        matches!(retry, Answer::Replayed(ref r) if r.body == "charged #1"),
        "{retry:?}"
    );
    assert_eq!(down.effects(&k), 1);
    assert!(matches!(
        rig.record(&k).await.map(|r| r.state),
        Some(RecordState::Completed { .. })
    ));
}

// Guards the watchdog under `hold`: a lease that can no longer be renewed (the store said it
// was lost, or could not be reached) does not cancel a handler that may be acting; its result
// is recorded if it still holds the key. Under `reexecute` the same loss cancels it
// (`engine_leases::renew_answered_lost_cancels_the_handler`).
#[tokio::test(start_paused = true)]
async fn under_hold_a_lost_lease_does_not_stop_the_handler() {
    let rig = Rig::new();
    rig.faults
        .set(idem_core::StoreOp::Renew, idem_testkit::Fault::RenewLost);
    let engine = rig.engine(Policy::default());
    let start = Instant::now();
    let result = engine
        .run(&key("renew-lost"), &fp(b"x"), |_| async {
            tokio::time::sleep(secs(25)).await;
            ok("finished")
        })
        .await
        .expect("run");
    assert!(
        matches!(
            result,
            Answer::Executed {
                output: "finished",
                settled: Settled::Stored,
                ..
            }
        ),
        "{result:?}"
    );
    assert_eq!(start.elapsed(), secs(25));
}

// Guards the bug the fault suite found: a completion the store failed was still handed to the
// caller as the answer, so a retry sent after it found the key in flight, then unknown (or,
// under `reexecute`, ran it again). Now the run tries for a lease's time, answers
// `Settled::Failed` (the carriers' "not recorded, retry"), and records it in the background
// once the store is back, even after a retry marked the record unknown.
#[tokio::test(start_paused = true)]
async fn an_answer_is_recorded_before_it_is_handed_out_or_later_in_the_background() {
    let rig = Rig::new();
    let engine = rig.engine(Policy::default());
    let lease = engine.policy().lease();

    rig.faults
        .set(idem_core::StoreOp::Complete, idem_testkit::Fault::Error);
    let k = key("store-blinks");
    let start = Instant::now();
    let ran = engine
        .run(&k, &fp(b"x"), |_| async { ok("charged") })
        .await
        .expect("run");
    assert!(
        matches!(
            ran,
            Answer::Executed {
                settled: Settled::Failed(_),
                ..
            }
        ),
        "{ran:?}"
    );
    assert!(
        start.elapsed() >= lease,
        "tried for a lease's time: {:?}",
        start.elapsed()
    );
    rig.faults.clear(idem_core::StoreOp::Complete);
    tokio::time::sleep(secs(10)).await;
    let retry = engine
        .run(&k, &fp(b"x"), |_| async { ok("again") })
        .await
        .expect("run");
    assert!(
        matches!(retry, Answer::Replayed(ref r) if r.body == "charged"),
        "{retry:?}"
    );

    // Down for longer than the lease: a retry meanwhile marks the record unknown; the
    // background completion still records the holder's answer.
    rig.faults
        .set(idem_core::StoreOp::Complete, idem_testkit::Fault::Error);
    let k = key("store-down-long");
    let ran = engine
        .run(&k, &fp(b"x"), |_| async { ok("charged") })
        .await
        .expect("run");
    assert!(matches!(
        ran,
        Answer::Executed {
            settled: Settled::Failed(_),
            ..
        }
    ));
    tokio::time::sleep(lease).await;
    let meanwhile = engine
        .run(&k, &fp(b"x"), |_| async { ok("again") })
        .await
        .expect("run");
    assert!(matches!(meanwhile, Answer::Unknown), "{meanwhile:?}");
    rig.faults.clear(idem_core::StoreOp::Complete);
    tokio::time::sleep(secs(10)).await;
    let after = engine
        .run(&k, &fp(b"x"), |_| async { ok("again") })
        .await
        .expect("run");
    assert!(
        matches!(after, Answer::Replayed(ref r) if r.body == "charged"),
        "{after:?}"
    );
}
