//! [`SqlTokens`]: one-time tokens in a PostgreSQL or MariaDB table, judged on the database
//! clock.
//!
//! One row per token, keyed by the token's scoped digest (the token itself is never stored):
//! `id, bound, payload, expires_at, consumed_at, forget_at` (milliseconds).
//!
//! - **issue** is one `INSERT … RETURNING expires_at` on PostgreSQL and MariaDB 10.5+. MySQL 8
//!   (and older MariaDB) has no `INSERT … RETURNING`: there the store runs the same insert
//!   without it, then reads `expires_at` back by id, in one transaction (the insert holds the
//!   new row's lock until commit, so a concurrent purge cannot take it in between). As the
//!   record store does for its claim, it asks `SELECT VERSION()` once, before its first
//!   issue, and picks the spelling the server accepts ([`SqlTokens::with_issue_then_read`]
//!   forces the portable one).
//! - **consume** reads the row (payload and expiry never change after issue), answers every
//!   refusal from that read, and otherwise runs the deciding statement
//!   `UPDATE … SET consumed_at = now WHERE id = :id AND consumed_at IS NULL AND expires_at > now`:
//!   the database lets exactly one concurrent update match the row, so exactly one consumer
//!   sees one row changed. A consumer that changed none reads again to say why (used or
//!   expired). The consume needs no `UPDATE … RETURNING`, so it reads the same everywhere.
//! - **inspect** is the read alone.
//! - Rows are kept until `forget_at` (expiry plus the retention), so expired and consumed
//!   tokens answer as such; [`SqlTokens::purge`] deletes rows past it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::time::Duration;

use bytes::Bytes;
use idem_core::record::duration_ms;
use idem_core::token::{
    ConsumeOutcome, DEFAULT_RETENTION, IssueRequest, Issued, Token, TokenState, TokenStore,
    binding_matches,
};
use idem_core::{Scope, StoreError, Timestamp};
use sqlx::Pool;

use crate::dialect::{OnePool, Sql, Written};
use crate::driver::{On, Value};
use crate::statements::{Param, Stmt, compile, expand};
use crate::table::{TableName, TableNameError};

/// The table used when none is configured.
pub const DEFAULT_TOKEN_TABLE: &str = "idem_tokens";

/// A database the token table can live in: PostgreSQL, MariaDB or MySQL 8 (each behind its
/// feature).
pub trait TokenDialect: OnePool {
    /// Creates the token table and its index if missing (no parameters).
    #[doc(hidden)]
    const CREATE_TOKENS: &'static str;
    /// Whether some servers of this dialect lack `INSERT … RETURNING`, so the issue may have
    /// to insert, then read the expiry back (chosen by `Sql::claim_returning`).
    #[doc(hidden)]
    const ISSUE_MAY_READ_BACK: bool = false;
}

#[cfg(feature = "postgres")]
impl TokenDialect for sqlx::Postgres {
    const CREATE_TOKENS: &'static str = "CREATE TABLE IF NOT EXISTS {t} (
    id          bytea  PRIMARY KEY,
    bound       bigint NOT NULL,
    payload     bytea  NOT NULL,
    expires_at  bigint NOT NULL,
    consumed_at bigint NULL,
    forget_at   bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_forget_idx ON {t} (forget_at);";
}

#[cfg(feature = "mysql")]
impl TokenDialect for sqlx::MySql {
    const ISSUE_MAY_READ_BACK: bool = true;

    const CREATE_TOKENS: &'static str = "CREATE TABLE IF NOT EXISTS {t} (
    id          BINARY(32)      NOT NULL PRIMARY KEY,
    bound       BIGINT          NOT NULL,
    payload     VARBINARY(1024) NOT NULL,
    expires_at  BIGINT          NOT NULL,
    consumed_at BIGINT          NULL,
    forget_at   BIGINT          NOT NULL,
    INDEX {t}_forget_idx (forget_at)
)";
}

const ISSUE: &str = "INSERT INTO {t} (id, bound, payload, expires_at, consumed_at, forget_at) \
    VALUES (:id, :bound, :payload, {now} + :ttl, NULL, {now} + :ttl + :retention) \
    RETURNING expires_at";
/// [`ISSUE`] without `RETURNING`, for servers that lack it (MySQL 8, MariaDB before 10.5).
const ISSUE_PLAIN: &str = "INSERT INTO {t} (id, bound, payload, expires_at, consumed_at, forget_at) \
    VALUES (:id, :bound, :payload, {now} + :ttl, NULL, {now} + :ttl + :retention)";
/// Reads back what [`ISSUE_PLAIN`] wrote, in the same transaction.
const ISSUE_READ: &str = "SELECT expires_at FROM {t} WHERE id = :id";
const VERSION: &str = "SELECT VERSION()";

/// Which issue statement the server takes: not asked yet, `INSERT … RETURNING`, or the
/// insert then a read.
// The issue mode is kept in the same encoding as the record store's claim mode, so one
// version probe (`crate::store::then_read`) serves both.
use crate::store::{
    CLAIM_RETURNING as ISSUE_RETURNING, CLAIM_THEN_READ as ISSUE_THEN_READ,
    CLAIM_UNKNOWN as ISSUE_UNKNOWN,
};
/// Returns `bound, payload, expires_at, consumed_at (0 when unused), now_ms`.
const READ: &str = "SELECT bound, payload, expires_at, COALESCE(consumed_at, 0), {now} \
    FROM {t} WHERE id = :id AND forget_at > {now}";
const CONSUME: &str = "UPDATE {t} SET consumed_at = {now} \
    WHERE id = :id AND consumed_at IS NULL AND expires_at > {now}";
const PURGE: &str = "DELETE FROM {t} WHERE forget_at <= {now}";

struct Statements {
    issue: Stmt,
    issue_plain: Stmt,
    issue_read: Stmt,
    version: Stmt,
    read: Stmt,
    consume: Stmt,
    purge: Stmt,
    create: String,
}

/// One-time tokens in a SQL table. Cheap to clone (the pool is shared).
pub struct SqlTokens<D: TokenDialect> {
    shared: Arc<Shared<D>>,
}

struct Shared<D: TokenDialect> {
    pool: Pool<D>,
    table: TableName,
    retention: Duration,
    sql: Statements,
    /// [`ISSUE_UNKNOWN`], [`ISSUE_RETURNING`] or [`ISSUE_THEN_READ`]; shared by clones.
    issue_mode: Arc<AtomicU8>,
}

impl<D: TokenDialect> Clone for SqlTokens<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<D: TokenDialect> fmt::Debug for SqlTokens<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlTokens")
            .field("table", &self.shared.table.as_str())
            .field("retention", &self.shared.retention)
            .finish()
    }
}

/// A row as read.
struct Row {
    payload: Option<Bytes>,
    expires_at: u64,
    consumed_at: u64,
    now: u64,
}

fn ms(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn int(d: Duration) -> i64 {
    i64::try_from(duration_ms(d)).unwrap_or(i64::MAX / 4)
}

impl<D: TokenDialect> SqlTokens<D> {
    /// Tokens on `pool` in the table `table` (create it with [`SqlTokens::migrate`]).
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(pool: Pool<D>, table: &str) -> Result<Self, TableNameError> {
        Ok(Self::build(
            pool,
            TableName::new(table)?,
            DEFAULT_RETENTION,
            Self::first_mode(),
        ))
    }

    /// Tokens on `pool` in [`DEFAULT_TOKEN_TABLE`].
    pub fn new(pool: Pool<D>) -> Self {
        Self::build(
            pool,
            TableName::new(DEFAULT_TOKEN_TABLE).unwrap_or_default(),
            DEFAULT_RETENTION,
            Self::first_mode(),
        )
    }

    /// Issues with the portable insert-then-read transaction even where the server accepts
    /// `INSERT … RETURNING` (MariaDB 10.5+), as on MySQL 8. For tests of that path; a dialect
    /// without it (PostgreSQL) ignores this.
    #[must_use]
    pub fn with_issue_then_read(self) -> Self {
        let mode = if D::ISSUE_MAY_READ_BACK {
            ISSUE_THEN_READ
        } else {
            ISSUE_RETURNING
        };
        let s = &self.shared;
        Self::build(
            s.pool.clone(),
            s.table.clone(),
            s.retention,
            Arc::new(AtomicU8::new(mode)),
        )
    }

    fn first_mode() -> Arc<AtomicU8> {
        let mode = if D::ISSUE_MAY_READ_BACK {
            ISSUE_UNKNOWN
        } else {
            ISSUE_RETURNING
        };
        Arc::new(AtomicU8::new(mode))
    }

    /// Keeps expired and consumed tokens for `retention` past their expiry (default
    /// [`DEFAULT_RETENTION`]), so they answer "expired" or "already used" rather than
    /// "unknown".
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        Self::build(
            self.shared.pool.clone(),
            self.shared.table.clone(),
            retention,
            self.shared.issue_mode.clone(),
        )
    }

    fn build(
        pool: Pool<D>,
        table: TableName,
        retention: Duration,
        issue_mode: Arc<AtomicU8>,
    ) -> Self {
        let stmt = |t: &str| compile(&expand::<D>(t, &table), D::PLACEHOLDERS);
        let sql = Statements {
            issue: stmt(ISSUE),
            issue_plain: stmt(ISSUE_PLAIN),
            issue_read: stmt(ISSUE_READ),
            version: stmt(VERSION),
            read: stmt(READ),
            consume: stmt(CONSUME),
            purge: stmt(PURGE),
            create: expand::<D>(D::CREATE_TOKENS, &table),
        };
        Self {
            shared: Arc::new(Shared {
                pool,
                table,
                retention,
                sql,
                issue_mode,
            }),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.shared.table.as_str()
    }

    /// Creates the table and its index if missing.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        D::execute_raw(On::Pool(&self.shared.pool), &self.shared.sql.create)
            .await
            .map_err(StoreError::unavailable)
    }

    /// Drops the table. For tests and teardown.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn drop_table(&self) -> Result<(), StoreError> {
        let sql = format!("DROP TABLE IF EXISTS {}", self.shared.table.as_str());
        D::execute_raw(On::Pool(&self.shared.pool), &sql)
            .await
            .map_err(StoreError::unavailable)
    }

    /// Deletes tokens past their retention; how many.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        D::execute(On::Pool(&self.shared.pool), &self.shared.sql.purge, &[])
            .await
            .map(|r| r.rows())
            .map_err(StoreError::unavailable)
    }

    /// Whether issues take the insert-then-read path: asks the server its version once.
    async fn issues_then_read(&self) -> Result<bool, StoreError> {
        crate::store::then_read(
            &self.shared.issue_mode,
            &self.shared.pool,
            &self.shared.sql.version,
            "token issue",
        )
        .await
    }

    /// The insert without `RETURNING`, then the row's expiry read back, in one transaction.
    async fn issue_then_read(
        &self,
        args: &crate::driver::Args<'_>,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        let pool = &self.shared.pool;
        let mut tx = match <D as Sql>::BEGIN {
            Some(statement) => pool.begin_with(statement).await?,
            None => pool.begin().await?,
        };
        D::execute(On::Conn(&mut *tx), &self.shared.sql.issue_plain, args).await?;
        let row = D::fetch_optional(On::Conn(&mut *tx), &self.shared.sql.issue_read, args).await?;
        tx.commit().await?;
        Ok(row)
    }

    async fn read(&self, id: &[u8; 32]) -> Result<Option<Row>, StoreError> {
        let args = [(Param::Id, Value::Bytes(id))];
        let row = D::fetch_optional(On::Pool(&self.shared.pool), &self.shared.sql.read, &args)
            .await
            .map_err(StoreError::unavailable)?;
        let Some(row) = row else { return Ok(None) };
        let cell = |r: Result<i64, sqlx::Error>| r.map(ms).map_err(StoreError::unavailable);
        let bound = cell(D::int(&row, 0))?;
        let payload = D::bytes(&row, 1).map_err(StoreError::unavailable)?;
        Ok(Some(Row {
            payload: (bound == 1).then(|| Bytes::from(payload.unwrap_or_default())),
            expires_at: cell(D::int(&row, 2))?,
            consumed_at: cell(D::int(&row, 3))?,
            now: cell(D::int(&row, 4))?,
        }))
    }

    /// The answer a read gives without writing, or `None` when the token is consumable.
    fn refusal(row: Option<&Row>, presented: Option<&[u8]>) -> Option<ConsumeOutcome> {
        let Some(row) = row else {
            return Some(ConsumeOutcome::Unknown);
        };
        if row.consumed_at != 0 {
            Some(ConsumeOutcome::AlreadyConsumed)
        } else if row.now >= row.expires_at {
            Some(ConsumeOutcome::Expired)
        } else if !binding_matches(row.payload.as_deref(), presented) {
            Some(ConsumeOutcome::Mismatch)
        } else {
            None
        }
    }
}

impl<D: TokenDialect> TokenStore for SqlTokens<D> {
    async fn issue(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
        let token = Token::generate()?;
        let id = token.digest(&req.scope);
        let (bound, payload): (i64, &[u8]) = match &req.payload {
            Some(p) => (1, p),
            None => (0, b""),
        };
        let args = [
            (Param::Id, Value::Bytes(&id)),
            (Param::Bound, Value::Int(bound)),
            (Param::Payload, Value::Bytes(payload)),
            (Param::Ttl, Value::Int(int(req.ttl))),
            (Param::Retention, Value::Int(int(self.shared.retention))),
        ];
        let row = if self.issues_then_read().await? {
            self.issue_then_read(&args).await
        } else {
            D::fetch_optional(On::Pool(&self.shared.pool), &self.shared.sql.issue, &args).await
        }
        .map_err(StoreError::unavailable)?
        .ok_or_else(|| StoreError::unavailable("token insert returned no row"))?;
        let expires_at = D::int(&row, 0).map_err(StoreError::unavailable)?;
        Ok(Issued {
            token,
            expires_at: Timestamp(ms(expires_at)),
        })
    }

    async fn consume(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> Result<ConsumeOutcome, StoreError> {
        let id = token.digest(scope);
        let row = self.read(&id).await?;
        if let Some(refused) = Self::refusal(row.as_ref(), presented) {
            return Ok(refused);
        }
        let args = [(Param::Id, Value::Bytes(&id))];
        let changed = D::execute(On::Pool(&self.shared.pool), &self.shared.sql.consume, &args)
            .await
            .map_err(StoreError::unavailable)?
            .rows();
        if changed == 1 {
            return Ok(ConsumeOutcome::Consumed {
                payload: row.and_then(|r| r.payload),
            });
        }
        // Another consumer won, or the token expired between the read and the update.
        let again = self.read(&id).await?;
        Ok(Self::refusal(again.as_ref(), presented).unwrap_or(ConsumeOutcome::AlreadyConsumed))
    }

    async fn inspect(&self, scope: &Scope, token: &Token) -> Result<TokenState, StoreError> {
        let Some(row) = self.read(&token.digest(scope)).await? else {
            return Ok(TokenState::Unknown);
        };
        Ok(if row.consumed_at != 0 {
            TokenState::Consumed {
                at: Timestamp(row.consumed_at),
            }
        } else if row.now >= row.expires_at {
            TokenState::Expired {
                at: Timestamp(row.expires_at),
            }
        } else {
            TokenState::Live {
                expires_at: Timestamp(row.expires_at),
                payload: row.payload,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode<D: TokenDialect>(t: &SqlTokens<D>) -> u8 {
        t.shared
            .issue_mode
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// MySQL-family stores ask the server before their first issue; PostgreSQL always has
    /// `INSERT … RETURNING`. Forcing the portable spelling survives a retention change, and
    /// the portable statements use no `RETURNING`.
    #[tokio::test]
    async fn issue_spelling_is_asked_forced_or_fixed() {
        let my = sqlx::mysql::MySqlPoolOptions::new()
            .connect_lazy("mysql://root@127.0.0.1:3306/test")
            .expect("lazy pool");
        let my = SqlTokens::new(my);
        assert_eq!(mode(&my), ISSUE_UNKNOWN);
        let forced = my.with_issue_then_read();
        assert_eq!(mode(&forced), ISSUE_THEN_READ);
        assert_eq!(
            mode(&forced.retention(Duration::from_secs(5))),
            ISSUE_THEN_READ
        );

        let pg = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/test")
            .expect("lazy pool");
        let pg = SqlTokens::new(pg);
        assert_eq!(mode(&pg), ISSUE_RETURNING);
        assert_eq!(mode(&pg.with_issue_then_read()), ISSUE_RETURNING);

        for portable in [ISSUE_PLAIN, ISSUE_READ] {
            assert!(!portable.contains("RETURNING"), "{portable}");
        }
    }
}
