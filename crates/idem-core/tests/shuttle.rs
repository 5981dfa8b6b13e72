//! Schedule exploration of the memory store's atomicity with shuttle.
//!
//! Built only with `--cfg shuttle` (see `scripts/shuttle.sh`), which swaps the store's lock
//! for shuttle's so every lock acquisition is a point where shuttle may switch threads.
#![cfg(shuttle)]

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use idem_core::decide::{self, Change};
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, ManualClock, MemoryStore, OwnerId, RecordState,
    ReleaseKind, Scope, ScopedKey, SettleOutcome, Store, StoredResponse, TakeoverPolicy, Timestamp,
};
use shuttle::future::block_on;
use shuttle::sync::Mutex;
use shuttle::thread;

const ITERATIONS: usize = 2_000;
const CLAIMERS: usize = 3;

fn key() -> ScopedKey {
    ScopedKey::new(
        Scope::new("shuttle").expect("namespace"),
        Key::new("k").expect("key"),
    )
}

fn request(lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: key(),
        fingerprint: Fingerprint::of_bytes(1, b"same request"),
        owner: OwnerId::random(),
        lease,
        ttl: Duration::from_secs(3600),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

/// `CLAIMERS` threads claim one absent key; exactly one may get it.
fn race_claims<C>(claim: C)
where
    C: Fn(&ClaimRequest) -> ClaimOutcome + Send + Sync + 'static,
{
    let claim = Arc::new(claim);
    let handles: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let claim = Arc::clone(&claim);
            thread::spawn(move || claim(&request(Duration::from_secs(30))))
        })
        .collect();
    let outcomes: Vec<ClaimOutcome> = handles
        .into_iter()
        .map(|h| h.join().expect("claimer"))
        .collect();
    let fences: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| match o {
            ClaimOutcome::Claimed { lease, .. } => Some(lease.fence),
            _ => None,
        })
        .collect();
    assert_eq!(
        fences.len(),
        1,
        "exactly one claimer may win, got {outcomes:?}"
    );
    assert_eq!(fences[0], 1, "the first claim of a key gets fence 1");
    let busy = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Busy { .. }))
        .count();
    assert_eq!(
        busy,
        CLAIMERS - 1,
        "the losers see a live lease: {outcomes:?}"
    );
}

fn memory_claim(
    store: MemoryStore,
) -> impl Fn(&ClaimRequest) -> ClaimOutcome + Send + Sync + 'static {
    move |req| block_on(store.claim(req)).expect("memory store never fails below capacity")
}

#[test]
fn memory_store_concurrent_claims_elect_exactly_one_holder() {
    // Guards: a claim that reads and writes the record in two separate steps (check-then-set),
    // letting two callers both see "absent" and both run the handler.
    shuttle::check_random(
        || {
            race_claims(memory_claim(MemoryStore::with_clock(
                16,
                ManualClock::new(Timestamp(1_000)),
            )))
        },
        ITERATIONS,
    );
    shuttle::check_pct(
        || {
            race_claims(memory_claim(MemoryStore::with_clock(
                16,
                ManualClock::new(Timestamp(1_000)),
            )))
        },
        ITERATIONS,
        3,
    );
}

/// A deliberately broken store: the claim reads the record under one lock acquisition and
/// writes it under another, the check-then-set the design forbids. Same decisions as the
/// memory store ([`decide::claim`]); only the atomicity differs.
#[derive(Clone, Default)]
struct SplitClaimStore {
    records: Arc<Mutex<HashMap<ScopedKey, idem_core::Record>>>,
    fence_high: Arc<Mutex<u64>>,
}

impl SplitClaimStore {
    fn claim(&self, req: &ClaimRequest) -> ClaimOutcome {
        let now = Timestamp(1_000);
        let previous = self.records.lock().expect("lock").get(&req.key).cloned();
        let floor = *self.fence_high.lock().expect("lock") + 1;
        let t = decide::claim(now, previous.as_ref(), req, floor);
        if let Change::Put(record) = t.change {
            let mut high = self.fence_high.lock().expect("lock");
            *high = (*high).max(record.fence);
            drop(high);
            self.records
                .lock()
                .expect("lock")
                .insert(req.key.clone(), record);
        }
        t.outcome
    }
}

#[test]
fn shuttle_finds_the_double_claim_of_a_split_read_and_write() {
    // Shows the exploration above bites: the same race, against a claim split into two lock
    // acquisitions, must be caught as a double claim.
    let found = catch_unwind(AssertUnwindSafe(|| {
        shuttle::check_random(
            || {
                let store = SplitClaimStore::default();
                race_claims(move |req| store.claim(req));
            },
            ITERATIONS,
        );
    }));
    let payload = found.expect_err("shuttle must find two holders for one key in the split claim");
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("exactly one claimer may win"),
        "failed for another reason: {message}"
    );
}

#[derive(Debug, Default)]
struct Seen {
    a_complete: Option<SettleOutcome>,
    a_release: Option<SettleOutcome>,
    b_claim: Option<ClaimOutcome>,
    b_complete: Option<SettleOutcome>,
}

/// Holder A's lease has run out. Concurrently: A completes, A's drop guard releases, and B
/// claims (taking over) and completes. Whatever the order, the fence rule must hold.
fn settle_race() {
    let clock = ManualClock::new(Timestamp(1_000));
    let store = MemoryStore::with_clock(16, clock.clone());
    let a = request(Duration::from_millis(10));
    let ClaimOutcome::Claimed { lease: a_lease, .. } = block_on(store.claim(&a)).expect("claim")
    else {
        panic!("the first claim must win");
    };
    clock.advance(Duration::from_millis(20));
    let ttl = Duration::from_secs(3600);
    let seen = Arc::new(Mutex::new(Seen::default()));

    let complete_a = {
        let (store, seen) = (store.clone(), Arc::clone(&seen));
        thread::spawn(move || {
            let r = block_on(store.complete(&Completion::new(
                Hold::of(&key(), &a_lease),
                &StoredResponse::new(200, "a"),
                ttl,
            )));
            seen.lock().expect("lock").a_complete = Some(r.expect("complete"));
        })
    };
    let release_a = {
        let (store, seen) = (store.clone(), Arc::clone(&seen));
        thread::spawn(move || {
            let r = block_on(store.release(&Hold::of(&key(), &a_lease), ReleaseKind::Retryable));
            seen.lock().expect("lock").a_release = Some(r.expect("release"));
        })
    };
    let claim_b = {
        let (store, seen) = (store.clone(), Arc::clone(&seen));
        thread::spawn(move || {
            let b = request(Duration::from_secs(30));
            let outcome = block_on(store.claim(&b)).expect("claim");
            let completed = match &outcome {
                ClaimOutcome::Claimed { lease, .. } => Some(
                    block_on(store.complete(&Completion::new(
                        Hold::new(&key(), b.owner, lease.fence),
                        &StoredResponse::new(200, "b"),
                        ttl,
                    )))
                    .expect("complete"),
                ),
                _ => None,
            };
            let mut seen = seen.lock().expect("lock");
            seen.b_claim = Some(outcome);
            seen.b_complete = completed;
        })
    };
    for h in [complete_a, release_a, claim_b] {
        h.join().expect("thread");
    }

    let seen = seen.lock().expect("lock");
    let settled = |o: Option<SettleOutcome>| o == Some(SettleOutcome::Settled);
    assert!(
        !(settled(seen.a_complete) && settled(seen.a_release)),
        "one claim settled twice: {seen:?}"
    );
    let b_fence = match &seen.b_claim {
        Some(ClaimOutcome::Claimed { lease, .. }) => Some(lease.fence),
        _ => None,
    };
    if let Some(fence) = b_fence {
        assert!(
            fence > a_lease.fence,
            "a new holder needs a higher fence: {seen:?}"
        );
        assert!(
            settled(seen.b_complete),
            "the current holder must be able to complete: {seen:?}"
        );
        assert!(
            !settled(seen.a_complete),
            "the stale holder completed after a takeover: {seen:?}"
        );
    } else {
        // B found A's result, so A completed before B claimed.
        assert!(
            matches!(&seen.b_claim, Some(ClaimOutcome::Done { response }) if response.body == "a"),
            "{seen:?}"
        );
        assert!(settled(seen.a_complete), "{seen:?}");
    }
    let record = block_on(store.get(&key()))
        .expect("get")
        .expect("a completed record is kept");
    match &record.state {
        RecordState::Completed { response, .. } if b_fence.is_some() => {
            assert_eq!(response.body, "b");
            assert_eq!(Some(record.fence), b_fence);
        }
        RecordState::Completed { response, .. } => {
            assert_eq!(response.body, "a");
            assert_eq!(record.fence, a_lease.fence);
        }
        other => panic!("the record must end completed, got {other:?}"),
    }
}

#[test]
fn claim_complete_and_release_interleavings_keep_the_fence_rule() {
    // Guards: a stale holder's complete or release (e.g. the engine's drop guard) landing
    // after a takeover and overwriting the new holder's record.
    shuttle::check_random(settle_race, ITERATIONS);
    shuttle::check_pct(settle_race, ITERATIONS, 3);
}
