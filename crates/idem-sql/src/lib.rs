//! idem stores on SQL databases, and the business-side backstop toolkit.
//!
//! - [`PgStore`] (feature `postgres`), [`MySqlStore`] (feature `mysql`, MySQL 8 / MariaDB
//!   10.5+) and [`SqliteStore`] (feature `sqlite`, the gateway's embedded default) implement
//!   [`idem_core::Store`]: every operation is one atomic statement judged on the database clock
//!   (see each module for the exact statement and its dialect notes).
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

pub mod backstop;
mod common;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use common::{DEFAULT_TABLE, TableName, TableNameError};
#[cfg(feature = "mysql")]
pub use mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// What a same-database run (`run_in_tx`) did.
#[derive(Debug)]
#[non_exhaustive]
pub enum TxOutcome<T> {
    /// The claim was won; the work ran and committed with its completion.
    Executed(T),
    /// The key had completed; this is the stored response. Nothing ran.
    Replayed(idem_core::StoredResponse),
    /// Another holder's claim is live (only seen when that holder is not in same-database
    /// mode: a transaction in progress makes claims wait instead). Nothing ran.
    InFlight {
        /// When to try again.
        retry_after: std::time::Duration,
    },
    /// The key was used with a different fingerprint. Nothing ran.
    Mismatch,
    /// An earlier attempt's outcome is unknown. Nothing ran.
    Unknown,
}

impl<T> TxOutcome<T> {
    /// The answer for a claim that was not won (`run_in_tx` handles `Claimed` itself).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(dead_code)
    )]
    fn from_claim(claim: idem_core::ClaimOutcome) -> Self {
        match claim {
            idem_core::ClaimOutcome::Done { response } => Self::Replayed(response),
            idem_core::ClaimOutcome::Busy { retry_after } => Self::InFlight { retry_after },
            idem_core::ClaimOutcome::Mismatch { .. } => Self::Mismatch,
            _ => Self::Unknown,
        }
    }
}

/// A store that claims and completes on a connection the caller holds (same-database mode):
/// what [`claim_work_complete`] needs of each backend.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
trait InTx {
    /// The backend's connection type (a transaction dereferences to it).
    type Conn;

    fn claim_on<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        req: &'a idem_core::ClaimRequest,
    ) -> impl Future<Output = Result<idem_core::ClaimOutcome, idem_core::StoreError>> + Send + 'a;

    fn complete_on<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        req: &'a idem_core::ClaimRequest,
        lease: idem_core::Lease,
        response: &'a idem_core::StoredResponse,
    ) -> impl Future<Output = Result<idem_core::SettleOutcome, idem_core::StoreError>> + Send + 'a;
}

/// Implements [`InTx`] for a store through its own `claim_in` and `complete_in`, and the
/// reaper's `Reap` through its own `reap` and `table`.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_macros)
)]
macro_rules! in_tx_by_inherent_methods {
    ($store:ty, $conn:ty) => {
        impl $crate::InTx for $store {
            type Conn = $conn;

            fn claim_on<'a>(
                &'a self,
                conn: &'a mut $conn,
                req: &'a ::idem_core::ClaimRequest,
            ) -> impl Future<Output = Result<::idem_core::ClaimOutcome, ::idem_core::StoreError>>
            + Send
            + 'a {
                self.claim_in(conn, req)
            }

            fn complete_on<'a>(
                &'a self,
                conn: &'a mut $conn,
                req: &'a ::idem_core::ClaimRequest,
                lease: ::idem_core::Lease,
                response: &'a ::idem_core::StoredResponse,
            ) -> impl Future<Output = Result<::idem_core::SettleOutcome, ::idem_core::StoreError>>
            + Send
            + 'a {
                self.complete_in(conn, &req.key, lease.owner, lease.fence, response, req.ttl)
            }
        }

        impl $crate::common::Reap for $store {
            fn table_name(&self) -> &$crate::common::TableName {
                &self.table
            }

            fn reap_pass(
                &self,
                batch: u32,
            ) -> impl Future<Output = Result<u64, ::idem_core::StoreError>> + Send {
                self.reap(batch)
            }
        }
    };
}
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports)
)]
pub(crate) use in_tx_by_inherent_methods;

/// Every backend's `run_in_tx` once its transaction `tx` is open: claims `req.key` in it,
/// and when the claim is won runs `work` there, completes and commits. Any other answer, or
/// any failure, drops (rolls back) the transaction.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
async fn claim_work_complete<DB, S, T, E, F>(
    store: &S,
    mut tx: sqlx::Transaction<'_, DB>,
    req: &idem_core::ClaimRequest,
    work: F,
) -> Result<TxOutcome<T>, InTxError<E>>
where
    DB: sqlx::Database,
    S: InTx<Conn = DB::Connection>,
    F: for<'c> FnOnce(
        &'c mut DB::Connection,
    )
        -> futures::future::BoxFuture<'c, Result<(T, idem_core::StoredResponse), E>>,
{
    let lease = match store.claim_on(&mut tx, req).await? {
        idem_core::ClaimOutcome::Claimed { lease, .. } => lease,
        other => return Ok(TxOutcome::from_claim(other)),
    };
    let (output, response) = work(&mut tx).await.map_err(InTxError::Work)?;
    match store.complete_on(&mut tx, req, lease, &response).await? {
        idem_core::SettleOutcome::Settled => {}
        _ => {
            return Err(InTxError::Store(idem_core::StoreError::unavailable(
                "claim lost inside its own transaction",
            )));
        }
    }
    tx.commit()
        .await
        .map_err(|e| InTxError::Store(idem_core::StoreError::unavailable(e)))?;
    Ok(TxOutcome::Executed(output))
}

/// Why a same-database run failed. Either way the transaction rolled back: no record and no
/// business row remain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InTxError<E> {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] idem_core::StoreError),
    /// The work returned an error.
    #[error("work failed inside the transaction")]
    Work(#[source] E),
}
