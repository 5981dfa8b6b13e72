//! The SQL paths of the unknown state beyond what the conformance suite reaches in one go, on
//! every dialect (and MariaDB's upsert-then-read claim):
//!
//! - a claim under `hold` on an expired lease answers the record's fence and the attempt's age
//!   and names the holder, who may release it as unknown (any number of times: the row stays
//!   as it is), then complete it; or release it as retryable;
//! - an unknown row naming nobody (released as unknown, or written by the previous version,
//!   which never named the holder) refuses its former holder;
//! - a resolve naming a fence is judged absent first, then fence, then state;
//! - the audit trail of those steps is the memory store's, event for event, at each audit
//!   level.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::audit::{AuditEvent, AuditKind, AuditLevel, AuditQuery};
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, MemoryStore, OwnerId, RecordState,
    ReleaseKind, RenewOutcome, Resolution, ResolveOutcome, Scope, ScopedKey, SettleOutcome,
    StateKind, Store, StoredResponse, TakeoverPolicy,
};
use idem_sql::SqlStore;

const LEASE: Duration = Duration::from_millis(400);
const TTL: Duration = Duration::from_secs(3600);

/// Runs raw SQL on the store's database (`{t}` is the table).
type Exec<'a> = &'a (dyn Fn(String) -> Pin<Box<dyn Future<Output = ()> + Send>> + Sync);

fn key(ns: &str, k: &str) -> ScopedKey {
    ScopedKey::new(Scope::new(ns).expect("ns"), Key::new(k).expect("key"))
}

fn req(key: &ScopedKey, takeover: TakeoverPolicy) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_bytes(1, b"charge 100"),
        owner: OwnerId::random(),
        lease: LEASE,
        ttl: TTL,
        takeover,
        request_id: Some("req".into()),
    }
}

async fn claimed<S: Store>(store: &S, key: &ScopedKey) -> Lease {
    match store
        .claim(&req(key, TakeoverPolicy::Hold))
        .await
        .expect("claim")
    {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("claim of {key}: expected Claimed, got {other:?}"),
    }
}

async fn wait_out_lease() {
    tokio::time::sleep(LEASE + Duration::from_millis(150)).await;
}

/// A claim under `hold` that finds `lease` expired: unknown at its fence, as old as the lease.
async fn held<S: Store>(store: &S, key: &ScopedKey, lease: &Lease) -> Duration {
    match store
        .claim(&req(key, TakeoverPolicy::Hold))
        .await
        .expect("claim")
    {
        ClaimOutcome::Unknown { fence, age } => {
            assert_eq!(fence, lease.fence, "{key}: the held record's fence");
            assert!(
                age >= LEASE && age < LEASE + Duration::from_secs(30),
                "{key}: the attempt's age is {age:?}"
            );
            age
        }
        other => panic!("hold claim of {key}: expected Unknown, got {other:?}"),
    }
}

/// `store.complete` at [`TTL`], which must answer.
async fn complete<S: Store>(
    store: &S,
    k: &ScopedKey,
    owner: OwnerId,
    fence: u64,
    response: &StoredResponse,
) -> SettleOutcome {
    store
        .complete(&Completion::new(Hold::new(k, owner, fence), response, TTL))
        .await
        .expect("complete")
}

/// `store.release`, which must answer.
async fn release<S: Store>(
    store: &S,
    k: &ScopedKey,
    owner: OwnerId,
    fence: u64,
    kind: ReleaseKind,
) -> SettleOutcome {
    store
        .release(&Hold::new(k, owner, fence), kind)
        .await
        .expect("release")
}

/// `store.resolve`, which must answer.
async fn resolve<S: Store>(
    store: &S,
    k: &ScopedKey,
    resolution: &Resolution,
    fence: Option<u64>,
) -> ResolveOutcome {
    store.resolve(k, resolution, fence).await.expect("resolve")
}

fn settled(outcome: SettleOutcome, what: &str) {
    assert_eq!(outcome, SettleOutcome::Settled, "{what}");
}

fn fenced(outcome: SettleOutcome, what: &str) {
    assert_eq!(outcome, SettleOutcome::Fenced, "{what}");
}

/// The holder of a held record: renewal refused, release as unknown keeps the record as it is
/// (twice), others fenced, then its completion replays.
async fn holder_completes<S: Store>(store: &S, ns: &str) {
    let k = key(ns, "complete");
    let a = claimed(store, &k).await;
    wait_out_lease().await;
    let age = held(store, &k, &a).await;
    let rec = store.get(&k).await.expect("get").expect("record");
    let RecordState::Unknown { owner, .. } = rec.state else {
        panic!("expected unknown, got {:?}", rec.state)
    };
    assert_eq!(owner, Some(a.owner), "the held record names its holder");
    // Read back (no write): the same fence, an age that does not go back.
    let ClaimOutcome::Unknown { fence, age: again } = store
        .claim(&req(&k, TakeoverPolicy::Reexecute))
        .await
        .expect("claim")
    else {
        panic!("claim of an unknown record")
    };
    assert_eq!(fence, a.fence);
    assert!(again >= age, "age {again:?} after {age:?}");
    assert_eq!(
        store.renew(&Hold::of(&k, &a), LEASE).await.expect("renew"),
        RenewOutcome::Lost,
        "an unknown record is not renewed"
    );
    for n in 0..2 {
        settled(
            release(store, &k, a.owner, a.fence, ReleaseKind::Unknown).await,
            "the holder releases its unknown record as unknown",
        );
        assert_eq!(
            store.get(&k).await.expect("get").expect("record"),
            rec,
            "release #{n} as unknown leaves the held record as it is"
        );
    }
    let response = StoredResponse::new(201, "late");
    fenced(
        complete(store, &k, OwnerId::random(), a.fence, &response).await,
        "another owner",
    );
    fenced(
        complete(store, &k, a.owner, a.fence + 1, &response).await,
        "another fence",
    );
    settled(
        complete(store, &k, a.owner, a.fence, &response).await,
        "the holder completes its unknown record",
    );
    assert_eq!(
        store
            .claim(&req(&k, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
        ClaimOutcome::Done { response }
    );
    fenced(
        release(store, &k, a.owner, a.fence, ReleaseKind::Retryable).await,
        "a completed record is nobody's",
    );
}

/// The holder of a held record releases it as retryable: the key is free, the fence goes on.
async fn holder_releases<S: Store>(store: &S, ns: &str) {
    let k = key(ns, "release");
    let a = claimed(store, &k).await;
    wait_out_lease().await;
    held(store, &k, &a).await;
    settled(
        release(store, &k, a.owner, a.fence, ReleaseKind::Retryable).await,
        "the holder releases its unknown record as retryable",
    );
    assert_eq!(store.get(&k).await.expect("get"), None);
    let b = claimed(store, &k).await;
    assert!(b.fence > a.fence);
}

/// Released as unknown: nobody is named, so the former holder is fenced both ways.
async fn released_names_nobody<S: Store>(store: &S, ns: &str) {
    let k = key(ns, "nobody");
    let a = claimed(store, &k).await;
    settled(
        release(store, &k, a.owner, a.fence, ReleaseKind::Unknown).await,
        "release as unknown",
    );
    let rec = store.get(&k).await.expect("get").expect("record");
    assert!(matches!(
        rec.state,
        RecordState::Unknown { owner: None, .. }
    ));
    fenced(
        complete(store, &k, a.owner, a.fence, &StoredResponse::new(200, "x")).await,
        "complete after release as unknown",
    );
    fenced(
        release(store, &k, a.owner, a.fence, ReleaseKind::Unknown).await,
        "release after release as unknown",
    );
    assert_eq!(store.get(&k).await.expect("get").expect("record"), rec);
}

/// A resolve naming a fence: absent first, then the fence, then the state.
async fn resolve_order<S: Store>(store: &S, ns: &str) {
    let k = key(ns, "order");
    let release = Resolution::Release;
    assert_eq!(
        resolve(store, &k, &release, Some(7)).await,
        ResolveOutcome::NotFound
    );
    let a = claimed(store, &k).await;
    assert_eq!(
        resolve(store, &k, &release, Some(a.fence + 1)).await,
        ResolveOutcome::Fenced { fence: a.fence },
        "a live lease under another fence is fenced before it is unresolvable"
    );
    assert_eq!(
        resolve(store, &k, &release, Some(a.fence)).await,
        ResolveOutcome::NotResolvable {
            state: StateKind::Processing
        }
    );
    let response = StoredResponse::new(200, "done");
    settled(
        complete(store, &k, a.owner, a.fence, &response).await,
        "complete",
    );
    assert_eq!(
        resolve(store, &k, &release, Some(a.fence - 1)).await,
        ResolveOutcome::Fenced { fence: a.fence }
    );
    assert_eq!(
        resolve(store, &k, &release, None).await,
        ResolveOutcome::NotResolvable {
            state: StateKind::Completed
        }
    );
    assert!(store.delete(&k).await.expect("delete"));
    assert_eq!(
        resolve(store, &k, &release, Some(a.fence)).await,
        ResolveOutcome::NotFound,
        "a deleted record (a tombstone) is absent"
    );
    // An expired lease with the right fence resolves.
    let b = claimed(store, &k).await;
    wait_out_lease().await;
    assert_eq!(
        resolve(store, &k, &release, Some(b.fence)).await,
        ResolveOutcome::Resolved
    );
}

/// Every scenario on `store`; its audit trail, oldest first, per key.
async fn scenarios<S: Store>(store: &S, ns: &str) -> Vec<Vec<AuditEvent>> {
    holder_completes(store, ns).await;
    holder_releases(store, ns).await;
    released_names_nobody(store, ns).await;
    resolve_order(store, ns).await;
    let mut trails = Vec::new();
    for k in ["complete", "release", "nobody", "order"] {
        let mut trail = store
            .audit(&AuditQuery::for_key(&key(ns, k)))
            .await
            .expect("audit");
        trail.reverse();
        trails.push(trail);
    }
    trails
}

/// What two stores' events must agree on.
fn shape(trails: &[Vec<AuditEvent>]) -> Vec<Vec<String>> {
    trails
        .iter()
        .map(|t| {
            t.iter()
                .map(|e| format!("{:?} {:?} {:?} {:?}", e.kind, e.outcome, e.status, e.actor))
                .collect()
        })
        .collect()
}

/// Fences relative to each trail's first event (the stores number them differently).
fn fences(trails: &[Vec<AuditEvent>]) -> Vec<Vec<i128>> {
    trails
        .iter()
        .map(|t| {
            let base = t.first().map_or(0, |e| i128::from(e.fence));
            t.iter()
                .map(|e| (i128::from(e.fence) - base).signum())
                .collect()
        })
        .collect()
}

/// Runs the scenarios on `store` and on a memory store, at the default audit level and (on
/// `at_all`, in another namespace) at `all`; the trails must match. Then a row as the
/// previous version left a held record (unknown, no owner) refuses its former holder.
async fn check<S: Store>(store: &S, at_all: &S, ns: &str, exec: Exec<'_>) {
    let ns_all = format!("{ns}.all");
    let memory = MemoryStore::new(1000).with_audit_level(AuditLevel::All);
    let (got, want) = tokio::join!(scenarios(at_all, &ns_all), scenarios(&memory, &ns_all));
    assert_eq!(shape(&got), shape(&want), "audit trail: {got:#?}");
    let held_trail = [
        (AuditKind::Claimed, None, None),
        (AuditKind::Unknown, Some("lease_expired"), None),
        (AuditKind::Unknown, Some("ambiguous"), None),
        (AuditKind::Unknown, Some("ambiguous"), None),
        (AuditKind::Fenced, Some("complete"), None),
        (AuditKind::Fenced, Some("complete"), None),
        // A late completion of an unknown record: recorded at every level, as it is why
        // the unknown never needed a resolve.
        (AuditKind::Completed, None, Some(201)),
        (AuditKind::Fenced, Some("release"), None),
    ];
    let kinds_etc = |t: &[AuditEvent]| -> Vec<(AuditKind, Option<String>, Option<u16>)> {
        t.iter()
            .map(|e| (e.kind, e.outcome.clone(), e.status))
            .collect()
    };
    let expected = |from: usize| -> Vec<(AuditKind, Option<String>, Option<u16>)> {
        held_trail[from..]
            .iter()
            .map(|(k, o, s)| (*k, o.map(str::to_owned), *s))
            .collect()
    };
    assert_eq!(
        kinds_etc(&got[0]),
        expected(0),
        "the held record's trail at all"
    );
    let order: Vec<_> = got[3].iter().map(|e| e.kind).collect();
    assert_eq!(
        order,
        [
            AuditKind::Claimed,
            AuditKind::Completed,
            AuditKind::Deleted,
            AuditKind::Claimed,
            AuditKind::Resolved,
        ],
        "fenced and refused resolves write nothing"
    );
    assert_eq!(fences(&got), fences(&want), "audit fences: {got:#?}");

    // The default level: the same trails without the fresh claims and the completion of a
    // processing record.
    let memory = MemoryStore::new(1000);
    let (got, want) = tokio::join!(scenarios(store, ns), scenarios(&memory, ns));
    assert_eq!(shape(&got), shape(&want), "audit trail: {got:#?}");
    assert_eq!(kinds_etc(&got[0]), expected(1), "the held record's trail");
    let order: Vec<_> = got[3].iter().map(|e| e.kind).collect();
    assert_eq!(order, [AuditKind::Deleted, AuditKind::Resolved]);
    assert_eq!(fences(&got), fences(&want), "audit fences: {got:#?}");

    let k = key(ns, "previous");
    let a = claimed(store, &k).await;
    wait_out_lease().await;
    held(store, &k, &a).await;
    exec("UPDATE {t} SET owner = NULL WHERE state = 2".into()).await;
    let rec = store.get(&k).await.expect("get").expect("record");
    assert!(
        matches!(rec.state, RecordState::Unknown { owner: None, .. }),
        "{rec:?}"
    );
    fenced(
        complete(store, &k, a.owner, a.fence, &StoredResponse::new(200, "x")).await,
        "a held row of the previous version names nobody",
    );
    held_again(store, &k, a.fence).await;
    assert_eq!(
        resolve(store, &k, &Resolution::Release, Some(a.fence)).await,
        ResolveOutcome::Resolved
    );
}

async fn held_again<S: Store>(store: &S, k: &ScopedKey, fence: u64) {
    let got = store
        .claim(&req(k, TakeoverPolicy::Reexecute))
        .await
        .expect("claim");
    assert!(
        matches!(got, ClaimOutcome::Unknown { fence: f, .. } if f == fence),
        "{got:?}"
    );
}

/// Runs [`check`] on `store`, with a copy of it that audits everything.
async fn check_at_all<D: idem_sql::Dialect>(store: &SqlStore<D>, ns: &str, exec: Exec<'_>) {
    let at_all = store.clone().with_audit_level(AuditLevel::All);
    check(store, &at_all, ns, exec).await;
}

/// A test named `$name` that runs [`check_at_all`] on the store of `$harness` (`None` skips),
/// running raw SQL through the pool its `$pool` method gives (`{t}` is the store's table).
macro_rules! held_unknown_test {
    ($name:ident, $harness:expr, $pool:ident, $ns:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(h) = $harness else {
                return;
            };
            let (pool, table) = (h.store.$pool().clone(), h.store.table().to_string());
            let exec = move |sql: String| -> Pin<Box<dyn Future<Output = ()> + Send>> {
                let (pool, sql) = (pool.clone(), sql.replace("{t}", &table));
                Box::pin(async move {
                    sqlx::raw_sql(&sql).execute(&pool).await.expect("raw sql");
                })
            };
            check_at_all(&h.store, $ns, &exec).await;
        }
    };
}

held_unknown_test!(
    postgres,
    common::PgHarness::connect().await,
    pool,
    "held.pg"
);
held_unknown_test!(
    mysql,
    common::MySqlHarness::connect().await,
    pool,
    "held.my"
);
held_unknown_test!(
    mysql_then_read,
    common::MySqlHarness::connect_then_read().await,
    pool,
    "held.my2"
);
held_unknown_test!(
    sqlite,
    Some(common::SqliteHarness::new().await),
    writer,
    "held.lite"
);
