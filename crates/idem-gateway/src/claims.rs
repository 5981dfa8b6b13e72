//! The claims this process holds, so graceful shutdown can wait for them to settle and
//! release the rest instead of leaving their leases to expire.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, OwnerId, ReleaseKind, ScopedKey, SettleOutcome, Store, StoreError,
    TakeoverPolicy,
};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A claim this process holds: enough to settle it at shutdown.
#[derive(Clone, Debug)]
struct Held {
    key: ScopedKey,
    takeover: TakeoverPolicy,
}

struct Claims {
    held: Mutex<HashMap<(OwnerId, u64), Held, BuildHasherDefault<ClaimIdHasher>>>,
    empty: Notify,
}

/// Hashes the gateway's own claim ids (random owner ids and fences, never client input),
/// so the default SipHash, built to resist chosen keys, is not needed on every claim and
/// settle: a multiply-rotate mix of the words.
#[derive(Debug, Default, Clone, Copy)]
struct ClaimIdHasher(u64);

impl ClaimIdHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;
}

impl Hasher for ClaimIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(Self::K);
    }

    fn write_u128(&mut self, n: u128) {
        // Truncations on purpose: the two halves.
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

/// Wraps a store and remembers the claims this process holds until they settle.
#[derive(Clone)]
pub struct TrackedStore<S> {
    inner: S,
    claims: Arc<Claims>,
}

impl<S> std::fmt::Debug for TrackedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedStore")
            .field("held", &self.claims.held.lock().len())
            .finish_non_exhaustive()
    }
}

impl<S: Store> TrackedStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            // Sized for the usual number in flight: a table this small (the default) filled
            // up with tombstones and rehashed on nearly every claim.
            claims: Arc::new(Claims {
                held: Mutex::new(HashMap::with_capacity_and_hasher(
                    256,
                    BuildHasherDefault::default(),
                )),
                empty: Notify::new(),
            }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Claims this process holds and has not settled yet.
    pub fn held(&self) -> usize {
        self.claims.held.lock().len()
    }

    /// Waits until every held claim is settled, or `deadline` passes; returns how many remain.
    pub async fn wait_settled(&self, deadline: tokio::time::Instant) -> usize {
        loop {
            let notified = self.claims.empty.notified();
            tokio::pin!(notified);
            // Registered before the check, so a settle in between is not missed.
            notified.as_mut().enable();
            let held = self.held();
            if held == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.held();
            }
        }
    }

    /// Releases every claim still held, as an interrupted run would be released: unknown
    /// under `hold`, retryable under `reexecute`. Returns how many were settled.
    pub async fn release_all(&self, timeout: Duration) -> usize {
        let held: Vec<((OwnerId, u64), Held)> = self.claims.held.lock().drain().collect();
        let mut settled = 0;
        for ((owner, fence), h) in held {
            let kind = match h.takeover {
                TakeoverPolicy::Hold => ReleaseKind::Unknown,
                _ => ReleaseKind::Retryable,
            };
            match tokio::time::timeout(
                timeout,
                self.inner.release(&Hold::new(&h.key, owner, fence), kind),
            )
            .await
            {
                Ok(Ok(_)) => {
                    settled += 1;
                    tracing::warn!(key = %h.key, fence, ?kind, "shutdown: released a claim still in flight");
                }
                Ok(Err(e)) => {
                    tracing::error!(key = %h.key, error = %e, "shutdown: release failed; the lease will expire")
                }
                Err(_) => {
                    tracing::error!(key = %h.key, "shutdown: release timed out; the lease will expire")
                }
            }
        }
        self.claims.empty.notify_waiters();
        settled
    }

    fn settled(&self, hold: &Hold<'_>, outcome: &Result<SettleOutcome, StoreError>) {
        // A failed settle is still held: the engine may retry, or the lease runs out.
        if outcome.is_err() {
            return;
        }
        let mut held = self.claims.held.lock();
        held.remove(&(hold.owner, hold.fence));
        if held.is_empty() {
            self.claims.empty.notify_waiters();
        }
    }
}

impl<S: Store> Store for TrackedStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(req).await?;
        if let ClaimOutcome::Claimed { lease, .. } = &outcome {
            self.claims.held.lock().insert(
                (lease.owner, lease.fence),
                Held {
                    key: req.key.clone(),
                    takeover: req.takeover,
                },
            );
        }
        Ok(outcome)
    }

    async fn complete(&self, completion: &Completion<'_>) -> Result<SettleOutcome, StoreError> {
        let outcome = self.inner.complete(completion).await;
        self.settled(&completion.hold, &outcome);
        outcome
    }

    async fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let outcome = self.inner.release(hold, kind).await;
        self.settled(hold, &outcome);
        outcome
    }

    idem_core::forward_store!(|t| &t.inner; renew, get, list, resolve, delete, audit);
}

#[cfg(test)]
mod tests {
    use idem_core::{Fingerprint, Key, MemoryStore, Scope, StoredResponse};

    use super::*;

    fn req(key: &str, takeover: TakeoverPolicy) -> ClaimRequest {
        ClaimRequest {
            key: ScopedKey::new(Scope::new("ns").expect("ns"), Key::new(key).expect("key")),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
            takeover,
            request_id: None,
        }
    }

    #[tokio::test]
    async fn held_claims_are_tracked_and_released_at_shutdown() {
        let store = TrackedStore::new(MemoryStore::new(100));
        let a = req("a", TakeoverPolicy::Hold);
        let b = req("b", TakeoverPolicy::Reexecute);
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&a).await.expect("claim") else {
            panic!("not claimed")
        };
        store.claim(&b).await.expect("claim");
        assert_eq!(store.held(), 2);
        store
            .complete(&Completion::new(
                Hold::of(&a.key, &lease),
                &StoredResponse::new(200, "ok"),
                a.ttl,
            ))
            .await
            .expect("complete");
        assert_eq!(store.held(), 1);
        assert_eq!(store.release_all(Duration::from_secs(1)).await, 1);
        assert_eq!(store.held(), 0);
        // Released as retryable (reexecute): the key can be claimed again at once.
        assert!(matches!(
            store
                .claim(&req("b", TakeoverPolicy::Reexecute))
                .await
                .expect("claim"),
            ClaimOutcome::Claimed { .. }
        ));
        // A held-policy claim released at shutdown becomes unknown.
        let c = req("c", TakeoverPolicy::Hold);
        store.claim(&c).await.expect("claim");
        store.release_all(Duration::from_secs(1)).await;
        assert!(matches!(
            store
                .claim(&req("c", TakeoverPolicy::Hold))
                .await
                .expect("claim"),
            ClaimOutcome::Unknown { .. }
        ));
        // Waiting ends when the last held claim settles.
        let d = req("d", TakeoverPolicy::Reexecute);
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&d).await.expect("claim") else {
            panic!("not claimed")
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(10);
        assert_eq!(store.wait_settled(deadline).await, 1, "d is still held");
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .wait_settled(tokio::time::Instant::now() + Duration::from_secs(10))
                    .await
            })
        };
        store
            .complete(&Completion::new(
                Hold::of(&d.key, &lease),
                &StoredResponse::new(200, "ok"),
                d.ttl,
            ))
            .await
            .expect("complete");
        assert_eq!(waiter.await.expect("join"), 0);
    }
}
