//! A PostgreSQL connection killed (`pg_terminate_backend`) in the middle of an operation gives
//! a clean `StoreError` and leaves no half-written record.

mod common;

use std::time::Duration;

use idem_core::store::Completion;
use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, ClaimRequest, OwnerId, ReleaseKind, SettleOutcome, Store, StoreError,
    StoredResponse, TakeoverPolicy,
};
use sqlx::{Connection, PgConnection};

fn req(key: &str) -> ClaimRequest {
    common::claim_req(
        "fault.pg",
        key,
        Duration::from_secs(30),
        Duration::from_secs(3600),
        TakeoverPolicy::Reexecute,
    )
}

/// Waits until a backend is blocked on a lock while running a statement on `table`, and
/// returns its pid. Polls `pg_stat_activity`: another server process's lock wait cannot be
/// awaited.
async fn blocked_backend(admin: &mut PgConnection, table: &str) -> i32 {
    for _ in 0..500 {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' LIMIT 1",
        )
        .bind(table)
        .fetch_optional(&mut *admin)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = pid {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the claim never blocked on the row lock");
}

/// A connection of its own to the test database (`why` names it).
async fn connect(why: &str) -> PgConnection {
    PgConnection::connect(&common::pg_url()).await.expect(why)
}

/// A connection to be killed, and its backend's pid.
async fn victim() -> (PgConnection, i32) {
    let mut conn = connect("conn").await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("pid");
    (conn, pid)
}

async fn terminate(admin: &mut PgConnection, pid: i32) {
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut *admin)
        .await
        .expect("terminate");
    assert!(killed, "pg_terminate_backend({pid}) failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_during_claim_is_a_store_error_and_writes_nothing() {
    let Some(h) = common::PgHarness::connect().await else {
        return;
    };
    let table = h.store.table().to_string();
    let mut admin = connect("admin").await;
    let mut locker = connect("locker").await;

    // A released record: a tombstone row the next claim must take with an upsert.
    let r = req("k");
    let ClaimOutcome::Claimed { lease: first, .. } = h.store.claim(&r).await.expect("claim") else {
        panic!("claim")
    };
    assert_eq!(
        h.store
            .release(
                &Hold::new(&r.key, r.owner, first.fence),
                ReleaseKind::Retryable
            )
            .await
            .expect("release"),
        SettleOutcome::Settled
    );

    // Another transaction holds the row, so the claim's upsert waits on it mid-statement.
    let mut tx = locker.begin().await.expect("begin");
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = $1 FOR UPDATE"))
        .bind(r.key.digest().to_vec())
        .execute(&mut *tx)
        .await
        .expect("lock");
    let store = h.store.clone();
    let second = ClaimRequest {
        owner: OwnerId::random(),
        ..r.clone()
    };
    let claim = tokio::spawn(async move { store.claim(&second).await });
    let pid = blocked_backend(&mut admin, &table).await;
    terminate(&mut admin, pid).await;
    let result = claim.await.expect("task");
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "a killed connection is a clean StoreError: {result:?}"
    );
    tx.commit().await.expect("unlock");

    // Nothing half-written: the key is still free, and the next claim gets a higher fence.
    assert_eq!(h.store.get(&r.key).await.expect("get"), None);
    let third = ClaimRequest {
        owner: OwnerId::random(),
        ..r.clone()
    };
    match h.store.claim(&third).await.expect("claim after the fault") {
        ClaimOutcome::Claimed {
            lease,
            takeover: false,
        } => assert!(lease.fence > first.fence),
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_inside_same_db_transaction_leaves_no_record_and_no_row() {
    let Some(h) = common::PgHarness::connect().await else {
        return;
    };
    let payments = format!("{}_payments", h.store.table());
    sqlx::raw_sql(&format!("CREATE TABLE {payments} (key text PRIMARY KEY)"))
        .execute(h.store.pool())
        .await
        .expect("schema");
    let mut admin = connect("admin").await;

    let r = req("tx");
    let (mut conn, pid) = victim().await;
    let mut tx = conn.begin().await.expect("begin");
    let ClaimOutcome::Claimed { lease, .. } = h.store.claim_in(&mut tx, &r).await.expect("claim")
    else {
        panic!("claim")
    };
    sqlx::query(&format!("INSERT INTO {payments} VALUES ('tx')"))
        .execute(&mut *tx)
        .await
        .expect("write");
    terminate(&mut admin, pid).await;
    let completed = h
        .store
        .complete_in(
            &mut tx,
            &Completion::new(
                Hold::of(&r.key, &lease),
                &StoredResponse::new(200, "ok"),
                r.ttl,
            ),
        )
        .await;
    assert!(
        matches!(completed, Err(StoreError::Unavailable(_))),
        "{completed:?}"
    );
    drop(tx);

    assert_eq!(
        h.store.get(&r.key).await.expect("get"),
        None,
        "no record survives the killed transaction"
    );
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {payments}"))
        .fetch_one(h.store.pool())
        .await
        .expect("count");
    assert_eq!(rows, 0, "no business row survives the killed transaction");
    sqlx::raw_sql(&format!("DROP TABLE {payments}"))
        .execute(h.store.pool())
        .await
        .expect("drop");
}

/// The unguarded variant: a claim written in two autocommit steps (create the row, then
/// stamp owner and lease). Killed between the steps, it leaves a processing row with no
/// owner, which the store then refuses to read. This is what the one-statement claim above
/// cannot leave behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_step_claim_killed_between_steps_leaves_a_half_written_record() {
    let Some(h) = common::PgHarness::connect().await else {
        return;
    };
    let table = h.store.table().to_string();
    let mut admin = connect("admin").await;
    let r = req("two-step");
    let (mut conn, pid) = victim().await;
    // Step 1 of the unguarded claim.
    sqlx::query(&format!(
        "INSERT INTO {table} (id, namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until, response,
                              state_at, request_id, created_at, expires_at, verdict)
         VALUES ($1, $2, NULL, $3, $4, 1, 0, NULL, 0, NULL, 0, NULL, 0, 9223372036854775807, 1)"
    ))
    .bind(r.key.digest().to_vec())
    .bind(r.key.scope.namespace())
    .bind(r.key.key.as_str())
    .bind(r.fingerprint.to_bytes().to_vec())
    .execute(&mut conn)
    .await
    .expect("step 1");
    terminate(&mut admin, pid).await;
    // Step 2 never runs.
    let step2 = sqlx::query(&format!("UPDATE {table} SET owner = $2 WHERE id = $1"))
        .bind(r.key.digest().to_vec())
        .bind(r.owner.to_bytes().to_vec())
        .execute(&mut conn)
        .await;
    assert!(step2.is_err());
    let read = h.store.get(&r.key).await;
    assert!(
        matches!(read, Err(StoreError::Codec(_))),
        "the unguarded claim left a half-written record: {read:?}"
    );
}
