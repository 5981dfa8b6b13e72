//! The engine over a memory store, on paused tokio time: renewal, lease loss, takeover, every
//! outcome, bad input, panics, timeouts, cancellation, store faults and the cache tier.
//!
//! Store time follows tokio's paused clock plus a manual offset ([`TestClock`]), so leases
//! and the engine's own deadlines move together under `advance`, and a test can still jump
//! the store clock alone (a crashed holder, a store whose clock runs ahead).
//!
//! How these were shown to bite: `renewal_check_bites_when_renewals_never_reach_the_store`
//! keeps an unguarded variant as a test; the two engine fixes made with these tests
//! (handler closure outside the panic guard, renewal bounded only by the store timeout)
//! failed them first. Against a scratch copy of the engine, each of these mutations failed
//! the tests named: ignoring a `Lost` renewal (renew_answered_lost…, takeover_by_a_competitor…),
//! a drop guard that never releases (dropping_run_mid_handler…, dropping_run_under_hold…),
//! a panic path that does not release (both panic tests), the local deadline counted from the
//! claim's answer (failing_renewals…, a_hanging_renewal…), no store timeout (a_hanging_store…,
//! a_hanging_renewal…), and a cache that does not answer mismatches (cached_replays…,
//! a_replay_from_the_store…).

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    Answer, CachedStore, ClaimOutcome, ClaimRequest, Clock, Engine, EngineError, Fingerprint, Key,
    KeyError, ListFilter, ManualClock, MemoryStore, OwnerId, Policy, PolicyError, Record,
    RecordState, ReleaseKind, Reply, Scope, ScopedKey, SettleOutcome, Settled, Settlement,
    StateKind, Store, StoreError, StoreOp, StoredResponse, TakeoverPolicy, Timestamp,
};
use idem_testkit::{Calls, CountingStore, Fault, FaultyStore};
use tokio::time::Instant;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// Store time: tokio's (paused) clock since the test started, plus a manual offset.
#[derive(Clone, Debug)]
struct TestClock {
    offset: ManualClock,
    start: Instant,
}

impl TestClock {
    fn new() -> Self {
        Self {
            offset: ManualClock::new(Timestamp(1_000_000)),
            start: Instant::now(),
        }
    }

    /// Moves store time forward without moving tokio time.
    fn jump(&self, by: Duration) {
        self.offset.advance(by);
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        self.offset.now().plus(self.start.elapsed())
    }
}

fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("tests.engine").expect("namespace"),
        Key::new(k).expect("key"),
    )
}

fn fp(body: &[u8]) -> Fingerprint {
    Fingerprint::of_bytes(1, body)
}

/// A policy that validates: handler timeout `h`, lease `h + 15 s`, renewals every `renew`.
fn policy(handler: Duration, renew: Duration) -> Policy {
    Policy::builder()
        .handler_timeout(handler)
        .lease(handler + secs(15))
        .renew_every(renew)
        .build()
        .expect("valid policy")
}

fn claim_request(
    k: &ScopedKey,
    body: &[u8],
    lease: Duration,
    takeover: TakeoverPolicy,
) -> ClaimRequest {
    ClaimRequest {
        key: k.clone(),
        fingerprint: fp(body),
        owner: OwnerId::random(),
        lease,
        ttl: secs(3600),
        takeover,
        request_id: None,
    }
}

/// Sets its flag when dropped: shows a handler future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Fails (after an hour of paused time, i.e. at once) instead of hanging when `f` never ends.
async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(secs(3600), f)
        .await
        .expect("must not hang")
}

/// A handler bug.
fn explode() -> Settlement<&'static str> {
    panic!("handler bug")
}

fn ok(body: &'static str) -> Settlement<&'static str> {
    Settlement::complete(body, StoredResponse::new(200, body))
}

// ---------------------------------------------------------------------------------------
// The rig: a memory store behind a fault injector, behind a call counter
// ---------------------------------------------------------------------------------------

/// What the engine talks to: every call counted, then faulted as the test says.
type Tested = CountingStore<FaultyStore<MemoryStore>>;

struct Rig {
    clock: TestClock,
    memory: MemoryStore,
    /// The faults' switches (shared with the store's).
    faults: FaultyStore<MemoryStore>,
    store: Tested,
}

impl Rig {
    /// A fresh memory store behind a fault injector. Call inside a paused runtime.
    fn new() -> Self {
        let clock = TestClock::new();
        let memory = MemoryStore::with_clock(1_000, clock.clone());
        let faults = FaultyStore::new(memory.clone());
        Self {
            store: CountingStore::new(faults.clone()),
            faults,
            memory,
            clock,
        }
    }

    fn engine(&self, policy: Policy) -> Engine<Tested> {
        Engine::new(self.store.clone(), policy)
    }

    /// Waits (on events, not time) until `enough` holds for the call counts.
    async fn wait_calls(&self, enough: impl FnMut(&Calls) -> bool) {
        // Bounded, so a missing call fails the test (paused time jumps to the bound) instead
        // of hanging it.
        tokio::time::timeout(secs(3600), self.store.wait_for(enough))
            .await
            .expect("the expected store calls never came");
    }

    async fn record(&self, k: &ScopedKey) -> Option<Record> {
        self.memory.get(k).await.expect("memory get")
    }
}

// ---------------------------------------------------------------------------------------
// Lease renewal and loss
// ---------------------------------------------------------------------------------------

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
        .handler_timeout(secs(30))
        .lease(secs(45))
        .renew_every(secs(15))
        .store_timeout(secs(20))
        .build()
        .expect("valid policy")
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_cancel_at_the_local_deadline() {
    // Guards: a local deadline counted from when the claim *answered* rather than when it was
    // sent, which would outlive the store's lease. The claim is applied at t=0 (store lease
    // until t=45) but answers at t=16; renewals then fail. The engine must give up by t=45,
    // before the handler timeout (t=46), and a competitor may take over at that instant.
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
        matches!(result, Err(EngineError::LeaseLost)),
        "got {result:?}"
    );
    assert_eq!(start.elapsed(), secs(45));
    assert!(dropped.load(Ordering::SeqCst));
    assert!(
        rig.store.calls()[StoreOp::Renew] >= 1,
        "renewal was attempted"
    );
    let competitor = rig
        .memory
        .claim(&claim_request(
            &k,
            b"x",
            secs(45),
            TakeoverPolicy::Reexecute,
        ))
        .await
        .expect("claim");
    assert!(
        matches!(competitor, ClaimOutcome::Claimed { takeover: true, .. }),
        "got {competitor:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_does_not_outlive_the_local_deadline() {
    // Guards: a renewal bounded only by the store timeout. Sent at t=31 and hanging, it would
    // keep the handler running until t=51 (then a handler timeout at t=46 would be reported),
    // while the store's lease ended at t=45 and a retry could already run: two holders at
    // once. The renewal must be cut at the local deadline.
    let rig = Rig::new();
    rig.faults.set(StoreOp::Claim, Fault::SlowAnswer(secs(16)));
    rig.faults.set(StoreOp::Renew, Fault::Hang);
    let engine = rig.engine(slow_store_policy());
    let start = Instant::now();
    let result =
        bounded(engine.run(&key("hanging"), &fp(b"x"), |_| pending::<Settlement<()>>())).await;
    assert!(
        matches!(result, Err(EngineError::LeaseLost)),
        "got {result:?}"
    );
    assert_eq!(
        start.elapsed(),
        secs(45),
        "cancelled no later than the store's lease"
    );
}

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
        .memory
        .claim(&claim_request(
            &k,
            b"x",
            secs(45),
            TakeoverPolicy::Reexecute,
        ))
        .await
        .expect("claim");
    let ClaimOutcome::Claimed { lease: old, .. } = crashed else {
        panic!("got {crashed:?}")
    };
    let engine = rig.engine(Policy::default());
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
        .complete(
            &k,
            old.owner,
            old.fence,
            &StoredResponse::new(200, "stale"),
            secs(60),
        )
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
    rig.memory
        .claim(&claim_request(&k, b"x", secs(45), TakeoverPolicy::Hold))
        .await
        .expect("claim");
    rig.clock.jump(secs(46));
    let engine = rig.engine(
        Policy::builder()
            .takeover(TakeoverPolicy::Hold)
            .build()
            .expect("policy"),
    );
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
    rig.memory
        .claim(&claim_request(
            &k,
            b"x",
            secs(45),
            TakeoverPolicy::Reexecute,
        ))
        .await
        .expect("claim");
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
    let holder = claim_request(&k, b"x", secs(45), TakeoverPolicy::Reexecute);
    let ClaimOutcome::Claimed { lease, .. } = rig.memory.claim(&holder).await.expect("claim")
    else {
        panic!("claim")
    };
    let engine = rig.engine(
        Policy::builder()
            .in_flight_wait(Some(secs(5)))
            .build()
            .expect("policy"),
    );
    let start = Instant::now();
    let (memory, x, k2) = (rig.memory.clone(), fp(b"x"), k.clone());
    let (waiter, ()) = tokio::join!(
        engine.run(&k, &x, |_| async { ok("must not run") }),
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let done = memory
                .complete(
                    &k2,
                    lease.owner,
                    lease.fence,
                    &StoredResponse::new(201, "first"),
                    secs(60),
                )
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
    rig.memory
        .claim(&claim_request(
            &k,
            b"x",
            secs(45),
            TakeoverPolicy::Reexecute,
        ))
        .await
        .expect("claim");
    let engine = rig.engine(
        Policy::builder()
            .in_flight_wait(Some(secs(2)))
            .build()
            .expect("policy"),
    );
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
    let holder = claim_request(&k, b"x", secs(45), TakeoverPolicy::Reexecute);
    let ClaimOutcome::Claimed { lease, .. } = rig.memory.claim(&holder).await.expect("claim")
    else {
        panic!("claim")
    };
    let engine = rig.engine(
        Policy::builder()
            .in_flight_wait(Some(secs(5)))
            .build()
            .expect("policy"),
    );
    let (memory, x, k2) = (rig.memory.clone(), fp(b"x"), k.clone());
    let (waiter, ()) = tokio::join!(engine.run(&k, &x, |_| async { ok("second") }), async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        memory
            .release(&k2, lease.owner, lease.fence, ReleaseKind::Retryable)
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

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

#[test]
fn invalid_keys_are_refused_with_the_rule_they_break() {
    // Guards: malformed keys accepted (or "ignored") instead of refused with a precise reason.
    assert_eq!(Key::new(""), Err(KeyError::Empty));
    assert_eq!(
        Key::new("k".repeat(256)),
        Err(KeyError::TooLong { len: 256 })
    );
    assert_eq!(
        Key::new("a\nb"),
        Err(KeyError::NotPrintable { byte: b'\n', at: 1 })
    );
    assert_eq!(
        Key::from_bytes(b"ok\xff"),
        Err(KeyError::NotPrintable { byte: 0xff, at: 2 })
    );
    assert_eq!(Key::new("trailing "), Err(KeyError::OuterSpace));
    assert_eq!(Key::new(" leading"), Err(KeyError::OuterSpace));
    assert_eq!(Scope::new("has space"), Err(KeyError::BadNamespace));
    assert_eq!(Scope::new(""), Err(KeyError::BadNamespace));
    assert_eq!(Scope::new("n".repeat(256)), Err(KeyError::BadNamespace));
    // Edges that are valid.
    assert!(Key::new("k".repeat(255)).is_ok());
    assert!(Key::new("~ !").is_ok());
    let e = Key::new("a\tb").expect_err("tab");
    assert!(
        e.to_string().contains("0x09"),
        "the message names the byte: {e}"
    );
}

#[test]
fn bad_policies_fail_at_build_time_with_a_clear_error() {
    // Guards: a lease shorter than the handler can run (a slow handler loses its claim to a
    // retry), a record that expires before its lease, and zero durations reaching run time.
    let zero = Duration::ZERO;
    let cases: Vec<(&str, Result<Policy, PolicyError>, PolicyError)> = vec![
        (
            "zero record ttl",
            Policy::builder().record_ttl(zero).build(),
            PolicyError::Zero("record ttl"),
        ),
        (
            "zero lease",
            Policy::builder().lease(zero).build(),
            PolicyError::Zero("lease"),
        ),
        (
            "zero handler timeout",
            Policy::builder().handler_timeout(zero).build(),
            PolicyError::Zero("handler timeout"),
        ),
        (
            "zero store timeout",
            Policy::builder().store_timeout(zero).build(),
            PolicyError::Zero("store timeout"),
        ),
        (
            "zero renew interval",
            Policy::builder().renew_every(zero).build(),
            PolicyError::Zero("renew interval"),
        ),
        (
            "lease longer than the ttl",
            Policy::builder()
                .lease(secs(120))
                .record_ttl(secs(60))
                .build(),
            PolicyError::TtlShorterThanLease {
                ttl: secs(60),
                lease: secs(120),
            },
        ),
        (
            "lease under handler timeout + 15 s",
            Policy::builder()
                .handler_timeout(secs(30))
                .lease(secs(44))
                .build(),
            PolicyError::LeaseTooShort {
                lease: secs(44),
                handler_timeout: secs(30),
            },
        ),
        (
            "lease exactly the handler timeout",
            Policy::builder()
                .handler_timeout(secs(30))
                .lease(secs(30))
                .build(),
            PolicyError::LeaseTooShort {
                lease: secs(30),
                handler_timeout: secs(30),
            },
        ),
        (
            "renewal no sooner than the lease",
            Policy::builder().renew_every(secs(45)).build(),
            PolicyError::RenewTooSlow {
                renew_every: secs(45),
                lease: secs(45),
            },
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(got, Err(want), "{what}");
    }
    let msg = Policy::builder()
        .handler_timeout(secs(30))
        .lease(secs(44))
        .build()
        .expect_err("short")
        .to_string();
    assert!(
        msg.contains("44s") && msg.contains("30s") && msg.contains("15s"),
        "names the numbers: {msg}"
    );
    assert!(
        Policy::builder()
            .handler_timeout(secs(30))
            .lease(secs(45))
            .build()
            .is_ok(),
        "exactly the margin is enough"
    );
}

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
    let hold = rig.engine(
        Policy::builder()
            .handler_timeout(secs(5))
            .lease(secs(20))
            .takeover(TakeoverPolicy::Hold)
            .build()
            .expect("policy"),
    );
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
    let engine = rig.engine(
        Policy::builder()
            .takeover(takeover)
            .build()
            .expect("policy"),
    );
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
    let engine = rig.engine(
        Policy::builder()
            .store_timeout(Duration::from_millis(250))
            .build()
            .expect("policy"),
    );
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

// ---------------------------------------------------------------------------------------
// Cache tier
// ---------------------------------------------------------------------------------------

fn cached_rig() -> (Rig, Engine<CachedStore<Tested>>) {
    let rig = Rig::new();
    let cached = CachedStore::with_clock(rig.store.clone(), 100, secs(600), rig.clock.clone());
    let engine = Engine::new(cached, Policy::default());
    (rig, engine)
}

#[tokio::test(start_paused = true)]
async fn cached_replays_make_no_store_calls() {
    // Guards: a cache that still asks the store on a hit (a replay costing a round trip).
    let (rig, engine) = cached_rig();
    let k = key("cached");
    let first = engine
        .run(&k, &fp(b"x"), |_| async { ok("kept") })
        .await
        .expect("run");
    assert!(matches!(
        first,
        Answer::Executed {
            settled: Settled::Stored,
            ..
        }
    ));
    let before = rig.store.calls();
    assert_eq!((before[StoreOp::Claim], before[StoreOp::Complete]), (1, 1));
    for _ in 0..3 {
        let replay = engine
            .run(&k, &fp(b"x"), |_| async { ok("must not run") })
            .await
            .expect("run");
        assert!(
            matches!(&replay, Answer::Replayed(r) if r.body == "kept"),
            "{replay:?}"
        );
    }
    let mismatch = engine
        .run(&k, &fp(b"different"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(mismatch, Answer::Mismatch),
        "mismatch detected from the cache: {mismatch:?}"
    );
    assert_eq!(rig.store.calls(), before, "no call reached the inner store");
}

#[tokio::test(start_paused = true)]
async fn processing_records_are_never_cached() {
    // Guards: caching a claim or busy answer, which would let the cache decide who holds a key.
    let (rig, engine) = cached_rig();
    let k = key("in-flight");
    let holder = claim_request(&k, b"x", secs(45), TakeoverPolicy::Reexecute);
    let first = engine.store().claim(&holder).await.expect("claim");
    let ClaimOutcome::Claimed { lease, .. } = first else {
        panic!("{first:?}")
    };
    for n in 1..=2 {
        let dup = engine
            .run(&k, &fp(b"x"), |_| async { ok("must not run") })
            .await
            .expect("run");
        assert!(matches!(dup, Answer::InFlight { .. }), "{dup:?}");
        assert_eq!(
            rig.store.calls()[StoreOp::Claim],
            1 + n,
            "each duplicate asked the store"
        );
    }
    assert_eq!(engine.store().cached(), 0);
    // Completing through the cached store fills the cache; the next replay is local.
    engine
        .store()
        .complete(
            &k,
            lease.owner,
            lease.fence,
            &StoredResponse::new(200, "done"),
            secs(60),
        )
        .await
        .expect("complete");
    assert_eq!(engine.store().cached(), 1);
    let claims = rig.store.calls()[StoreOp::Claim];
    let replay = engine
        .run(&k, &fp(b"x"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(&replay, Answer::Replayed(r) if r.body == "done"),
        "{replay:?}"
    );
    assert_eq!(rig.store.calls()[StoreOp::Claim], claims);
}

#[tokio::test(start_paused = true)]
async fn a_replay_from_the_store_fills_the_cache_and_mismatch_is_still_caught() {
    // Guards: a replay from the store not filling the cache (every retry pays a round trip),
    // and a cached entry answering a different fingerprint with a replay.
    let (rig, engine) = cached_rig();
    let k = key("warm");
    // Completed by another process, straight on the shared store.
    let other = Engine::new(rig.memory.clone(), Policy::default());
    other
        .run(&k, &fp(b"x"), |_| async { ok("remote") })
        .await
        .expect("run");
    let replay = engine
        .run(&k, &fp(b"x"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(&replay, Answer::Replayed(r) if r.body == "remote"),
        "{replay:?}"
    );
    let calls = rig.store.calls();
    assert_eq!(calls[StoreOp::Claim], 1);
    let mismatch = engine
        .run(&k, &fp(b"y"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(matches!(mismatch, Answer::Mismatch), "{mismatch:?}");
    assert_eq!(rig.store.calls(), calls, "answered from the cache");
}
