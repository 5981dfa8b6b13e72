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

mod answer;
mod in_tx;
mod lease;
mod policy;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

pub use answer::{Action, Answer, EngineError, Reply, Settled, Settlement};
pub use in_tx::TxStore;
pub use policy::{LEASE_MARGIN, Policy, PolicyBuilder, PolicyError};

use lease::{ClaimGuard, timed_op, watchdog};

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Lease, OwnerId, ReleaseKind, StoredResponse};
use crate::store::{ClaimOutcome, ClaimRequest, SettleOutcome, Store, StoreError};

/// The span field [`Engine::run_traced`] records the hashed scoped key in.
pub const SPAN_KEY: &str = "idem.key";
/// The span field [`Engine::run_traced`] records the claim's fence in.
pub const SPAN_FENCE: &str = "idem.fence";

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
    /// # Tracing
    /// The current span, if it declares them, gets `idem.key` (the scoped key's
    /// [digest](ScopedKey::digest_hex), never the key itself) and, once claimed, `idem.fence`.
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
        let span = tracing::Span::current();
        if !span.is_disabled() && span.has_field(SPAN_KEY) {
            span.record(SPAN_KEY, key.digest_hex());
        }
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
        span.record(SPAN_FENCE, lease.fence);
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
