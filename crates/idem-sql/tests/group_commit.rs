//! Group commit on PostgreSQL and SQLite: claims and completions that wait for the store's
//! one writer connection are sent together, and each key still runs once.
//!
//! On PostgreSQL a grouped claim statement stamps every key it claims with the same fence
//! (the statement's clock in microseconds), while lone claims on one connection each get
//! their own: so shared fences show that claims were grouped, and the same run with group
//! commit off shows none.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, OwnerId, Scope, ScopedKey, SettleOutcome, Store,
    StoredResponse, TakeoverPolicy,
};
use tokio::task::JoinSet;

const KEYS: usize = 12;
const PER_KEY: usize = 4;

fn request(key: &str, body: &[u8], lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: ScopedKey::new(
            Scope::new("group").expect("scope"),
            Key::new(key).expect("key"),
        ),
        fingerprint: Fingerprint::of_bytes(1, body),
        owner: OwnerId::random(),
        lease,
        ttl: Duration::from_secs(600),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

/// Claims every request at once; the outcomes by key.
async fn claim_all<S: Store + Clone + 'static>(
    store: &S,
    requests: Vec<ClaimRequest>,
) -> BTreeMap<String, Vec<(ClaimRequest, ClaimOutcome)>> {
    let mut set = JoinSet::new();
    for req in requests {
        let store = store.clone();
        set.spawn(async move {
            let outcome = store.claim(&req).await.expect("claim");
            (req, outcome)
        });
    }
    let mut by_key: BTreeMap<String, Vec<_>> = BTreeMap::new();
    while let Some(done) = set.join_next().await {
        let (req, outcome) = done.expect("task");
        by_key
            .entry(req.key.key.as_str().to_owned())
            .or_default()
            .push((req, outcome));
    }
    by_key
}

/// Each key's one claimed request and its fence; panics unless every key was claimed exactly
/// once and every other claim of it found it busy.
fn claimed_once(
    by_key: &BTreeMap<String, Vec<(ClaimRequest, ClaimOutcome)>>,
    takeover: bool,
) -> Vec<(ClaimRequest, u64)> {
    assert_eq!(by_key.len(), KEYS, "every key answered");
    let mut claimed = Vec::new();
    for (key, outcomes) in by_key {
        let mut won = outcomes.iter().filter_map(|(req, o)| match o {
            ClaimOutcome::Claimed { lease, takeover: t } => Some((req.clone(), lease.fence, *t)),
            _ => None,
        });
        let (req, fence, t) = won
            .next()
            .unwrap_or_else(|| panic!("{key}: nobody claimed"));
        assert!(won.next().is_none(), "{key} claimed twice: {outcomes:?}");
        assert_eq!(t, takeover, "{key}: takeover flag");
        let busy = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, ClaimOutcome::Busy { .. }))
            .count();
        assert_eq!(
            busy,
            PER_KEY - 1,
            "{key}: the others are busy: {outcomes:?}"
        );
        claimed.push((req, fence));
    }
    claimed
}

fn requests(tag: &str, lease: Duration) -> Vec<ClaimRequest> {
    (0..KEYS * PER_KEY)
        .map(|i| request(&format!("{tag}-{}", i % KEYS), b"same", lease))
        .collect()
}

/// Completes every claim at once, with its own fence plus `offset`.
async fn complete_all<S: Store + Clone + 'static>(
    store: &S,
    claimed: &[(ClaimRequest, u64)],
    offset: u64,
) -> Vec<SettleOutcome> {
    let mut set = JoinSet::new();
    for (req, fence) in claimed.iter().cloned() {
        let store = store.clone();
        set.spawn(async move {
            let body = format!("made {}", req.key.key.as_str());
            store
                .complete(&Completion::new(
                    Hold::new(&req.key, req.owner, fence + offset),
                    &StoredResponse::new(201, body),
                    req.ttl,
                ))
                .await
                .expect("complete")
        });
    }
    set.join_all().await
}

/// The whole life of a group of keys: claimed once each, completed, fenced completions
/// refused, replays and mismatches answered; returns how many distinct fences the claims got.
async fn life_of_keys<S: Store + Clone + 'static>(store: &S, tag: &str) -> usize {
    let claimed = claimed_once(
        &claim_all(store, requests(tag, Duration::from_secs(30))).await,
        false,
    );
    let fences: BTreeSet<u64> = claimed.iter().map(|(_, f)| *f).collect();

    let stale = complete_all(store, &claimed, 1).await;
    assert!(
        stale.iter().all(|o| *o == SettleOutcome::Fenced),
        "{stale:?}"
    );
    let settled = complete_all(store, &claimed, 0).await;
    assert!(
        settled.iter().all(|o| *o == SettleOutcome::Settled),
        "{settled:?}"
    );

    let mut again = requests(tag, Duration::from_secs(30));
    again.extend(
        (0..KEYS).map(|i| request(&format!("{tag}-{i}"), b"other", Duration::from_secs(30))),
    );
    for (key, outcomes) in claim_all(store, again).await {
        for (req, outcome) in outcomes {
            match outcome {
                ClaimOutcome::Done { response } => {
                    assert_eq!(req.fingerprint, Fingerprint::of_bytes(1, b"same"));
                    assert_eq!(response.body, format!("made {key}").into_bytes());
                }
                ClaimOutcome::Mismatch { .. } => {
                    assert_eq!(req.fingerprint, Fingerprint::of_bytes(1, b"other"));
                }
                other => panic!("{key}: a completed key answered {other:?}"),
            }
        }
    }
    fences.len()
}

/// Expired leases taken over by a group of claims: once per key.
async fn takeovers<S: Store + Clone + 'static>(store: &S, tag: &str) {
    let short = Duration::from_millis(300);
    for i in 0..KEYS {
        let req = request(&format!("{tag}-{i}"), b"same", short);
        assert!(matches!(
            store.claim(&req).await.expect("claim"),
            ClaimOutcome::Claimed { .. }
        ));
    }
    tokio::time::sleep(short * 2).await;
    claimed_once(
        &claim_all(store, requests(tag, Duration::from_secs(30))).await,
        true,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_groups_claims_and_each_key_runs_once() {
    let Some(h) = common::PgHarness::with_connections(1).await else {
        return;
    };
    let distinct = life_of_keys(&h.store, "pg").await;
    assert!(
        distinct < KEYS,
        "{distinct} fences for {KEYS} claims: the waiting claims were not grouped"
    );
    takeovers(&h.store, "pg-expired").await;
}

/// The control: the same claims with group commit off each get a fence of their own, so the
/// test above can tell grouped claims from lone ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_group_commit_claims_alone() {
    let Some(h) = common::PgHarness::with_connections(1).await else {
        return;
    };
    let store = h.store.clone().with_group_commit(false);
    let distinct = life_of_keys(&store, "pg-alone").await;
    assert_eq!(
        distinct, KEYS,
        "lone claims on one connection share no fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_groups_in_one_transaction_and_each_key_runs_once() {
    let h = common::SqliteHarness::new().await;
    life_of_keys(&h.store, "lite").await;
    takeovers(&h.store, "lite-expired").await;
    // The grouped and the lone paths agree: a store sharing the file without group commit
    // replays what the grouped one stored.
    let alone = Arc::new(h.store.clone().with_group_commit(false));
    let replay = alone
        .claim(&request("lite-0", b"same", Duration::from_secs(30)))
        .await
        .expect("claim");
    assert!(matches!(replay, ClaimOutcome::Done { .. }), "{replay:?}");
}
