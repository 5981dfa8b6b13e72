//! Same-database mode: the claim, the business write and the completion commit in one
//! transaction; a rollback leaves neither a record nor a business row.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, OwnerId, Store, StoredResponse, TakeoverPolicy,
};
use idem_sql::{InTxError, TxOutcome};

fn req(ns: &str, key: &str) -> ClaimRequest {
    ClaimRequest {
        fingerprint: Fingerprint::of_bytes(1, b"pay 100"),
        ..common::claim_req(
            ns,
            key,
            Duration::from_secs(30),
            Duration::from_secs(3600),
            TakeoverPolicy::Reexecute,
        )
    }
}

fn fresh(r: &ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        owner: OwnerId::random(),
        ..r.clone()
    }
}

#[derive(Debug)]
struct Boom;

/// Asserts that of eight concurrent runs one executed and seven replayed.
fn assert_one_executed_seven_replayed<E: std::fmt::Debug>(results: &[Result<TxOutcome<()>, E>]) {
    let executed = results
        .iter()
        .filter(|r| matches!(r, Ok(TxOutcome::Executed(()))))
        .count();
    let replayed = results
        .iter()
        .filter(|r| matches!(r, Ok(TxOutcome::Replayed(_))))
        .count();
    assert_eq!((executed, replayed), (1, 7), "{results:?}");
}

mod postgres {
    use super::*;

    async fn setup() -> Option<(common::PgHarness, String)> {
        let h = common::PgHarness::connect().await?;
        let payments = format!("{}_payments", h.store.table());
        sqlx::raw_sql(&format!(
            "CREATE TABLE {payments} (key text PRIMARY KEY, amount bigint NOT NULL)"
        ))
        .execute(h.store.pool())
        .await
        .expect("schema");
        Some((h, payments))
    }

    async fn rows(h: &common::PgHarness, payments: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {payments}"))
            .fetch_one(h.store.pool())
            .await
            .expect("count")
    }

    async fn teardown(h: &common::PgHarness, payments: &str) {
        sqlx::raw_sql(&format!("DROP TABLE {payments}"))
            .execute(h.store.pool())
            .await
            .expect("drop");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rollback_after_claim_leaves_no_record_and_no_row() {
        let Some((h, payments)) = setup().await else {
            return;
        };
        let r = req("same-db.pg", "k1");

        // Explicit rollback after claim + business write.
        let mut tx = h.store.pool().begin().await.expect("begin");
        assert!(matches!(
            h.store.claim_in(&mut tx, &r).await.expect("claim"),
            ClaimOutcome::Claimed { .. }
        ));
        sqlx::query(&format!("INSERT INTO {payments} VALUES ($1, 100)"))
            .bind("k1")
            .execute(&mut *tx)
            .await
            .expect("write");
        tx.rollback().await.expect("rollback");
        assert_eq!(h.store.get(&r.key).await.expect("get"), None);
        assert_eq!(rows(&h, &payments).await, 0);

        // Work that fails: the helper rolls back.
        let p = payments.clone();
        let failed = h
            .store
            .run_in_tx(&fresh(&r), move |tx| {
                async move {
                    sqlx::query(&format!("INSERT INTO {p} VALUES ('k1', 100)"))
                        .execute(&mut *tx)
                        .await
                        .map_err(|_| Boom)?;
                    Err::<((), StoredResponse), _>(Boom)
                }
                .boxed()
            })
            .await;
        assert!(matches!(failed, Err(InTxError::Work(Boom))));
        assert_eq!(h.store.get(&r.key).await.expect("get"), None);
        assert_eq!(rows(&h, &payments).await, 0);
        teardown(&h, &payments).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_runs_execute_once_and_replay() {
        let Some((h, payments)) = setup().await else {
            return;
        };
        let h = Arc::new(h);
        let r = req("same-db.pg", "k2");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (h, r, p) = (h.clone(), fresh(&r), payments.clone());
                tokio::spawn(async move {
                    h.store
                        .run_in_tx(&r, move |tx| {
                            async move {
                                sqlx::query(&format!("INSERT INTO {p} VALUES ('k2', 100)"))
                                    .execute(&mut *tx)
                                    .await?;
                                Ok::<_, sqlx::Error>(((), StoredResponse::new(201, "paid")))
                            }
                            .boxed()
                        })
                        .await
                        .expect("run")
                })
            })
            .collect();
        let mut executed = 0;
        for t in tasks {
            match t.await.expect("task") {
                TxOutcome::Executed(()) => executed += 1,
                TxOutcome::Replayed(resp) => assert_eq!(resp.body, "paid"),
                other => panic!("concurrent same-db runs wait and replay, got {other:?}"),
            }
        }
        assert_eq!(executed, 1);
        assert_eq!(rows(&h, &payments).await, 1);
        teardown(&h, &payments).await;
    }
}

/// On harness `$h`, whose store reaches its database through the pool its `$pool` method gives
/// and opens a transaction with `$begin`, and with the business table `$payments` created: a
/// claim and a business write rolled back leave neither a record nor a row, then eight
/// concurrent runs execute once and replay seven times. A macro because the dialects' pools and
/// transactions are different types.
macro_rules! rollback_then_concurrent_runs {
    ($h:expr, $pool:ident, $begin:expr, $payments:expr, $ns:literal) => {{
        let (h, payments) = (&$h, $payments);
        let count = || async {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {payments}"))
                .fetch_one(h.store.$pool())
                .await
                .expect("count")
        };
        let r = req($ns, "k");
        let mut tx = $begin.await.expect("begin");
        assert!(matches!(
            h.store.claim_in(&mut tx, &r).await.expect("claim"),
            ClaimOutcome::Claimed { .. }
        ));
        sqlx::query(&format!("INSERT INTO {payments} VALUES ('k', 1)"))
            .execute(&mut *tx)
            .await
            .expect("write");
        tx.rollback().await.expect("rollback");
        assert_eq!(h.store.get(&r.key).await.expect("get"), None);
        assert_eq!(count().await, 0);

        let reqs: Vec<_> = (0..8).map(|_| fresh(&r)).collect();
        let results = futures::future::join_all(reqs.iter().map(|r| {
            let p = payments.to_owned();
            h.store.run_in_tx(r, move |tx| {
                async move {
                    sqlx::query(&format!("INSERT INTO {p} VALUES ('k', 1)"))
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, sqlx::Error>(((), StoredResponse::new(200, "ok")))
                }
                .boxed()
            })
        }))
        .await;
        assert_one_executed_seven_replayed(&results);
        assert_eq!(count().await, 1);
    }};
}

mod sqlite {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rollback_leaves_nothing_and_concurrent_runs_execute_once() {
        let h = common::SqliteHarness::new().await;
        sqlx::raw_sql("CREATE TABLE payments (key TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(h.store.writer())
            .await
            .expect("schema");
        rollback_then_concurrent_runs!(
            h,
            writer,
            h.store.writer().begin_with("BEGIN IMMEDIATE"),
            "payments",
            "same-db.sqlite"
        );
    }
}

mod mysql {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rollback_leaves_nothing_and_concurrent_runs_execute_once() {
        let Some(h) = common::MySqlHarness::connect().await else {
            return;
        };
        same_db(h).await;
    }

    /// The same on the claim MySQL 8 takes (upsert, then a locking read, in the caller's
    /// transaction).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_portable_claim_keeps_same_database_mode() {
        let Some(h) = common::MySqlHarness::connect_then_read().await else {
            return;
        };
        same_db(h).await;
    }

    async fn same_db(h: common::MySqlHarness) {
        let payments = format!("{}_payments", h.store.table());
        sqlx::raw_sql(&format!("CREATE TABLE {payments} (k VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL) ENGINE = InnoDB"))
            .execute(h.store.pool())
            .await
            .expect("schema");
        rollback_then_concurrent_runs!(
            h,
            pool,
            h.store.pool().begin(),
            payments.as_str(),
            "same-db.mysql"
        );
        sqlx::raw_sql(&format!("DROP TABLE {payments}"))
            .execute(h.store.pool())
            .await
            .expect("drop");
    }
}
