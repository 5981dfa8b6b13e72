//! MemoryStore passes the whole conformance suite: on a manual clock with 1 000 model-test
//! cases, on the system clock the way real-server stores run it, and behind the local cache
//! tier (whose own unit tests live in idem-core's `store/cache.rs`).

use std::time::Duration;

use idem_core::{AuditLevel, CachedStore, MemoryStore};
use idem_testkit::{Harness, MemoryHarness};

idem_testkit::conformance_tests!(MemoryHarness::new(), cases = 1000);

/// The real-clock path every server-backed store takes: sleeping instead of moving a clock,
/// one shared store, timestamps checked with latency slack.
mod system_clock {
    use super::*;

    fn harness() -> idem_testkit::ServerHarness<MemoryStore> {
        let store = MemoryStore::new(100_000);
        let all = store.clone().with_audit_level(AuditLevel::All);
        idem_testkit::ServerHarness::new(store, all, Duration::from_millis(300))
    }

    idem_testkit::conformance_tests!(harness(), cases = 24);
}

/// `CachedStore<MemoryStore>` on one manual clock.
#[derive(Clone, Debug, Default)]
struct CachedHarness(MemoryHarness);

impl Harness for CachedHarness {
    type Store = CachedStore<MemoryStore>;

    async fn store_at(&self, level: AuditLevel) -> Self::Store {
        let inner = self.0.store_at(level).await;
        CachedStore::with_clock(
            inner,
            1_000,
            Duration::from_secs(3_600),
            self.0.clock().clone(),
        )
    }

    async fn advance(&self, d: Duration) {
        self.0.advance(d).await;
    }

    fn lease(&self) -> Duration {
        self.0.lease()
    }

    fn time_travel(&self) -> bool {
        true
    }
}

mod cached {
    use super::*;

    idem_testkit::conformance_tests!(CachedHarness::default(), cases = 500);
}

/// The generator reaches every branch of the contract, often: without this a model test could
/// pass by never generating the interesting sequences.
#[tokio::test]
async fn model_reaches_every_branch() {
    let hits = idem_testkit::model::coverage(&MemoryHarness::new(), 1000).await;
    eprintln!("model branch coverage over 1000 cases: {hits:#?}");
    for branch in idem_testkit::model::BRANCHES {
        let n = hits.get(branch).copied().unwrap_or(0);
        assert!(
            n >= 20,
            "branch {branch:?} exercised only {n} times in 1000 cases"
        );
    }
}
