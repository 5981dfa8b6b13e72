//! [`MySqlStore`]: records in a MySQL 8 / MariaDB 10.5+ table.
//!
//! Every operation is one statement judged on the server clock (`UTC_TIMESTAMP(6)`, fixed
//! for the statement and independent of the session time zone):
//!
//! - **claim** is one `INSERT … ON DUPLICATE KEY UPDATE … RETURNING` (MariaDB returns the row
//!   as it stands after the statement, written or not). The first assignment computes a
//!   `verdict` from the existing row — keep (0), fresh claim of an absent or expired record (1),
//!   takeover (2), or hold → unknown (3) — and every later assignment reads that freshly
//!   assigned `verdict`, which relies on MySQL's left-to-right evaluation of assignments. The
//!   store's own pool strips MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode, which would break that;
//!   callers of [`MySqlStore::claim_in`] on their own connections must not enable it. A
//!   replay therefore takes the row lock briefly, unlike PostgreSQL and SQLite.
//!   `RETURNING` on `INSERT` is MariaDB syntax (10.5+); MySQL 8 is not supported by this
//!   statement.
//! - **renew** is one guarded `UPDATE` that hands the new deadline back through
//!   `LAST_INSERT_ID(expr)` (no `UPDATE … RETURNING` before MariaDB 11);
//!   **complete / release / delete** are one guarded `UPDATE` each; **resolve** is a guarded
//!   `UPDATE`, then a read to say why it did not apply.
//!
//! The pool's sessions run at `READ COMMITTED`, so the reaper's batched deletes take no gap
//! locks. A claim that loses an InnoDB deadlock (SQLSTATE 40001) is run again.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, OwnerId, Record, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError, StoredResponse,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Executor as _, MySqlConnection, MySqlPool, Row};

use crate::common::{
    self, COLUMN_COUNT, COLUMNS, MAX_RACES, RawRecord, TableName, TableNameError, claim_outcome,
    fence_param, ms, raw_record, settled, state_code, too_many_races, ts, unresolved,
};

/// The server clock in microseconds, fixed for the statement.
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// Records in a MariaDB (or MySQL) table. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: TableName,
    sql: std::sync::Arc<Statements>,
}

struct Statements {
    claim: String,
    renew: String,
    complete: String,
    release_retryable: String,
    release_unknown: String,
    get: String,
    list: String,
    resolve_complete: String,
    resolve_release: String,
    resolve_probe: String,
    delete: String,
    reap: String,
}

/// Binds: id, namespace, principal, key, fingerprint, owner, lease ms, request id, lease ms,
/// ttl ms, hold.
const CLAIM: &str = r"
INSERT INTO {t} (id, namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until,
                 response, state_at, request_id, created_at, expires_at, verdict)
VALUES (?, ?, ?, ?, ?, {now_us}, 0, ?, {now} + ?, NULL, {now}, ?, {now}, {now} + GREATEST(?, ?), 1)
ON DUPLICATE KEY UPDATE
    verdict = CASE WHEN expires_at <= {now} THEN 1
                   WHEN fingerprint <> VALUES(fingerprint) OR state <> 0 OR lease_until > {now} THEN 0
                   WHEN ? THEN 3 ELSE 2 END,
    fence = IF(verdict IN (1, 2), GREATEST(fence + 1, VALUES(fence)), fence),
    state = CASE verdict WHEN 0 THEN state WHEN 3 THEN 2 ELSE 0 END,
    owner = CASE verdict WHEN 0 THEN owner WHEN 3 THEN NULL ELSE VALUES(owner) END,
    lease_until = CASE verdict WHEN 0 THEN lease_until WHEN 3 THEN 0 ELSE VALUES(lease_until) END,
    response = IF(verdict = 0, response, NULL),
    state_at = IF(verdict = 0, state_at, VALUES(state_at)),
    request_id = IF(verdict IN (1, 2), VALUES(request_id), request_id),
    created_at = IF(verdict = 1, VALUES(created_at), created_at),
    expires_at = IF(verdict IN (1, 2), VALUES(expires_at), expires_at),
    namespace = IF(verdict = 1, VALUES(namespace), namespace),
    principal = IF(verdict = 1, VALUES(principal), principal),
    idem_key = IF(verdict = 1, VALUES(idem_key), idem_key),
    fingerprint = IF(verdict = 1, VALUES(fingerprint), fingerprint)
RETURNING {cols}, {now} AS now_ms
";

/// A live record that is unknown, or processing under a lease that ran out.
const RESOLVABLE: &str =
    "id = ? AND expires_at > {now} AND (state = 2 OR (state = 0 AND lease_until <= {now}))";

const MIGRATIONS: &[&str] = &[r"
CREATE TABLE IF NOT EXISTS {t} (
    id          BINARY(32)    NOT NULL PRIMARY KEY,
    namespace   VARCHAR(255)  NOT NULL,
    principal   TEXT          NULL,
    idem_key    VARCHAR(255)  NOT NULL,
    fingerprint VARBINARY(34) NOT NULL,
    fence       BIGINT        NOT NULL,
    state       SMALLINT      NOT NULL,
    owner       BINARY(16)    NULL,
    lease_until BIGINT        NOT NULL,
    response    LONGBLOB      NULL,
    state_at    BIGINT        NOT NULL,
    request_id  TEXT          NULL,
    created_at  BIGINT        NOT NULL,
    expires_at  BIGINT        NOT NULL,
    verdict     SMALLINT      NOT NULL,
    KEY {t}_expires_idx (expires_at),
    KEY {t}_created_idx (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
"];

impl Statements {
    fn new(table: &TableName) -> Self {
        let now_ms = format!("({NOW_US} DIV 1000)");
        let t = |s: &str| {
            common::sql(
                &s.replace("{now_us}", NOW_US)
                    .replace("{now}", &now_ms)
                    .replace("{cols}", COLUMNS),
                table,
            )
        };
        let live_holder = "id = ? AND owner = ? AND fence = ? AND state = 0 AND expires_at > {now}";
        Self {
            claim: t(CLAIM),
            renew: t(&format!(
                "UPDATE {{t}} SET lease_until = LAST_INSERT_ID({{now}} + ?), expires_at = GREATEST(expires_at, {{now}} + ?) \
                 WHERE {live_holder}"
            )),
            complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = ?, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + ?, verdict = 0 WHERE {live_holder}"
            )),
            release_retryable: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {live_holder}"
            )),
            release_unknown: t(&format!(
                "UPDATE {{t}} SET state = 2, owner = NULL, lease_until = 0, state_at = {{now}}, verdict = 0 WHERE {live_holder}"
            )),
            get: t("SELECT {cols} FROM {t} WHERE id = ? AND expires_at > {now}"),
            list: t("SELECT {cols} FROM {t} WHERE expires_at > {now} \
                 AND (? IS NULL OR namespace = ?) AND (? IS NULL OR principal = ?) \
                 AND (? IS NULL OR state = ?) AND (? IS NULL OR created_at <= {now} - ?) \
                 ORDER BY created_at, id LIMIT ?"),
            resolve_complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = ?, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + ?, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_release: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_probe: t(
                "SELECT state, lease_until, expires_at, {now} AS now_ms FROM {t} WHERE id = ?",
            ),
            delete: t(
                "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 0 \
                 WHERE id = ? AND expires_at > {now}",
            ),
            reap: t("DELETE FROM {t} WHERE expires_at <= {now} ORDER BY expires_at LIMIT ?"),
        }
    }
}

impl MySqlStore {
    /// A store on `pool`, using the table [`crate::DEFAULT_TABLE`]. The pool's sessions must
    /// not use the `SIMULTANEOUS_ASSIGNMENT` SQL mode ([`MySqlStore::connect`] makes sure).
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_table_name(pool, TableName::default())
    }

    /// A store on `pool` using `table`.
    pub fn with_table_name(pool: MySqlPool, table: TableName) -> Self {
        let sql = std::sync::Arc::new(Statements::new(&table));
        Self { pool, table, sql }
    }

    /// A store on `pool` using the table named `table`.
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(pool: MySqlPool, table: &str) -> Result<Self, TableNameError> {
        Ok(Self::with_table_name(pool, TableName::new(table)?))
    }

    /// Connects a pool of up to `max_connections` to `url` (`mysql://…`); every session gets
    /// `READ COMMITTED` and left-to-right assignments.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL is malformed or the server is unreachable.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: MySqlConnectOptions = url.parse().map_err(StoreError::unavailable)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    conn.execute("SET SESSION sql_mode = REPLACE(@@SESSION.sql_mode, 'SIMULTANEOUS_ASSIGNMENT', '')").await?;
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::new(pool))
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Creates the table and its indexes if they do not exist (idempotent).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        for step in MIGRATIONS {
            sqlx::raw_sql(&common::sql(step, &self.table))
                .execute(&self.pool)
                .await
                .map_err(StoreError::unavailable)?;
        }
        Ok(())
    }

    /// Drops the table. For tests and teardown.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn drop_table(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(&common::sql("DROP TABLE IF EXISTS {t}", &self.table))
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(())
    }

    /// Deletes expired rows (tombstones included), `batch` at a time (`DELETE … ORDER BY
    /// expires_at LIMIT n`), until none is left. Returns how many rows were deleted.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database failed; rows deleted before stay deleted.
    pub async fn reap(&self, batch: u32) -> Result<u64, StoreError> {
        common::reap_in_batches(batch, |n| async move {
            let done = sqlx::query(&self.sql.reap)
                .bind(u64::from(n))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// Runs [`MySqlStore::reap`] every `every` on the current tokio runtime, until the handle is
    /// aborted. Failures are logged and retried on the next tick.
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> tokio::task::JoinHandle<()> {
        common::spawn_reaper(self, every, batch)
    }

    async fn claim_once(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, sqlx::Error> {
        let row = sqlx::query(&self.sql.claim)
            .bind(req.key.digest().to_vec())
            .bind(req.key.scope.namespace())
            .bind(req.key.scope.principal())
            .bind(req.key.key.as_str())
            .bind(req.fingerprint.to_bytes().to_vec())
            .bind(req.owner.to_bytes().to_vec())
            .bind(ms(req.lease))
            .bind(req.request_id.as_deref())
            .bind(ms(req.lease))
            .bind(ms(req.ttl))
            .bind(matches!(req.takeover, idem_core::TakeoverPolicy::Hold))
            .fetch_one(&mut *conn)
            .await?;
        let now: i64 = row.try_get(COLUMN_COUNT)?;
        let raw = raw_record!(&row, 0, bytes).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let wrote = raw.verdict != 0;
        claim_outcome(req, wrote, Some(raw), ts(now))
            .map_err(|e| sqlx::Error::Protocol(e.to_string()))
    }

    /// Claims a key on the caller's connection, typically inside the transaction that also
    /// carries the business writes (same-database mode). A rollback leaves no trace;
    /// concurrent claims of the key wait for the transaction to end.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed (a deadlock included: the transaction is then
    /// rolled back by the server).
    pub async fn claim_in(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..MAX_RACES {
            if let Some(outcome) = self
                .claim_once(conn, req)
                .await
                .map_err(StoreError::unavailable)?
            {
                return Ok(outcome);
            }
        }
        Err(too_many_races())
    }

    /// Completes a claim made with [`MySqlStore::claim_in`] on the same connection.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed.
    pub async fn complete_in(
        &self,
        conn: &mut MySqlConnection,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let done = sqlx::query(&self.sql.complete)
            .bind(response.encode())
            .bind(ms(ttl))
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .execute(&mut *conn)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(settled(done.rows_affected()))
    }

    /// Same-database mode in one call: begins a transaction, claims `req.key`, and when the
    /// claim is won runs `work` on the transaction; `work` returns its output and the response
    /// to store. The completion commits with `work`'s writes; when `work` fails, everything
    /// rolls back and leaves no record and no business row.
    ///
    /// # Errors
    /// [`crate::InTxError::Store`] when the database failed, [`crate::InTxError::Work`] with
    /// `work`'s error.
    pub async fn run_in_tx<T, E, F>(
        &self,
        req: &ClaimRequest,
        work: F,
    ) -> Result<crate::TxOutcome<T>, crate::InTxError<E>>
    where
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<(T, StoredResponse), E>>,
    {
        let tx = self
            .pool
            .begin()
            .await
            .map_err(|e| crate::InTxError::Store(StoreError::unavailable(e)))?;
        crate::claim_work_complete(self, tx, req, work).await
    }

    async fn settle(
        &self,
        sql: &str,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
    ) -> Result<SettleOutcome, StoreError> {
        let done = sqlx::query(sql)
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(settled(done.rows_affected()))
    }
}

/// The session that runs a statement lost an InnoDB deadlock; the statement was rolled back.
fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("40001"))
}

crate::in_tx_by_inherent_methods!(MySqlStore, MySqlConnection);

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Store for MySqlStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::unavailable)?;
        for _ in 0..MAX_RACES {
            match self.claim_once(&mut conn, req).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => {}
                // Autocommit: the deadlocked statement was rolled back whole; run it again.
                Err(e) if is_deadlock(&e) => {}
                Err(e) => return Err(StoreError::unavailable(e)),
            }
        }
        Err(too_many_races())
    }

    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let done = sqlx::query(&self.sql.renew)
            .bind(ms(lease))
            .bind(ms(lease))
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        // sqlx asks for found rows, so a renewal within the same millisecond still counts.
        if done.rows_affected() == 1 {
            let deadline = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
            Ok(RenewOutcome::Renewed {
                deadline: ts(deadline),
            })
        } else {
            Ok(RenewOutcome::Lost)
        }
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::unavailable)?;
        self.complete_in(&mut conn, key, owner, fence, response, ttl)
            .await
    }

    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let sql = match kind {
            ReleaseKind::Retryable => &self.sql.release_retryable,
            _ => &self.sql.release_unknown,
        };
        self.settle(sql, key, owner, fence).await
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(&self.sql.get)
            .bind(key.digest().to_vec())
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        row.map(|row| raw_record!(&row, 0, bytes).and_then(RawRecord::into_record))
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let ns = filter.namespace.as_deref();
        let principal = filter.principal.as_deref();
        let state = filter.state.map(state_code);
        let age = filter.older_than.map(ms);
        let rows = sqlx::query(&self.sql.list)
            .bind(ns)
            .bind(ns)
            .bind(principal)
            .bind(principal)
            .bind(state)
            .bind(state)
            .bind(age)
            .bind(age)
            .bind(u64::try_from(filter.effective_limit()).unwrap_or(100))
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        rows.iter()
            .map(|row| raw_record!(row, 0, bytes).and_then(RawRecord::into_record))
            .collect()
    }

    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        let id = key.digest().to_vec();
        for _ in 0..MAX_RACES {
            let query = match resolution {
                Resolution::Complete { response, ttl } => sqlx::query(&self.sql.resolve_complete)
                    .bind(response.encode())
                    .bind(ms(*ttl))
                    .bind(&id),
                _ => sqlx::query(&self.sql.resolve_release).bind(&id),
            };
            if query
                .execute(&self.pool)
                .await
                .map_err(StoreError::unavailable)?
                .rows_affected()
                == 1
            {
                return Ok(ResolveOutcome::Resolved);
            }
            let row = sqlx::query(&self.sql.resolve_probe)
                .bind(&id)
                .fetch_optional(&self.pool)
                .await
                .map_err(StoreError::unavailable)?;
            let (now, state) = match row {
                Some(row) => {
                    let get = |c: &str| row.try_get::<i64, _>(c).map_err(StoreError::unavailable);
                    let state: i16 = row.try_get("state").map_err(StoreError::unavailable)?;
                    (
                        get("now_ms")?,
                        Some((state, get("lease_until")?, get("expires_at")?)),
                    )
                }
                None => (0, None),
            };
            if let Some(outcome) = unresolved(ts(now), state) {
                return Ok(outcome);
            }
        }
        Err(too_many_races())
    }

    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql.delete)
            .bind(key.digest().to_vec())
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(done.rows_affected() == 1)
    }
}
