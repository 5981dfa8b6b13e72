//! A deliberately faulty store, to show the suite bites.
//!
//! [`BrokenStore`] applies `idem_core::decide` like the memory store, except for one
//! selectable [`Bug`]. With [`Bug::None`] it passes the whole suite; with any other bug some
//! rule or the model test must fail. This crate's `tests/bites.rs` holds that to account.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_core::audit::{self, AuditEvent, AuditLevel, AuditQuery, AuditRetention, Ring, Step};
use idem_core::decide::{self, Change};
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Clock, ListFilter, ManualClock, Record, RecordState, ReleaseKind,
    RenewOutcome, Resolution, ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError,
    TakeoverPolicy, Timestamp,
};

use crate::harness::Harness;

/// The bug a [`BrokenStore`] has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Bug {
    /// No bug: the store follows the contract.
    None,
    /// `complete` writes the response whoever asks, ignoring owner, fence and state.
    CompleteUnconditionally,
    /// No fence counter outlives a record: after expiry, release or delete fences restart at 1.
    FenceResetsAfterExpiry,
    /// `claim` reads, awaits, then writes: racing claims all see the key absent.
    CheckThenSetClaim,
    /// `claim` ignores the fingerprint: another request replays or takes the key over.
    IgnoresFingerprint,
    /// `release(Unknown)` removes the record as if retryable: an ambiguous outcome re-runs.
    UnknownReleaseRemoves,
    /// `resolve` also settles processing records whose lease is still live.
    ResolvesLiveLease,
    /// Records never expire: the record TTL is ignored.
    IgnoresTtl,
    /// `renew` checks the owner but not the fence.
    RenewIgnoresFence,
    /// The `hold` policy takes an expired lease over like `reexecute`: a handler whose outcome
    /// is ambiguous runs again.
    HoldTakesOver,
    /// Resolves and deletes change the record but leave no trace in the audit trail.
    UnauditedSettlements,
    /// `resolve` ignores the fence it is given: a settlement decided about one attempt
    /// applies to a later one.
    ResolveIgnoresFence,
    /// The audit trail records every transition whatever the level: the default level's
    /// promise of no write for a claim and its completion is broken.
    IgnoresAuditLevel,
}

impl Bug {
    /// Every bug, without [`Bug::None`].
    pub const ALL: [Bug; 12] = [
        Bug::CompleteUnconditionally,
        Bug::FenceResetsAfterExpiry,
        Bug::CheckThenSetClaim,
        Bug::IgnoresFingerprint,
        Bug::UnknownReleaseRemoves,
        Bug::ResolvesLiveLease,
        Bug::IgnoresTtl,
        Bug::RenewIgnoresFence,
        Bug::HoldTakesOver,
        Bug::UnauditedSettlements,
        Bug::ResolveIgnoresFence,
        Bug::IgnoresAuditLevel,
    ];
}

/// An in-memory store with one selectable [`Bug`]. Clones share records.
#[derive(Clone, Debug)]
pub struct BrokenStore {
    bug: Bug,
    level: AuditLevel,
    clock: ManualClock,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Records with their insertion sequence (for a stable oldest-first order).
    records: HashMap<ScopedKey, (u64, Record)>,
    next_seq: u64,
    fence_high: u64,
    ignore_ttl: bool,
    audit: Ring,
    audit_seq: u64,
}

impl Inner {
    fn record(&mut self, event: Option<AuditEvent>) {
        if let Some(event) = event {
            self.audit_seq += 1;
            self.audit
                .push(self.audit_seq, event, AuditRetention::default());
        }
    }

    fn get(&self, key: &ScopedKey) -> Option<&Record> {
        self.records.get(key).map(|(_, r)| r)
    }

    fn write(&mut self, key: &ScopedKey, change: Change) {
        match change {
            Change::Put(mut record) => {
                if self.ignore_ttl {
                    record.expires_at = Timestamp(u64::MAX);
                }
                self.fence_high = self.fence_high.max(record.fence);
                let seq = match self.records.get(key) {
                    Some((seq, _)) => *seq,
                    None => {
                        self.next_seq += 1;
                        self.next_seq
                    }
                };
                self.records.insert(key.clone(), (seq, record));
            }
            Change::Remove => {
                self.records.remove(key);
            }
            _ => {}
        }
    }
}

impl BrokenStore {
    /// The clock the store judges time by (clones share it).
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// A store with `bug`, on `clock`.
    pub fn new(bug: Bug, clock: ManualClock) -> Self {
        let inner = Inner {
            ignore_ttl: bug == Bug::IgnoresTtl,
            ..Inner::default()
        };
        Self {
            bug,
            level: AuditLevel::default(),
            clock,
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// This store recording the changes `level` names (its clones share the records).
    #[must_use]
    pub fn with_audit_level(mut self, level: AuditLevel) -> Self {
        self.level = level;
        self
    }

    /// The event `step` records at this store's level.
    fn event(
        &self,
        step: Step<'_>,
        key: &ScopedKey,
        now: Timestamp,
        previous: Option<&Record>,
    ) -> Option<AuditEvent> {
        let level = match self.bug {
            Bug::IgnoresAuditLevel => AuditLevel::All,
            _ => self.level,
        };
        audit::event_for(step, key, now, previous).filter(|e| level.records(e.kind, previous))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn apply<O>(
        &self,
        key: &ScopedKey,
        step: impl FnOnce(Timestamp, Option<&Record>) -> decide::Transition<O>,
        event: impl FnOnce(&O, Timestamp, Option<&Record>) -> Option<AuditEvent>,
    ) -> O {
        let now = self.clock.now();
        let mut inner = self.lock();
        let previous = inner.get(key);
        let t = step(now, previous);
        let event = event(&t.outcome, now, previous);
        inner.write(key, t.change);
        inner.record(event);
        t.outcome
    }

    fn decide_claim(
        &self,
        now: Timestamp,
        previous: Option<&Record>,
        req: &ClaimRequest,
        floor: u64,
    ) -> decide::Transition<ClaimOutcome> {
        let live = decide::live(now, previous);
        let (previous, floor) = match self.bug {
            // Forget everything about expired records, and keep no counter.
            Bug::FenceResetsAfterExpiry => (live, 1),
            _ => (previous, floor),
        };
        match (self.bug, live) {
            (Bug::IgnoresFingerprint, Some(r)) => {
                let req = ClaimRequest {
                    fingerprint: r.fingerprint,
                    ..req.clone()
                };
                decide::claim(now, previous, &req, floor)
            }
            (Bug::HoldTakesOver, _) => {
                let req = ClaimRequest {
                    takeover: TakeoverPolicy::Reexecute,
                    ..req.clone()
                };
                decide::claim(now, previous, &req, floor)
            }
            _ => decide::claim(now, previous, req, floor),
        }
    }
}

impl Store for BrokenStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.bug == Bug::CheckThenSetClaim {
            let (previous, floor) = {
                let inner = self.lock();
                (inner.get(&req.key).cloned(), inner.fence_high + 1)
            };
            // The await point between read and write (a round trip, in a real store): other
            // claims run here.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let now = self.clock.now();
            let t = self.decide_claim(now, previous.as_ref(), req, floor);
            let event = self.event(
                Step::Claim(req, &t.outcome),
                &req.key,
                now,
                previous.as_ref(),
            );
            let mut inner = self.lock();
            inner.write(&req.key, t.change);
            inner.record(event);
            return Ok(t.outcome);
        }
        let now = self.clock.now();
        let mut inner = self.lock();
        let floor = inner.fence_high + 1;
        let previous = inner.get(&req.key);
        let t = self.decide_claim(now, previous, req, floor);
        let event = self.event(Step::Claim(req, &t.outcome), &req.key, now, previous);
        inner.write(&req.key, t.change);
        inner.record(event);
        Ok(t.outcome)
    }

    fn renew(
        &self,
        hold: &Hold<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<RenewOutcome, StoreError>> + Send {
        let (&Hold { key, owner, fence }, bug) = (hold, self.bug);
        std::future::ready(Ok(self.apply(
            key,
            |now, prev| {
                let fence = match (bug, prev.map(|r| (&r.state, r.fence))) {
                    (
                        Bug::RenewIgnoresFence,
                        Some((RecordState::Processing { owner: o, .. }, current)),
                    ) if *o == owner => current,
                    _ => fence,
                };
                decide::renew(now, prev, owner, fence, lease)
            },
            |_, _, _| None,
        )))
    }

    fn complete(
        &self,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send {
        let (
            &Completion {
                hold,
                response,
                ttl,
            },
            bug,
        ) = (completion, self.bug);
        let Hold { key, owner, fence } = hold;
        std::future::ready(Ok(self.apply(
            key,
            |now, prev| match (bug, decide::live(now, prev)) {
                (Bug::CompleteUnconditionally, Some(record)) => {
                    let mut next = record.clone();
                    next.state = RecordState::Completed {
                        response: response.clone(),
                        completed_at: now,
                    };
                    next.expires_at = now.plus(ttl);
                    decide::Transition {
                        change: Change::Put(next),
                        outcome: SettleOutcome::Settled,
                    }
                }
                _ => decide::complete(now, prev, owner, fence, response.clone(), ttl),
            },
            |&outcome, now, prev| {
                let status = response.status;
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
        let kind = match (self.bug, kind) {
            (Bug::UnknownReleaseRemoves, ReleaseKind::Unknown) => ReleaseKind::Retryable,
            _ => kind,
        };
        std::future::ready(Ok(self.apply(
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
        let now = self.clock.now();
        std::future::ready(Ok(decide::live(now, self.lock().get(key)).cloned()))
    }

    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send {
        let now = self.clock.now();
        let inner = self.lock();
        let mut found: Vec<&(u64, Record)> = inner
            .records
            .values()
            .filter(|(_, r)| decide::matches_filter(now, r, filter))
            .collect();
        found.sort_by_key(|(seq, r)| (r.created_at, *seq));
        let out = found
            .into_iter()
            .take(filter.effective_limit())
            .map(|(_, r)| r.clone())
            .collect();
        std::future::ready(Ok(out))
    }

    fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
        fence: Option<u64>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send {
        let bug = self.bug;
        std::future::ready(Ok(self.apply(
            key,
            |now, prev| {
                // Pretend the lease has run out by judging it a lease later.
                let judged_at = match (bug, decide::live(now, prev).map(|r| &r.state)) {
                    (Bug::ResolvesLiveLease, Some(RecordState::Processing { lease_until, .. })) => {
                        now.max(*lease_until)
                    }
                    _ => now,
                };
                let fence = if bug == Bug::ResolveIgnoresFence {
                    None
                } else {
                    fence
                };
                let mut t = decide::resolve(judged_at, prev, resolution, fence);
                if let Change::Put(record) = &mut t.change
                    && let RecordState::Completed { completed_at, .. } = &mut record.state
                {
                    *completed_at = now;
                }
                t
            },
            |&outcome, now, prev| match bug {
                Bug::UnauditedSettlements => None,
                _ => self.event(Step::Resolve(resolution, outcome), key, now, prev),
            },
        )))
    }

    fn delete(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = self.clock.now();
        let mut inner = self.lock();
        let previous = decide::live(now, inner.get(key));
        let existed = previous.is_some();
        let event = match self.bug {
            Bug::UnauditedSettlements => None,
            _ => self.event(Step::Delete { existed }, key, now, previous),
        };
        inner.write(key, Change::Remove);
        inner.record(event);
        if self.bug == Bug::FenceResetsAfterExpiry {
            inner.fence_high = 0;
        }
        std::future::ready(Ok(existed))
    }

    fn audit(
        &self,
        query: &AuditQuery,
    ) -> impl Future<Output = Result<Vec<AuditEvent>, StoreError>> + Send {
        let found = self.lock().audit.matching(query, query.effective_limit());
        std::future::ready(Ok(found.into_iter().map(|(_, e)| e).collect()))
    }
}

/// A [`Harness`] for [`BrokenStore`]s with one bug, on a manual clock.
#[derive(Clone, Debug)]
pub struct BrokenHarness {
    bug: Bug,
    clock: ManualClock,
}

impl BrokenHarness {
    /// A harness whose stores all have `bug`.
    pub fn new(bug: Bug) -> Self {
        Self {
            bug,
            clock: ManualClock::new(Timestamp(1_767_225_600_000)),
        }
    }
}

impl Harness for BrokenHarness {
    type Store = BrokenStore;

    fn store_at(&self, level: AuditLevel) -> impl Future<Output = BrokenStore> + Send {
        std::future::ready(BrokenStore::new(self.bug, self.clock.clone()).with_audit_level(level))
    }

    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(10)
    }

    fn time_travel(&self) -> bool {
        true
    }
}
