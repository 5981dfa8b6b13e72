//! One shard of a [`MemoryStore`](super::MemoryStore): its records, the lazy age and expiry
//! indexes over them, the bytes they take, the sweep, and the capacity check.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;

use crate::decide::Change;
use crate::key::ScopedKey;
use crate::record::{Record, RecordState, Timestamp};
use crate::store::StoreError;

/// One shard's records and indexes.
#[derive(Default)]
pub(super) struct Inner {
    /// Entries found by the key's hash (computed once per operation) and the key itself.
    /// Boxed: a record is a few hundred bytes, and the table moves every record on each
    /// growth; a pointer moves cheaply.
    pub(super) records: HashTable<Box<Entry>>,
    /// Insertion order, oldest first: (seq, key hash). Kept lazily: removing a record
    /// leaves its pair behind, and a pair counts only while an entry with that hash still
    /// has that seq. Stale pairs are dropped when they reach the front, or all at once when
    /// they outnumber the records. So an insert or a removal is O(1) here, where an
    /// ordered map would cost O(log n) per fresh request.
    pub(super) by_age: VecDeque<(u64, u64)>,
    /// Expiry times, bucketed by second: second -> (expires_at, seq, key hash). Lazy in the
    /// same way: a record whose expiry moved or that was removed leaves its old triple,
    /// which a sweep skips because it no longer matches the entry.
    pub(super) by_expiry: BTreeMap<u64, Vec<(Timestamp, u64, u64)>>,
    /// Triples held in `by_expiry`, stale ones included.
    pub(super) expiry_len: usize,
    /// What the records of the whole store take in memory, as [`footprint`] counts it: one
    /// counter shared by every shard, so the byte bound holds for the store, however its
    /// keys fall between shards.
    pub(super) bytes: Arc<AtomicUsize>,
    pub(super) next_seq: u64,
    /// Highest fence ever issued in this shard; outlives every record, so fences never
    /// repeat for any key of the shard.
    pub(super) fence_high: u64,
    /// This shard's part of the audit trail.
    pub(super) audit: crate::audit::Ring,
    /// `expired` events of the last sweep, until the store numbers them into `audit`.
    pub(super) expired: Vec<crate::audit::AuditEvent>,
}

/// Stale index entries tolerated beyond the live ones before an index is rebuilt.
pub(super) const STALE_SLACK: usize = 1024;

pub(super) struct Entry {
    pub(super) hash: u64,
    pub(super) seq: u64,
    pub(super) record: Record,
}

impl Inner {
    pub(super) fn get(&self, hash: u64, key: &ScopedKey) -> Option<&Entry> {
        self.records
            .find(hash, |e| e.record.key == *key)
            .map(|e| &**e)
    }

    /// The live entry an index pair or triple names, if it still names one.
    pub(super) fn current(&self, seq: u64, hash: u64) -> Option<&Entry> {
        named(&self.records, seq, hash)
    }

    pub(super) fn write(&mut self, hash: u64, key: &ScopedKey, change: Change) {
        match change {
            Change::Keep => {}
            Change::Remove => self.remove(hash, key),
            Change::Put(record) => {
                self.fence_high = self.fence_high.max(record.fence);
                let expires_at = record.expires_at;
                let size = footprint(&record);
                let seq = match self.records.find_mut(hash, |e| e.record.key == *key) {
                    Some(entry) if entry.record.created_at == record.created_at => {
                        let moved = entry.record.expires_at != expires_at;
                        resize(&self.bytes, footprint(&entry.record), size);
                        entry.record = record;
                        if moved {
                            let seq = entry.seq;
                            self.index_expiry(expires_at, seq, hash);
                        }
                        return;
                    }
                    // A record created anew over an expired one is young: it takes a new
                    // place in age order (for list) instead of inheriting the
                    // old one's. Its old index entries go stale with the old seq.
                    Some(entry) => {
                        resize(&self.bytes, footprint(&entry.record), size);
                        entry.seq = self.next_seq;
                        entry.record = record;
                        entry.seq
                    }
                    None => {
                        self.bytes.fetch_add(size, Ordering::Relaxed);
                        let seq = self.next_seq;
                        self.records.insert_unique(
                            hash,
                            Box::new(Entry { hash, seq, record }),
                            |e| e.hash,
                        );
                        seq
                    }
                };
                self.next_seq += 1;
                self.by_age.push_back((seq, hash));
                if self.by_age.len() > 2 * self.records.len() + STALE_SLACK {
                    let records = &self.records;
                    self.by_age
                        .retain(|&(seq, hash)| named(records, seq, hash).is_some());
                }
                self.index_expiry(expires_at, seq, hash);
            }
        }
    }

    pub(super) fn index_expiry(&mut self, expires_at: Timestamp, seq: u64, hash: u64) {
        self.push_expiry(expires_at, seq, hash);
        if self.expiry_len > 2 * self.records.len() + STALE_SLACK {
            self.by_expiry.clear();
            self.expiry_len = 0;
            let live: Vec<_> = self
                .records
                .iter()
                .map(|e| (e.record.expires_at, e.seq, e.hash))
                .collect();
            for (t, seq, hash) in live {
                self.push_expiry(t, seq, hash);
            }
        }
    }

    pub(super) fn push_expiry(&mut self, expires_at: Timestamp, seq: u64, hash: u64) {
        self.by_expiry
            .entry(expires_at.0 / 1000)
            .or_default()
            .push((expires_at, seq, hash));
        self.expiry_len += 1;
    }

    /// Removes the record under `key`; its index entries go stale.
    pub(super) fn remove(&mut self, hash: u64, key: &ScopedKey) {
        if let Ok(found) = self.records.find_entry(hash, |e| e.record.key == *key) {
            let (entry, _) = found.remove();
            self.bytes
                .fetch_sub(footprint(&entry.record), Ordering::Relaxed);
        }
    }

    /// The live (seq, hash) pairs in age order, oldest first.
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = &Entry> {
        self.by_age
            .iter()
            .filter_map(|&(seq, hash)| self.current(seq, hash))
    }

    pub(super) fn sweep(&mut self, now: Timestamp) -> usize {
        let mut swept = 0;
        let Self {
            records,
            by_expiry,
            expiry_len,
            expired,
            bytes,
            ..
        } = self;
        while let Some(mut bucket) = by_expiry.first_entry() {
            if *bucket.key() > now.0 / 1000 {
                break;
            }
            bucket.get_mut().retain(|&(t, seq, hash)| {
                if t > now {
                    return true; // later in the current second
                }
                *expiry_len -= 1;
                let due = records.find_entry(hash, |e| e.seq == seq && e.record.expires_at == t);
                if let Ok(found) = due {
                    let (entry, _) = found.remove();
                    bytes.fetch_sub(footprint(&entry.record), Ordering::Relaxed);
                    expired.push(crate::audit::expired(&entry.record));
                    swept += 1;
                }
                false
            });
            if !bucket.get().is_empty() {
                break;
            }
            bucket.remove();
        }
        swept
    }

    /// Makes room for one new record taking `size` bytes, or says the shard (at `capacity`
    /// records) or the store (at `max_bytes`) is full.
    ///
    /// Only expired records are dropped for it. A completed record still within its TTL is a
    /// promise to replay its answer, and a processing or unknown one stands between a retry
    /// and a second execution: dropping any of them early would let a flood of cheap new keys
    /// turn a victim's retry into a second run. Past that, the new claim is refused.
    pub(super) fn make_room(
        &mut self,
        now: Timestamp,
        size: usize,
        capacity: usize,
        max_bytes: usize,
    ) -> Result<(), StoreError> {
        let fits = |inner: &Self| {
            inner.records.len() < capacity
                && inner.bytes.load(Ordering::Relaxed).saturating_add(size) <= max_bytes
        };
        if fits(self) {
            return Ok(());
        }
        self.sweep(now);
        if fits(self) {
            return Ok(());
        }
        if self.records.len() >= capacity {
            Err(StoreError::Full { capacity })
        } else {
            Err(StoreError::FullBytes { max_bytes })
        }
    }
}

/// Moves the shared byte count from a record's old footprint to its new one. Every change
/// happens under the shard's lock; the counter is shared so the shards can add up.
fn resize(bytes: &AtomicUsize, old: usize, new: usize) {
    if new >= old {
        bytes.fetch_add(new - old, Ordering::Relaxed);
    } else {
        bytes.fetch_sub(old - new, Ordering::Relaxed);
    }
}

/// Bytes a held record takes besides its key's table slot, roughly: the boxed entry, its
/// index entries, and the allocation headers of its strings.
const RECORD_OVERHEAD: usize = 256;
/// Bytes a stored header or trailer takes besides its name and value.
const FIELD_OVERHEAD: usize = 48;

/// What `record` takes in memory: a fixed overhead, its key, request id and stored answer.
pub(super) fn footprint(record: &Record) -> usize {
    let key = &record.key;
    let text = key.scope.namespace().len()
        + key.scope.principal().map_or(0, str::len)
        + key.key.as_str().len()
        + record.request_id.as_ref().map_or(0, String::len);
    let answer = match &record.state {
        RecordState::Completed { response, .. } => {
            response.size() + FIELD_OVERHEAD * (response.headers.len() + response.trailers.len())
        }
        RecordState::Processing { .. } | RecordState::Unknown { .. } => 0,
    };
    RECORD_OVERHEAD + text + answer
}

/// The entry under `hash` with age sequence number `seq`, if one is held.
fn named(records: &HashTable<Box<Entry>>, seq: u64, hash: u64) -> Option<&Entry> {
    records.find(hash, |e| e.seq == seq).map(|e| &**e)
}
