//! What differs between the databases: the text of the statements and how the database reports
//! what they did. Everything else is written once, in [`crate::SqlStore`].
//!
//! Statements are templates compiled once per table (see [`crate::statements`]): `{t}` is the
//! table, `{cols}` the record columns (all but `id`), `{now}` / `{now_us}` the database clock
//! in milliseconds / microseconds, `{greatest}` the dialect's `GREATEST`, `{holder}`, `{held}`,
//! `{resolvable}`, `{on_conflict}` and `{create_table}` fragments several dialects share (the
//! last with `{blob}`, `{bigint}` and `{smallint}` column types), and `:name` a parameter,
//! which each dialect spells its own way ([`Placeholders`]).
//!
//! Statements no dialect spells differently are in [`crate::statements`]; the defaults of
//! [`Sql`] are the portable spelling of those some dialects spell their own way.

use futures::future::BoxFuture;
use sqlx::{Decode, Pool, Type};

use crate::driver::Driver;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// A database a [`crate::SqlStore`] keeps its records in: sqlx's `Postgres`, `MySql` (MariaDB)
/// or `Sqlite`, each behind its feature. Sealed: the statements are written for these three.
pub trait Dialect: Sql {}

impl<D: Sql> Dialect for D {}

/// How a dialect writes statement parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// Numbered after a prefix (`$1`, `?1`): a parameter used twice is bound once.
    Numbered(&'static str),
    /// Anonymous `?` in textual order: a parameter used twice is bound twice.
    Positional,
}

/// How a dialect's renew statement hands back the new lease deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal<S> {
    /// `UPDATE … RETURNING lease_until`: one row when renewed, none when the lease was lost.
    Returning(S),
    /// `UPDATE … SET lease_until = LAST_INSERT_ID(…)`: renewed when it matched one row, and the
    /// deadline is the statement's last insert id (MariaDB has no `UPDATE … RETURNING`).
    LastInsertId(S),
}

impl<S> Renewal<S> {
    /// The same renewal with its statement mapped.
    pub(crate) fn map<T>(self, f: impl FnOnce(S) -> T) -> Renewal<T> {
        match self {
            Self::Returning(s) => Renewal::Returning(f(s)),
            Self::LastInsertId(s) => Renewal::LastInsertId(f(s)),
        }
    }
}

/// How a dialect's store commits concurrent claims and completions together
/// ([`crate::SqlStore::with_group_commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Each operation commits on its own.
    Off,
    /// The waiting operations run their own statements in one transaction: one commit (one
    /// log flush) for all of them. For a database with one writer (SQLite).
    Transaction,
    /// The waiting claims are one statement ([`Sql::CLAIM_MANY`]) and the waiting completions
    /// another ([`Sql::COMPLETE_MANY`]), each bound as arrays: one round trip and one commit
    /// for many operations.
    Statement,
}

/// The columns of the claims one [`Sql::CLAIM_MANY`] binds, one array per column, in the
/// statement's parameter order.
#[derive(Debug, Default)]
pub struct ClaimColumns {
    pub(crate) id: Vec<Vec<u8>>,
    pub(crate) namespace: Vec<String>,
    pub(crate) principal: Vec<Option<String>>,
    pub(crate) key: Vec<String>,
    pub(crate) fingerprint: Vec<Vec<u8>>,
    pub(crate) owner: Vec<Vec<u8>>,
    pub(crate) lease: Vec<i64>,
    pub(crate) ttl: Vec<i64>,
    pub(crate) request_id: Vec<Option<String>>,
}

/// The columns of the completions one [`Sql::COMPLETE_MANY`] binds.
#[derive(Debug, Default)]
pub struct CompleteColumns {
    pub(crate) id: Vec<Vec<u8>>,
    pub(crate) owner: Vec<Vec<u8>>,
    pub(crate) fence: Vec<i64>,
    pub(crate) response: Vec<Vec<u8>>,
    pub(crate) ttl: Vec<i64>,
}

/// What a statement that returns no rows reports.
pub trait Written {
    /// How many rows it matched.
    fn rows(&self) -> u64;
    /// The value it set through `LAST_INSERT_ID(expr)`, where the database has that.
    fn last_insert_id(&self) -> Option<u64> {
        None
    }
}

/// A dialect's SQL and error codes (the items behind [`Dialect`]).
pub trait Sql: Driver + sqlx::Database<QueryResult: Written> {
    /// The store's type name, for `Debug`.
    const STORE: &'static str;
    /// How statement parameters are written.
    const PLACEHOLDERS: Placeholders;
    /// How text columns are decoded.
    type Text: for<'r> Decode<'r, Self> + Type<Self> + Into<String>;
    /// The database clock in milliseconds, fixed for the statement.
    const NOW_MS: &'static str;
    /// The database clock in microseconds, fixed for the statement (may use `{now}`).
    const NOW_US: &'static str;
    /// The function giving the largest of its arguments.
    const GREATEST: &'static str = "GREATEST";
    /// The column type of bytes in `{create_table}`.
    const BLOB: &'static str = "BLOB";
    /// The column type of 64-bit integers in `{create_table}`.
    const BIGINT: &'static str = "BIGINT";
    /// The column type of 16-bit integers in `{create_table}`.
    const SMALLINT: &'static str = "SMALLINT";

    /// Creates the table and its indexes if missing, in one transaction (no parameters).
    const MIGRATE: &'static str = "{create_table}";
    /// A read that answers a claim without writing when it can (replay, busy, unknown,
    /// mismatch), run before [`Sql::CLAIM`]; returns `false, now_ms, {cols}`.
    const CLAIM_READ: Option<&'static str> = None;
    /// The claim: returns `wrote, now_ms, {cols}` (the written row, or the row it read), or
    /// no row when a concurrent claim won in between.
    const CLAIM: &'static str;
    /// For a dialect whose [`Sql::CLAIM`] ends in a `RETURNING` only some of its servers
    /// accept: the claim without it, and the locking read of the row it left, run in one
    /// transaction on the servers [`Sql::claim_returning`] turns down.
    const CLAIM_THEN_READ: Option<(&'static str, &'static str)> = None;
    /// Whether a server whose `SELECT VERSION()` says `version` runs [`Sql::CLAIM`] as
    /// written.
    fn claim_returning(version: &str) -> bool {
        let _ = version;
        true
    }
    /// Extends the holder's lease.
    const RENEW: Renewal<&'static str> = Renewal::Returning(
        "UPDATE {t} SET lease_until = {now} + :lease, \
         expires_at = {greatest}(expires_at, {now} + :lease), verdict = 10 WHERE {holder} \
         RETURNING lease_until",
    );
    /// Lists live records, oldest first.
    const LIST: &'static str = "SELECT {cols} FROM {t} WHERE expires_at > {now} \
        AND (:namespace IS NULL OR namespace = :namespace) \
        AND (:principal IS NULL OR principal = :principal) \
        AND (:state IS NULL OR state = :state) \
        AND (:age IS NULL OR created_at <= {now} - :age) \
        ORDER BY created_at, id LIMIT :limit";
    /// Deletes at most `:limit` expired rows.
    const REAP: &'static str;

    /// The audit table, its indexes and the triggers that fill it (see [`crate::audit`]);
    /// `{on_insert}`, `{on_update}`, `{on_delete}` are the event rows, `{acols}` their
    /// columns. Runs after [`Sql::MIGRATE`] in the same transaction.
    const AUDIT_MIGRATE: &'static str = r"
CREATE TABLE IF NOT EXISTS {t}_audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    namespace  TEXT    NOT NULL,
    principal  TEXT    NOT NULL,
    idem_key   TEXT    NOT NULL,
    event      INTEGER NOT NULL,
    fence      INTEGER NOT NULL,
    request_id TEXT,
    outcome    TEXT,
    head       BLOB,
    owner      BLOB,
    actor      TEXT
);
CREATE INDEX IF NOT EXISTS {t}_audit_key_idx ON {t}_audit (namespace, idem_key, seq);
CREATE INDEX IF NOT EXISTS {t}_audit_at_idx ON {t}_audit (at_ms);
CREATE TRIGGER IF NOT EXISTS {t}_audit_ins AFTER INSERT ON {t}
    BEGIN INSERT INTO {t}_audit ({acols}) {on_insert}; END;
CREATE TRIGGER IF NOT EXISTS {t}_audit_upd AFTER UPDATE ON {t}
    BEGIN INSERT INTO {t}_audit ({acols}) {on_update}; END;
CREATE TRIGGER IF NOT EXISTS {t}_audit_del AFTER DELETE ON {t}
    BEGIN INSERT INTO {t}_audit ({acols}) {on_delete}; END;
";
    /// Deletes at most `:limit` events older than `:age` ms.
    const AUDIT_REAP: &'static str = "DELETE FROM {t}_audit WHERE seq IN \
        (SELECT seq FROM {t}_audit WHERE at_ms < {now} - :age ORDER BY seq LIMIT :limit)";
    /// A test that text parameter `:{p}` is NULL.
    const TEXT_NULL: &'static str = ":{p} IS NULL";
    /// A test that integer parameter `:{p}` is NULL.
    const INT_NULL: &'static str = ":{p} IS NULL";
    /// What a `SELECT` without a table needs before its `WHERE`.
    const DUAL: &'static str = "";
    /// Appended to the drop statement: what else the audit trail leaves behind.
    const DROP_AUDIT_FN: &'static str = "";
    /// A NULL of the bytes column type.
    const NULL_BLOB: &'static str = "NULL";
    /// The first three bytes of `NEW.response`.
    const HEAD: &'static str = "substr(NEW.response, 1, 3)";

    /// Run on every connection of a pool the store opens itself.
    const SESSION: &'static [&'static str] = &[];
    /// Begins the store's own transactions (`None`: the driver's `BEGIN`).
    const BEGIN: Option<&'static str> = None;
    /// Error codes (`DatabaseError::code`) after which a claim on the store's own pool runs
    /// again: the database rolled the statement back whole.
    const CLAIM_RETRY_CODES: &'static [&'static str] = &[];

    /// How concurrent claims and completions share a commit.
    const GROUPING: Grouping = Grouping::Off;
    /// Under [`Grouping::Statement`]: claims many keys in one statement, each bound as an
    /// array ([`ClaimColumns`], `$1` to `$9`). A key without a row is inserted as a fresh
    /// claim; for a key with one the statement reads it (the snapshot before the statement)
    /// and returns it unwritten, for the same judgement as [`Sql::CLAIM`]'s read. Returns
    /// `wrote, now_ms, {cols}, id` per key it inserted or read; a key it returns nothing for
    /// (a concurrent insert it waited on) is claimed again alone.
    const CLAIM_MANY: Option<&'static str> = None;
    /// Under [`Grouping::Statement`]: completes many claims in one statement
    /// ([`CompleteColumns`], `$1` to `$5`), each guarded as a single completion is; returns the `id` of each row it completed.
    const COMPLETE_MANY: Option<&'static str> = None;
    /// Runs the compiled [`Sql::CLAIM_MANY`] on `pool`.
    fn claim_many<'a>(
        pool: &'a Pool<Self>,
        sql: &'a str,
        columns: ClaimColumns,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        let _ = (pool, sql, columns);
        Box::pin(async { Err(sqlx::Error::Protocol("no grouped claim".into())) })
    }
    /// Runs the compiled [`Sql::COMPLETE_MANY`] on `pool`.
    fn complete_many<'a>(
        pool: &'a Pool<Self>,
        sql: &'a str,
        columns: CompleteColumns,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        let _ = (pool, sql, columns);
        Box::pin(async { Err(sqlx::Error::Protocol("no grouped completion".into())) })
    }
}

/// A dialect whose store reads and writes through one pool (PostgreSQL, MariaDB), built with
/// `new` / `with_table` / `connect`.
pub trait OnePool: Dialect {}
