//! The business-side backstop: the seeds' second and third lines of defence, usable without
//! the rest of idem (`docs/sql-stores.md`, "Backstop toolkit").
//!
//! - [`unique_violation`]: recognises a unique violation precisely (PostgreSQL `23505`,
//!   MySQL/MariaDB `1062`, SQLite `2067`/`1555`), with the constraint it hit. Nothing else —
//!   not a foreign-key, `NOT NULL` or check violation, not a lost connection — is a duplicate.
//! - [`insert_once`]: inserts a row protected by a unique index (`UNIQUE(user_id,
//!   idempotency_key)`); on a violation of *that* index it re-reads the existing row and
//!   returns it only if it is live (not soft-deleted, in a state that answers the request).
//! - [`Transitions`]: a declared state machine applied with `UPDATE … WHERE state IN (allowed
//!   sources)`; repeating a transition is a no-op success, an illegal one an error.
//! - [`optimistic`]: a version-checked update with bounded retries.
//! - [`fenced`] and [`FencedUpdate`]: a write that lands only with a newer lock fence than the
//!   row's, so a lock holder that paused past its lease is refused.
//!
//! The helpers take the SQL as closures, so they work with any of the three backends and with
//! the caller's own schema.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_sql::backstop::{Liveness, insert_once};
//! use sqlx::Row;
//!
//! let (user, key) = (7_i64, "order-42");
//! let order = insert_once(
//!     "orders_user_key_uq",
//!     || async {
//!         let row = sqlx::query("INSERT INTO orders (user_id, idem_key) VALUES ($1, $2) RETURNING id")
//!             .bind(user).bind(key).fetch_one(&pool).await?;
//!         Ok((row.try_get::<i64, _>(0)?, false))
//!     },
//!     || async {
//!         let row = sqlx::query("SELECT id, deleted FROM orders WHERE user_id = $1 AND idem_key = $2")
//!             .bind(user).bind(key).fetch_optional(&pool).await?;
//!         row.map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<bool, _>(1)?))).transpose()
//!     },
//!     |(_, deleted): &(i64, bool)| if *deleted { Liveness::Gone("soft-deleted") } else { Liveness::Live },
//! )
//! .await?;
//! # let _ = order; Ok(()) }
//! ```

mod fenced;
mod insert;
mod optimistic;
mod transition;
mod unique;

pub use fenced::{FencedError, FencedUpdate, fenced};
pub use insert::{InsertOnce, InsertOnceError, Liveness, insert_once};
pub use optimistic::{OptimisticError, Versioned, optimistic};
pub use transition::{Applied, TransitionError, Transitions};
pub use unique::{UniqueViolation, is_unique_violation, unique_violation};

/// Checks that `name` is a plain SQL identifier (letters, digits, `_`), for the table and
/// column names the helpers splice into SQL.
fn identifier(name: &str) -> Result<&str, crate::TableNameError> {
    crate::TableName::new(name).map(|_| name)
}
