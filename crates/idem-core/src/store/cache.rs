//! A local cache tier for completed records, in front of any store.
//!
//! Completed records are immutable until their TTL, so a process can replay them from memory
//! with zero round trips. Processing and unknown records are never cached: the store stays
//! the only judge of who holds a key.
//!
//! One caveat: an admin `delete` or `resolve` made through another process does not reach
//! this cache, which may replay an entry for up to its `max_age` afterwards.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quick_cache::sync::Cache;

use crate::clock::{Clock, SystemClock};
use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{OwnerId, RecordState, ReleaseKind, StoredResponse, Timestamp};
use crate::store::{
    ClaimOutcome, ClaimRequest, Completion, Hold, Resolution, ResolveOutcome, SettleOutcome, Store,
    StoreError,
};

#[derive(Clone)]
struct Cached {
    fingerprint: Fingerprint,
    response: StoredResponse,
    until: Timestamp,
}

/// How often claims were answered from the cache, and how often they went to the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Claims answered from the cache (a replay or a mismatch), with no store round trip.
    pub hits: u64,
    /// Claims that went to the store.
    pub misses: u64,
}

#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Wraps a store with a bounded local cache of completed responses.
#[derive(Clone)]
pub struct CachedStore<S> {
    inner: S,
    done: Arc<Cache<ScopedKey, Arc<Cached>>>,
    counts: Arc<Counts>,
    /// Fingerprints of claims this process holds, so completing them can fill the cache.
    held: Arc<Cache<(OwnerId, u64), Fingerprint>>,
    clock: Arc<dyn Clock>,
    max_age: Duration,
}

impl<S: Store> CachedStore<S> {
    /// Caches up to `entries` completed responses for at most `max_age` each.
    pub fn new(inner: S, entries: usize, max_age: Duration) -> Self {
        Self::with_clock(inner, entries, max_age, SystemClock)
    }

    /// As [`CachedStore::new`], on a given clock.
    pub fn with_clock(inner: S, entries: usize, max_age: Duration, clock: impl Clock) -> Self {
        Self {
            inner,
            done: Arc::new(Cache::new(entries.max(1))),
            counts: Arc::default(),
            held: Arc::new(Cache::new(entries.clamp(16, 65_536))),
            clock: Arc::new(clock),
            max_age,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Number of cached responses.
    pub fn cached(&self) -> usize {
        self.done.len()
    }

    /// Claims answered from the cache and claims that went to the store, since creation
    /// (shared by every clone).
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.counts.hits.load(Ordering::Relaxed),
            misses: self.counts.misses.load(Ordering::Relaxed),
        }
    }

    fn remember(
        &self,
        key: &ScopedKey,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) {
        let until = self.clock.now().plus(ttl.min(self.max_age));
        self.done.insert(
            key.clone(),
            Arc::new(Cached {
                fingerprint,
                response,
                until,
            }),
        );
    }

    fn lookup(&self, req: &ClaimRequest) -> Option<ClaimOutcome> {
        let hit = self.done.get(&req.key)?;
        if hit.until <= self.clock.now() {
            self.done.remove(&req.key);
            return None;
        }
        Some(if hit.fingerprint == req.fingerprint {
            ClaimOutcome::Done {
                response: hit.response.clone(),
            }
        } else {
            ClaimOutcome::Mismatch {
                stored: hit.fingerprint,
            }
        })
    }
}

impl<S> fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("cached", &self.done.len())
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Store for CachedStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if let Some(hit) = self.lookup(req) {
            self.counts.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(hit);
        }
        self.counts.misses.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.claim(req).await?;
        match &outcome {
            ClaimOutcome::Done { response } => {
                // The claimant's ttl says nothing about when this record expires, so ask
                // the store: a cache entry must never outlive its record.
                if let Ok(Some(record)) = self.inner.get(&req.key).await
                    && matches!(record.state, RecordState::Completed { .. })
                    && record.fingerprint == req.fingerprint
                {
                    let left = record.expires_at.since(self.clock.now());
                    self.remember(&req.key, req.fingerprint, response.clone(), left);
                }
            }
            ClaimOutcome::Claimed { lease, .. } => self
                .held
                .insert((lease.owner, lease.fence), req.fingerprint),
            _ => {}
        }
        Ok(outcome)
    }

    async fn complete(&self, completion: &Completion<'_>) -> Result<SettleOutcome, StoreError> {
        let outcome = self.inner.complete(completion).await?;
        let Completion {
            hold,
            response,
            ttl,
        } = *completion;
        let fingerprint = self
            .held
            .remove(&(hold.owner, hold.fence))
            .map(|(_, fp)| fp);
        if let (SettleOutcome::Settled, Some(fp)) = (outcome, fingerprint) {
            self.remember(hold.key, fp, response.compacted(), ttl);
        }
        Ok(outcome)
    }

    fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        self.held.remove(&(hold.owner, hold.fence));
        self.inner.release(hold, kind)
    }

    fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
        fence: Option<u64>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
        self.done.remove(key);
        self.inner.resolve(key, resolution, fence)
    }

    fn delete(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.done.remove(key);
        self.inner.delete(key)
    }

    crate::forward_store!(|c| &c.inner; renew, get, list, audit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::key::{Key, Scope};
    use crate::record::TakeoverPolicy;
    use crate::store::MemoryStore;

    // Bug guarded: CachedStore filled its cache from a store's `Done` for the *claimant's* ttl,
    // so it kept replaying a record after the record expired in the store (a new claim must
    // run). Found by idem-testkit's `cached::model_matches_store`.
    #[tokio::test]
    async fn cached_replay_never_outlives_its_record() {
        let clock = ManualClock::new(Timestamp(1_767_225_600_000));
        let inner = MemoryStore::with_clock(100_000, clock.clone());
        let cached = CachedStore::with_clock(
            inner.clone(),
            100,
            Duration::from_secs(3_600),
            clock.clone(),
        );
        let key = ScopedKey::new(
            Scope::new("cache-expiry").expect("ns"),
            Key::new("k").expect("key"),
        );
        let req = |ttl| ClaimRequest {
            key: key.clone(),
            fingerprint: Fingerprint::of_bytes(1, &[1]),
            owner: OwnerId::random(),
            lease: Duration::from_secs(10),
            ttl,
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        };
        // Completed by another process (straight on the shared store), kept for one minute.
        let first = req(Duration::from_secs(60));
        let ClaimOutcome::Claimed { lease, .. } = inner.claim(&first).await.expect("claim") else {
            panic!("not claimed")
        };
        let response = StoredResponse::new(200, "once");
        inner
            .complete(&Completion::new(
                Hold::of(&key, &lease),
                &response,
                Duration::from_secs(60),
            ))
            .await
            .expect("complete");
        // This process replays it, claiming with a day-long ttl.
        let replay = cached
            .claim(&req(Duration::from_secs(86_400)))
            .await
            .expect("claim");
        assert_eq!(replay, ClaimOutcome::Done { response });
        // The first replay went to the store; the second is answered from the cache.
        assert!(matches!(
            cached
                .claim(&req(Duration::from_secs(86_400)))
                .await
                .expect("claim"),
            ClaimOutcome::Done { .. }
        ));
        assert_eq!(cached.stats(), CacheStats { hits: 1, misses: 1 });
        clock.advance(Duration::from_secs(61));
        let after = cached
            .claim(&req(Duration::from_secs(86_400)))
            .await
            .expect("claim");
        assert!(
            matches!(
                after,
                ClaimOutcome::Claimed {
                    takeover: false,
                    ..
                }
            ),
            "replayed an expired record: {after:?}"
        );
    }
}
