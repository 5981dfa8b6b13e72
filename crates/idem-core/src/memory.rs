//! `MemoryStore`: a bounded, swept, in-process store. The embedded test double and the
//! fast path for single-process deployments.
//!
//! Transitions are the pure functions of [`crate::decide`], applied under a lock, so every
//! operation is atomic. Capacity is a hard bound: a claim for a new key at capacity first
//! drops expired records, then the oldest records that no one depends on. Processing records
//! with a live lease and unknown records are never evicted (evicting them would let a retry
//! run twice); when nothing else is left the claim fails with [`StoreError::Full`].
//!
//! A large store (capacity of at least [`SHARD_SIZE`] × 2) is split into up to
//! [`MAX_SHARDS`] shards by key hash, each with its own lock, capacity share, age order and
//! fence counter, so concurrent requests rarely wait on each other and a growing table
//! rehashes one shard at a time. A key always lives in the same shard, so everything the
//! state machine promises per key holds unchanged; eviction order ("oldest first") is then
//! kept per shard. Smaller stores are one shard, exactly bounded.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::{Future, ready};
use std::hash::BuildHasher;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use hashbrown::HashTable;

use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Change, Transition};
use crate::key::ScopedKey;
use crate::record::{OwnerId, Record, RecordState, ReleaseKind, StoredResponse, Timestamp};
use crate::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome,
    SettleOutcome, Store, StoreError,
};
use crate::sync::Mutex;

/// Records per shard below which a store is not split further.
pub const SHARD_SIZE: usize = 8192;
/// The most shards a store is split into.
pub const MAX_SHARDS: usize = 16;

/// A bounded in-memory store. Clones share the same records.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Box<dyn Clock>,
    capacity: usize,
    /// Seeded per store, so key hashes cannot be predicted from outside.
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<Inner>]>,
}

#[derive(Default)]
struct Inner {
    /// Entries found by the key's hash (computed once per operation) and the key itself.
    /// Boxed: a record is a few hundred bytes, and moving it into the table (and every
    /// record again on each growth) showed in profiles; a pointer moves cheaply.
    records: HashTable<Box<Entry>>,
    /// Insertion order: seq -> key hash. The first entry is the oldest.
    by_age: BTreeMap<u64, u64>,
    /// (expires_at, seq), for sweeping.
    by_expiry: BTreeSet<(Timestamp, u64)>,
    next_seq: u64,
    /// Highest fence ever issued in this shard; outlives every record, so fences never
    /// repeat for any key of the shard.
    fence_high: u64,
}

struct Entry {
    hash: u64,
    seq: u64,
    record: Record,
}

impl MemoryStore {
    /// A store holding at most `capacity` records, on the system clock.
    pub fn new(capacity: usize) -> Self {
        Self::with_clock(capacity, SystemClock)
    }

    /// A store on a given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(capacity: usize, clock: impl Clock) -> Self {
        let capacity = capacity.max(1);
        let shards = (capacity / SHARD_SIZE)
            .clamp(1, MAX_SHARDS)
            .next_power_of_two()
            .min(MAX_SHARDS);
        Self {
            shared: Arc::new(Shared {
                clock: Box::new(clock),
                capacity,
                hasher: foldhash::fast::RandomState::default(),
                shards: (0..shards).map(|_| Mutex::new(Inner::default())).collect(),
            }),
        }
    }

    /// Number of records held, expired ones included until swept.
    pub fn len(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| lock(s).records.len())
            .sum()
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
        self.shared.sweep()
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
                let swept = shared.sweep();
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
        let (hash, _, mut inner) = self.shared.shard(key);
        let t = step(now, inner.get(hash, key).map(|e| &e.record));
        inner.write(hash, key, t.change);
        t.outcome
    }
}

fn lock(shard: &Mutex<Inner>) -> crate::sync::MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave a half-applied transition: every
    // write is computed first and then applied with infallible map operations.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The key's hash, its shard's index, and the shard, locked.
    fn shard(&self, key: &ScopedKey) -> (u64, usize, crate::sync::MutexGuard<'_, Inner>) {
        let hash = self.hasher.hash_one(key);
        // The table uses the hash's low bits for buckets and its top 7 bits as tags; the
        // shard takes bits in between.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        (hash, index, lock(&self.shards[index]))
    }

    /// Shard `index`'s share of the capacity; the shares add up to the capacity exactly.
    fn shard_capacity(&self, index: usize) -> usize {
        let n = self.shards.len();
        self.capacity / n + usize::from(index < self.capacity % n)
    }

    fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.shards.iter().map(|s| lock(s).sweep(now)).sum()
    }
}

impl Inner {
    fn get(&self, hash: u64, key: &ScopedKey) -> Option<&Entry> {
        self.records
            .find(hash, |e| e.record.key == *key)
            .map(|e| &**e)
    }

    fn write(&mut self, hash: u64, key: &ScopedKey, change: Change) {
        match change {
            Change::Keep => {}
            Change::Remove => self.remove(hash, key),
            Change::Put(record) => {
                self.fence_high = self.fence_high.max(record.fence);
                // A record created anew over an expired one is young: it takes a new place in
                // age order (for list and eviction) instead of inheriting the old one's.
                if self
                    .get(hash, key)
                    .is_some_and(|e| e.record.created_at != record.created_at)
                {
                    self.remove(hash, key);
                }
                if let Some(entry) = self.records.find_mut(hash, |e| e.record.key == *key) {
                    if entry.record.expires_at != record.expires_at {
                        self.by_expiry.remove(&(entry.record.expires_at, entry.seq));
                        self.by_expiry.insert((record.expires_at, entry.seq));
                    }
                    entry.record = record;
                } else {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.by_age.insert(seq, hash);
                    self.by_expiry.insert((record.expires_at, seq));
                    self.records
                        .insert_unique(hash, Box::new(Entry { hash, seq, record }), |e| e.hash);
                }
            }
        }
    }

    fn remove(&mut self, hash: u64, key: &ScopedKey) {
        self.remove_where(hash, |e| e.record.key == *key);
    }

    /// The entry with this age sequence number, if it is still held.
    fn by_seq(&self, seq: u64) -> Option<&Entry> {
        let hash = *self.by_age.get(&seq)?;
        self.records.find(hash, |e| e.seq == seq).map(|e| &**e)
    }

    fn remove_seq(&mut self, seq: u64) {
        if let Some(&hash) = self.by_age.get(&seq) {
            self.remove_where(hash, |e| e.seq == seq);
        }
    }

    /// Removes the entry under `hash` that `pick` chooses, with its age and expiry entries.
    fn remove_where(&mut self, hash: u64, pick: impl Fn(&Entry) -> bool) {
        if let Ok(found) = self.records.find_entry(hash, |e| pick(e)) {
            let (entry, _) = found.remove();
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
            self.by_expiry.remove(&(expires_at, seq));
            self.remove_seq(seq);
            swept += 1;
        }
        swept
    }

    /// Makes room for one new record, or says the shard is full.
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
            .keys()
            .copied()
            .find(|&seq| self.by_seq(seq).is_some_and(|e| evictable(now, &e.record)));
        match victim {
            Some(seq) => {
                self.remove_seq(seq);
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
        let (hash, index, mut inner) = self.shared.shard(&req.key);
        let previous = inner.get(hash, &req.key).map(|e| &e.record);
        let exists = previous.is_some();
        let floor = inner.fence_high + 1;
        let t = decide::claim(now, previous, req, floor);
        let result = match (&t.change, exists) {
            (Change::Put(_), false) => inner.make_room(now, self.shared.shard_capacity(index)),
            _ => Ok(()),
        };
        let result = result.map(|()| {
            inner.write(hash, &req.key, t.change);
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
        // Kept in exact-size buffers: a slice of a larger buffer would pin all of it.
        let response = response.compacted();
        ready(Ok(self.apply(key, |now, prev| {
            decide::complete(now, prev, owner, fence, &response, ttl)
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
        let (hash, _, inner) = self.shared.shard(key);
        let found = decide::live(now, inner.get(hash, key).map(|e| &e.record)).cloned();
        ready(Ok(found))
    }

    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send {
        let now = self.shared.clock.now();
        let mut found: Vec<Record> = Vec::new();
        for shard in &self.shared.shards {
            let inner = lock(shard);
            found.extend(
                inner
                    .by_age
                    .keys()
                    .filter_map(|&seq| inner.by_seq(seq))
                    .map(|e| &e.record)
                    .filter(|r| decide::matches_filter(now, r, filter))
                    .cloned(),
            );
        }
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
        let (hash, _, mut inner) = self.shared.shard(key);
        let existed = decide::live(now, inner.get(hash, key).map(|e| &e.record)).is_some();
        inner.remove(hash, key);
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

    #[tokio::test]
    async fn a_sharded_store_stays_within_its_capacity() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let capacity = 3 * SHARD_SIZE + 5;
        let store = MemoryStore::with_clock(capacity, clock.clone());
        assert!(store.shared.shards.len() > 1, "expected a sharded store");
        for i in 0..capacity + 2_000 {
            claim_and_complete(&store, &format!("k{i}"), Duration::from_secs(100)).await;
        }
        let held = store.len();
        assert!(held <= capacity, "{held} records held, capacity {capacity}");
        // Every shard filled up to its share before evicting.
        assert!(
            held > capacity - 2 * store.shared.shards.len(),
            "only {held} held"
        );
        // The newest record is always kept: eviction takes the oldest of its shard.
        let last = format!("k{}", capacity + 1_999);
        assert!(store.get(&key(&last)).await.expect("get").is_some());
    }

    // Bug guarded: a completed response whose body was a slice of a larger buffer (as an HTTP
    // client's read buffer hands out) pinned that whole buffer for the record's lifetime; the
    // gateway kept about 5 KB per record for a 14-byte body.
    #[tokio::test]
    async fn a_stored_body_does_not_pin_the_buffer_it_was_sliced_from() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(10, clock);
        let buffer = bytes::Bytes::from(vec![7u8; 8192]);
        let req = ClaimRequest {
            key: key("slice"),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(60),
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        };
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await.expect("claim") else {
            panic!("not claimed");
        };
        let response = StoredResponse::new(200, buffer.slice(0..10))
            .with_header("x-part", buffer.slice(10..20));
        let done = store
            .complete(&req.key, lease.owner, lease.fence, &response, req.ttl)
            .await
            .expect("complete");
        assert_eq!(done, SettleOutcome::Settled);
        drop(response);
        assert!(
            buffer.is_unique(),
            "the store still holds a slice of the 8 KB buffer"
        );
        let ClaimOutcome::Done { response } = store.claim(&req).await.expect("replay") else {
            panic!("no replay");
        };
        assert_eq!(&response.body[..], &[7u8; 10]);
    }
}
