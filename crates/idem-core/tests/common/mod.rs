//! Shared rigs for the engine tests, on paused tokio time.
//!
//! Store time follows tokio's paused clock plus a manual offset ([`TestClock`]), so leases
//! and the engine's own deadlines move together under `advance`, and a test can still jump
//! the store clock alone (a crashed holder, a store whose clock runs ahead). The [`Rig`] puts
//! a memory store behind idem-testkit's `FaultyStore` and `CountingStore`.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Clock, Engine, Fingerprint, Key, ManualClock, MemoryStore, OwnerId,
    Policy, Record, Scope, ScopedKey, Settlement, Store, StoredResponse, TakeoverPolicy, Timestamp,
};
use idem_testkit::{Calls, CountingStore, FaultyStore};
use tokio::time::Instant;

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// Store time: tokio's (paused) clock since the test started, plus a manual offset.
#[derive(Clone, Debug)]
pub struct TestClock {
    offset: ManualClock,
    start: Instant,
}

impl TestClock {
    pub fn new() -> Self {
        Self {
            offset: ManualClock::new(Timestamp(1_000_000)),
            start: Instant::now(),
        }
    }

    /// Moves store time forward without moving tokio time.
    pub fn jump(&self, by: Duration) {
        self.offset.advance(by);
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        self.offset.now().plus(self.start.elapsed())
    }
}

pub fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("tests.engine").expect("namespace"),
        Key::new(k).expect("key"),
    )
}

pub fn fp(body: &[u8]) -> Fingerprint {
    Fingerprint::of_bytes(1, body)
}

/// A `reexecute` policy (an expired lease runs again, so a lost lease cancels the handler):
/// handler timeout `h`, lease `h + 15 s`, renewals every `renew`.
pub fn policy(handler: Duration, renew: Duration) -> Policy {
    Policy::builder()
        .takeover(TakeoverPolicy::Reexecute)
        .handler_timeout(handler)
        .lease(handler + secs(15))
        .renew_every(renew)
        .build()
        .expect("valid policy")
}

pub fn claim_request(
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
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Fails (after an hour of paused time, i.e. at once) instead of hanging when `f` never ends.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(secs(3600), f)
        .await
        .expect("must not hang")
}

/// A handler bug.
pub fn explode() -> Settlement<&'static str> {
    panic!("handler bug")
}

pub fn ok(body: &'static str) -> Settlement<&'static str> {
    Settlement::complete(body, StoredResponse::new(200, body))
}

// ---------------------------------------------------------------------------------------
// The rig: a memory store behind a fault injector, behind a call counter
// ---------------------------------------------------------------------------------------

/// What the engine talks to: every call counted, then faulted as the test says.
pub type Tested = CountingStore<FaultyStore<MemoryStore>>;

pub struct Rig {
    /// Store time.
    pub clock: TestClock,
    /// The store itself, for setting up and inspecting records behind the engine's back.
    pub memory: MemoryStore,
    /// The faults' switches (shared with the store's).
    pub faults: FaultyStore<MemoryStore>,
    /// What the engine talks to.
    pub store: Tested,
}

impl Rig {
    /// A fresh memory store behind a fault injector. Call inside a paused runtime.
    pub fn new() -> Self {
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

    pub fn engine(&self, policy: Policy) -> Engine<Tested> {
        Engine::new(self.store.clone(), policy)
    }

    /// Waits (on events, not time) until `enough` holds for the call counts.
    pub async fn wait_calls(&self, enough: impl FnMut(&Calls) -> bool) {
        // Bounded, so a missing call fails the test (paused time jumps to the bound) instead
        // of hanging it.
        tokio::time::timeout(secs(3600), self.store.wait_for(enough))
            .await
            .expect("the expected store calls never came");
    }

    /// Claims `k` (the request `b"x"`) straight on the memory store, as another process would.
    pub async fn claim_elsewhere(
        &self,
        k: &ScopedKey,
        lease: Duration,
        takeover: TakeoverPolicy,
    ) -> ClaimOutcome {
        self.memory
            .claim(&claim_request(k, b"x", lease, takeover))
            .await
            .expect("claim")
    }

    /// [`Rig::claim_elsewhere`] under `reexecute` with a 45 s lease, which must claim: the
    /// holder's lease.
    pub async fn lease_elsewhere(&self, k: &ScopedKey) -> idem_core::Lease {
        match self
            .claim_elsewhere(k, secs(45), TakeoverPolicy::Reexecute)
            .await
        {
            ClaimOutcome::Claimed { lease, .. } => lease,
            other => panic!("claim of {k}: got {other:?}"),
        }
    }

    pub async fn record(&self, k: &ScopedKey) -> Option<Record> {
        self.memory.get(k).await.expect("memory get")
    }
}

/// The default policy with what `set` changes.
pub fn policy_with(
    set: impl FnOnce(idem_core::PolicyBuilder) -> idem_core::PolicyBuilder,
) -> Policy {
    set(Policy::builder()).build().expect("policy")
}
