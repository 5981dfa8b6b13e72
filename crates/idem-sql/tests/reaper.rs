//! The reaper deletes expired rows (tombstones included) in batches and nothing live; fences
//! keep increasing after it deleted a key's row.

mod common;

use std::time::Duration;

use idem_core::audit::{AuditKind, AuditQuery};
use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, ClaimRequest, OwnerId, ReleaseKind, SettleOutcome, Store, TakeoverPolicy,
};

fn req(key: &str, ttl: Duration) -> ClaimRequest {
    common::claim_req(
        "reaper",
        key,
        Duration::from_millis(20),
        ttl,
        TakeoverPolicy::Reexecute,
    )
}

async fn fence<S: Store>(store: &S, r: &ClaimRequest) -> u64 {
    match store.claim(r).await.expect("claim") {
        ClaimOutcome::Claimed { lease, .. } => lease.fence,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Claims 7 short-lived keys (one of them released at once) and one long-lived key, waits
/// for the short ones to expire, reaps in batches of 2, and checks what is left.
async fn check<S: Store>(store: &S, reap: impl AsyncFn(u32) -> u64) {
    let mut old = Vec::new();
    let mut released = false;
    for i in 0..7 {
        // The first one lives long enough to be released in time; its tombstone expires at
        // once.
        let ttl = Duration::from_millis(if i == 0 { 10_000 } else { 20 });
        let r = req(&format!("short-{i}"), ttl);
        let f = fence(store, &r).await;
        if i == 0 {
            released = store
                .release(&Hold::new(&r.key, r.owner, f), ReleaseKind::Retryable)
                .await
                .expect("release")
                == SettleOutcome::Settled;
        }
        old.push((r, f));
    }
    let long = req("long", Duration::from_secs(600));
    fence(store, &long).await;
    idem_testkit::sleep_for(Duration::from_millis(40)).await;
    assert_eq!(
        reap(2).await,
        7,
        "every expired row goes, batch after batch"
    );
    assert_eq!(reap(2).await, 0);
    // The reaper's deletes leave `expired` events, except for a released row, whose release
    // was recorded when it happened.
    let expired = store
        .audit(&AuditQuery {
            namespace: Some("reaper".into()),
            kind: Some(AuditKind::Expired),
            ..AuditQuery::default()
        })
        .await
        .expect("audit");
    let mut keys: Vec<&str> = expired.iter().map(|e| e.key.as_str()).collect();
    keys.sort_unstable();
    let mut want = vec![
        "short-1", "short-2", "short-3", "short-4", "short-5", "short-6",
    ];
    if !released {
        want.insert(0, "short-0");
    }
    assert_eq!(keys, want);
    for e in &expired {
        let (_, f) = old
            .iter()
            .find(|(r, _)| r.key.key.as_str() == e.key)
            .expect("a short key");
        assert_eq!(e.fence, *f, "{e:?}");
    }
    assert!(
        store.get(&long.key).await.expect("get").is_some(),
        "a live record survives the reaper"
    );
    for (r, f) in old {
        let again = ClaimRequest {
            owner: OwnerId::random(),
            ..r
        };
        assert!(
            fence(store, &again).await > f,
            "the fence must still increase after the row was reaped"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Some(h) = common::PgHarness::connect().await else {
        return;
    };
    check(&h.store, async |b| h.store.reap(b).await.expect("reap")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    let Some(h) = common::MySqlHarness::connect().await else {
        return;
    };
    check(&h.store, async |b| h.store.reap(b).await.expect("reap")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let h = common::SqliteHarness::new().await;
    check(&h.store, async |b| h.store.reap(b).await.expect("reap")).await;
}
