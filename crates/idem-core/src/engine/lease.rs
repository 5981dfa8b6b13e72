//! Keeping a claim while the handler runs: bounded store calls, the renewal watchdog, and the
//! guard that releases an abandoned claim.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Policy;
use crate::key::ScopedKey;
use crate::record::{Lease, ReleaseKind, TakeoverPolicy};
use crate::store::{Hold, RenewOutcome, Store, StoreError};

/// Bounds a store call by the policy's store timeout.
pub(super) fn timed_op<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    timed_call(limit, move || op)
}

/// As [`timed_op`], making the store call (`call`) when first polled. The call's future is
/// then held once, where an argument to an `async fn` is held both as the argument and as
/// the pinned future the function polls.
pub(super) async fn timed_call<T, Op>(
    limit: Duration,
    call: impl FnOnce() -> Op,
) -> Result<T, StoreError>
where
    Op: Future<Output = Result<T, StoreError>>,
{
    let mut op = std::pin::pin!(call());
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
pub(super) enum LeaseLoss {
    /// The store said another holder has the key.
    Taken,
    /// Renewals failed until the lease would have run out on our own clock.
    Expired,
}

/// Renews the lease every `renew_every`; resolves only when the lease is lost and the
/// handler must stop.
///
/// The local deadline is measured from when the last successful request was *sent*, on a
/// monotonic clock, so it is never later than the store's own deadline.
///
/// Under `reexecute` a lost lease means a retry may run the key again, so the handler is
/// stopped. Under `hold` nothing runs again blind: the watchdog keeps renewing while it can
/// (and stops renewing once refused) but never stops the handler, whose result is recorded
/// if it still holds the key.
pub(super) async fn watchdog<S: Store>(
    store: &S,
    key: &ScopedKey,
    lease: Lease,
    policy: &Policy,
    sent_at: Instant,
    takeover: TakeoverPolicy,
) -> LeaseLoss {
    let stops = takeover == TakeoverPolicy::Reexecute;
    let mut deadline = sent_at + policy.lease;
    loop {
        let wake = if stops {
            (Instant::now() + policy.renew_every).min(deadline)
        } else {
            Instant::now() + policy.renew_every
        };
        tokio::time::sleep_until(wake).await;
        if stops && Instant::now() >= deadline {
            return LeaseLoss::Expired;
        }
        let sent = Instant::now();
        // A renewal still pending at the deadline must not keep the handler running past it.
        let limit = if stops {
            policy
                .store_timeout
                .min(deadline.saturating_duration_since(sent))
        } else {
            policy.store_timeout
        };
        match timed_op(limit, store.renew(&Hold::of(key, &lease), policy.lease)).await {
            Ok(RenewOutcome::Renewed { .. }) => deadline = sent + policy.lease,
            Ok(_) if stops => return LeaseLoss::Taken,
            Ok(_) => {
                tracing::warn!(key = %key, fence = lease.fence, "lease no longer renewable (marked unknown, settled or taken); the handler goes on");
                return std::future::pending().await;
            }
            Err(e) => {
                tracing::warn!(key = %key, fence = lease.fence, error = %e, "lease renewal failed")
            }
        }
    }
}

/// Releases a claim if the run is abandoned before it settles. Borrows the run's store and
/// key; only a drop that must release in the background clones them.
pub(super) struct ClaimGuard<'a, S: Store> {
    pub(super) store: &'a Arc<S>,
    pub(super) key: &'a ScopedKey,
    pub(super) lease: Lease,
    pub(super) kind: ReleaseKind,
    pub(super) store_timeout: Duration,
    pub(super) armed: bool,
}

impl<'a, S: Store> ClaimGuard<'a, S> {
    /// A guard on `lease` of `key` that releases it as `policy` says of an interrupted run
    /// unless disarmed.
    pub(super) fn armed(
        store: &'a Arc<S>,
        key: &'a ScopedKey,
        lease: Lease,
        policy: &Policy,
    ) -> Self {
        Self {
            store,
            key,
            lease,
            kind: policy.interrupted_release(),
            store_timeout: policy.store_timeout,
            armed: true,
        }
    }

    pub(super) async fn settle_now(&mut self, kind: ReleaseKind) {
        self.armed = false;
        let hold = Hold::of(self.key, &self.lease);
        let op = self.store.release(&hold, kind);
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
            if let Err(e) = timed_op(limit, store.release(&Hold::of(&key, &lease), kind)).await {
                tracing::error!(key = %key, error = %e, "release after drop failed; lease will expire");
            }
        });
    }
}
