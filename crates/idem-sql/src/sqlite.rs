//! [`SqliteStore`]: records in a SQLite file, the gateway's embedded durable default.
//!
//! The file runs in WAL mode with a busy timeout. Writes go through a single-connection
//! writer pool, so the store's own writers queue in the pool instead of meeting
//! `SQLITE_BUSY`; reads (replays, status) use a separate pool of readers and never wait for
//! writers. Other processes sharing the file are handled by the busy timeout.
//!
//! - **claim** reads the row first: replays, busy, unknown and mismatch answers need no write
//!   and are linearised at that read. Otherwise one `INSERT … ON CONFLICT (id) DO UPDATE …
//!   WHERE … RETURNING` re-checks the latest row and claims (fresh, takeover, or hold →
//!   unknown); when a concurrent claim won in between it returns nothing and the claim reads
//!   again (bounded).
//! - **renew / complete / release / delete** are one guarded `UPDATE` each; **resolve** is a
//!   guarded `UPDATE`, then a read to say why it did not apply.
//!
//! The clock is `unixepoch('subsec')`, which SQLite keeps fixed within one statement.
//!
//! Same-database mode begins its transactions with `BEGIN IMMEDIATE`, taking the write lock
//! up front, so a transaction never fails half-way because another writer committed first.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures::future::BoxFuture;
use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, OwnerId, Record, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError, StoredResponse,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqliteConnection, SqlitePool};

use crate::common::{
    self, COLUMN_COUNT, COLUMNS, MAX_RACES, RawRecord, TableName, TableNameError, claim_outcome,
    fence_param, ms, raw_record, settled, shared_queries, state_code, too_many_races, ts,
    unresolved,
};

/// The default database file.
pub const DEFAULT_PATH: &str = "./idem.db";

/// The clock in milliseconds; SQLite fixes `'now'` for the duration of a statement.
const NOW_MS: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER))";

/// How long a connection waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Records in a SQLite file. Cheap to clone (the pools are shared).
#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    table: TableName,
    sql: std::sync::Arc<Statements>,
}

struct Statements {
    read: String,
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

/// A live record that is unknown, or processing under a lease that ran out.
const RESOLVABLE: &str =
    "id = ?1 AND expires_at > {now} AND (state = 2 OR (state = 0 AND lease_until <= {now}))";

/// Parameters: ?1 id, ?2 namespace, ?3 principal, ?4 key, ?5 fingerprint, ?6 owner,
/// ?7 lease ms, ?8 ttl ms, ?9 hold, ?10 request id. Inside `DO UPDATE`, `excluded.state_at` is
/// "now" and `r` is the existing row.
const CLAIM: &str = r"
INSERT INTO {t} AS r (id, namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until,
                      response, state_at, request_id, created_at, expires_at, verdict)
VALUES (?1, ?2, ?3, ?4, ?5, {now} * 1000, 0, ?6, {now} + ?7, NULL, {now}, ?10, {now}, {now} + MAX(?7, ?8), 1)
ON CONFLICT (id) DO UPDATE SET
    verdict = CASE WHEN r.expires_at <= excluded.state_at THEN 1 WHEN ?9 THEN 3 ELSE 2 END,
    namespace = excluded.namespace,
    principal = excluded.principal,
    idem_key = excluded.idem_key,
    fingerprint = excluded.fingerprint,
    fence = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN r.fence ELSE MAX(r.fence + 1, excluded.fence) END,
    state = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN 2 ELSE 0 END,
    owner = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN NULL ELSE excluded.owner END,
    lease_until = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN 0 ELSE excluded.lease_until END,
    response = NULL,
    state_at = excluded.state_at,
    request_id = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN r.request_id ELSE excluded.request_id END,
    created_at = CASE WHEN r.expires_at > excluded.state_at THEN r.created_at ELSE excluded.created_at END,
    expires_at = CASE WHEN r.expires_at > excluded.state_at AND ?9 THEN r.expires_at ELSE excluded.expires_at END
WHERE r.expires_at <= excluded.state_at
   OR (r.fingerprint = excluded.fingerprint AND r.state = 0 AND r.lease_until <= excluded.state_at)
RETURNING {cols}
";

const MIGRATIONS: &[&str] = &[r"
CREATE TABLE IF NOT EXISTS {t} (
    id          BLOB    PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    principal   TEXT,
    idem_key    TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    fence       INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    owner       BLOB,
    lease_until INTEGER NOT NULL,
    response    BLOB,
    state_at    INTEGER NOT NULL,
    request_id  TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    verdict     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_expires_idx ON {t} (expires_at);
CREATE INDEX IF NOT EXISTS {t}_created_idx ON {t} (created_at);
"];

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = |s: &str| {
            common::sql(
                &s.replace("{now}", NOW_MS).replace("{cols}", COLUMNS),
                table,
            )
        };
        let live_holder =
            "id = ?1 AND owner = ?2 AND fence = ?3 AND state = 0 AND expires_at > {now}";
        Self {
            read: t("SELECT {cols}, {now} AS now_ms FROM {t} WHERE id = ?1"),
            claim: t(CLAIM),
            renew: t(&format!(
                "UPDATE {{t}} SET lease_until = {{now}} + ?4, expires_at = MAX(expires_at, {{now}} + ?4) \
                 WHERE {live_holder} RETURNING lease_until"
            )),
            complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = ?4, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + ?5, verdict = 0 WHERE {live_holder}"
            )),
            release_retryable: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {live_holder}"
            )),
            release_unknown: t(&format!(
                "UPDATE {{t}} SET state = 2, owner = NULL, lease_until = 0, state_at = {{now}}, verdict = 0 WHERE {live_holder}"
            )),
            get: t("SELECT {cols} FROM {t} WHERE id = ?1 AND expires_at > {now}"),
            list: t("SELECT {cols} FROM {t} WHERE expires_at > {now} \
                 AND (?1 IS NULL OR namespace = ?1) AND (?2 IS NULL OR principal = ?2) \
                 AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR created_at <= {now} - ?4) \
                 ORDER BY created_at, id LIMIT ?5"),
            resolve_complete: t(&format!(
                "UPDATE {{t}} SET state = 1, response = ?2, owner = NULL, lease_until = 0, state_at = {{now}}, \
                 expires_at = {{now}} + ?3, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_release: t(&format!(
                "UPDATE {{t}} SET expires_at = {{now}}, owner = NULL, response = NULL, verdict = 0 WHERE {RESOLVABLE}"
            )),
            resolve_probe: t(
                "SELECT state, lease_until, expires_at, {now} AS now_ms FROM {t} WHERE id = ?1",
            ),
            delete: t(
                "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 0 \
                 WHERE id = ?1 AND expires_at > {now}",
            ),
            reap: t(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at <= {now} LIMIT ?1)",
            ),
        }
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` with the default table, a
    /// single writer and four readers.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the file cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        Self::open_with(options, 4).await
    }

    /// Opens [`DEFAULT_PATH`].
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the file cannot be opened.
    pub async fn open_default() -> Result<Self, StoreError> {
        Self::open(DEFAULT_PATH).await
    }

    /// Opens a database from a URL such as `sqlite:./idem.db` or `sqlite:///var/lib/idem.db`.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL is malformed or the file cannot be opened.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::unavailable)?
            .create_if_missing(true);
        Self::open_with(options, 4).await
    }

    /// Opens with explicit options; WAL, the busy timeout and foreign keys are set on top.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the file cannot be opened.
    pub async fn open_with(
        options: SqliteConnectOptions,
        readers: u32,
    ) -> Result<Self, StoreError> {
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(StoreError::unavailable)?;
        let reader = SqlitePoolOptions::new()
            .max_connections(readers.max(1))
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::from_pools(writer, reader))
    }

    /// A store on existing pools: `writer` should hold one connection (more work, but meet
    /// the busy timeout under contention), `reader` any number.
    pub fn from_pools(writer: SqlitePool, reader: SqlitePool) -> Self {
        let table = TableName::default();
        let sql = std::sync::Arc::new(Statements::new(&table));
        Self {
            writer,
            reader,
            table,
            sql,
        }
    }

    /// The same store on another table.
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(mut self, table: &str) -> Result<Self, TableNameError> {
        self.table = TableName::new(table)?;
        self.sql = std::sync::Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// The writer pool: same-database work goes through it.
    pub fn writer(&self) -> &SqlitePool {
        &self.writer
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
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
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
            .execute(&self.writer)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(())
    }

    /// Deletes expired rows (tombstones included), `batch` at a time, until none is left;
    /// the writer is free between batches. Returns how many rows were deleted.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database failed; rows deleted before stay deleted.
    pub async fn reap(&self, batch: u32) -> Result<u64, StoreError> {
        common::reap_in_batches(batch, |n| async move {
            let done = sqlx::query(&self.sql.reap)
                .bind(i64::from(n))
                .execute(&self.writer)
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// Runs [`SqliteStore::reap`] every `every` on the current tokio runtime, until the handle is
    /// aborted. Failures are logged and retried on the next tick.
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> tokio::task::JoinHandle<()> {
        common::spawn_reaper(self, every, batch)
    }

    async fn read(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let row = sqlx::query(&self.sql.read)
            .bind(req.key.digest().to_vec())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::unavailable)?;
        let Some(row) = row else { return Ok(None) };
        let now: i64 = row.try_get(COLUMN_COUNT).map_err(StoreError::unavailable)?;
        claim_outcome(req, false, Some(raw_record!(&row, 0)?), ts(now))
    }

    async fn upsert(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
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
        match row {
            Some(row) => claim_outcome(
                req,
                true,
                Some(raw_record!(&row, 0)?),
                idem_core::Timestamp(0),
            ),
            None => Ok(None),
        }
    }

    /// Claims a key on the caller's connection, inside the transaction that also carries the
    /// business writes (same-database mode; begin it with `BEGIN IMMEDIATE`, as
    /// [`SqliteStore::run_in_tx`] does). A rollback leaves no trace.
    ///
    /// # Errors
    /// [`StoreError`] when a statement failed.
    pub async fn claim_in(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..MAX_RACES {
            if let Some(outcome) = self.read(conn, req).await? {
                return Ok(outcome);
            }
            if let Some(outcome) = self.upsert(conn, req).await? {
                return Ok(outcome);
            }
        }
        Err(too_many_races())
    }

    /// Completes a claim made with [`SqliteStore::claim_in`] on the same connection.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed.
    pub async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
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

    /// Same-database mode in one call: begins an immediate transaction on the writer, claims
    /// `req.key`, and when the claim is won runs `work` on the transaction; `work` returns its
    /// output and the response to store. The completion commits with `work`'s writes; when
    /// `work` fails, everything rolls back and leaves no record and no business row.
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
        F: for<'c> FnOnce(
            &'c mut SqliteConnection,
        ) -> BoxFuture<'c, Result<(T, StoredResponse), E>>,
    {
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
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
            .execute(&self.writer)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(settled(done.rows_affected()))
    }
}

crate::in_tx_by_inherent_methods!(SqliteStore, SqliteConnection);

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Store for SqliteStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..MAX_RACES {
            let mut reader = self
                .reader
                .acquire()
                .await
                .map_err(StoreError::unavailable)?;
            if let Some(outcome) = self.read(&mut reader, req).await? {
                return Ok(outcome);
            }
            drop(reader);
            let mut writer = self
                .writer
                .acquire()
                .await
                .map_err(StoreError::unavailable)?;
            if let Some(outcome) = self.upsert(&mut writer, req).await? {
                return Ok(outcome);
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
        let row = sqlx::query(&self.sql.renew)
            .bind(key.digest().to_vec())
            .bind(owner.to_bytes().to_vec())
            .bind(fence_param(fence))
            .bind(ms(lease))
            .fetch_optional(&self.writer)
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
        let mut conn = self
            .writer
            .acquire()
            .await
            .map_err(StoreError::unavailable)?;
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

    shared_queries!(reader: reader, writer: writer);
}
