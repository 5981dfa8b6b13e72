//! PostgreSQL advisory locks against the shared server: exclusion and fences in both forms,
//! and a watchdog that cancels the work when the holding session is terminated.

mod common;

use std::time::Duration;

use idem_sql::PgLock;
use idem_sql::lock::LockError;
use sqlx::Connection as _;

async fn lock() -> Option<PgLock> {
    let pool = common::pg_pool(8).await?;
    let lock = PgLock::new(pool)
        .op_timeout(Duration::from_millis(500))
        .check_every(Duration::from_millis(100));
    lock.migrate().await.expect("migrate");
    Some(lock)
}

fn name(label: &str) -> String {
    format!("{label}-{:x}", idem_core::OwnerId::random().0)
}

#[tokio::test]
async fn session_lock_excludes_and_fences_grow() {
    let Some(lock) = lock().await else { return };
    let n = name("session");
    let mut last = 0;
    for _ in 0..3 {
        let held = lock.try_acquire(&n).await.expect("free");
        assert!(held.fence > last);
        last = held.fence;
        assert!(matches!(lock.try_acquire(&n).await, Err(LockError::Busy)));
        assert!(lock.release(held).await.expect("release"));
    }
    // A dropped holder closes its session: the lock is free again.
    let held = lock.try_acquire(&n).await.expect("free");
    drop(held);
    let again = lock
        .acquire(&n, Duration::from_secs(5))
        .await
        .expect("freed by the drop");
    assert!(again.fence > last);
    assert!(lock.release(again).await.expect("release"));
    assert!(matches!(
        lock.try_acquire("").await,
        Err(LockError::BadName)
    ));
}

#[tokio::test]
async fn transaction_lock_lasts_until_commit() {
    let Some(lock) = lock().await else { return };
    let n = name("xact");
    let mut conn = sqlx::PgConnection::connect(&common::pg_url())
        .await
        .expect("conn");
    let mut tx = conn.begin().await.expect("begin");
    let fence = lock
        .try_acquire_xact(&mut tx, &n)
        .await
        .expect("xact")
        .expect("free");
    assert!(matches!(lock.try_acquire(&n).await, Err(LockError::Busy)));
    tx.commit().await.expect("commit");
    let after = lock.try_acquire(&n).await.expect("released by the commit");
    assert!(after.fence > fence);
    let mut tx = conn.begin().await.expect("begin");
    assert_eq!(
        lock.try_acquire_xact(&mut tx, &n).await.expect("xact"),
        None
    );
    tx.rollback().await.expect("rollback");
    assert!(lock.release(after).await.expect("release"));
}

#[tokio::test]
async fn run_holds_and_releases() {
    let Some(lock) = lock().await else { return };
    let n = name("run");
    let probe = lock.clone();
    let fence = lock
        .run(&n, Duration::ZERO, |lease| {
            let n = n.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(matches!(probe.try_acquire(&n).await, Err(LockError::Busy)));
                lease.fence
            }
        })
        .await
        .expect("ran");
    let after = lock.try_acquire(&n).await.expect("released");
    assert!(after.fence > fence);
    assert!(lock.release(after).await.expect("release"));
}

/// The holding backend is terminated (the server drops the lock with it): the watchdog's next
/// check fails, the work is dropped and the call says the lock was lost.
#[tokio::test]
async fn terminated_session_cancels_the_work() {
    let Some(lock) = lock().await else { return };
    let n = name("killed");
    let admin = lock.clone();
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
    let (n2, l2) = (n.clone(), lock.clone());
    let run = tokio::spawn(async move {
        l2.run(&n2, Duration::ZERO, |_lease| async move {
            let _ = pid_tx.send(());
            std::future::pending::<()>().await;
        })
        .await
    });
    pid_rx.await.expect("work started");
    // Find the holder by its lock and terminate it.
    let mut c = sqlx::PgConnection::connect(&common::pg_url())
        .await
        .expect("conn");
    let terminated: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted \
           AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0) LIMIT 1",
    )
    .bind(&n)
    .fetch_one(&mut c)
    .await
    .expect("terminate");
    assert!(terminated);
    let result = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("run returned")
        .expect("task");
    assert!(matches!(result, Err(LockError::Lost)), "{result:?}");
    let free = admin
        .acquire(&n, Duration::from_secs(5))
        .await
        .expect("lock freed");
    assert!(admin.release(free).await.expect("release"));
}
