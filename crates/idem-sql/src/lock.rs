//! [`PgLock`]: PostgreSQL advisory locks with fences, in session and transaction form.
//!
//! - **Session form** ([`PgLock::try_acquire`], [`PgLock::run`]): `pg_try_advisory_lock` on a
//!   connection taken from the pool and kept for the hold; the lock lasts as long as that
//!   session, so there is no lease to renew. [`PgLock::run`]'s watchdog instead confirms the
//!   session every `check_every` (`SELECT 1`, bounded by the operation timeout); the moment a
//!   check fails (connection lost, backend terminated: the server has then dropped the lock)
//!   the work is dropped and the call returns [`LockError::Lost`].
//! - **Transaction form** ([`PgLock::try_acquire_xact`]): `pg_try_advisory_xact_lock` on the
//!   caller's transaction, released by its commit or rollback.
//! - **Fences** come from one sequence (`<name>_fence`, created by [`PgLock::migrate`]),
//!   taken only when the lock was granted: strictly increasing for every lock, durable across
//!   restarts (a sequence may skip values after a crash, never repeat one).
//! - Lock names map to the 64-bit key `hashtextextended(name, 0)`; two names sharing a key
//!   only contend with each other, they never share a fence.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use idem_core::StoreError;
use idem_core::lock::check_lock_name;
pub use idem_core::lock::{LockError, LockLease};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Row};
use tokio::time::Instant;

use crate::table::TableName;

/// The sequence used when none is configured.
pub const DEFAULT_FENCE_SEQUENCE: &str = "idem_lock_fence";

/// Advisory locks on a PostgreSQL pool. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgLock {
    pool: PgPool,
    sequence: TableName,
    op_timeout: Duration,
    check_every: Duration,
}

impl fmt::Debug for PgLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLock")
            .field("sequence", &self.sequence.as_str())
            .field("op_timeout", &self.op_timeout)
            .field("check_every", &self.check_every)
            .finish()
    }
}

/// A held session lock: the session holding it and the fence. Release it with
/// [`PgLock::release`]; dropping it closes the session, which releases the lock.
pub struct PgHeld {
    conn: Option<PoolConnection<Postgres>>,
    key: i64,
    /// Strictly greater than every fence handed out earlier.
    pub fence: u64,
    /// The backend process holding the lock (`pg_backend_pid()`).
    pub backend_pid: i32,
}

impl fmt::Debug for PgHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgHeld")
            .field("fence", &self.fence)
            .field("backend_pid", &self.backend_pid)
            .finish()
    }
}

impl Drop for PgHeld {
    fn drop(&mut self) {
        // A session still holding the lock must not go back to the pool, where the next user
        // would inherit it: close it instead (the server then drops the lock).
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

fn db(e: sqlx::Error) -> StoreError {
    StoreError::unavailable(e)
}

async fn within<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, op).await {
        Ok(r) => r.map_err(db),
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}

fn fence_of(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::unavailable("negative fence"))
}

impl PgLock {
    /// Locks on `pool`, fences from [`DEFAULT_FENCE_SEQUENCE`], 1 s per operation, sessions
    /// confirmed every 500 ms during [`PgLock::run`].
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sequence: TableName::new(DEFAULT_FENCE_SEQUENCE).unwrap_or_default(),
            op_timeout: Duration::from_secs(1),
            check_every: Duration::from_millis(500),
        }
    }

    /// Bounds every statement by `limit`.
    #[must_use]
    pub fn op_timeout(mut self, limit: Duration) -> Self {
        self.op_timeout = limit.max(Duration::from_millis(1));
        self
    }

    /// How often [`PgLock::run`] confirms the holding session.
    #[must_use]
    pub fn check_every(mut self, every: Duration) -> Self {
        self.check_every = every.max(Duration::from_millis(1));
        self
    }

    /// Creates the fence sequence if missing.
    ///
    /// # Errors
    /// [`StoreError`] when the database refused.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One implicit transaction; the advisory lock serialises concurrent migrations, which
        // `IF NOT EXISTS` alone does not.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext('idem-sql:{0}')); \
             CREATE SEQUENCE IF NOT EXISTS {0}",
            self.sequence.as_str()
        );
        within(self.op_timeout, sqlx::raw_sql(&sql).execute(&self.pool))
            .await
            .map(drop)
    }

    /// The statement that takes the lock if free and, only then, a fence.
    fn take_sql(&self, xact: bool) -> String {
        let f = if xact {
            "pg_try_advisory_xact_lock"
        } else {
            "pg_try_advisory_lock"
        };
        format!(
            "SELECT k, CASE WHEN {f}(k) THEN nextval('{}') ELSE 0 END, pg_backend_pid() \
             FROM (SELECT hashtextextended($1, 0) AS k) s",
            self.sequence.as_str()
        )
    }

    /// Takes `name` on a session of its own, if it is free.
    ///
    /// # Errors
    /// [`LockError::Busy`] when another session holds it, [`LockError::BadName`], or
    /// [`LockError::Store`] when the database failed.
    pub async fn try_acquire(&self, name: &str) -> Result<PgHeld, LockError> {
        let name = check_lock_name(name)?;
        let mut conn = within(self.op_timeout, self.pool.acquire()).await?;
        let sql = self.take_sql(false);
        let row = within(
            self.op_timeout,
            sqlx::query(&sql).bind(name).fetch_one(&mut *conn),
        )
        .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                // The lock may have been taken before the timeout: close the session.
                drop(conn.detach());
                return Err(e.into());
            }
        };
        let key: i64 = row.try_get(0).map_err(db)?;
        let fence: i64 = row.try_get(1).map_err(db)?;
        if fence == 0 {
            return Err(LockError::Busy);
        }
        Ok(PgHeld {
            conn: Some(conn),
            key,
            fence: fence_of(fence)?,
            backend_pid: row.try_get(2).map_err(db)?,
        })
    }

    /// Takes `name`, retrying while it is busy, for at most `wait`.
    ///
    /// # Errors
    /// As [`PgLock::try_acquire`]; [`LockError::Busy`] when `wait` ran out.
    pub async fn acquire(&self, name: &str, wait: Duration) -> Result<PgHeld, LockError> {
        let give_up = Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        loop {
            match self.try_acquire(name).await {
                Err(LockError::Busy) if Instant::now() + pause < give_up => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Releases a session lock and returns its session to the pool; false when the session
    /// no longer held it.
    ///
    /// # Errors
    /// [`StoreError`] when the database failed; the session is then closed, which releases
    /// the lock.
    pub async fn release(&self, mut held: PgHeld) -> Result<bool, StoreError> {
        let Some(mut conn) = held.conn.take() else {
            return Ok(false);
        };
        let unlocked = within(
            self.op_timeout,
            sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
                .bind(held.key)
                .fetch_one(&mut *conn),
        )
        .await;
        match unlocked {
            Ok(true) => Ok(true),
            other => {
                drop(conn.detach());
                other
            }
        }
    }

    /// Takes `name` for the rest of the caller's transaction, if it is free; the fence, or
    /// `None` when another session holds it. Commit or rollback releases it.
    ///
    /// # Errors
    /// [`LockError::BadName`], or [`LockError::Store`] when the database failed.
    pub async fn try_acquire_xact(
        &self,
        tx: &mut PgConnection,
        name: &str,
    ) -> Result<Option<u64>, LockError> {
        let name = check_lock_name(name)?;
        let sql = self.take_sql(true);
        let row = within(self.op_timeout, sqlx::query(&sql).bind(name).fetch_one(tx)).await?;
        let fence: i64 = row.try_get(1).map_err(db)?;
        Ok(if fence == 0 {
            None
        } else {
            Some(fence_of(fence)?)
        })
    }

    /// Takes `name` (waiting up to `wait`), runs `work` while a watchdog confirms the holding
    /// session, and releases the lock when `work` ends.
    ///
    /// # Errors
    /// [`LockError::Busy`], [`LockError::BadName`] or [`LockError::Store`] before `work`
    /// starts; [`LockError::Lost`] when the session could not be confirmed and `work` was
    /// dropped.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` and closes the session, releasing the lock.
    pub async fn run<T, F, Fut>(&self, name: &str, wait: Duration, work: F) -> Result<T, LockError>
    where
        F: FnOnce(LockLease) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut held = self.acquire(name, wait).await?;
        let (lease, lost) = LockLease::new(held.fence);
        let work = work(lease);
        let Some(mut conn) = held.conn.take() else {
            return Err(LockError::Lost);
        };
        let watchdog = async {
            loop {
                tokio::time::sleep(self.check_every).await;
                let alive = within(self.op_timeout, sqlx::query("SELECT 1").execute(&mut *conn))
                    .await
                    .is_ok();
                if !alive {
                    lost.raise();
                    tracing::warn!(
                        fence = held.fence,
                        "advisory lock session lost; work cancelled"
                    );
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            biased;
            () = watchdog => None,
            out = work => Some(out),
        };
        match outcome {
            Some(out) => {
                held.conn = Some(conn);
                // A failed release closes the session, which releases the lock.
                let _ = self.release(held).await;
                Ok(out)
            }
            None => {
                drop(conn.detach());
                Err(LockError::Lost)
            }
        }
    }
}
