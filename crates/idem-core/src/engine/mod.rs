//! The engine: claim, run the handler under a renewed lease, then complete or release.
//!
//! Every carrier (HTTP, gRPC, consumers, plain functions) goes through [`Engine::run`], so
//! there is one state machine.
//!
//! ```
//! use idem_core::{Answer, Engine, Fingerprint, Key, MemoryStore, Scope, ScopedKey, Settlement, StoredResponse};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new(10_000), Default::default());
//! let key = ScopedKey::new(Scope::new("payments.charge")?, Key::new("order-42")?);
//! let fp = Fingerprint::of_bytes(1, b"amount=100");
//! for attempt in 0..2 {
//!     let outcome = engine
//!         .run(&key, &fp, |_lease| async {
//!             Settlement::complete("charged", StoredResponse::new(200, "charged"))
//!         })
//!         .await?;
//!     match outcome {
//!         Answer::Executed { .. } => assert_eq!(attempt, 0),
//!         Answer::Replayed(response) => assert_eq!(response.body, "charged"),
//!         other => panic!("unexpected {other:?}"),
//!     }
//! }
//! # Ok(()) }
//! ```

mod policy;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;
use tokio::time::Instant;

pub use policy::{LEASE_MARGIN, Policy, PolicyBuilder, PolicyError};

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::outcome::{Kept, Outcome};
use crate::record::{Lease, OwnerId, ReleaseKind, StoredResponse};
use crate::store::{ClaimOutcome, ClaimRequest, RenewOutcome, SettleOutcome, Store, StoreError};

/// What the handler asks the engine to do with its result.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Keep this response and replay it to every retry.
    Complete(StoredResponse),
    /// Keep nothing; release the claim as this kind.
    Release(ReleaseKind),
}

/// A handler's result: the value for this caller, and what to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement<T> {
    /// Returned to the caller of [`Engine::run`].
    pub output: T,
    /// What the engine records.
    pub action: Action,
}

impl<T> Settlement<T> {
    /// Return `output` and store `response` for replay.
    pub fn complete(output: T, response: StoredResponse) -> Self {
        Self {
            output,
            action: Action::Complete(response),
        }
    }

    /// Return `output` and release the claim.
    pub fn release(output: T, kind: ReleaseKind) -> Self {
        Self {
            output,
            action: Action::Release(kind),
        }
    }
}

/// What became of the handler's result after it ran.
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled {
    /// The response is stored for replay.
    Stored,
    /// The claim was released as asked.
    Released(ReleaseKind),
    /// Another holder took the key over meanwhile; the result was discarded.
    Fenced,
    /// The store failed while settling. The record stays processing until its lease runs
    /// out, then follows the takeover policy.
    Failed(StoreError),
}

/// The answer to one [`Engine::run`]; [`Answer::outcome`] names it for metrics and logs.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer<T> {
    /// This call claimed the key and ran the handler.
    Executed {
        /// The handler's output.
        output: T,
        /// The lease it ran under (its fence is the write token downstream).
        lease: Lease,
        /// True if an expired lease was taken over.
        takeover: bool,
        /// What was recorded.
        settled: Settled,
    },
    /// The key had completed; this is the stored response.
    Replayed(StoredResponse),
    /// Another holder is running the handler.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with a different fingerprint; nothing ran.
    Mismatch,
    /// An earlier attempt's outcome is unknown; nothing ran.
    Unknown,
}

impl<T> Answer<T> {
    /// What became of the request, for metrics, logs and audit.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Executed { settled, .. } => match settled {
                Settled::Stored => Outcome::Executed(Kept::Stored),
                Settled::Released(kind) => Outcome::Executed(Kept::Released(*kind)),
                Settled::Fenced => Outcome::Fenced,
                Settled::Failed(_) => Outcome::Executed(Kept::Unsettled),
            },
            Self::Replayed(_) => Outcome::Replayed,
            Self::InFlight { .. } => Outcome::InFlight,
            Self::Mismatch => Outcome::Mismatch,
            Self::Unknown => Outcome::Unknown,
        }
    }
}

/// The engine could not give a definite answer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The store failed before the handler ran; nothing ran.
    #[error("store failed")]
    Store(#[from] StoreError),
    /// The lease was lost while the handler ran; the handler was cancelled.
    #[error("lease lost; handler cancelled")]
    LeaseLost,
    /// The handler ran past its timeout and was cancelled; the claim was released per policy.
    #[error("handler timed out after {0:?}")]
    HandlerTimedOut(Duration),
    /// The handler panicked; the claim was released so a retry can run.
    #[error("handler panicked")]
    HandlerPanicked,
    /// A stored response could not be decoded into the caller's type.
    #[error("stored response does not decode: {0}")]
    Decode(String),
    /// The closure's value could not be encoded for storage; the claim was released.
    #[error("value does not encode: {0}")]
    Encode(String),
}

impl EngineError {
    /// What became of the request. `interrupted` is what an interrupted handler leaves
    /// behind under the run's policy ([`Policy::interrupted_release`]).
    pub fn outcome(&self, interrupted: ReleaseKind) -> Outcome {
        match self {
            Self::Store(_) => Outcome::StoreUnavailable,
            Self::LeaseLost => Outcome::Fenced,
            Self::HandlerTimedOut(_) => Outcome::Executed(Kept::Interrupted(interrupted)),
            Self::HandlerPanicked => Outcome::Executed(Kept::Interrupted(ReleaseKind::Retryable)),
            // A stored value was found; only its decoding for this caller failed.
            Self::Decode(_) => Outcome::Replayed,
            Self::Encode(_) => Outcome::Executed(Kept::Released(ReleaseKind::Retryable)),
        }
    }
}

/// The function-level answer of [`Engine::call_json`].
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply<T, E> {
    /// The closure ran now and succeeded; its value is stored.
    Executed(T),
    /// A stored value from an earlier run.
    Replayed(T),
    /// The closure ran now and failed; the claim was released so a retry runs again.
    Failed(E),
    /// Another holder is running it.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with different arguments.
    Mismatch,
    /// An earlier attempt's outcome is unknown.
    Unknown,
}

impl<T, E> Reply<T, E> {
    /// What became of the call, for metrics, logs and audit.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Executed(_) => Outcome::Executed(Kept::Stored),
            Self::Replayed(_) => Outcome::Replayed,
            Self::Failed(_) => Outcome::Executed(Kept::Released(ReleaseKind::Retryable)),
            Self::InFlight { .. } => Outcome::InFlight,
            Self::Mismatch => Outcome::Mismatch,
            Self::Unknown => Outcome::Unknown,
        }
    }
}

/// The idempotency engine over a store. Cheap to clone.
#[derive(Debug)]
pub struct Engine<S> {
    store: Arc<S>,
    policy: Arc<Policy>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<S: Store> Engine<S> {
    /// An engine over `store` with `policy` (validated when it was built).
    pub fn new(store: S, policy: Policy) -> Self {
        Self {
            store: Arc::new(store),
            policy: Arc::new(policy),
        }
    }

    /// The same store under another policy (per route or per operation).
    #[must_use]
    pub fn with_policy(&self, policy: Policy) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::new(policy),
        }
    }

    /// The store, for status and admin queries.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Runs `handler` at most once for `key`, or answers with what an earlier run left.
    ///
    /// See [`Engine::run_traced`].
    ///
    /// # Errors
    /// See [`EngineError`].
    pub async fn run<T, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        handler: F,
    ) -> Result<Answer<T>, EngineError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Settlement<T>>,
    {
        self.run_traced(key, fingerprint, None, handler).await
    }

    /// Runs `handler` at most once for `key`, keeping `request_id` on the record.
    ///
    /// The handler runs only after a claim is durable. While it runs, a watchdog renews the
    /// lease; if renewal is refused, or fails until the lease would have run out, the handler
    /// is cancelled and [`EngineError::LeaseLost`] returned. The handler's [`Settlement`]
    /// then completes or releases the claim.
    ///
    /// # Errors
    /// See [`EngineError`].
    ///
    /// # Cancel safety
    /// Dropping the future after the claim releases it in the background: retryable under
    /// `reexecute`, unknown under `hold`. No lease is orphaned.
    pub async fn run_traced<T, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        request_id: Option<&str>,
        handler: F,
    ) -> Result<Answer<T>, EngineError>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Settlement<T>>,
    {
        let policy = &*self.policy;
        let req = ClaimRequest {
            key: key.clone(),
            fingerprint: *fingerprint,
            owner: OwnerId::random(),
            lease: policy.lease,
            ttl: policy.record_ttl,
            takeover: policy.takeover,
            request_id: request_id.map(str::to_owned),
        };
        let (lease, takeover, sent_at) = match self.claim_or_wait(&req).await? {
            Claimed::Now {
                lease,
                takeover,
                sent_at,
            } => (lease, takeover, sent_at),
            Claimed::Not(outcome) => return Ok(outcome),
        };
        tracing::debug!(key = %key, fence = lease.fence, takeover, "claimed");
        let mut guard = ClaimGuard {
            store: &self.store,
            key,
            lease,
            kind: policy.interrupted_release(),
            store_timeout: policy.store_timeout,
            armed: true,
        };

        // Call the handler inside the guarded future, so a panic in the closure body itself
        // (before it returns its future) is caught as well.
        let started = Instant::now();
        let mut work =
            std::pin::pin!(AssertUnwindSafe(async move { handler(lease).await }).catch_unwind());
        // A handler that finishes on its first poll needs neither the timeout's timer nor the
        // watchdog; one that does not gets both, with the deadline counted from `started`.
        let result = match futures::poll!(work.as_mut()) {
            std::task::Poll::Ready(done) => Ok(done),
            std::task::Poll::Pending => {
                let timed = tokio::time::timeout_at(started + policy.handler_timeout, work);
                let lost = watchdog(&*self.store, key, lease, policy, sent_at);
                tokio::select! {
                    biased;
                    r = timed => r,
                    loss = lost => {
                        guard.armed = false;
                        tracing::warn!(key = %key, fence = lease.fence, ?loss, "lease lost; handler cancelled");
                        return Err(EngineError::LeaseLost);
                    }
                }
            }
        };
        let settlement = match result {
            Ok(Ok(settlement)) => settlement,
            Ok(Err(_panic)) => {
                guard.settle_now(ReleaseKind::Retryable).await;
                tracing::error!(key = %key, fence = lease.fence, "handler panicked; claim released");
                return Err(EngineError::HandlerPanicked);
            }
            Err(_elapsed) => {
                let kind = policy.interrupted_release();
                guard.settle_now(kind).await;
                tracing::warn!(key = %key, fence = lease.fence, ?kind, "handler timed out; claim released");
                return Err(EngineError::HandlerTimedOut(policy.handler_timeout));
            }
        };
        let settled = match &settlement.action {
            Action::Complete(response) => self.complete(key, lease, response).await,
            Action::Release(kind) => match timed_op(
                policy.store_timeout,
                self.store.release(key, lease.owner, lease.fence, *kind),
            )
            .await
            {
                Ok(SettleOutcome::Settled) => Settled::Released(*kind),
                Ok(_) => Settled::Fenced,
                Err(e) => Settled::Failed(e),
            },
        };
        guard.armed = false;
        match &settled {
            Settled::Fenced => {
                tracing::warn!(key = %key, fence = lease.fence, "result discarded: fenced by a newer holder")
            }
            Settled::Failed(e) => {
                tracing::error!(key = %key, fence = lease.fence, error = %e, "could not settle result")
            }
            _ => {}
        }
        Ok(Answer::Executed {
            output: settlement.output,
            lease,
            takeover,
            settled,
        })
    }

    /// Function-level convenience: runs `f` at most once for `key` and stores its `Ok` value
    /// as JSON; an `Err` releases the claim so a retry runs again.
    ///
    /// # Errors
    /// See [`EngineError`]; a stored value that does not decode as `T` is
    /// [`EngineError::Decode`].
    pub async fn call_json<T, E, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        f: F,
    ) -> Result<Reply<T, E>, EngineError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let outcome = self
            .run(key, fingerprint, |lease| async move {
                match f(lease).await {
                    Ok(value) => match serde_json::to_vec(&value) {
                        Ok(body) => Settlement::complete(Ok(value), StoredResponse::new(0, body)),
                        Err(e) => {
                            Settlement::release(Err(Err(e.to_string())), ReleaseKind::Retryable)
                        }
                    },
                    Err(e) => Settlement::release(Err(Ok(e)), ReleaseKind::Retryable),
                }
            })
            .await?;
        Ok(match outcome {
            Answer::Executed {
                output: Ok(value), ..
            } => Reply::Executed(value),
            Answer::Executed {
                output: Err(Ok(e)), ..
            } => Reply::Failed(e),
            Answer::Executed {
                output: Err(Err(encode)),
                ..
            } => return Err(EngineError::Encode(encode)),
            Answer::Replayed(response) => Reply::Replayed(
                serde_json::from_slice(&response.body)
                    .map_err(|e| EngineError::Decode(e.to_string()))?,
            ),
            Answer::InFlight { retry_after } => Reply::InFlight { retry_after },
            Answer::Mismatch => Reply::Mismatch,
            Answer::Unknown => Reply::Unknown,
        })
    }

    async fn claim_or_wait<T>(&self, req: &ClaimRequest) -> Result<Claimed<T>, EngineError> {
        let policy = &*self.policy;
        let give_up = policy.in_flight_wait.map(|w| Instant::now() + w);
        let mut poll = Duration::from_millis(10);
        loop {
            let sent_at = Instant::now();
            let outcome = timed_op(policy.store_timeout, self.store.claim(req)).await?;
            return Ok(match outcome {
                ClaimOutcome::Claimed { lease, takeover } => Claimed::Now {
                    lease,
                    takeover,
                    sent_at,
                },
                ClaimOutcome::Done { response } => Claimed::Not(Answer::Replayed(response)),
                ClaimOutcome::Unknown => Claimed::Not(Answer::Unknown),
                ClaimOutcome::Mismatch { .. } => Claimed::Not(Answer::Mismatch),
                ClaimOutcome::Busy { retry_after } => match give_up {
                    Some(deadline) if Instant::now() < deadline => {
                        let nap = poll
                            .min(retry_after)
                            .min(deadline.saturating_duration_since(Instant::now()));
                        tokio::time::sleep(nap.max(Duration::from_millis(1))).await;
                        poll = (poll * 2).min(Duration::from_millis(250));
                        continue;
                    }
                    _ => Claimed::Not(Answer::InFlight { retry_after }),
                },
            });
        }
    }

    async fn complete(&self, key: &ScopedKey, lease: Lease, response: &StoredResponse) -> Settled {
        let policy = &*self.policy;
        let mut attempt = 0;
        loop {
            let result = timed_op(
                policy.store_timeout,
                self.store
                    .complete(key, lease.owner, lease.fence, response, policy.record_ttl),
            )
            .await;
            match result {
                Ok(SettleOutcome::Settled) => return Settled::Stored,
                Ok(_) => return Settled::Fenced,
                // The effect happened: try a little harder to record it before giving up.
                // The write landed but too few replicas acknowledged it: retrying would only
                // meet the completed record and report a false `Fenced`.
                Err(e @ StoreError::Uncertain { .. }) => return Settled::Failed(e),
                Err(e) if attempt >= 2 => return Settled::Failed(e),
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, attempt, "complete failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                }
            }
        }
    }
}

enum Claimed<T> {
    Now {
        lease: Lease,
        takeover: bool,
        sent_at: Instant,
    },
    Not(Answer<T>),
}

/// Bounds a store call by the policy's store timeout.
async fn timed_op<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut op = std::pin::pin!(op);
    // A store that answers at once (memory, a cache hit) needs no timer.
    if let std::task::Poll::Ready(result) = futures::poll!(op.as_mut()) {
        return result;
    }
    match tokio::time::timeout(limit, op).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}

/// Why the watchdog gave up the lease.
#[derive(Debug)]
enum LeaseLoss {
    /// The store said another holder has the key.
    Taken,
    /// Renewals failed until the lease would have run out on our own clock.
    Expired,
}

/// Renews the lease every `renew_every`; resolves only when the lease is lost.
///
/// The local deadline is measured from when the last successful request was *sent*, on a
/// monotonic clock, so it is never later than the store's own deadline.
async fn watchdog<S: Store>(
    store: &S,
    key: &ScopedKey,
    lease: Lease,
    policy: &Policy,
    sent_at: Instant,
) -> LeaseLoss {
    let mut deadline = sent_at + policy.lease;
    loop {
        let wake = (Instant::now() + policy.renew_every).min(deadline);
        tokio::time::sleep_until(wake).await;
        if Instant::now() >= deadline {
            return LeaseLoss::Expired;
        }
        let sent = Instant::now();
        // A renewal still pending at the deadline must not keep the handler running past it.
        let limit = policy
            .store_timeout
            .min(deadline.saturating_duration_since(sent));
        match timed_op(
            limit,
            store.renew(key, lease.owner, lease.fence, policy.lease),
        )
        .await
        {
            Ok(RenewOutcome::Renewed { .. }) => deadline = sent + policy.lease,
            Ok(_) => return LeaseLoss::Taken,
            Err(e) => {
                tracing::warn!(key = %key, fence = lease.fence, error = %e, "lease renewal failed")
            }
        }
    }
}

/// Releases a claim if the run is abandoned before it settles. Borrows the run's store and
/// key; only a drop that must release in the background clones them.
struct ClaimGuard<'a, S: Store> {
    store: &'a Arc<S>,
    key: &'a ScopedKey,
    lease: Lease,
    kind: ReleaseKind,
    store_timeout: Duration,
    armed: bool,
}

impl<S: Store> ClaimGuard<'_, S> {
    async fn settle_now(&mut self, kind: ReleaseKind) {
        self.armed = false;
        let op = self
            .store
            .release(self.key, self.lease.owner, self.lease.fence, kind);
        if let Err(e) = timed_op(self.store_timeout, op).await {
            tracing::error!(key = %self.key, fence = self.lease.fence, error = %e, "release failed; lease will expire");
        }
    }
}

impl<S: Store> Drop for ClaimGuard<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(key = %self.key, "run dropped outside a runtime; lease will expire");
            return;
        };
        let (store, key, lease, kind, limit) = (
            Arc::clone(self.store),
            self.key.clone(),
            self.lease,
            self.kind,
            self.store_timeout,
        );
        tracing::warn!(key = %key, fence = lease.fence, ?kind, "run dropped mid-handler; releasing");
        runtime.spawn(async move {
            if let Err(e) = timed_op(limit, store.release(&key, lease.owner, lease.fence, kind)).await {
                tracing::error!(key = %key, error = %e, "release after drop failed; lease will expire");
            }
        });
    }
}
