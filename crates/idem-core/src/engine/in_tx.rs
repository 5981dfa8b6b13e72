//! Same-transaction runs: the claim, the handler's own writes and the completion commit in one
//! database transaction (the inbox pattern), through the same engine and the same answers.
//!
//! A store that keeps its records in the database the handler writes to implements
//! [`TxStore`] (idem-sql does, for PostgreSQL, MariaDB and SQLite); [`Engine::run_in_tx`]
//! then begins a transaction, claims on it, runs the work on it, completes on it and commits.
//! There is no lease to keep alive: a concurrent claim of the same key waits on the row lock
//! until the transaction ends, then sees the completed record (or, after a rollback, claims
//! afresh). A crash anywhere before the commit leaves neither the record nor the writes.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::Engine;
use super::answer::{Answer, EngineError, Settled};
use super::lease::timed_op;
use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Lease, ReleaseKind, StoredResponse};
use crate::store::{
    ClaimOutcome, ClaimRequest, Completion, Hold, SettleOutcome, Store, StoreError,
};

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
        completion: &Completion<'_>,
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
        let (mut tx, lease, takeover) = match self.claim_tx(key, fingerprint, request_id).await? {
            Claimed::Won(tx, lease, takeover) => (tx, lease, takeover),
            Claimed::Answered(answer) => return Ok(answer),
        };
        let policy = self.policy();
        let ran = tokio::time::timeout(
            policy.handler_timeout,
            AssertUnwindSafe(work(&mut tx, lease)).catch_unwind(),
        )
        .await;
        let done = match finished(key, ran, policy.handler_timeout) {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                end(&**self.store(), tx, policy.store_timeout).await;
                return Ok(rolled_back(e, lease, takeover));
            }
            Err(e) => {
                end(&**self.store(), tx, policy.store_timeout).await;
                return Err(e);
            }
        };
        self.settle_tx(tx, key, lease, takeover, done).await
    }

    /// [`Engine::run_in_tx`] for work that must own the transaction while it runs: work that
    /// hands it on to code which cannot borrow it, such as a tower service handling a request
    /// (idem-http's same-transaction layer puts it in the request as a [`SharedTx`]).
    ///
    /// `work` gets the transaction and gives it back with its result. Given back with `Ok`,
    /// the writes commit with the completion; with `Err`, everything rolls back, as in
    /// [`Engine::run_in_tx`]. Not given back (`None`), nothing can commit: the transaction
    /// rolls back when its holder drops it, and the run ends in [`EngineError::TxNotReturned`]
    /// (or, with `Err`, the released answer).
    ///
    /// # Errors
    /// As [`Engine::run_in_tx`], and [`EngineError::TxNotReturned`].
    ///
    /// # Cancel safety
    /// As [`Engine::run_in_tx`]: dropping the future drops the transaction.
    pub async fn run_in_tx_owned<T, E, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        request_id: Option<&str>,
        work: F,
    ) -> Result<Answer<Result<T, E>>, EngineError>
    where
        F: FnOnce(S::Tx, Lease) -> Fut,
        Fut: Future<Output = (Option<S::Tx>, Result<(T, StoredResponse), E>)> + Send,
    {
        let (tx, lease, takeover) = match self.claim_tx(key, fingerprint, request_id).await? {
            Claimed::Won(tx, lease, takeover) => (tx, lease, takeover),
            Claimed::Answered(answer) => return Ok(answer),
        };
        let policy = self.policy();
        // A panic or a timeout drops the transaction inside the work's future: the driver
        // rolls it back.
        let ran = tokio::time::timeout(
            policy.handler_timeout,
            AssertUnwindSafe(work(tx, lease)).catch_unwind(),
        )
        .await
        .map(|caught| {
            caught.map(|(tx, result)| match result {
                Ok(done) => Ok((tx, done)),
                Err(e) => Err((tx, e)),
            })
        });
        match finished(key, ran, policy.handler_timeout)? {
            Ok((Some(tx), done)) => self.settle_tx(tx, key, lease, takeover, done).await,
            Ok((None, _)) => {
                tracing::error!(key = %key, "work kept its transaction; nothing committed");
                Err(EngineError::TxNotReturned)
            }
            Err((tx, e)) => {
                if let Some(tx) = tx {
                    end(&**self.store(), tx, policy.store_timeout).await;
                }
                Ok(rolled_back(e, lease, takeover))
            }
        }
    }

    /// Begins a transaction and claims `key` in it: the transaction and the claim when won,
    /// else the answer (the transaction already rolled back).
    async fn claim_tx<T>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        request_id: Option<&str>,
    ) -> Result<Claimed<S::Tx, T>, EngineError> {
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
        .await;
        let claim = match claim {
            Ok(claim) => claim,
            Err(e) => {
                end(store, tx, policy.store_timeout).await;
                return Err(e.into());
            }
        };
        match claim {
            ClaimOutcome::Claimed { lease, takeover } => {
                tracing::debug!(key = %key, fence = lease.fence, takeover, "claimed in transaction");
                Ok(Claimed::Won(tx, lease, takeover))
            }
            ClaimOutcome::Unknown { fence, age } => {
                end(store, tx, policy.store_timeout).await;
                // Settled from the probe, if any; a released key runs on the caller's retry.
                let answer = self.settle_unknown(key, fence, age, false).await?;
                Ok(Claimed::Answered(answer.unwrap_or(Answer::Unknown)))
            }
            other => {
                // Nothing to keep: the claim only read (or waited on) the record.
                end(store, tx, policy.store_timeout).await;
                Ok(Claimed::Answered(Answer::unclaimed(other)))
            }
        }
    }

    /// Completes and commits a run whose work succeeded.
    async fn settle_tx<T, E>(
        &self,
        tx: S::Tx,
        key: &ScopedKey,
        lease: Lease,
        takeover: bool,
        (output, response): (T, StoredResponse),
    ) -> Result<Answer<Result<T, E>>, EngineError> {
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
        let completion = Completion::new(Hold::of(key, &lease), response, policy.record_ttl);
        let completed = timed_op(
            policy.store_timeout,
            store.complete_in(&mut tx, &completion),
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

/// A transaction shared with code that cannot borrow it: a tower service gets it as a request
/// extension, its handler locks it to write, and the run takes it back when the handler has
/// answered, to complete the key in it and commit. Cheap to clone; every clone is the same
/// transaction.
pub struct SharedTx<Tx>(Arc<tokio::sync::Mutex<Option<Tx>>>);

impl<Tx> SharedTx<Tx> {
    /// Shares `tx`.
    pub fn new(tx: Tx) -> Self {
        Self(Arc::new(tokio::sync::Mutex::new(Some(tx))))
    }

    /// Locks the transaction to write on it; waits while another clone holds it. `None` once
    /// the run has taken it back: the handler answered, and what it writes now would not
    /// commit.
    pub async fn lock(&self) -> Option<tokio::sync::OwnedMappedMutexGuard<Option<Tx>, Tx>> {
        // An owned guard: it borrows nothing, so a task it moves into is `'static`.
        let guard = Arc::clone(&self.0).lock_owned().await;
        tokio::sync::OwnedMutexGuard::try_map(guard, Option::as_mut).ok()
    }

    /// Takes the transaction back. `None` when it was taken already, or when a clone still
    /// holds the lock (work that goes on after its handler answered): such a transaction
    /// cannot commit, and rolls back when its holder drops it.
    pub fn take(&self) -> Option<Tx> {
        self.0.try_lock().ok()?.take()
    }
}

impl<Tx> Clone for SharedTx<Tx> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<Tx> fmt::Debug for SharedTx<Tx> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTx").finish_non_exhaustive()
    }
}

/// What claiming in a new transaction came to.
enum Claimed<Tx, T> {
    /// Won: the open transaction, the lease, and whether it took an expired claim over.
    Won(Tx, Lease, bool),
    /// Not won: the answer for the caller.
    Answered(Answer<T>),
}

/// The work's result, or why it did not finish (it panicked or ran out of time).
fn finished<R>(
    key: &ScopedKey,
    ran: Result<std::thread::Result<R>, tokio::time::error::Elapsed>,
    limit: std::time::Duration,
) -> Result<R, EngineError> {
    match ran {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(_panic)) => {
            tracing::error!(key = %key, "work panicked; transaction rolled back");
            Err(EngineError::HandlerPanicked)
        }
        Err(_elapsed) => {
            tracing::warn!(key = %key, "work timed out; transaction rolled back");
            Err(EngineError::HandlerTimedOut(limit))
        }
    }
}

/// The answer for work that failed: everything rolled back, so a retry runs again.
fn rolled_back<T, E>(e: E, lease: Lease, takeover: bool) -> Answer<Result<T, E>> {
    Answer::Executed {
        output: Err(e),
        lease,
        takeover,
        settled: Settled::Released(ReleaseKind::Retryable),
    }
}

/// Rolls `tx` back, waiting at most `limit`: past it the transaction is dropped, which rolls
/// it back once the driver gets to it.
async fn end<S: TxStore>(store: &S, tx: S::Tx, limit: std::time::Duration) {
    let _ = tokio::time::timeout(limit, store.rollback(tx)).await;
}
