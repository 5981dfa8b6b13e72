//! What a store crate provides so the suite can run against its store: fresh stores and a
//! way to let time pass.

use std::future::Future;
use std::time::Duration;

use idem_core::audit::AuditLevel;
use idem_core::{ManualClock, MemoryStore, Store, Timestamp};

/// Gives the conformance suite stores to test and a way to let store time pass.
///
/// Every rule and every model-test case works in its own freshly generated namespace, so a
/// harness may hand out the same shared store (one Redis, one database) every time; records
/// of different rules never meet. Rules only ever filter `list` by their own namespace or
/// principal.
///
/// Time: the suite never reads a clock. It calls [`Harness::advance`] and expects the store's
/// clock to have moved by *at least* that much when it returns. A store on a
/// [`ManualClock`] moves the clock; a store judged by a server's clock (Redis `PX`, SQL
/// `now()`) sleeps. Every duration the suite uses is a multiple of [`Harness::lease`], and
/// every "not yet expired" assertion keeps at least half a lease of margin, so a real-server
/// harness should choose a lease that comfortably exceeds a few round trips on a loaded
/// machine (300 ms to 1 s).
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + Clone;

    /// A store to test that records the changes `level` names in its audit trail. May be a
    /// fresh one or a shared one (see the trait docs); stores at both levels may share
    /// their records. The audit rules run at both levels; every other rule and the model
    /// test take [`Harness::store`].
    fn store_at(&self, level: AuditLevel) -> impl Future<Output = Self::Store> + Send;

    /// A store to test at the default audit level.
    fn store(&self) -> impl Future<Output = Self::Store> + Send {
        self.store_at(AuditLevel::default())
    }

    /// Lets at least `d` of store time pass: advances a manual clock, or sleeps.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;

    /// The lease the suite claims with; every other duration is a multiple of it.
    fn lease(&self) -> Duration;

    /// True when [`Harness::advance`] is free and exact (a manual clock): the model test then
    /// generates longer cases with more time steps and demands exact timestamps. A harness
    /// answering false gets shorter cases and half a model step of timestamp slack.
    fn time_travel(&self) -> bool {
        false
    }

    /// The model test's time step: every lease, TTL and advance it generates is a small
    /// multiple of it. On a real clock a case whose added latency (round trips, sleep
    /// overshoot) exceeds half a step is inconclusive and replaced. Defaults to a quarter
    /// lease.
    fn model_step(&self) -> Duration {
        self.lease() / 4
    }
}

/// [`MemoryStore`]s on one shared [`ManualClock`]: time moves only when the suite says so.
#[derive(Clone, Debug)]
pub struct MemoryHarness {
    clock: ManualClock,
    capacity: usize,
}

impl MemoryHarness {
    /// A harness whose stores hold up to 100 000 records.
    pub fn new() -> Self {
        Self::with_capacity(100_000)
    }

    /// A harness whose stores hold up to `capacity` records.
    pub fn with_capacity(capacity: usize) -> Self {
        // A realistic epoch, so no rule can pass by accident of a zero timestamp.
        Self {
            clock: ManualClock::new(Timestamp(1_767_225_600_000)),
            capacity,
        }
    }

    /// The clock every store of this harness reads.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    fn store_at(&self, level: AuditLevel) -> impl Future<Output = MemoryStore> + Send {
        std::future::ready(
            MemoryStore::with_clock(self.capacity, self.clock.clone()).with_audit_level(level),
        )
    }

    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(10)
    }

    fn time_travel(&self) -> bool {
        true
    }
}

/// Helper for real-server harnesses: sleeps `d` plus a small allowance for the millisecond
/// rounding of store clocks (and for Redis, which keeps a key until the millisecond *after* its
/// `PX` deadline).
pub async fn sleep_for(d: Duration) {
    tokio::time::sleep(d + Duration::from_millis(2)).await;
}

/// A harness for a store judged by a real clock (a server's, or the system clock): hands out
/// clones of one store and lets time pass by sleeping.
///
/// Sharing one store is safe: every rule and model case works in its own namespace.
#[derive(Clone, Debug)]
pub struct ServerHarness<S> {
    store: S,
    all: S,
    lease: Duration,
}

impl<S: Store + Clone> ServerHarness<S> {
    /// Tests `store`, at the default audit level, and `all`, the same store recording
    /// every transition ([`AuditLevel::All`]), with leases of `lease` (300 ms to 1 s suits a
    /// loaded two-core machine).
    pub fn new(store: S, all: S, lease: Duration) -> Self {
        Self { store, all, lease }
    }
}

impl<S: Store + Clone> Harness for ServerHarness<S> {
    type Store = S;

    fn store_at(&self, level: AuditLevel) -> impl Future<Output = S> + Send {
        std::future::ready(match level {
            AuditLevel::All => self.all.clone(),
            _ => self.store.clone(),
        })
    }

    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        sleep_for(d)
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}
