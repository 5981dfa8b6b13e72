//! MemoryStore passes the whole conformance suite: on a manual clock with 1 000 model-test
//! cases, on the system clock the way real-server stores run it, and behind the local cache
//! tier.

use std::time::Duration;

use idem_core::{CachedStore, MemoryStore};
use idem_testkit::{Harness, MemoryHarness};

idem_testkit::conformance_tests!(MemoryHarness::new(), cases = 1000);

/// The real-clock path every server-backed store takes: sleeping instead of moving a clock,
/// one shared store, timestamps checked with latency slack.
mod system_clock {
    use super::*;

    idem_testkit::conformance_tests!(
        idem_testkit::ServerHarness::new(MemoryStore::new(100_000), Duration::from_millis(300)),
        cases = 24
    );
}

/// `CachedStore<MemoryStore>` on one manual clock.
#[derive(Clone, Debug, Default)]
struct CachedHarness(MemoryHarness);

impl Harness for CachedHarness {
    type Store = CachedStore<MemoryStore>;

    async fn store(&self) -> Self::Store {
        let inner = self.0.store().await;
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

// Bug guarded: CachedStore filled its cache from a store's `Done` for the *claimant's* ttl,
// so it kept replaying a record after the record expired in the store (a new claim must run).
// Found by `cached::model_matches_store`; this test failed on the cache.rs of b169ec7.
#[tokio::test]
async fn cached_replay_never_outlives_its_record() {
    use idem_core::{
        ClaimOutcome, ClaimRequest, Key, OwnerId, Scope, ScopedKey, Store, StoredResponse,
        TakeoverPolicy,
    };

    let h = MemoryHarness::new();
    let inner = h.store().await;
    let cached = CachedStore::with_clock(
        inner.clone(),
        100,
        Duration::from_secs(3_600),
        h.clock().clone(),
    );
    let key = ScopedKey::new(
        Scope::new("cache-expiry").expect("ns"),
        Key::new("k").expect("key"),
    );
    let req = |ttl| ClaimRequest {
        key: key.clone(),
        fingerprint: idem_testkit::fp(1),
        owner: OwnerId::random(),
        lease: Duration::from_secs(10),
        ttl,
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    };
    // Completed by another process (straight on the shared store), kept for one minute.
    let first = req(Duration::from_secs(60));
    let ClaimOutcome::Claimed { lease, .. } = inner.claim(&first).await.expect("claim") else {
        panic!("not claimed")
    };
    let response = StoredResponse::new(200, "once");
    inner
        .complete(
            &key,
            lease.owner,
            lease.fence,
            &response,
            Duration::from_secs(60),
        )
        .await
        .expect("complete");
    // This process replays it, claiming with a day-long ttl.
    let replay = cached
        .claim(&req(Duration::from_secs(86_400)))
        .await
        .expect("claim");
    assert_eq!(replay, ClaimOutcome::Done { response });
    h.advance(Duration::from_secs(61)).await;
    let after = cached
        .claim(&req(Duration::from_secs(86_400)))
        .await
        .expect("claim");
    assert!(
        matches!(
            after,
            ClaimOutcome::Claimed {
                takeover: false,
                ..
            }
        ),
        "replayed an expired record: {after:?}"
    );
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
