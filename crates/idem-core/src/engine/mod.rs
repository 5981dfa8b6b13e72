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
mod probe;
mod unseen;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

pub use answer::{Action, Answer, EngineError, Reply, Settled, Settlement};
pub use in_tx::{SharedTx, TxStore};
pub use policy::{HELD_LEASE, LEASE_MARGIN, Policy, PolicyBuilder, PolicyError};
pub use probe::{Probe, ProbeAnswer, ProbeFn, ProbeFuture};

use lease::{ClaimGuard, timed_call, timed_op, watchdog};

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Lease, OwnerId, ReleaseKind, StoredResponse, TakeoverPolicy};
use crate::store::{
    ClaimOutcome, ClaimRequest, Completion, Hold, Resolution, ResolveOutcome, SettleOutcome, Store,
    StoreError,
};

/// The span field [`Engine::run_traced`] records the hashed scoped key in.
pub const SPAN_KEY: &str = "idem.key";
/// The span field [`Engine::run_traced`] records the claim's fence in.
pub const SPAN_FENCE: &str = "idem.fence";
/// The audit actor of the settlements the engine makes from a [`Probe`]'s answer.
pub const PROBE_ACTOR: &str = "engine:probe";

/// The idempotency engine over a store. Cheap to clone.
pub struct Engine<S> {
    store: Arc<S>,
    policy: Arc<Policy>,
    probe: Option<Arc<dyn Probe>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
            probe: self.probe.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("probe", &self.probe.is_some())
            .finish()
    }
}

impl<S: Store> Engine<S> {
    /// An engine over `store` with `policy` (validated when it was built).
    pub fn new(store: S, policy: Policy) -> Self {
        Self {
            store: Arc::new(store),
            policy: Arc::new(policy),
            probe: None,
        }
    }

    /// The same store under another policy (per route or per operation), keeping the probe.
    #[must_use]
    pub fn with_policy(&self, policy: Policy) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::new(policy),
            probe: self.probe.clone(),
        }
    }

    /// The same engine, settling unknown keys by asking `probe` (see [`Probe`]) before it
    /// answers "unknown".
    #[must_use]
    pub fn with_probe(&self, probe: Arc<dyn Probe>) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
            probe: Some(probe),
        }
    }

    /// Whether this engine asks a probe about unknown keys.
    pub fn has_probe(&self) -> bool {
        self.probe.is_some()
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
    // Not an `async fn`: one that only awaited `run_traced` would wrap its future in another
    // of the same size, copied on every call.
    pub fn run<T, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        handler: F,
    ) -> impl Future<Output = Result<Answer<T>, EngineError>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Settlement<T>>,
    {
        self.run_traced(key, fingerprint, None, handler)
    }

    /// Runs `handler` at most once for `key`, keeping `request_id` on the record.
    ///
    /// The handler runs only after a claim is durable, and is cancelled at the handler
    /// timeout, counted from when the claim was sent. While it runs, a watchdog renews the
    /// lease. Under `reexecute`, if renewal is refused, or fails until the lease would have
    /// run out, the handler is cancelled and [`EngineError::LeaseLost`] returned (a retry may
    /// run it again); under `hold` nobody runs it again blind, so the handler goes on and its
    /// result is recorded if it still holds the key (a late holder may complete its record
    /// after a retry marked it unknown). The handler's [`Settlement`] then completes or
    /// releases the claim.
    ///
    /// A claim that finds the key unknown asks the engine's [`Probe`], if it has one (see
    /// [`Engine::with_probe`]), and settles the key from its answer.
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
        // The request is dropped once the claim is answered: the rest of the run does not
        // carry it.
        let claimed = {
            let req = self.claim_request(key, fingerprint, request_id, policy.takeover);
            self.claim_or_wait(&req).await?
        };
        let (lease, takeover, sent_at) = match claimed {
            Claimed::Now {
                lease,
                takeover,
                sent_at,
            } => (lease, takeover, sent_at),
            Claimed::Not(outcome) => return Ok(outcome),
        };
        span.record(SPAN_FENCE, lease.fence);
        tracing::debug!(key = %key, fence = lease.fence, takeover, "claimed");
        let mut guard = ClaimGuard::armed(&self.store, key, lease, policy);

        // The attempt's time counts from before the claim was sent, so on the store's clock it
        // ends no later than the record's age says (a probe's "not done" is believed past it).
        let started = sent_at;
        if Instant::now() >= started + policy.handler_timeout {
            // Paused (or starved) between the claim and here: too late to start the effect.
            guard.settle_now(ReleaseKind::Retryable).await;
            tracing::warn!(key = %key, fence = lease.fence, "claim came back after the handler timeout; not run, released");
            return Err(EngineError::HandlerTimedOut(policy.handler_timeout));
        }
        // Call the handler inside the guarded future, so a panic in the closure body itself
        // (before it returns its future) is caught as well.
        let mut work =
            std::pin::pin!(AssertUnwindSafe(async move { handler(lease).await }).catch_unwind());
        // A handler that finishes on its first poll needs neither the timeout's timer nor the
        // watchdog; one that does not gets both, with the deadline counted from `started`.
        // Their timers and renewal state are boxed, so this future stays small for the
        // handlers that never wait.
        let result = match futures::poll!(work.as_mut()) {
            std::task::Poll::Ready(done) => Ok(done),
            std::task::Poll::Pending => {
                let timed = tokio::time::timeout_at(started + policy.handler_timeout, work);
                let lost = watchdog(&*self.store, key, lease, policy, sent_at, policy.takeover);
                let raced = Box::pin(async move {
                    tokio::select! {
                        biased;
                        r = timed => Ok(r),
                        loss = lost => Err(loss),
                    }
                });
                match raced.await {
                    Ok(r) => r,
                    Err(loss) => {
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
        let settled = self.settle(key, lease, &settlement.action).await;
        guard.armed = false;
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

    /// The claim of `key` for one attempt under this engine's policy, by a new owner.
    fn claim_request(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        request_id: Option<&str>,
        takeover: TakeoverPolicy,
    ) -> ClaimRequest {
        let policy = &*self.policy;
        ClaimRequest {
            key: key.clone(),
            fingerprint: *fingerprint,
            owner: OwnerId::random(),
            lease: policy.lease,
            ttl: policy.record_ttl,
            takeover,
            request_id: request_id.map(str::to_owned),
        }
    }

    /// Records what the handler's settlement asks for (complete or release) under `lease`,
    /// logging a result that was fenced or could not be settled.
    async fn settle(&self, key: &ScopedKey, lease: Lease, action: &Action) -> Settled {
        let settled = match action {
            Action::Complete(response) => self.complete(key, lease, response).await,
            Action::Release(kind) => match timed_op(
                self.policy.store_timeout,
                self.store.release(&Hold::of(key, &lease), *kind),
            )
            .await
            {
                Ok(SettleOutcome::Settled) => Settled::Released(*kind),
                Ok(_) => Settled::Fenced,
                Err(e) => Settled::Failed(e),
            },
        };
        match &settled {
            Settled::Fenced => {
                tracing::warn!(key = %key, fence = lease.fence, "result discarded: fenced by a newer holder")
            }
            Settled::Failed(e) => {
                tracing::error!(key = %key, fence = lease.fence, error = %e, "could not settle result")
            }
            _ => {}
        }
        settled
    }

    async fn claim_or_wait<T>(&self, req: &ClaimRequest) -> Result<Claimed<T>, EngineError> {
        let policy = &*self.policy;
        let give_up = policy.in_flight_wait.map(|w| Instant::now() + w);
        let mut poll = Duration::from_millis(10);
        // A settled unknown record is claimed again; twice is enough to see what others did
        // meanwhile without looping on a record that keeps changing.
        let mut settles = 0;
        loop {
            let sent_at = Instant::now();
            // The claim's answer is large (it may hold a response to replay): `timed_call`
            // keeps one copy of its future where `timed_op` would keep two.
            let outcome = match timed_call(policy.store_timeout, || self.store.claim(req)).await {
                Ok(outcome) => outcome,
                // A full store refused the claim outright: nothing to look for (and a flood
                // of refused claims must not start a watcher each).
                Err(e @ (StoreError::Full { .. } | StoreError::FullBytes { .. })) => {
                    return Err(e.into());
                }
                Err(e) => {
                    // The claim may have been applied all the same; nothing runs under it.
                    unseen::release_unseen_claim(
                        Arc::clone(&self.store),
                        req.key.clone(),
                        req.owner,
                        sent_at,
                        req.lease,
                        policy.store_timeout,
                    );
                    return Err(e.into());
                }
            };
            return Ok(match outcome {
                ClaimOutcome::Claimed { lease, takeover } => Claimed::Now {
                    lease,
                    takeover,
                    sent_at,
                },
                // Boxed: a probe's round trip is rare, and its state would otherwise be part
                // of every run's future.
                ClaimOutcome::Unknown { fence, age } => {
                    match Box::pin(self.settle_unknown(&req.key, fence, age, settles < 2)).await? {
                        Some(answer) => Claimed::Not(answer),
                        None => {
                            settles += 1;
                            continue;
                        }
                    }
                }
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
                other => Claimed::Not(Answer::unclaimed(other)),
            });
        }
    }

    /// What a claim that found `key` unknown answers: `None` when the record was settled (or
    /// changed) and the key should be claimed again, which `again` allows.
    ///
    /// The table is in [`probe`](self::probe)'s docs.
    async fn settle_unknown<T>(
        &self,
        key: &ScopedKey,
        fence: u64,
        age: Duration,
        again: bool,
    ) -> Result<Option<Answer<T>>, EngineError> {
        let policy = &*self.policy;
        // The attempt may still be running (or its request still reach the downstream
        // system) until it is as old as the handler timeout.
        let running = policy
            .handler_timeout
            .checked_sub(age)
            .filter(|d| !d.is_zero());
        let in_flight = |left: Duration| Answer::InFlight { retry_after: left };
        // Without a probe nothing here can settle it: unknown at once, as it will be later.
        let Some(probe) = &self.probe else {
            return Ok(Some(Answer::Unknown));
        };
        let answer = match tokio::time::timeout(policy.probe_timeout, probe.probe(key, fence)).await
        {
            Ok(answer) => answer,
            Err(_) => ProbeAnswer::Unknown(format!("no answer within {:?}", policy.probe_timeout)),
        };
        let resolution = match answer {
            ProbeAnswer::Done(response) => Resolution::Complete {
                response,
                ttl: policy.record_ttl,
            },
            ProbeAnswer::NotDone if running.is_none() => Resolution::Release,
            ProbeAnswer::NotDone | ProbeAnswer::Unknown(_) => {
                if let ProbeAnswer::Unknown(why) = &answer {
                    tracing::debug!(key = %key, fence, why = %why, "probe cannot say");
                }
                return Ok(Some(running.map_or(Answer::Unknown, in_flight)));
            }
        };
        let resolved = crate::audit::acting_as(PROBE_ACTOR.to_owned(), || {
            timed_op(
                policy.store_timeout,
                self.store.resolve(key, &resolution, Some(fence)),
            )
        })
        .await?;
        tracing::info!(key = %key, fence, ?resolved, settled = match &resolution {
            Resolution::Complete { .. } => "complete",
            _ => "release",
        }, "unknown key settled by probe");
        Ok(match (resolved, resolution) {
            (ResolveOutcome::Resolved, Resolution::Complete { response, .. }) => {
                Some(Answer::Replayed(response))
            }
            // Released: claimed again (and run). Or someone else settled or claimed it
            // meanwhile: the next claim says what is there now.
            _ if again => None,
            // Released, but this call claims no more: the caller's retry runs it.
            (ResolveOutcome::Resolved, _) => Some(in_flight(Duration::ZERO)),
            _ => Some(running.map_or(Answer::Unknown, in_flight)),
        })
    }

    /// Records the handler's response. The effect happened, so a store that fails is tried
    /// again, with backoff, for as long as a lease lasts (at least three tries): an answer
    /// must not reach the caller before it is durable, or a retry sent after it could find
    /// the key in flight, unknown, or (under `reexecute`) run it again. Past that the run
    /// answers [`Settled::Failed`] (carriers answer "not recorded, retry") and a background
    /// task keeps trying ([`complete_later`]).
    async fn complete(&self, key: &ScopedKey, lease: Lease, response: &StoredResponse) -> Settled {
        let policy = &*self.policy;
        let give_up = Instant::now() + policy.lease.max(Duration::from_secs(1));
        let mut attempt = 0u32;
        let mut failed_before = false;
        loop {
            let result = timed_op(
                policy.store_timeout,
                self.store.complete(&Completion::new(
                    Hold::of(key, &lease),
                    response,
                    policy.record_ttl,
                )),
            )
            .await;
            match result {
                Ok(SettleOutcome::Settled) => return Settled::Stored,
                // After a failed try, "fenced" may be that try's write having landed.
                // Boxed for the same reason as the probe: only a failed try gets here.
                Ok(_) if failed_before && Box::pin(self.holds_answer(key, response)).await => {
                    return Settled::Stored;
                }
                Ok(_) => return Settled::Fenced,
                // The write landed but too few replicas acknowledged it: retrying would only
                // meet the completed record, and nothing here can make it more durable.
                Err(e @ StoreError::Uncertain { .. }) => return Settled::Failed(e),
                Err(e) if attempt >= 2 && Instant::now() >= give_up => {
                    complete_later(
                        Arc::clone(&self.store),
                        key.clone(),
                        lease,
                        response.clone(),
                        policy.record_ttl,
                        policy.store_timeout,
                    );
                    return Settled::Failed(e);
                }
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, attempt, "complete failed; retrying");
                    failed_before = true;
                    attempt += 1;
                    let nap = Duration::from_millis(20 << attempt.min(5));
                    tokio::time::sleep(nap.min(give_up.saturating_duration_since(Instant::now())))
                        .await;
                }
            }
        }
    }

    /// Whether the key's record is completed with `response` (a completion whose answer was
    /// lost landed after all).
    async fn holds_answer(&self, key: &ScopedKey, response: &StoredResponse) -> bool {
        matches!(
            timed_op(self.policy.store_timeout, self.store.get(key)).await,
            Ok(Some(crate::record::Record {
                state: crate::record::RecordState::Completed { response: stored, .. },
                ..
            })) if stored == *response
        )
    }
}

/// How long a completion the run gave up on is still tried in the background.
pub const COMPLETE_LATER_FOR: Duration = Duration::from_secs(300);

/// Keeps trying to record a response whose run already answered "not recorded", with
/// backoff up to 5 s, for [`COMPLETE_LATER_FOR`]: until it lands, or the store says someone
/// else settled the key (a probe stored the same effect's answer). The holder may complete
/// its record even after a retry marked it unknown, so an outage longer than the lease is
/// covered too. A process that dies meanwhile leaves the key to the probe or an operator.
fn complete_later<S: Store>(
    store: Arc<S>,
    key: ScopedKey,
    lease: Lease,
    response: StoredResponse,
    ttl: Duration,
    store_timeout: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let until = Instant::now() + COMPLETE_LATER_FOR;
        let mut nap = Duration::from_millis(200);
        while Instant::now() < until {
            tokio::time::sleep(nap).await;
            let completion = Completion::new(Hold::of(&key, &lease), &response, ttl);
            let op = store.complete(&completion);
            match timed_op(store_timeout, op).await {
                Ok(SettleOutcome::Settled) => {
                    tracing::info!(key = %key, fence = lease.fence, "completion recorded after the store came back");
                    return;
                }
                Ok(_) => {
                    tracing::warn!(key = %key, fence = lease.fence, "late completion fenced: the key was settled meanwhile");
                    return;
                }
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "late completion failed; trying again");
                    nap = (nap * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::error!(key = %key, fence = lease.fence, "completion never recorded; the key is left to the probe or an operator");
    });
}

enum Claimed<T> {
    Now {
        lease: Lease,
        takeover: bool,
        sent_at: Instant,
    },
    Not(Answer<T>),
}
