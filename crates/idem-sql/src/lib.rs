//! idem stores on SQL databases, and the business-side backstop toolkit.
//!
//! - [`PgStore`] (feature `postgres`), [`MySqlStore`] (feature `mysql`, MariaDB 10.5+ or MySQL 8) and
//!   [`SqliteStore`] (feature `sqlite`, the gateway's embedded default) are one [`SqlStore`]
//!   over each [`Dialect`], implementing [`idem_core::Store`]: every operation is one atomic
//!   statement judged on the database clock (see each dialect's module for its statements).
//! - **Group commit** ([`SqlStore::with_group_commit`], on by default): concurrent claims and
//!   completions that wait for a slot share a commit (PostgreSQL: one statement each; SQLite:
//!   one transaction), under the same guards.
//! - **Same-database mode**: when the business writes live in the same database as the
//!   records, `claim_in` / `complete_in` run on the caller's transaction, so the claim, the
//!   effects and the completion commit (or roll back) together.
//! - [`backstop`]: the seeds' last lines of defence, usable without the rest of idem: a precise
//!   unique-violation classifier, an insert-once helper, guarded state transitions and an
//!   optimistic lock.
//!
//! The guide `docs/sql-stores.md` shows the schema and each dialect's statements.
//!
//! # Fences survive expiry
//! Expired rows are kept as tombstones (a released or deleted record is made to expire now)
//! until the reaper deletes them, and a claim's fence is `max(previous + 1, clock in
//! microseconds)`. While the row exists the first term makes fences strictly increase; after the
//! reaper deleted it, the second does, because every earlier fence was at most its claim's
//! clock reading plus the claims made within the same microsecond, and the row expired at least
//! a millisecond after its last claim. A database clock stepped backwards could repeat a
//! number, which is why a lease is the pair (owner id, fence): owner ids are random per claim.
//!
//! # Example
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::{Engine, Fingerprint, Key, Answer, Scope, ScopedKey, Settlement, StoredResponse};
//! use idem_sql::SqliteStore;
//!
//! let dir = std::env::temp_dir().join(format!("idem-doc-{}.db", std::process::id()));
//! let store = SqliteStore::open(&dir).await?;
//! store.migrate().await?;
//! let engine = Engine::new(store, Default::default());
//! let key = ScopedKey::new(Scope::new("orders.create")?, Key::new("order-42")?);
//! let fp = Fingerprint::of_bytes(1, b"{\"sku\":\"tea\"}");
//! let first = engine.run(&key, &fp, |_lease| async { Settlement::complete((), StoredResponse::new(201, "made")) }).await?;
//! assert!(matches!(first, Answer::Executed { .. }));
//! let again = engine.run(&key, &fp, |_lease| async { Settlement::complete((), StoredResponse::new(201, "twice")) }).await?;
//! assert!(matches!(again, Answer::Replayed(r) if r.body == "made"));
//! # drop(engine); let _ = std::fs::remove_file(&dir);
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))] fn main() {}
//! ```

// Without a backend feature only the backstop's classifier-free parts remain.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused)
)]

mod audit;
pub mod backstop;
mod dialect;
mod driver;
mod group;
#[cfg(feature = "postgres")]
pub mod lock;
pub mod outbox;
mod reaper;
mod record;
mod statements;
mod store;
mod table;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod tokens;
mod tx;

pub use dialect::Dialect;
#[cfg(feature = "mysql")]
pub use dialect::mysql::{self, MySqlStore};
#[cfg(feature = "postgres")]
pub use dialect::postgres::{self, PgStore};
#[cfg(feature = "sqlite")]
pub use dialect::sqlite::{self, SqliteStore};
#[cfg(feature = "postgres")]
pub use lock::{PgHeld, PgLock};
pub use outbox::{DEFAULT_OUTBOX_TABLE, OutboxDialect, SqlOutbox};
pub use store::SqlStore;
pub use table::{DEFAULT_TABLE, TableName, TableNameError};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use tokens::{DEFAULT_TOKEN_TABLE, SqlTokens, TokenDialect};
pub use tx::{InTxError, TxOutcome};
