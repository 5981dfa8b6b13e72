//! Same-database mode: the claim, the business writes and the completion in one transaction.

use std::time::Duration;

use futures::future::BoxFuture;
use idem_core::store::{Completion, Hold};
use idem_core::{ClaimOutcome, ClaimRequest, SettleOutcome, StoreError, StoredResponse, TxStore};

use crate::SqlStore;
use crate::dialect::Dialect;
use crate::driver::On;

/// What a same-database run (`run_in_tx`) did.
#[derive(Debug)]
#[non_exhaustive]
pub enum TxOutcome<T> {
    /// The claim was won; the work ran and committed with its completion.
    Executed(T),
    /// The key had completed; this is the stored response. Nothing ran.
    Replayed(StoredResponse),
    /// Another holder's claim is live (only seen when that holder is not in same-database
    /// mode: a transaction in progress makes claims wait instead). Nothing ran.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with a different fingerprint. Nothing ran.
    Mismatch,
    /// An earlier attempt's outcome is unknown. Nothing ran.
    Unknown,
}

impl<T> TxOutcome<T> {
    /// The answer for a claim that was not won (`run_in_tx` handles `Claimed` itself).
    fn from_claim(claim: ClaimOutcome) -> Self {
        match claim {
            ClaimOutcome::Done { response } => Self::Replayed(response),
            ClaimOutcome::Busy { retry_after } => Self::InFlight { retry_after },
            ClaimOutcome::Mismatch { .. } => Self::Mismatch,
            _ => Self::Unknown,
        }
    }
}

/// Why a same-database run failed. Either way the transaction rolled back: no record and no
/// business row remain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InTxError<E> {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The work returned an error.
    #[error("work failed inside the transaction")]
    Work(#[source] E),
}

impl<D: Dialect> SqlStore<D> {
    /// Claims a key on the caller's connection, typically inside the transaction that also
    /// carries the business writes (same-database mode). Commit makes the claim, the writes and
    /// the [`SqlStore::complete_in`] durable together; a rollback leaves no trace. Concurrent
    /// claims of the same key wait for that transaction to end.
    ///
    /// PostgreSQL needs `READ COMMITTED` (its default): under `REPEATABLE READ` a concurrent
    /// claim makes the claim fail with a serialization error. SQLite transactions must begin
    /// with `BEGIN IMMEDIATE`, as [`SqlStore::run_in_tx`] does. MariaDB connections must not
    /// enable the `SIMULTANEOUS_ASSIGNMENT` SQL mode. On MySQL (the claim is an upsert, then a
    /// read) the connection must be inside a transaction.
    ///
    /// # Errors
    /// [`StoreError`] when a statement failed (a MariaDB deadlock included: the server then
    /// rolled the transaction back); the transaction is then unusable.
    pub async fn claim_in(
        &self,
        conn: &mut D::Connection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_on(Some(conn), req).await
    }

    /// Completes a claim made with [`SqlStore::claim_in`] on the same connection.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed.
    pub async fn complete_in(
        &self,
        conn: &mut D::Connection,
        completion: &Completion<'_>,
    ) -> Result<SettleOutcome, StoreError> {
        self.complete_on(On::Conn(conn), completion).await
    }

    /// Same-database mode in one call: begins a transaction on the writer (SQLite: `BEGIN
    /// IMMEDIATE`), claims `req.key`, and when the claim is won runs `work` on the
    /// transaction; `work` returns its output and the response to store. The completion
    /// commits with `work`'s writes. Any other answer, or any failure, rolls the transaction
    /// back and leaves no record and no business row.
    ///
    /// # Errors
    /// [`InTxError::Store`] when the database failed, [`InTxError::Work`] with `work`'s error.
    pub async fn run_in_tx<T, E, F>(
        &self,
        req: &ClaimRequest,
        work: F,
    ) -> Result<TxOutcome<T>, InTxError<E>>
    where
        F: for<'c> FnOnce(&'c mut D::Connection) -> BoxFuture<'c, Result<(T, StoredResponse), E>>,
    {
        let mut tx = self.begin().await.map_err(StoreError::unavailable)?;
        let lease = match self.claim_in(&mut tx, req).await? {
            ClaimOutcome::Claimed { lease, .. } => lease,
            other => return Ok(TxOutcome::from_claim(other)),
        };
        let (output, response) = work(&mut tx).await.map_err(InTxError::Work)?;
        let on = On::Conn(&mut *tx);
        let completion = Completion::new(Hold::of(&req.key, &lease), &response, req.ttl);
        match self.complete_on(on, &completion).await? {
            SettleOutcome::Settled => {}
            _ => {
                return Err(InTxError::Store(StoreError::unavailable(
                    "claim lost inside its own transaction",
                )));
            }
        }
        tx.commit().await.map_err(StoreError::unavailable)?;
        Ok(TxOutcome::Executed(output))
    }
}

/// The engine's same-transaction entry point ([`idem_core::Engine::run_in_tx`]) on a SQL store:
/// the transaction is sqlx's, begun on the writer (SQLite: `BEGIN IMMEDIATE`).
impl<D: Dialect> TxStore for SqlStore<D> {
    type Tx = sqlx::Transaction<'static, D>;

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        SqlStore::begin(self).await.map_err(StoreError::unavailable)
    }

    async fn claim_in(
        &self,
        tx: &mut Self::Tx,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_on(Some(&mut **tx), req).await
    }

    async fn complete_in(
        &self,
        tx: &mut Self::Tx,
        completion: &Completion<'_>,
    ) -> Result<SettleOutcome, StoreError> {
        self.complete_on(On::Conn(&mut **tx), completion).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError> {
        tx.commit().await.map_err(StoreError::unavailable)
    }

    /// Rolls back now: sqlx only queues the rollback of a dropped transaction, and the claim's
    /// row lock would stay held until the connection is used or returned to the pool.
    async fn rollback(&self, tx: Self::Tx) {
        if let Err(e) = tx.rollback().await {
            tracing::debug!(error = %e, "rollback failed; the connection drops the transaction");
        }
    }
}
