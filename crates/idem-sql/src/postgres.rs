//! [`PgStore`]: records in a PostgreSQL table.
//!
//! Every operation is one statement judged on `statement_timestamp()`:
//!
//! - **claim** is one `WITH … INSERT … ON CONFLICT (id) DO UPDATE … WHERE … RETURNING`. Its
//!   first CTE reads the row; when the read already decides the answer without a write
//!   (replay, busy, unknown, mismatch) the insert gets no input row, so a replay takes no row
//!   lock. Otherwise the upsert's `WHERE` re-checks the *latest* row version (fresh claim on an
//!   absent or expired record, takeover, or hold → unknown), and the statement returns either
//!   the written row or the row it read. In the rare case where the read saw a claimable record
//!   but a concurrent claim won the upsert, the statement is run again (bounded).
//! - **renew / complete / release / delete** are one guarded `UPDATE` each.
//! - **resolve** is a guarded `UPDATE`, then a read to say why it did not apply.
//!
//! Use `READ COMMITTED` (PostgreSQL's default) for same-database mode: under `REPEATABLE
//! READ` a concurrent claim of the same key makes the upsert fail with a serialization error.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, OwnerId, Record, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError, StoredResponse,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Row};

use crate::common::{
    self, COLUMNS, MAX_RACES, RawRecord, TableName, TableNameError, claim_outcome, fence_param, ms,
    raw_record, settled, shared_queries, state_code, too_many_races, ts, unresolved,
};

/// The database clock in milliseconds, fixed for the statement.
const NOW_MS: &str = "((extract(epoch FROM statement_timestamp()) * 1000)::bigint)";

/// Records in a PostgreSQL table. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
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

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = |s: &str| {
            common::sql(
                &s.replace("{now}", NOW_MS).replace("{cols}", COLUMNS),
                table,
            )
        };
        let live_holder =
            "id = $1 AND owner = $2 AND fence = $3 AND state = 0 AND expires_at > {now}";
        Self {
            claim: t(CLAIM),
            renew: t(&format!(
                "UPDATE {{t}} SET lease_until = {{now}} + $4, expires_at = GREATEST(expires_at, {{now}} + $4) \
                 WHERE {live_holder} RETURNING lease_until"
            )),
            complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = $4, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + $5, verdict = 0 WHERE {live_holder}"
            )),
            release_retryable: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {live_holder}"
            )),
            release_unknown: t(&format!(
                "UPDATE {{t}} SET state = 2, owner = NULL, lease_until = 0, state_at = {{now}}, verdict = 0 WHERE {live_holder}"
            )),
            get: t("SELECT {cols} FROM {t} WHERE id = $1 AND expires_at > {now}"),
            list: t("SELECT {cols} FROM {t} WHERE expires_at > {now} \
                 AND ($1::text IS NULL OR namespace = $1) AND ($2::text IS NULL OR principal = $2) \
                 AND ($3::smallint IS NULL OR state = $3) AND ($4::bigint IS NULL OR created_at <= {now} - $4) \
                 ORDER BY created_at, id LIMIT $5"),
            resolve_complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = $2, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + $3, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_release: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_probe: t(
                "SELECT state, lease_until, expires_at, {now} AS now_ms FROM {t} WHERE id = $1",
            ),
            delete: t(
                "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 0 \
                 WHERE id = $1 AND expires_at > {now}",
            ),
            reap: t(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE expires_at <= {now} \
                 ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) AND expires_at <= {now}",
            ),
        }
    }
}

/// A live record that is unknown, or processing under a lease that ran out.
const RESOLVABLE: &str =
    "id = $1 AND expires_at > {now} AND (state = 2 OR (state = 0 AND lease_until <= {now}))";

/// Parameters: $1 id, $2 namespace, $3 principal, $4 key, $5 fingerprint, $6 owner,
/// $7 lease ms, $8 ttl ms, $9 hold, $10 request id.
///
/// `cur` reads the row; `ins` gets an input row only when that read does not already decide a
/// read-only answer, and its `WHERE` re-checks the latest row version. Inside `DO UPDATE`,
/// `EXCLUDED.state_at` is "now" and `r` is the existing row.
const CLAIM: &str = r"
WITH clk AS (
    SELECT us, us / 1000 AS ms FROM (SELECT (extract(epoch FROM statement_timestamp()) * 1000000)::bigint AS us) c
), cur AS (
    SELECT {cols} FROM {t} WHERE id = $1
), ins AS (
    INSERT INTO {t} AS r (id, namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until,
                          response, state_at, request_id, created_at, expires_at, verdict)
    SELECT $1, $2, $3, $4, $5, clk.us, 0, $6, clk.ms + $7, NULL, clk.ms, $10, clk.ms, clk.ms + GREATEST($7, $8), 1
    FROM clk
    WHERE NOT EXISTS (
        SELECT 1 FROM cur WHERE cur.expires_at > clk.ms
           AND (cur.fingerprint <> $5 OR cur.state <> 0 OR cur.lease_until > clk.ms))
    ON CONFLICT (id) DO UPDATE SET
        verdict = CASE WHEN r.expires_at <= EXCLUDED.state_at THEN 1 WHEN $9 THEN 3 ELSE 2 END,
        namespace = EXCLUDED.namespace,
        principal = EXCLUDED.principal,
        idem_key = EXCLUDED.idem_key,
        fingerprint = EXCLUDED.fingerprint,
        fence = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN r.fence
                     ELSE GREATEST(r.fence + 1, EXCLUDED.fence) END,
        state = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN 2 ELSE 0 END,
        owner = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN NULL ELSE EXCLUDED.owner END,
        lease_until = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN 0 ELSE EXCLUDED.lease_until END,
        response = NULL,
        state_at = EXCLUDED.state_at,
        request_id = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN r.request_id ELSE EXCLUDED.request_id END,
        created_at = CASE WHEN r.expires_at > EXCLUDED.state_at THEN r.created_at ELSE EXCLUDED.created_at END,
        expires_at = CASE WHEN r.expires_at > EXCLUDED.state_at AND $9 THEN r.expires_at ELSE EXCLUDED.expires_at END
    WHERE r.expires_at <= EXCLUDED.state_at
       OR (r.fingerprint = EXCLUDED.fingerprint AND r.state = 0 AND r.lease_until <= EXCLUDED.state_at)
    RETURNING {cols}
)
SELECT true AS wrote, clk.ms AS now_ms, ins.* FROM ins, clk
UNION ALL
SELECT false, clk.ms, cur.* FROM cur, clk WHERE NOT EXISTS (SELECT 1 FROM ins)
";

const MIGRATIONS: &[&str] = &[r"
CREATE TABLE IF NOT EXISTS {t} (
    id          bytea    PRIMARY KEY,
    namespace   text     NOT NULL,
    principal   text,
    idem_key    text     NOT NULL,
    fingerprint bytea    NOT NULL,
    fence       bigint   NOT NULL,
    state       smallint NOT NULL,
    owner       bytea,
    lease_until bigint   NOT NULL,
    response    bytea,
    state_at    bigint   NOT NULL,
    request_id  text,
    created_at  bigint   NOT NULL,
    expires_at  bigint   NOT NULL,
    verdict     smallint NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_expires_idx ON {t} (expires_at);
CREATE INDEX IF NOT EXISTS {t}_created_idx ON {t} (created_at);
"];

impl PgStore {
    /// A store on `pool`, using the table [`crate::DEFAULT_TABLE`].
    pub fn new(pool: PgPool) -> Self {
        Self::with_table_name(pool, TableName::default())
    }

    /// A store on `pool` using `table`.
    pub fn with_table_name(pool: PgPool, table: TableName) -> Self {
        let sql = std::sync::Arc::new(Statements::new(&table));
        Self { pool, table, sql }
    }

    /// A store on `pool` using the table named `table`.
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(pool: PgPool, table: &str) -> Result<Self, TableNameError> {
        Ok(Self::with_table_name(pool, TableName::new(table)?))
    }

    /// Connects a pool of up to `max_connections` to `url` (`postgres://…`).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL is malformed or the server is unreachable.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(StoreError::unavailable)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::new(pool))
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Creates the table and its indexes if they do not exist (idempotent; concurrent callers
    /// are serialised by an advisory lock).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::unavailable)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idem-sql:{}", self.table))
            .execute(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        for step in MIGRATIONS {
            sqlx::raw_sql(&common::sql(step, &self.table))
                .execute(&mut *tx)
                .await
                .map_err(StoreError::unavailable)?;
        }
        tx.commit().await.map_err(StoreError::unavailable)
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

    /// Deletes expired rows (tombstones included), `batch` at a time, until none is left.
    /// Each batch is its own short statement and skips rows another statement holds.
    /// Returns how many rows were deleted.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database failed; rows deleted before stay deleted.
    pub async fn reap(&self, batch: u32) -> Result<u64, StoreError> {
        common::reap_in_batches(batch, |n| async move {
            let done = sqlx::query(&self.sql.reap)
                .bind(i64::from(n))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// Runs [`PgStore::reap`] every `every` on the current tokio runtime, until the handle is
    /// aborted. Failures are logged and retried on the next tick.
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> tokio::task::JoinHandle<()> {
        common::spawn_reaper(self, every, batch)
    }

    /// Claims a key on the caller's connection, typically inside the transaction that also
    /// carries the business writes (same-database mode). Commit makes the claim, the writes
    /// and the [`PgStore::complete_in`] durable together; a rollback leaves no trace.
    /// Concurrent claims of the same key wait for that transaction to end.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed; the transaction is then unusable.
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..MAX_RACES {
            let row = sqlx::query(&self.sql.claim)
                .bind(req.key.digest().to_vec())
                .bind(req.key.scope.namespace())
                .bind(req.key.scope.principal())
                .bind(req.key.key.as_str())
                .bind(req.fingerprint.to_bytes().to_vec())
                .bind(req.owner.to_bytes().to_vec())
                .bind(ms(req.lease))
                .bind(ms(req.ttl))
                .bind(matches!(req.takeover, idem_core::TakeoverPolicy::Hold))
                .bind(req.request_id.as_deref())
                .fetch_optional(&mut *conn)
                .await
                .map_err(StoreError::unavailable)?;
            let (wrote, now, raw) = match row {
                Some(row) => {
                    let wrote: bool = row.try_get(0).map_err(StoreError::unavailable)?;
                    let now: i64 = row.try_get(1).map_err(StoreError::unavailable)?;
                    (wrote, now, Some(raw_record!(&row, 2)?))
                }
                None => (false, 0, None),
            };
            // With no row at all the statement read nothing and wrote nothing: a concurrent
            // claim holds the key's insert; run again to see it.
            if raw.is_none() {
                continue;
            }
            if let Some(outcome) = claim_outcome(req, wrote, raw, ts(now))? {
                return Ok(outcome);
            }
        }
        Err(too_many_races())
    }

    /// Completes a claim made with [`PgStore::claim_in`] on the same connection.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed.
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let done = sqlx::query(&self.sql.complete)
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .bind(response.encode())
            .bind(ms(ttl))
            .execute(&mut *conn)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(settled(done.rows_affected()))
    }

    /// Same-database mode in one call: begins a transaction, claims `req.key`, and when the
    /// claim is won runs `work` on the transaction; `work` returns its output and the response
    /// to store. The completion commits with `work`'s writes. When `work` fails, the
    /// transaction rolls back and leaves no record and no business row.
    ///
    /// # Errors
    /// [`InTxError::Store`] when the database failed, [`InTxError::Work`] with `work`'s error.
    pub async fn run_in_tx<T, E, F>(
        &self,
        req: &ClaimRequest,
        work: F,
    ) -> Result<crate::TxOutcome<T>, crate::InTxError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<(T, StoredResponse), E>>,
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

crate::in_tx_by_inherent_methods!(PgStore, PgConnection);

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Store for PgStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::unavailable)?;
        self.claim_in(&mut conn, req).await
    }

    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let row = sqlx::query(&self.sql.renew)
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .bind(ms(lease))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        match row {
            Some(row) => {
                let deadline: i64 = row.try_get(0).map_err(StoreError::unavailable)?;
                Ok(RenewOutcome::Renewed {
                    deadline: ts(deadline),
                })
            }
            None => Ok(RenewOutcome::Lost),
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

    shared_queries!(reader: pool, writer: pool);
}
