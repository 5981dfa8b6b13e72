//! The audit trail: one event per state change of a record, written by the store in the
//! same atomic step as the change, and queried with [`Store::audit`](crate::Store::audit).
//!
//! Every store keeps its trail bounded (see [`AuditRetention`]): the memory store in a ring,
//! the SQL stores in a table next to the records, Redis in a capped stream per namespace.
//! By default a store leaves out the routine path a record already describes (a fresh claim
//! and its completion, see [`AuditLevel`]); `AuditLevel::All` records every transition.
//! `docs/operations.md` describes what each store records and how to read the trail.
//!
//! Who made a change: `instance` names the process that held the claim (the process part of
//! its [`OwnerId`], see [`instance_of`]); `actor` names an operator or a reconciler for the
//! changes they make (resolve, delete). A caller names itself for the store operations it
//! runs inside [`acting_as`]:
//!
//! ```
//! use idem_core::audit::{self, AuditKind, AuditQuery};
//! use idem_core::{
//!     ClaimOutcome, ClaimRequest, Fingerprint, Hold, Key, MemoryStore, OwnerId, ReleaseKind,
//!     Resolution, Scope, ScopedKey, Store, TakeoverPolicy,
//! };
//! use std::time::Duration;
//!
//! # fn main() {
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! runtime.block_on(async {
//!     let store = MemoryStore::new(100);
//!     let key = ScopedKey::new(Scope::new("docs").unwrap(), Key::new("k").unwrap());
//!     let req = ClaimRequest {
//!         key: key.clone(),
//!         fingerprint: Fingerprint::of_bytes(1, b"x"),
//!         owner: OwnerId::random(),
//!         lease: Duration::from_secs(5),
//!         ttl: Duration::from_secs(60),
//!         takeover: TakeoverPolicy::Hold,
//!         request_id: Some("req-1".into()),
//!     };
//!     let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await.unwrap() else {
//!         unreachable!()
//!     };
//!     store.release(&Hold::of(&key, &lease), ReleaseKind::Unknown).await.unwrap();
//!     audit::acting_as("operator:ann", || store.resolve(&key, &Resolution::Release, None))
//!         .await
//!         .unwrap();
//!
//!     let trail = store.audit(&AuditQuery::for_key(&key)).await.unwrap();
//!     let kinds: Vec<AuditKind> = trail.iter().map(|e| e.kind).collect();
//!     // Newest first. The fresh claim is the record's own story, not the trail's (a store
//!     // built `with_audit_level(AuditLevel::All)` writes it too).
//!     assert_eq!(kinds, [AuditKind::Resolved, AuditKind::Unknown]);
//!     assert_eq!(trail[0].actor.as_deref(), Some("operator:ann"));
//! });
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use crate::key::ScopedKey;
use crate::record::{OwnerId, Record, RecordState, ReleaseKind, Timestamp};
use crate::store::{ClaimOutcome, ClaimRequest, Resolution, ResolveOutcome, SettleOutcome};

mod level;

pub use level::{AuditLevel, AuditLevelError};

/// What happened to a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AuditKind {
    /// A fresh claim: absent (or expired, or released) became processing. Recorded at
    /// [`AuditLevel::All`] only.
    Claimed,
    /// The holder stored its final response. Recorded at [`AuditLevel::All`], and at the
    /// default level when it settles an unknown record.
    Completed,
    /// The holder gave the claim up before any effect: the key is free again.
    Released,
    /// The outcome became unknown: the holder said so, or its lease ran out under `hold`.
    Unknown,
    /// An expired lease was claimed again with a higher fence.
    TakenOver,
    /// A stale holder tried to settle and was refused; nothing changed.
    Fenced,
    /// An operator or reconciler settled an unknown or stuck record.
    Resolved,
    /// An operator deleted the record.
    Deleted,
    /// The record reached the end of its life and the store removed it.
    Expired,
}

impl AuditKind {
    /// Every kind, in code order.
    pub const ALL: [AuditKind; 9] = [
        AuditKind::Claimed,
        AuditKind::Completed,
        AuditKind::Released,
        AuditKind::Unknown,
        AuditKind::TakenOver,
        AuditKind::Fenced,
        AuditKind::Resolved,
        AuditKind::Deleted,
        AuditKind::Expired,
    ];

    /// The name used in APIs: `claimed`, `completed`, …, `taken_over`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AuditKind::Claimed => "claimed",
            AuditKind::Completed => "completed",
            AuditKind::Released => "released",
            AuditKind::Unknown => "unknown",
            AuditKind::TakenOver => "taken_over",
            AuditKind::Fenced => "fenced",
            AuditKind::Resolved => "resolved",
            AuditKind::Deleted => "deleted",
            AuditKind::Expired => "expired",
        }
    }

    /// A small stable number for stores that keep the kind as an integer (1-9).
    pub const fn code(self) -> u8 {
        match self {
            AuditKind::Claimed => 1,
            AuditKind::Completed => 2,
            AuditKind::Released => 3,
            AuditKind::Unknown => 4,
            AuditKind::TakenOver => 5,
            AuditKind::Fenced => 6,
            AuditKind::Resolved => 7,
            AuditKind::Deleted => 8,
            AuditKind::Expired => 9,
        }
    }

    /// The kind with [`AuditKind::code`] `code`.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|k| i64::from(k.code()) == code)
    }
}

impl fmt::Display for AuditKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an [`AuditKind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown audit event `{0}`: use claimed, completed, released, unknown, taken_over, fenced, resolved, deleted or expired"
)]
pub struct AuditKindError(pub String);

impl FromStr for AuditKind {
    type Err = AuditKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| AuditKindError(s.to_owned()))
    }
}

/// One state change of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    /// When it happened (store clock).
    pub at: Timestamp,
    /// The key's namespace.
    pub namespace: String,
    /// The key's principal, empty when the key has none.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// What happened.
    pub kind: AuditKind,
    /// The fence of the claim the change concerns (for `fenced`, the stale caller's).
    pub fence: u64,
    /// Request id of the claim, where the store has it.
    pub request_id: Option<String>,
    /// How the change settled the record, for kinds that say more than their name:
    /// `released` → `retryable`; `unknown` → `ambiguous` (the holder said so) or
    /// `lease_expired` (held at takeover); `resolved` → `complete` or `release`; `fenced` →
    /// the refused operation (`complete` or `release`); `expired` → `evicted` when the
    /// memory store dropped the record early to make room.
    pub outcome: Option<String>,
    /// The stored response's status, for `completed` and `resolved` with a response.
    pub status: Option<u16>,
    /// The process that made the change (see [`instance_of`]); `None` for changes the store
    /// made on its own (expiry).
    pub instance: Option<String>,
    /// Who asked for the change, when it was not the holder (see [`acting_as`]).
    pub actor: Option<String>,
}

impl AuditEvent {
    /// An event of `kind` on `key` at `at` for fence `fence`, with every optional field
    /// empty.
    pub fn new(kind: AuditKind, key: &ScopedKey, at: Timestamp, fence: u64) -> Self {
        Self {
            at,
            namespace: key.scope.namespace().to_owned(),
            scope: key.scope.principal().unwrap_or_default().to_owned(),
            key: key.key.as_str().to_owned(),
            kind,
            fence,
            request_id: None,
            outcome: None,
            status: None,
            instance: None,
            actor: None,
        }
    }
}

/// Which events [`Store::audit`](crate::Store::audit) returns: every given field must
/// match. Results are newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this principal (`Some("")` for keys without one).
    pub scope: Option<String>,
    /// Only this key.
    pub key: Option<String>,
    /// Only this kind of event.
    pub kind: Option<AuditKind>,
    /// Only events at or after this instant.
    pub since: Option<Timestamp>,
    /// Only events at or before this instant.
    pub until: Option<Timestamp>,
    /// At most this many events (0 means the default, 100; at most 10 000).
    pub limit: usize,
}

impl AuditQuery {
    /// Every event of one scoped key.
    pub fn for_key(key: &ScopedKey) -> Self {
        Self {
            namespace: Some(key.scope.namespace().to_owned()),
            scope: Some(key.scope.principal().unwrap_or_default().to_owned()),
            key: Some(key.key.as_str().to_owned()),
            ..Self::default()
        }
    }

    /// The effective limit.
    pub fn effective_limit(&self) -> usize {
        match self.limit {
            0 => 100,
            n => n.min(10_000),
        }
    }

    /// Whether `event` passes every filter (the limit aside).
    pub fn matches(&self, event: &AuditEvent) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|n| *n == event.namespace)
            && self.scope.as_ref().is_none_or(|s| *s == event.scope)
            && self.key.as_ref().is_none_or(|k| *k == event.key)
            && self.kind.is_none_or(|k| k == event.kind)
            && self.since.is_none_or(|t| event.at >= t)
            && self.until.is_none_or(|t| event.at <= t)
    }
}

/// How much of the trail a store keeps. Older events go first; each store documents how
/// exactly it applies the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditRetention {
    /// Most events kept (the memory store: in total; Redis: per namespace stream,
    /// approximately).
    pub max_events: usize,
    /// Events older than this are removed (SQL: by the reaper; memory: when new events
    /// arrive). Redis streams are bounded by count only.
    pub max_age: Duration,
}

impl Default for AuditRetention {
    /// 100 000 events, 30 days.
    fn default() -> Self {
        Self {
            max_events: 100_000,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// The instance part of an owner id: 16 hex digits naming the process that made the claim
/// (the process nonce of [`OwnerId::random`]).
pub fn instance_of(owner: OwnerId) -> String {
    format!("{:016x}", (owner.0 >> 64) as u64)
}

/// This process's instance id, as [`instance_of`] names it in the trail.
pub fn this_instance() -> String {
    instance_of(OwnerId::random())
}

tokio::task_local! {
    static ACTOR: String;
}

/// Calls `call` and runs the future it returns with `actor` named as who asks for the store
/// changes it makes: resolves and deletes inside it are recorded with that actor.
///
/// The name travels with the task, so store wrappers need not forward it. `call` runs inside
/// the scope too, because some stores act when called rather than when polled. A store
/// operation moved to another task loses the name (and is recorded without an actor).
pub async fn acting_as<F: Future>(actor: impl Into<String>, call: impl FnOnce() -> F) -> F::Output {
    ACTOR.scope(actor.into(), async move { call().await }).await
}

/// The actor named by the innermost [`acting_as`] around the current task, if any.
pub fn current_actor() -> Option<String> {
    ACTOR.try_with(Clone::clone).ok()
}

/// What one store operation did, as [`event_for`] needs it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Step<'a> {
    /// A claim and its outcome.
    Claim(&'a ClaimRequest, &'a ClaimOutcome),
    /// A completion by `owner` at `fence` of a response with `status`.
    Complete {
        /// The caller.
        owner: OwnerId,
        /// The caller's fence.
        fence: u64,
        /// The response's status.
        status: u16,
        /// What the store answered.
        outcome: SettleOutcome,
    },
    /// A release by `owner` at `fence`.
    Release {
        /// The caller.
        owner: OwnerId,
        /// The caller's fence.
        fence: u64,
        /// How it gave the claim up.
        kind: ReleaseKind,
        /// What the store answered.
        outcome: SettleOutcome,
    },
    /// A resolve and its outcome.
    Resolve(&'a Resolution, ResolveOutcome),
    /// A delete; `existed` is what the store answered.
    Delete {
        /// Whether a live record was deleted.
        existed: bool,
    },
}

/// The event an operation records at [`AuditLevel::All`], if it changed the record (or was
/// fenced), given the record it found (`previous`, live or not) at `now`. Renewals, reads
/// and refusals record nothing. The actor is [`current_actor`]'s, for resolves and deletes.
/// A store at another level keeps the event if [`AuditLevel::records`] says so.
///
/// For stores that apply transitions in process (the memory store, test doubles); remote
/// stores write the same events from their scripts and statements.
pub fn event_for(
    step: Step<'_>,
    key: &ScopedKey,
    now: Timestamp,
    previous: Option<&Record>,
) -> Option<AuditEvent> {
    let prev_fence = previous.map_or(0, |r| r.fence);
    let prev_request = previous.and_then(|r| r.request_id.clone());
    let mut event = match step {
        Step::Claim(req, outcome) => return claim_event(req, outcome, key, now, previous),
        Step::Complete {
            owner,
            fence,
            status,
            outcome,
        } => {
            let mut e = match outcome {
                SettleOutcome::Settled => {
                    let mut e = AuditEvent::new(AuditKind::Completed, key, now, fence);
                    e.status = Some(status);
                    e
                }
                _ => fenced(key, now, fence, "complete"),
            };
            e.instance = Some(instance_of(owner));
            e
        }
        Step::Release {
            owner,
            fence,
            kind,
            outcome,
        } => {
            let mut e = match (outcome, kind) {
                (SettleOutcome::Settled, ReleaseKind::Unknown) => {
                    let mut e = AuditEvent::new(AuditKind::Unknown, key, now, fence);
                    e.outcome = Some("ambiguous".into());
                    e
                }
                (SettleOutcome::Settled, _) => {
                    let mut e = AuditEvent::new(AuditKind::Released, key, now, fence);
                    e.outcome = Some("retryable".into());
                    e
                }
                _ => fenced(key, now, fence, "release"),
            };
            e.instance = Some(instance_of(owner));
            e
        }
        Step::Resolve(resolution, ResolveOutcome::Resolved) => {
            let mut e = AuditEvent::new(AuditKind::Resolved, key, now, prev_fence);
            match resolution {
                Resolution::Complete { response, .. } => {
                    e.outcome = Some("complete".into());
                    e.status = Some(response.status);
                }
                _ => e.outcome = Some("release".into()),
            }
            e.actor = current_actor();
            e.instance = Some(this_instance());
            e
        }
        Step::Resolve(..) => return None,
        Step::Delete { existed: true } => {
            let mut e = AuditEvent::new(AuditKind::Deleted, key, now, prev_fence);
            e.actor = current_actor();
            e.instance = Some(this_instance());
            e
        }
        Step::Delete { existed: false } => return None,
    };
    if event.request_id.is_none() && event.fence == prev_fence {
        event.request_id = prev_request;
    }
    Some(event)
}

/// The event `step` records at `level`: [`event_for`]'s, if [`AuditLevel::records`] keeps it.
///
/// A claim that claimed and a completion that settled are the steps of every first request;
/// their kind follows from the outcome alone, so the level is asked before the event is built,
/// and a level that leaves them out spends no allocation on them.
pub(crate) fn event_at(
    level: AuditLevel,
    step: Step<'_>,
    key: &ScopedKey,
    now: Timestamp,
    previous: Option<&Record>,
) -> Option<AuditEvent> {
    if kind_of(&step).is_some_and(|kind| !level.records(kind, previous)) {
        return None;
    }
    event_for(step, key, now, previous).filter(|e| level.records(e.kind, previous))
}

/// The kind of the event [`event_for`] makes of `step`, where the step's outcome alone says
/// it: a claim that claimed (fresh or taken over) and a completion that settled.
fn kind_of(step: &Step<'_>) -> Option<AuditKind> {
    match step {
        Step::Claim(_, ClaimOutcome::Claimed { takeover, .. }) => Some(if *takeover {
            AuditKind::TakenOver
        } else {
            AuditKind::Claimed
        }),
        Step::Complete {
            outcome: SettleOutcome::Settled,
            ..
        } => Some(AuditKind::Completed),
        _ => None,
    }
}

/// The event a claim records: claimed or taken over, or the unknown mark a claim leaves on
/// an expired lease under `hold`.
fn claim_event(
    req: &ClaimRequest,
    outcome: &ClaimOutcome,
    key: &ScopedKey,
    now: Timestamp,
    previous: Option<&Record>,
) -> Option<AuditEvent> {
    let mut e = match outcome {
        ClaimOutcome::Claimed { lease, takeover } => {
            let kind = if *takeover {
                AuditKind::TakenOver
            } else {
                AuditKind::Claimed
            };
            AuditEvent::new(kind, key, now, lease.fence)
        }
        // Unknown from a claim that found a processing record with an expired lease under
        // `hold`: the claim just marked it.
        ClaimOutcome::Unknown { .. }
            if previous.is_some_and(|r| {
                matches!(r.state, RecordState::Processing { lease_until, .. } if lease_until <= now)
                    && r.expires_at > now
            }) =>
        {
            let mut e = AuditEvent::new(
                AuditKind::Unknown,
                key,
                now,
                previous.map_or(0, |r| r.fence),
            );
            e.outcome = Some("lease_expired".into());
            e.request_id = previous.and_then(|r| r.request_id.clone());
            e
        }
        _ => return None,
    };
    if e.request_id.is_none() {
        e.request_id.clone_from(&req.request_id);
    }
    e.instance = Some(instance_of(req.owner));
    Some(e)
}

fn fenced(key: &ScopedKey, now: Timestamp, fence: u64, op: &str) -> AuditEvent {
    let mut e = AuditEvent::new(AuditKind::Fenced, key, now, fence);
    e.outcome = Some(op.into());
    e
}

/// The event a store records when it removes `record` at the end of its life.
pub fn expired(record: &Record) -> AuditEvent {
    let mut e = AuditEvent::new(
        AuditKind::Expired,
        &record.key,
        record.expires_at,
        record.fence,
    );
    e.request_id.clone_from(&record.request_id);
    e
}

/// A bounded ring of events, oldest first: what the memory store keeps per shard (and test
/// doubles keep).
#[derive(Debug, Default)]
pub struct Ring {
    events: VecDeque<(u64, AuditEvent)>,
}

impl Ring {
    /// Adds `event` (numbered `seq`), dropping the oldest events beyond `max_events` and
    /// those older than `max_age` before `event.at`.
    pub fn push(&mut self, seq: u64, event: AuditEvent, retention: AuditRetention) {
        let horizon = Timestamp(
            event
                .at
                .0
                .saturating_sub(crate::record::duration_ms(retention.max_age)),
        );
        while self
            .events
            .front()
            .is_some_and(|(_, e)| e.at < horizon || self.events.len() >= retention.max_events)
        {
            self.events.pop_front();
        }
        if retention.max_events > 0 {
            self.events.push_back((seq, event));
        }
    }

    /// The matching events, with their numbers, newest first, at most `limit`.
    pub fn matching(&self, query: &AuditQuery, limit: usize) -> Vec<(u64, AuditEvent)> {
        self.events
            .iter()
            .rev()
            .filter(|(_, e)| query.matches(e))
            .take(limit)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Key, Scope};

    fn key() -> ScopedKey {
        ScopedKey::new(
            Scope::new("ns").expect("ns").with_principal("p"),
            Key::new("k").expect("key"),
        )
    }

    #[test]
    fn kinds_round_trip_by_name_and_code() {
        for kind in AuditKind::ALL {
            assert_eq!(kind.as_str().parse::<AuditKind>(), Ok(kind));
            assert_eq!(AuditKind::from_code(i64::from(kind.code())), Some(kind));
        }
        assert!("maybe".parse::<AuditKind>().is_err());
        assert_eq!(AuditKind::from_code(0), None);
    }

    #[test]
    fn queries_filter_every_field() {
        let e = AuditEvent::new(AuditKind::Claimed, &key(), Timestamp(100), 1);
        assert!(AuditQuery::for_key(&key()).matches(&e));
        let other = ScopedKey::new(Scope::new("ns").expect("ns"), Key::new("k").expect("k"));
        assert!(
            !AuditQuery::for_key(&other).matches(&e),
            "principal differs"
        );
        let q = |f: fn(&mut AuditQuery)| {
            let mut q = AuditQuery::default();
            f(&mut q);
            q.matches(&e)
        };
        assert!(q(|q| q.since = Some(Timestamp(100))));
        assert!(!q(|q| q.since = Some(Timestamp(101))));
        assert!(q(|q| q.until = Some(Timestamp(100))));
        assert!(!q(|q| q.until = Some(Timestamp(99))));
        assert!(!q(|q| q.kind = Some(AuditKind::Completed)));
        assert!(!q(|q| q.namespace = Some("other".into())));
    }

    #[test]
    fn the_ring_keeps_the_newest_within_count_and_age() {
        let retention = AuditRetention {
            max_events: 3,
            max_age: Duration::from_millis(1000),
        };
        let mut ring = Ring::default();
        for i in 0..5u64 {
            let e = AuditEvent::new(AuditKind::Claimed, &key(), Timestamp(i), i);
            ring.push(i, e, retention);
        }
        let fences: Vec<u64> = ring
            .matching(&AuditQuery::default(), 10)
            .iter()
            .map(|(_, e)| e.fence)
            .collect();
        assert_eq!(fences, [4, 3, 2]);
        let late = AuditEvent::new(AuditKind::Claimed, &key(), Timestamp(1004), 9);
        ring.push(9, late, retention);
        let fences: Vec<u64> = ring
            .matching(&AuditQuery::default(), 10)
            .iter()
            .map(|(_, e)| e.fence)
            .collect();
        assert_eq!(
            fences,
            [9, 4],
            "events older than a second before the newest go"
        );
    }

    /// Every completion and release `owner` may make under `fence`, settled and fenced.
    fn settle_steps<'a>(owner: OwnerId, fence: u64) -> Vec<Step<'a>> {
        let mut steps = Vec::new();
        for outcome in [SettleOutcome::Settled, SettleOutcome::Fenced] {
            steps.push(Step::Complete {
                owner,
                fence,
                status: 200,
                outcome,
            });
            for kind in [ReleaseKind::Retryable, ReleaseKind::Unknown] {
                steps.push(Step::Release {
                    owner,
                    fence,
                    kind,
                    outcome,
                });
            }
        }
        steps
    }

    // `event_at` decides some steps before building their event; what it returns must be
    // exactly what filtering the built event gives, for every step, level and previous state.
    #[test]
    fn deciding_before_building_keeps_exactly_the_events_the_level_records() {
        use crate::fingerprint::Fingerprint;
        use crate::record::{Lease, StoredResponse, TakeoverPolicy};
        let owner = OwnerId(3 << 64 | 1);
        let req = ClaimRequest {
            key: key(),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner,
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(60),
            takeover: TakeoverPolicy::Hold,
            request_id: Some("req-1".into()),
        };
        let lease = Lease {
            owner,
            fence: 2,
            deadline: Timestamp(2_000),
        };
        let record = |state| Record {
            key: key(),
            fingerprint: req.fingerprint,
            fence: 2,
            request_id: Some("req-0".into()),
            created_at: Timestamp(500),
            expires_at: Timestamp(100_000),
            state,
        };
        let processing = record(RecordState::Processing {
            owner,
            lease_until: Timestamp(900),
        });
        let unknown = record(RecordState::Unknown {
            since: Timestamp(950),
            owner: Some(owner),
        });
        let claimed = ClaimOutcome::Claimed {
            lease,
            takeover: false,
        };
        let taken_over = ClaimOutcome::Claimed {
            lease,
            takeover: true,
        };
        let marked = ClaimOutcome::Unknown {
            fence: 2,
            age: Duration::from_millis(500),
        };
        let busy = ClaimOutcome::Busy {
            retry_after: Duration::from_secs(1),
        };
        let complete = Resolution::Complete {
            response: StoredResponse::new(200, "ok"),
            ttl: Duration::from_secs(60),
        };
        let mut steps = vec![
            Step::Claim(&req, &claimed),
            Step::Claim(&req, &taken_over),
            Step::Claim(&req, &marked),
            Step::Claim(&req, &busy),
            Step::Resolve(&complete, ResolveOutcome::Resolved),
            Step::Resolve(&Resolution::Release, ResolveOutcome::Resolved),
            Step::Delete { existed: true },
            Step::Delete { existed: false },
        ];
        steps.extend(settle_steps(owner, 2));
        let (now, mut kept) = (Timestamp(1_000), [0usize; 2]);
        for (i, level) in AuditLevel::ALL.into_iter().enumerate() {
            for previous in [None, Some(&processing), Some(&unknown)] {
                for step in &steps {
                    let built = event_for(*step, &key(), now, previous)
                        .filter(|e| level.records(e.kind, previous));
                    let decided = event_at(level, *step, &key(), now, previous);
                    assert_eq!(decided, built, "{level} {step:?} after {previous:?}");
                    kept[i] += usize::from(decided.is_some());
                }
            }
        }
        // The operator level leaves out the routine claim and completion, and only those.
        assert!(kept[0] < kept[1], "{kept:?}");
        let routine = |previous| {
            event_at(
                AuditLevel::Operator,
                Step::Complete {
                    owner,
                    fence: 2,
                    status: 200,
                    outcome: SettleOutcome::Settled,
                },
                &key(),
                now,
                previous,
            )
        };
        assert_eq!(routine(Some(&processing)), None);
        assert_eq!(
            routine(Some(&unknown)).map(|e| e.kind),
            Some(AuditKind::Completed),
            "completing an unknown record is written"
        );
    }

    #[tokio::test]
    async fn the_actor_travels_with_the_task() {
        assert_eq!(current_actor(), None);
        let inner = acting_as("ops", || async { current_actor() }).await;
        assert_eq!(inner.as_deref(), Some("ops"));
        assert_eq!(instance_of(OwnerId(7 << 64 | 1)), "0000000000000007");
    }
}
