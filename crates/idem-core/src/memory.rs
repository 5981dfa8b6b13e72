//! `MemoryStore`: a bounded, swept, in-process store. The embedded test double and the
//! fast path for single-process deployments.
//!
//! Transitions are the pure functions of [`crate::decide`], applied under one lock, so every
//! operation is atomic. Capacity is a hard bound: a claim for a new key at capacity first
//! drops expired records, then the oldest records that no one depends on. Processing records
//! with a live lease and unknown records are never evicted (evicting them would let a retry
//! run twice); when nothing else is left the claim fails with [`StoreError::Full`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::{Future, ready};
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Change, Transition};
use crate::key::ScopedKey;
use crate::record::{OwnerId, Record, RecordState, ReleaseKind, StoredResponse, Timestamp};
use crate::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome,
    SettleOutcome, Store, StoreError,
};
use crate::sync::Mutex;

/// A bounded in-memory store. Clones share the same records.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Box<dyn Clock>,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    records: HashMap<ScopedKey, Entry>,
    /// Insertion order: seq -> key. The first entry is the oldest.
    by_age: BTreeMap<u64, ScopedKey>,
    /// (expires_at, seq), for sweeping.
    by_expiry: BTreeSet<(Timestamp, u64)>,
    next_seq: u64,
    /// Highest fence ever issued; outlives every record, so fences never repeat.
    fence_high: u64,
}

struct Entry {
    record: Record,
    seq: u64,
}

impl MemoryStore {
    /// A store holding at most `capacity` records, on the system clock.
    pub fn new(capacity: usize) -> Self {
        Self::with_clock(capacity, SystemClock)
    }

    /// A store on a given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(capacity: usize, clock: impl Clock) -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Box::new(clock),
                capacity: capacity.max(1),
                inner: Mutex::new(Inner::default()),
            }),
        }
    }

    /// Number of records held, expired ones included until swept.
    pub fn len(&self) -> usize {
        self.shared.lock().records.len()
    }

    /// True when no records are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured capacity.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Removes expired records now; returns how many.
    pub fn sweep(&self) -> usize {
        let now = self.shared.clock.now();
        self.shared.lock().sweep(now)
    }

    /// Sweeps every `every` on the current tokio runtime until the store is dropped.
    pub fn spawn_sweeper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let now = shared.clock.now();
                let swept = shared.lock().sweep(now);
                if swept > 0 {
                    tracing::trace!(swept, "memory store sweep");
                }
            }
        })
    }

    fn apply<O>(
        &self,
        key: &ScopedKey,
        step: impl FnOnce(Timestamp, Option<&Record>) -> Transition<O>,
    ) -> O {
        let now = self.shared.clock.now();
        let mut inner = self.shared.lock();
        let t = step(now, inner.records.get(key).map(|e| &e.record));
        inner.write(key, t.change);
        t.outcome
    }
}

impl Shared {
    fn lock(&self) -> crate::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied transition: every
        // write is computed first and then applied with infallible map operations.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn write(&mut self, key: &ScopedKey, change: Change) {
        match change {
            Change::Keep => {}
            Change::Remove => self.remove(key),
            Change::Put(record) => {
                self.fence_high = self.fence_high.max(record.fence);
                // A record created anew over an expired one is young: it takes a new place in
                // age order (for list and eviction) instead of inheriting the old one's.
                if self
                    .records
                    .get(key)
                    .is_some_and(|e| e.record.created_at != record.created_at)
                {
                    self.remove(key);
                }
                if let Some(entry) = self.records.get_mut(key) {
                    if entry.record.expires_at != record.expires_at {
                        self.by_expiry.remove(&(entry.record.expires_at, entry.seq));
                        self.by_expiry.insert((record.expires_at, entry.seq));
                    }
                    entry.record = record;
                } else {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.by_age.insert(seq, key.clone());
                    self.by_expiry.insert((record.expires_at, seq));
                    self.records.insert(key.clone(), Entry { record, seq });
                }
            }
        }
    }

    fn remove(&mut self, key: &ScopedKey) {
        if let Some(entry) = self.records.remove(key) {
            self.by_age.remove(&entry.seq);
            self.by_expiry.remove(&(entry.record.expires_at, entry.seq));
        }
    }

    fn sweep(&mut self, now: Timestamp) -> usize {
        let mut swept = 0;
        while let Some(&(expires_at, seq)) = self.by_expiry.first() {
            if expires_at > now {
                break;
            }
            if let Some(key) = self.by_age.get(&seq).cloned() {
                self.remove(&key);
            } else {
                self.by_expiry.remove(&(expires_at, seq));
            }
            swept += 1;
        }
        swept
    }

    /// Makes room for one new record, or says the store is full.
    fn make_room(&mut self, now: Timestamp, capacity: usize) -> Result<(), StoreError> {
        if self.records.len() < capacity {
            return Ok(());
        }
        self.sweep(now);
        if self.records.len() < capacity {
            return Ok(());
        }
        let victim = self
            .by_age
            .values()
            .find(|k| {
                self.records
                    .get(*k)
                    .is_some_and(|e| evictable(now, &e.record))
            })
            .cloned();
        match victim {
            Some(key) => {
                self.remove(&key);
                Ok(())
            }
            None => Err(StoreError::Full { capacity }),
        }
    }
}

fn evictable(now: Timestamp, record: &Record) -> bool {
    match &record.state {
        RecordState::Completed { .. } => true,
        RecordState::Processing { lease_until, .. } => *lease_until <= now,
        RecordState::Unknown { .. } => false,
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.shared.capacity)
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send {
        let now = self.shared.clock.now();
        let mut inner = self.shared.lock();
        let previous = inner.records.get(&req.key).map(|e| &e.record);
        let floor = inner.fence_high + 1;
        let t = decide::claim(now, previous, req, floor);
        let result = match (&t.change, inner.records.contains_key(&req.key)) {
            (Change::Put(_), false) => inner.make_room(now, self.shared.capacity),
            _ => Ok(()),
        };
        let result = result.map(|()| {
            inner.write(&req.key, t.change);
            t.outcome
        });
        drop(inner);
        ready(result)
    }

    fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> impl Future<Output = Result<RenewOutcome, StoreError>> + Send {
        ready(Ok(self.apply(key, |now, prev| {
            decide::renew(now, prev, owner, fence, lease)
        })))
    }

    fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        ready(Ok(self.apply(key, |now, prev| {
            decide::complete(now, prev, owner, fence, response, ttl)
        })))
    }

    fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        ready(Ok(self.apply(key, |now, prev| {
            decide::release(now, prev, owner, fence, kind)
        })))
    }

    fn get(
        &self,
        key: &ScopedKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        let now = self.shared.clock.now();
        let inner = self.shared.lock();
        let found = decide::live(now, inner.records.get(key).map(|e| &e.record)).cloned();
        ready(Ok(found))
    }

    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send {
        let now = self.shared.clock.now();
        let inner = self.shared.lock();
        let mut found: Vec<Record> = inner
            .by_age
            .values()
            .filter_map(|k| inner.records.get(k))
            .map(|e| &e.record)
            .filter(|r| decide::matches_filter(now, r, filter))
            .cloned()
            .collect();
        // Sort before limiting, so the limit keeps the oldest records.
        found.sort_by_key(|r| r.created_at);
        found.truncate(filter.effective_limit());
        ready(Ok(found))
    }

    fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
        ready(Ok(self.apply(key, |now, prev| {
            decide::resolve(now, prev, resolution)
        })))
    }

    fn delete(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = self.shared.clock.now();
        let mut inner = self.shared.lock();
        let existed = decide::live(now, inner.records.get(key).map(|e| &e.record)).is_some();
        inner.remove(key);
        ready(Ok(existed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::fingerprint::Fingerprint;
    use crate::key::{Key, Scope};
    use crate::record::TakeoverPolicy;

    fn key(name: &str) -> ScopedKey {
        ScopedKey::new(Scope::new("mem").expect("ns"), Key::new(name).expect("key"))
    }

    async fn claim_and_complete(store: &MemoryStore, name: &str, ttl: Duration) {
        let req = ClaimRequest {
            key: key(name),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(1),
            ttl,
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        };
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await.expect("claim") else {
            panic!("{name} not claimed");
        };
        let done = store
            .complete(
                &req.key,
                lease.owner,
                lease.fence,
                &StoredResponse::new(200, ""),
                ttl,
            )
            .await
            .expect("complete");
        assert_eq!(done, SettleOutcome::Settled);
    }

    // Bug guarded: a key claimed again over its expired (unswept) record kept the old
    // record's place in age order, so eviction dropped it as "oldest" while it was the newest.
    #[tokio::test]
    async fn a_reclaimed_key_is_young_for_eviction() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(2, clock.clone());
        claim_and_complete(&store, "a", Duration::from_secs(5)).await;
        claim_and_complete(&store, "b", Duration::from_secs(100)).await;
        clock.advance(Duration::from_secs(10));
        // "a" expired but is still held in memory; claimed again it is the newest record.
        claim_and_complete(&store, "a", Duration::from_secs(100)).await;
        claim_and_complete(&store, "c", Duration::from_secs(100)).await;
        assert!(
            store.get(&key("a")).await.expect("get").is_some(),
            "the newest record was evicted"
        );
        assert!(
            store.get(&key("b")).await.expect("get").is_none(),
            "the oldest record should go"
        );
    }
}
