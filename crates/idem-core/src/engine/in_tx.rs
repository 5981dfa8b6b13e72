//! Same-transaction runs: the claim, the handler's own writes and the completion commit in one
//! database transaction (the inbox pattern), through the same engine and the same answers.
//!
//! A store that keeps its records in the database the handler writes to implements
//! [`TxStore`] (idem-sql does, for PostgreSQL, MariaDB and SQLite); [`Engine::run_in_tx`]
//! then begins a transaction, claims on it, runs the work on it, completes on it and commits.
//! There is no lease to keep alive: a concurrent claim of the same key waits on the row lock
//! until the transaction ends, then sees the completed record (or, after a rollback, claims
//! afresh). A crash anywhere before the commit leaves neither the record nor the writes.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::Engine;
use super::answer::{Answer, EngineError, Settled};
use super::lease::timed_op;
use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Lease, OwnerId, ReleaseKind, StoredResponse};
use crate::store::{ClaimOutcome, ClaimRequest, SettleOutcome, Store, StoreError};

/// A store whose records can be written inside a caller's database transaction.
///
/// # Cancel safety
/// Dropping a `Tx` without [`TxStore::commit`] rolls it back: neither the claim nor anything
/// written on it remains.
pub trait TxStore: Store {
    /// An open transaction; the work writes on it.
    type Tx: Send;

    /// Begins a transaction.
    ///
    /// # Errors
    /// [`StoreError`] when the database could not be reached.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Claims a key inside `tx`.
    ///
    /// # Errors
    /// [`StoreError`] when a statement failed; the transaction is then unusable.
    fn claim_in(
        &self,
        tx: &mut Self::Tx,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Completes a claim made with [`TxStore::claim_in`] inside the same `tx`.
    ///
    /// # Errors
    /// [`StoreError`] when the statement failed.
    fn complete_in(
        &self,
        tx: &mut Self::Tx,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send;

    /// Commits `tx`.
    ///
    /// # Errors
    /// [`StoreError`] when the commit failed or its result is not known (the connection broke
    /// while committing): the writes may or may not have landed.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Ends `tx`, keeping nothing written on it, and frees its locks now. The engine calls it
    /// whenever it does not commit. The default drops `tx`; a store whose driver rolls back
    /// a dropped transaction only later (when the connection is next used or returned to a
    /// pool) should roll back here, so the row lock a claim took is not held meanwhile.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = ()> + Send {
        drop(tx);
        std::future::ready(())
    }
}

impl<S: TxStore> Engine<S> {
    /// Runs `work` at most once for `key`, inside the transaction that records the key.
    ///
    /// `work` gets the open transaction and the lease, and returns its output and the response
    /// to store. Its `Ok` commits the writes together with the completion
    /// ([`Settled::Stored`]); its `Err` rolls everything back and the answer is
    /// `Executed { output: Err(e), settled: Released(Retryable) }`, so a retry runs again. A
    /// failed commit is [`Settled::Failed`]: whether the writes landed is not known, and the
    /// next claim finds out (completed, or absent after a rollback).
    ///
    /// # Errors
    /// [`EngineError::Store`] when the transaction could not begin or the claim failed (nothing
    /// ran), [`EngineError::HandlerTimedOut`] / [`EngineError::HandlerPanicked`] when the work
    /// did not finish (rolled back).
    ///
    /// # Cancel safety
    /// Dropping the future drops the transaction: everything rolls back.
    pub async fn run_in_tx<T, E, F>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        request_id: Option<&str>,
        work: F,
    ) -> Result<Answer<Result<T, E>>, EngineError>
    where
        F: for<'c> FnOnce(&'c mut S::Tx, Lease) -> BoxFuture<'c, Result<(T, StoredResponse), E>>,
    {
        let policy = self.policy();
        let store = &**self.store();
        // A crash rolls the effect back with the claim: by default, a leftover expired lease
        // is run again.
        let req = self.claim_request(key, fingerprint, request_id, policy.takeover_in_tx());
        let mut tx = timed_op(policy.store_timeout, store.begin()).await?;
        // The claim may wait on another transaction's row lock: that wait is the in-flight
        // duplicate finishing, so it is bounded by the handler timeout, not the store timeout.
        let claim = timed_op(
            policy.store_timeout + policy.handler_timeout,
            store.claim_in(&mut tx, &req),
        )
        .await?;
        let (lease, takeover) = match claim {
            ClaimOutcome::Claimed { lease, takeover } => (lease, takeover),
            ClaimOutcome::Unknown { fence, age } => {
                end(store, tx, policy.store_timeout).await;
                // Settled from the probe, if any; a released key runs on the caller's retry.
                return self
                    .settle_unknown(key, fence, age, false)
                    .await
                    .map(|a| a.unwrap_or(Answer::Unknown));
            }
            other => {
                // Nothing to keep: the claim only read (or waited on) the record.
                end(store, tx, policy.store_timeout).await;
                return Ok(Answer::unclaimed(other));
            }
        };
        tracing::debug!(key = %key, fence = lease.fence, takeover, "claimed in transaction");
        let ran = tokio::time::timeout(
            policy.handler_timeout,
            AssertUnwindSafe(work(&mut tx, lease)).catch_unwind(),
        )
        .await;
        let (output, response) = match ran {
            Ok(Ok(Ok(done))) => done,
            Ok(Ok(Err(e))) => {
                end(store, tx, policy.store_timeout).await;
                return Ok(Answer::Executed {
                    output: Err(e),
                    lease,
                    takeover,
                    settled: Settled::Released(ReleaseKind::Retryable),
                });
            }
            Ok(Err(_panic)) => {
                end(store, tx, policy.store_timeout).await;
                tracing::error!(key = %key, "work panicked; transaction rolled back");
                return Err(EngineError::HandlerPanicked);
            }
            Err(_elapsed) => {
                end(store, tx, policy.store_timeout).await;
                tracing::warn!(key = %key, "work timed out; transaction rolled back");
                return Err(EngineError::HandlerTimedOut(policy.handler_timeout));
            }
        };
        let settled = self.commit_in(tx, key, lease, &response).await?;
        Ok(Answer::Executed {
            output: Ok(output),
            lease,
            takeover,
            settled,
        })
    }

    /// Completes `lease`'s claim inside `tx` and commits it; rolls back instead when the
    /// completion was fenced.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the completion's statement failed (rolled back).
    async fn commit_in(
        &self,
        mut tx: S::Tx,
        key: &ScopedKey,
        lease: Lease,
        response: &StoredResponse,
    ) -> Result<Settled, EngineError> {
        let policy = self.policy();
        let store = &**self.store();
        let completed = timed_op(
            policy.store_timeout,
            store.complete_in(
                &mut tx,
                key,
                lease.owner,
                lease.fence,
                response,
                policy.record_ttl,
            ),
        )
        .await;
        Ok(match completed {
            Ok(SettleOutcome::Settled) => {
                match timed_op(policy.store_timeout, store.commit(tx)).await {
                    Ok(()) => Settled::Stored,
                    Err(e) => {
                        tracing::error!(key = %key, error = %e, "commit failed; outcome not known");
                        Settled::Failed(e)
                    }
                }
            }
            // Rolled back: neither the writes nor the record stay.
            Ok(_) => {
                end(store, tx, policy.store_timeout).await;
                Settled::Fenced
            }
            Err(e) => {
                end(store, tx, policy.store_timeout).await;
                return Err(EngineError::Store(e));
            }
        })
    }
}

/// Rolls `tx` back, waiting at most `limit`: past it the transaction is dropped, which rolls
/// it back once the driver gets to it.
async fn end<S: TxStore>(store: &S, tx: S::Tx, limit: std::time::Duration) {
    let _ = tokio::time::timeout(limit, store.rollback(tx)).await;
}
