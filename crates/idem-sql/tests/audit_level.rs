//! What a first request writes to the audit table at each audit level, counted in the table
//! itself: at the default nothing (the row tells the claim and its completion), at `all`
//! one row for each. A late holder completing its unknown row is recorded at both.

mod common;

use std::time::Duration;

use common::{MySqlHarness, PgHarness, SqliteHarness};
use idem_core::audit::{AuditKind, AuditLevel};
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, OwnerId, SettleOutcome, Store, StoredResponse, TakeoverPolicy,
};

fn req(key: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        request_id: Some("req-1".into()),
        ..common::claim_req(
            "audit-level",
            key,
            lease,
            Duration::from_secs(60),
            TakeoverPolicy::Hold,
        )
    }
}

/// Claims `key` with `lease`, runs `between`, then completes it as the claim's holder.
async fn claim_then_complete<S: Store>(
    store: &S,
    key: &str,
    lease: Duration,
    between: impl AsyncFn(&ClaimRequest),
) {
    let r = req(key, lease);
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&r).await.expect("claim") else {
        panic!("{key} not claimed");
    };
    between(&r).await;
    let done = store
        .complete(&Completion::new(
            Hold::of(&r.key, &lease),
            &StoredResponse::new(200, "ok"),
            r.ttl,
        ))
        .await
        .expect("complete");
    assert_eq!(done, SettleOutcome::Settled);
}

/// The event codes the audit table holds for `key`, oldest first, read with `codes`.
async fn trail(codes: &impl AsyncFn(&str) -> Vec<i16>, table: &str, key: &str) -> Vec<i16> {
    codes(&format!(
        "SELECT event FROM {table}_audit WHERE idem_key = '{key}' ORDER BY seq"
    ))
    .await
}

/// A first request at each level, and a holder that completes after a claim under `hold`
/// marked its expired lease unknown.
async fn check<S: Store + Clone>(
    store: &S,
    at_all: &S,
    table: &str,
    codes: impl AsyncFn(&str) -> Vec<i16>,
) {
    let (claimed, completed, unknown) = (
        i16::from(AuditKind::Claimed.code()),
        i16::from(AuditKind::Completed.code()),
        i16::from(AuditKind::Unknown.code()),
    );
    let long = Duration::from_secs(10);
    claim_then_complete(store, "plain", long, async |_| {}).await;
    assert_eq!(
        trail(&codes, table, "plain").await,
        Vec::<i16>::new(),
        "audit rows after a first request"
    );
    claim_then_complete(at_all, "all", long, async |_| {}).await;
    assert_eq!(trail(&codes, table, "all").await, [claimed, completed]);

    for (s, key) in [(store, "late"), (at_all, "late-all")] {
        let short = Duration::from_millis(200);
        claim_then_complete(s, key, short, async |r| {
            idem_testkit::sleep_for(short * 2).await;
            let retry = ClaimRequest {
                owner: OwnerId::random(),
                ..r.clone()
            };
            let marked = s.claim(&retry).await.expect("claim");
            assert!(matches!(marked, ClaimOutcome::Unknown { .. }), "{marked:?}");
        })
        .await;
    }
    assert_eq!(
        trail(&codes, table, "late").await,
        [unknown, completed],
        "a late holder settling its unknown row is recorded"
    );
    assert_eq!(
        trail(&codes, table, "late-all").await,
        [claimed, unknown, completed]
    );
}

/// Runs [`check`] on `$store` and a copy of it at `all`, reading the trail of `$table` through
/// `$pool`. A macro because the dialects' pools are different types.
macro_rules! check_at_all {
    ($store:expr, $pool:expr, $table:expr) => {{
        let pool = $pool.clone();
        let codes = async |sql: &str| -> Vec<i16> {
            sqlx::query_scalar(sql)
                .fetch_all(&pool)
                .await
                .expect("trail")
        };
        let at_all = $store.clone().with_audit_level(AuditLevel::All);
        check(&$store, &at_all, $table, codes).await;
    }};
}

#[tokio::test]
async fn postgres_records_a_first_request_only_at_all() {
    let Some(h) = PgHarness::connect().await else {
        return;
    };
    check_at_all!(h.store, h.store.pool(), h.store.table().as_str());
}

#[tokio::test]
async fn mysql_records_a_first_request_only_at_all() {
    for then_read in [false, true] {
        let Some(h) = MySqlHarness::connect().await else {
            return;
        };
        let store = if then_read {
            h.store.clone().with_claim_then_read()
        } else {
            h.store.clone()
        };
        check_at_all!(store, h.store.pool(), h.store.table().as_str());
    }
}

#[tokio::test]
async fn sqlite_records_a_first_request_only_at_all() {
    let h = SqliteHarness::new().await;
    check_at_all!(h.store, h.store.writer(), h.store.table().as_str());
}
