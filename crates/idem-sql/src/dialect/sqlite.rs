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

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use idem_core::StoreError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult};
use sqlx::{Sqlite, SqlitePool};

use super::{Placeholders, Sql, Written};
use crate::table::{TableName, TableNameError};

/// The default database file.
pub const DEFAULT_PATH: &str = "./idem.db";

/// How long a connection waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Records in a SQLite file. Cheap to clone (the pools are shared).
pub type SqliteStore = crate::SqlStore<Sqlite>;

impl Sql for Sqlite {
    const STORE: &'static str = "SqliteStore";
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered("?");
    type Text = String;
    const NOW_MS: &'static str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER))";
    /// The clock has millisecond precision.
    const NOW_US: &'static str = "({now} * 1000)";
    /// The scalar `MAX` of several arguments.
    const GREATEST: &'static str = "MAX";
    const BIGINT: &'static str = "INTEGER";
    const SMALLINT: &'static str = "INTEGER";

    /// Runs on a reader, so replays never wait for the writer.
    const CLAIM_READ: Option<&'static str> =
        Some("SELECT false AS wrote, {now} AS now_ms, {cols} FROM {t} WHERE id = :id");

    /// Returns nothing when the upsert left the row alone: a concurrent claim took it after
    /// the read.
    const CLAIM: &'static str = r"
INSERT INTO {t} AS r (id, {cols})
VALUES (:id, :namespace, :principal, :key, :fingerprint, {now_us}, 0, :owner, {now} + :lease, NULL, {now},
        :request_id, {now}, {now} + {greatest}(:lease, :ttl), {claimed})
{on_conflict}
RETURNING true AS wrote, {now} AS now_ms, {cols}
";

    const REAP: &'static str = "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at <= {now} LIMIT :limit)";

    /// Takes the write lock up front.
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");
    /// One writer connection: claims and completions that wait for it share a transaction.
    const GROUPING: super::Grouping = super::Grouping::Transaction;
}

impl Written for SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
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
        Self::with_pools(writer, reader, TableName::default())
    }

    /// The same store on another table.
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(self, table: &str) -> Result<Self, TableNameError> {
        let table = TableName::new(table)?;
        Ok(Self::with_pools(self.writer, self.reader, table)
            .with_audit_retention(self.audit_age)
            .with_audit_level(self.audit_level))
    }

    /// The writer pool: same-database work goes through it.
    pub fn writer(&self) -> &SqlitePool {
        &self.writer
    }
}
