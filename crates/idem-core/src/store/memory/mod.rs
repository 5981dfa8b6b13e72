//! `MemoryStore`: a bounded, swept, in-process store. The embedded test double and the
//! fast path for single-process deployments.
//!
//! Transitions are the pure functions of [`crate::decide`], applied under a lock, so every
//! operation is atomic. Capacity is a hard bound, in records and in bytes (see
//! [`MemoryStore::bounded`]): a claim for a new key at either bound first drops expired
//! records, and if that is not enough it fails with [`StoreError::Full`] or
//! [`StoreError::FullBytes`] (carriers answer 503). A record that has not expired is never
//! dropped to make room: a completed one would turn its key's retry into a second execution,
//! and a processing or unknown one likewise. The byte bound is checked when a new key is
//! claimed; the answer a claim completes with is always kept, so the records may pass the
//! bound by at most the answers of the claims in flight.
//!
//! A large store (capacity of at least [`SHARD_SIZE`] × 2) is split into up to
//! [`MAX_SHARDS`] shards by key hash, each with its own lock, capacity share, age order and
//! fence counter, so concurrent requests rarely wait on each other and a growing table
//! rehashes one shard at a time. A key always lives in the same shard, so everything the
//! state machine promises per key holds unchanged; a shard refuses new keys once its share of
//! the capacity is full, while the byte bound is the whole store's. Smaller stores are one
//! shard, exactly bounded.

mod shard;

use std::fmt;
use std::future::{Future, ready};
use std::hash::BuildHasher;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::audit::{self, AuditEvent, AuditLevel, AuditQuery, AuditRetention, Step};
use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Change, Transition};
use crate::key::ScopedKey;
use crate::record::{Record, ReleaseKind, Timestamp};
use crate::store::{
    ClaimOutcome, ClaimRequest, Completion, Hold, ListFilter, RenewOutcome, Resolution,
    ResolveOutcome, SettleOutcome, Store, StoreError,
};
use crate::sync::Mutex;
use shard::{Inner, footprint};

/// Records per shard below which a store is not split further.
pub const SHARD_SIZE: usize = 8192;
/// The most shards a store is split into.
pub const MAX_SHARDS: usize = 16;

/// Most bytes a memory store's records take unless told otherwise: 256 MiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// The audit trail a memory store keeps unless told otherwise: 10 000 events, 7 days.
pub const MEMORY_AUDIT: AuditRetention = AuditRetention {
    max_events: 10_000,
    max_age: Duration::from_secs(7 * 24 * 3600),
};

/// A bounded in-memory store. Clones share the same records.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    /// Which changes this handle records (see [`MemoryStore::with_audit_level`]).
    level: AuditLevel,
}

struct Shared {
    clock: Box<dyn Clock>,
    capacity: usize,
    max_bytes: usize,
    /// What the records take, shared with every shard (see [`Inner::bytes`]).
    bytes: Arc<AtomicUsize>,
    /// Seeded per store, so key hashes cannot be predicted from outside.
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<Inner>]>,
    /// How much of the audit trail each shard keeps (its share of the events).
    audit: AuditRetention,
    /// Numbers events across shards, so a query can merge them newest first.
    audit_seq: AtomicU64,
}

impl MemoryStore {
    /// A store holding at most `capacity` records, on the system clock.
    pub fn new(capacity: usize) -> Self {
        Self::with_clock(capacity, SystemClock)
    }

    /// A store on a given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(capacity: usize, clock: impl Clock) -> Self {
        Self::with_audit(capacity, clock, MEMORY_AUDIT)
    }

    /// A store on a given clock that keeps `retention` of its audit trail: at most
    /// `max_events` events in all (split evenly between shards), none older than `max_age`
    /// before the newest of its shard. Its records take at most [`DEFAULT_MAX_BYTES`].
    pub fn with_audit(capacity: usize, clock: impl Clock, retention: AuditRetention) -> Self {
        Self::bounded(capacity, DEFAULT_MAX_BYTES, clock, retention)
    }

    /// As [`MemoryStore::with_audit`], holding at most `capacity` records that take at most
    /// `max_bytes` bytes in all (keys, stored answers and a fixed overhead per record). A
    /// sharded store splits the capacity evenly between its shards; the byte bound is the
    /// whole store's.
    pub fn bounded(
        capacity: usize,
        max_bytes: usize,
        clock: impl Clock,
        retention: AuditRetention,
    ) -> Self {
        let capacity = capacity.max(1);
        let shards = (capacity / SHARD_SIZE)
            .clamp(1, MAX_SHARDS)
            .next_power_of_two()
            .min(MAX_SHARDS);
        let bytes = Arc::new(AtomicUsize::new(0));
        Self {
            shared: Arc::new(Shared {
                clock: Box::new(clock),
                capacity,
                max_bytes,
                bytes: Arc::clone(&bytes),
                hasher: foldhash::fast::RandomState::default(),
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Inner {
                            bytes: Arc::clone(&bytes),
                            ..Inner::default()
                        })
                    })
                    .collect(),
                audit: AuditRetention {
                    max_events: retention.max_events.div_ceil(shards),
                    max_age: retention.max_age,
                },
                audit_seq: AtomicU64::new(0),
            }),
            level: AuditLevel::default(),
        }
    }

    /// This store recording the changes `level` names in its audit trail (by default
    /// [`AuditLevel::Operator`]: no event for a fresh claim or its completion). The level
    /// belongs to this handle and the clones made from it; the records and the trail are
    /// shared with every clone.
    #[must_use]
    pub fn with_audit_level(mut self, level: AuditLevel) -> Self {
        self.level = level;
        self
    }

    /// The event `step` records at this store's level (see [`audit::event_for`]).
    fn event(
        &self,
        step: Step<'_>,
        key: &ScopedKey,
        now: Timestamp,
        previous: Option<&Record>,
    ) -> Option<AuditEvent> {
        audit::event_at(self.level, step, key, now, previous)
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

    /// The configured bound on the bytes the records take.
    pub fn max_bytes(&self) -> usize {
        self.shared.max_bytes
    }

    /// The bytes the records take now, as the bound counts them.
    pub fn bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::Relaxed)
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

    /// Applies the transition `step` decides, and records the event `event` makes of it.
    fn apply<O>(
        &self,
        key: &ScopedKey,
        step: impl FnOnce(Timestamp, Option<&Record>) -> Transition<O>,
        event: impl FnOnce(&O, Timestamp, Option<&Record>) -> Option<AuditEvent>,
    ) -> O {
        let now = self.shared.clock.now();
        let (hash, _, mut inner) = self.shared.shard(key);
        let previous = inner.get(hash, key).map(|e| &e.record);
        let t = step(now, previous);
        let event = event(&t.outcome, now, previous);
        inner.write(hash, key, t.change);
        self.shared.record(&mut inner, event);
        t.outcome
    }
}

fn lock(shard: &Mutex<Inner>) -> crate::sync::MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave a half-applied transition: every
    // write is computed first and then applied with infallible map operations.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Adds `event` to the locked shard's trail.
    fn record(&self, inner: &mut Inner, event: Option<AuditEvent>) {
        if event.is_none() && inner.expired.is_empty() {
            return;
        }
        for event in std::mem::take(&mut inner.expired).into_iter().chain(event) {
            let seq = self.audit_seq.fetch_add(1, Ordering::Relaxed);
            inner.audit.push(seq, event, self.audit);
        }
    }

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
        self.shards
            .iter()
            .map(|s| {
                let mut inner = lock(s);
                let swept = inner.sweep(now);
                self.record(&mut inner, None);
                swept
            })
            .sum()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.shared.capacity)
            .field("max_bytes", &self.shared.max_bytes)
            .field("audit", &self.level)
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
        let event = self.event(Step::Claim(req, &t.outcome), &req.key, now, previous);
        let result = match (&t.change, exists) {
            (Change::Put(record), false) => inner.make_room(
                now,
                footprint(record),
                self.shared.shard_capacity(index),
                self.shared.max_bytes,
            ),
            _ => Ok(()),
        };
        let result = result.map(|()| {
            inner.write(hash, &req.key, t.change);
            self.shared.record(&mut inner, event);
            t.outcome
        });
        drop(inner);
        ready(result)
    }

    fn renew(
        &self,
        hold: &Hold<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<RenewOutcome, StoreError>> + Send {
        let &Hold { key, owner, fence } = hold;
        ready(Ok(self.apply(
            key,
            |now, prev| decide::renew(now, prev, owner, fence, lease),
            |_, _, _| None,
        )))
    }

    fn complete(
        &self,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        let &Completion {
            hold: Hold { key, owner, fence },
            response,
            ttl,
        } = completion;
        // Kept in exact-size buffers: a slice of a larger buffer would pin all of it.
        let response = response.compacted();
        let status = response.status;
        ready(Ok(self.apply(
            key,
            |now, prev| decide::complete(now, prev, owner, fence, response, ttl),
            |&outcome, now, prev| {
                let step = Step::Complete {
                    owner,
                    fence,
                    status,
                    outcome,
                };
                self.event(step, key, now, prev)
            },
        )))
    }

    fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        let &Hold { key, owner, fence } = hold;
        ready(Ok(self.apply(
            key,
            |now, prev| decide::release(now, prev, owner, fence, kind),
            |&outcome, now, prev| {
                let step = Step::Release {
                    owner,
                    fence,
                    kind,
                    outcome,
                };
                self.event(step, key, now, prev)
            },
        )))
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
                    .oldest_first()
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
        fence: Option<u64>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
        ready(Ok(self.apply(
            key,
            |now, prev| decide::resolve(now, prev, resolution, fence),
            |&outcome, now, prev| self.event(Step::Resolve(resolution, outcome), key, now, prev),
        )))
    }

    fn delete(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = self.shared.clock.now();
        let (hash, _, mut inner) = self.shared.shard(key);
        let previous = decide::live(now, inner.get(hash, key).map(|e| &e.record));
        let existed = previous.is_some();
        let event = self.event(Step::Delete { existed }, key, now, previous);
        inner.remove(hash, key);
        self.shared.record(&mut inner, event);
        ready(Ok(existed))
    }

    fn audit(
        &self,
        query: &AuditQuery,
    ) -> impl Future<Output = Result<Vec<AuditEvent>, StoreError>> + Send {
        let limit = query.effective_limit();
        let mut found = Vec::new();
        for shard in &self.shared.shards {
            found.extend(lock(shard).audit.matching(query, limit));
        }
        found.sort_by_key(|(seq, e)| std::cmp::Reverse((e.at, *seq)));
        found.truncate(limit);
        ready(Ok(found.into_iter().map(|(_, e)| e).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::shard::STALE_SLACK;
    use super::*;
    use crate::clock::ManualClock;
    use crate::fingerprint::Fingerprint;
    use crate::key::{Key, Scope};
    use crate::record::{OwnerId, StoredResponse, TakeoverPolicy};

    fn key(name: &str) -> ScopedKey {
        ScopedKey::new(Scope::new("mem").expect("ns"), Key::new(name).expect("key"))
    }

    async fn claim_and_complete(store: &MemoryStore, name: &str, ttl: Duration) {
        try_claim_and_complete(store, name, ttl)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    async fn try_claim_and_complete(
        store: &MemoryStore,
        name: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let req = ClaimRequest {
            key: key(name),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(1),
            ttl,
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        };
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await? else {
            panic!("{name} not claimed");
        };
        let done = store
            .complete(&Completion::new(
                Hold::of(&req.key, &lease),
                &StoredResponse::new(200, ""),
                ttl,
            ))
            .await
            .expect("complete");
        assert_eq!(done, SettleOutcome::Settled);
        Ok(())
    }

    #[tokio::test]
    async fn the_sweep_records_what_expired_and_the_ring_keeps_its_bound() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let retention = AuditRetention {
            max_events: 3,
            max_age: Duration::from_secs(3600),
        };
        let store =
            MemoryStore::with_audit(10, clock.clone(), retention).with_audit_level(AuditLevel::All);
        claim_and_complete(&store, "a", Duration::from_secs(5)).await;
        clock.advance(Duration::from_secs(10));
        assert_eq!(store.sweep(), 1);
        let all = store.audit(&AuditQuery::default()).await.expect("audit");
        let kinds: Vec<_> = all.iter().map(|e| e.kind).collect();
        use crate::audit::AuditKind::{Claimed, Completed, Expired};
        assert_eq!(kinds, [Expired, Completed, Claimed]);
        assert_eq!(
            all[0].at,
            Timestamp(1_005_000),
            "expired when its TTL ran out"
        );
        claim_and_complete(&store, "b", Duration::from_secs(5)).await;
        let all = store.audit(&AuditQuery::default()).await.expect("audit");
        assert_eq!(all.len(), 3, "bounded: the oldest events went");
        assert_eq!(all[0].key, "b");
    }

    // At the default level a claim and its completion leave the trail alone; the record's
    // expiry is still written.
    #[tokio::test]
    async fn the_default_level_records_no_routine_claim_or_completion() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(10, clock.clone());
        claim_and_complete(&store, "a", Duration::from_secs(5)).await;
        let all = store.audit(&AuditQuery::default()).await.expect("audit");
        assert_eq!(all, [], "a first request wrote to the trail");
        clock.advance(Duration::from_secs(10));
        assert_eq!(store.sweep(), 1);
        let all = store.audit(&AuditQuery::default()).await.expect("audit");
        let kinds: Vec<_> = all.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [crate::audit::AuditKind::Expired]);
    }

    // A full store sweeps before it refuses: a record whose TTL ran out makes room, and is
    // audited as expired when its TTL ran out, not when the room was needed.
    #[tokio::test]
    async fn a_full_store_makes_room_only_from_expired_records() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(1, clock.clone());
        claim_and_complete(&store, "a", Duration::from_secs(100)).await;
        let refused = try_claim_and_complete(&store, "b", Duration::from_secs(100)).await;
        assert!(
            matches!(refused, Err(StoreError::Full { capacity: 1 })),
            "{refused:?}"
        );
        assert!(store.get(&key("a")).await.expect("get").is_some());
        clock.advance(Duration::from_secs(101));
        claim_and_complete(&store, "b", Duration::from_secs(100)).await;
        let expired = store
            .audit(&AuditQuery {
                kind: Some(crate::audit::AuditKind::Expired),
                ..AuditQuery::default()
            })
            .await
            .expect("audit");
        assert_eq!(expired.len(), 1);
        assert_eq!(
            (expired[0].key.as_str(), expired[0].at),
            ("a", Timestamp(1_100_000))
        );
    }

    // A key claimed again over its expired (unswept) record replaces it in place: it takes
    // no new room, so it is never refused at capacity, and the records beside it stay.
    #[tokio::test]
    async fn a_key_reclaimed_over_its_expired_record_takes_no_new_room() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(2, clock.clone());
        claim_and_complete(&store, "a", Duration::from_secs(5)).await;
        claim_and_complete(&store, "b", Duration::from_secs(100)).await;
        clock.advance(Duration::from_secs(10));
        claim_and_complete(&store, "a", Duration::from_secs(100)).await;
        let refused = try_claim_and_complete(&store, "c", Duration::from_secs(100)).await;
        assert!(
            matches!(refused, Err(StoreError::Full { .. })),
            "{refused:?}"
        );
        assert!(store.get(&key("a")).await.expect("get").is_some());
        assert!(store.get(&key("b")).await.expect("get").is_some());
        assert_eq!(only_shard(&store).oldest_first().count(), 2);
    }

    /// The one shard of a small store, for looking at its indexes.
    fn only_shard(store: &MemoryStore) -> crate::sync::MutexGuard<'_, Inner> {
        assert_eq!(store.shared.shards.len(), 1);
        lock(&store.shared.shards[0])
    }

    // Bug guarded: the expiry index is lazy, so a completed record still has the triple of
    // its claim (lease expiry) in it. A sweep that took any triple of the record's seq as
    // due would drop a completed record when its old lease ran out, long before its TTL.
    #[tokio::test]
    async fn a_sweep_skips_an_expiry_the_record_has_moved_past() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(10, clock.clone());
        let req = ClaimRequest {
            key: key("a"),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        };
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await.expect("claim") else {
            panic!("not claimed");
        };
        clock.advance(Duration::from_secs(5));
        let response = StoredResponse::new(200, "");
        let ttl = Duration::from_secs(3600);
        let completion = Completion::new(Hold::of(&req.key, &lease), &response, ttl);
        let done = store.complete(&completion);
        assert_eq!(done.await.expect("complete"), SettleOutcome::Settled);
        clock.advance(Duration::from_secs(6)); // past the claim's expiry, not the new one
        assert_eq!(store.sweep(), 0, "swept on the claim's stale expiry");
        assert!(store.get(&key("a")).await.expect("get").is_some());
        clock.advance(Duration::from_secs(3600));
        assert_eq!(store.sweep(), 1);
        assert!(store.is_empty());
        let inner = only_shard(&store);
        assert_eq!((inner.by_expiry.len(), inner.expiry_len), (0, 0));
    }

    // The lazy indexes keep stale entries; churn (claims, completions, deletes and
    // re-claims over expired records) must not let them grow without bound, and what they
    // say must stay true: every live record in age order, the byte count exact, and a full
    // store refusing rather than dropping.
    #[tokio::test]
    async fn lazy_indexes_stay_bounded_and_true_under_churn() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let store = MemoryStore::with_clock(64, clock.clone());
        for i in 0..20_000u32 {
            let name = format!("k{}", i % 48);
            claim_and_complete(&store, &name, Duration::from_secs(2)).await;
            if i % 3 == 0 {
                store.delete(&key(&name)).await.expect("delete");
            }
            if i % 7 == 0 {
                clock.advance(Duration::from_millis(900));
            }
            let inner = only_shard(&store);
            let live = inner.records.len();
            assert!(
                inner.by_age.len() <= 2 * live + STALE_SLACK + 1,
                "age index grew"
            );
            assert!(
                inner.expiry_len <= 2 * live + STALE_SLACK + 1,
                "expiry index grew"
            );
            let counted: usize = inner.by_expiry.values().map(Vec::len).sum();
            assert_eq!(counted, inner.expiry_len);
            let bytes: usize = inner.records.iter().map(|e| footprint(&e.record)).sum();
            assert_eq!(store.bytes(), bytes, "the byte count drifted");
            assert_eq!(
                inner.oldest_first().count(),
                live,
                "a live record left age order"
            );
        }
        // Fill to capacity with long-lived records, delete the oldest, add two more: the
        // first takes the deleted one's room, the second is refused and nothing is dropped.
        clock.advance(Duration::from_secs(10));
        store.sweep();
        for i in 0..64 {
            claim_and_complete(&store, &format!("f{i}"), Duration::from_secs(1000)).await;
        }
        store.delete(&key("f0")).await.expect("delete");
        claim_and_complete(&store, "g0", Duration::from_secs(1000)).await;
        let refused = try_claim_and_complete(&store, "g1", Duration::from_secs(1000)).await;
        assert!(
            matches!(refused, Err(StoreError::Full { .. })),
            "{refused:?}"
        );
        assert_eq!(store.len(), 64);
        assert!(store.get(&key("f1")).await.expect("get").is_some());
        assert!(store.get(&key("g0")).await.expect("get").is_some());
        assert_eq!(only_shard(&store).oldest_first().count(), 64);
    }

    #[tokio::test]
    async fn a_sharded_store_stays_within_its_capacity() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let capacity = 3 * SHARD_SIZE + 5;
        let store = MemoryStore::with_clock(capacity, clock.clone());
        assert!(store.shared.shards.len() > 1, "expected a sharded store");
        let mut refused = 0;
        for i in 0..capacity + 2_000 {
            if try_claim_and_complete(&store, &format!("k{i}"), Duration::from_secs(100))
                .await
                .is_err()
            {
                refused += 1;
            }
        }
        let held = store.len();
        assert!(held <= capacity, "{held} records held, capacity {capacity}");
        assert_eq!(held + refused, capacity + 2_000);
        // Every shard filled up to its share before refusing.
        assert!(
            held > capacity - 2 * store.shared.shards.len(),
            "only {held} held"
        );
        // Nothing held was dropped to make room: the first record is still there.
        assert!(store.get(&key("k0")).await.expect("get").is_some());
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
            .complete(&Completion::new(
                Hold::of(&req.key, &lease),
                &response,
                req.ttl,
            ))
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
