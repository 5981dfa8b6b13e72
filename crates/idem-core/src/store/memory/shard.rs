//! One shard of a [`MemoryStore`](super::MemoryStore): its records, the lazy age and expiry
//! indexes over them, the sweep, and eviction at capacity.

use std::collections::{BTreeMap, VecDeque};

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
                let seq = match self.records.find_mut(hash, |e| e.record.key == *key) {
                    Some(entry) if entry.record.created_at == record.created_at => {
                        let moved = entry.record.expires_at != expires_at;
                        entry.record = record;
                        if moved {
                            let seq = entry.seq;
                            self.index_expiry(expires_at, seq, hash);
                        }
                        return;
                    }
                    // A record created anew over an expired one is young: it takes a new
                    // place in age order (for list and eviction) instead of inheriting the
                    // old one's. Its old index entries go stale with the old seq.
                    Some(entry) => {
                        entry.seq = self.next_seq;
                        entry.record = record;
                        entry.seq
                    }
                    None => {
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
            found.remove();
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

    /// Makes room for one new record, or says the shard is full.
    pub(super) fn make_room(&mut self, now: Timestamp, capacity: usize) -> Result<(), StoreError> {
        if self.records.len() < capacity {
            return Ok(());
        }
        self.sweep(now);
        if self.records.len() < capacity {
            return Ok(());
        }
        while let Some(&(seq, hash)) = self.by_age.front() {
            if self.current(seq, hash).is_some() {
                break;
            }
            self.by_age.pop_front();
        }
        let victim = self
            .oldest_first()
            .find(|e| evictable(now, &e.record))
            .map(|e| (e.seq, e.hash));
        match victim {
            Some((seq, hash)) => {
                if let Ok(found) = self.records.find_entry(hash, |e| e.seq == seq) {
                    let (entry, _) = found.remove();
                    // Removed before the end of its life to make room: recorded as expired
                    // now, with the reason.
                    let mut event = crate::audit::expired(&entry.record);
                    event.at = now;
                    event.outcome = Some("evicted".into());
                    self.expired.push(event);
                }
                Ok(())
            }
            None => Err(StoreError::Full { capacity }),
        }
    }
}

/// The entry under `hash` with age sequence number `seq`, if one is held.
fn named(records: &HashTable<Box<Entry>>, seq: u64, hash: u64) -> Option<&Entry> {
    records.find(hash, |e| e.seq == seq).map(|e| &**e)
}

fn evictable(now: Timestamp, record: &Record) -> bool {
    match &record.state {
        RecordState::Completed { .. } => true,
        RecordState::Processing { lease_until, .. } => *lease_until <= now,
        RecordState::Unknown { .. } => false,
    }
}
