//! [`SqlTokens`]: one-time tokens in a PostgreSQL or MariaDB table, judged on the database
//! clock.
//!
//! One row per token, keyed by the token's scoped digest (the token itself is never stored):
//! `id, bound, payload, expires_at, consumed_at, forget_at` (milliseconds).
//!
//! - **issue** is one `INSERT … RETURNING expires_at` (MariaDB 10.5+ syntax on the MySQL side;
//!   MySQL 8 lacks it, as it lacks the record store's claim statement).
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
use std::time::Duration;

use bytes::Bytes;
use idem_core::record::duration_ms;
use idem_core::token::{
    ConsumeOutcome, DEFAULT_RETENTION, IssueRequest, Issued, Token, TokenState, TokenStore,
    binding_matches,
};
use idem_core::{Scope, StoreError, Timestamp};
use sqlx::Pool;

use crate::dialect::{OnePool, Written};
use crate::driver::{On, Value};
use crate::statements::{Param, Stmt, compile, expand};
use crate::table::{TableName, TableNameError};

/// The table used when none is configured.
pub const DEFAULT_TOKEN_TABLE: &str = "idem_tokens";

/// A database the token table can live in: PostgreSQL or MariaDB (each behind its feature).
pub trait TokenDialect: OnePool {
    /// Creates the token table and its index if missing (no parameters).
    #[doc(hidden)]
    const CREATE_TOKENS: &'static str;
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
/// Returns `bound, payload, expires_at, consumed_at (0 when unused), now_ms`.
const READ: &str = "SELECT bound, payload, expires_at, COALESCE(consumed_at, 0), {now} \
    FROM {t} WHERE id = :id AND forget_at > {now}";
const CONSUME: &str = "UPDATE {t} SET consumed_at = {now} \
    WHERE id = :id AND consumed_at IS NULL AND expires_at > {now}";
const PURGE: &str = "DELETE FROM {t} WHERE forget_at <= {now}";

struct Statements {
    issue: Stmt,
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
        Ok(Self::build(pool, TableName::new(table)?, DEFAULT_RETENTION))
    }

    /// Tokens on `pool` in [`DEFAULT_TOKEN_TABLE`].
    pub fn new(pool: Pool<D>) -> Self {
        Self::build(
            pool,
            TableName::new(DEFAULT_TOKEN_TABLE).unwrap_or_default(),
            DEFAULT_RETENTION,
        )
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
        )
    }

    fn build(pool: Pool<D>, table: TableName, retention: Duration) -> Self {
        let stmt = |t: &str| compile(&expand::<D>(t, &table), D::PLACEHOLDERS);
        let sql = Statements {
            issue: stmt(ISSUE),
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
        let row = D::fetch_optional(On::Pool(&self.shared.pool), &self.shared.sql.issue, &args)
            .await
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
