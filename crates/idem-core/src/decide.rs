//! The state machine as pure functions: `(now, previous record, attempt) -> (change, outcome)`.
//!
//! No I/O and no clock: stores that can run Rust (memory) apply these directly under a lock;
//! remote stores (Lua, SQL) implement the same table, and the conformance suite holds them to
//! it. `docs/design.md` describes the state machine.
//!
//! | previous (live)                     | same fingerprint               | other fingerprint |
//! |-------------------------------------|--------------------------------|-------------------|
//! | absent / expired record             | claim, fence = next            | claim             |
//! | processing, lease live              | busy until lease end           | mismatch          |
//! | processing, lease expired, hold     | becomes unknown                | mismatch          |
//! | processing, lease expired, reexecute| takeover: claim, fence = next  | mismatch          |
//! | completed                           | replay                         | mismatch          |
//! | unknown                             | unknown (its fence and age)    | mismatch          |
//!
//! An unknown record marked on an expired lease still names its holder: that holder (owner
//! and fence) may complete or release it, so a holder paused past its lease finishes its own
//! work. One its holder released as unknown names nobody. Either is otherwise settled only by
//! a [`resolve`] (which may name the record's fence).

use std::time::Duration;

use crate::record::{
    Lease, OwnerId, Record, RecordState, ReleaseKind, StateKind, StoredResponse, TakeoverPolicy,
    Timestamp,
};
use crate::store::{
    ClaimOutcome, ClaimRequest, RenewOutcome, Resolution, ResolveOutcome, SettleOutcome,
};

/// What a store must do to its copy of the record.
// A short-lived value, applied right away: boxing the record would cost an allocation per
// write for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Leave it as it is.
    Keep,
    /// Replace (or create) it.
    Put(Record),
    /// Remove it.
    Remove,
}

/// A decided transition: the change to apply and the outcome to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition<O> {
    /// What to write.
    pub change: Change,
    /// What to answer.
    pub outcome: O,
}

impl<O> Transition<O> {
    fn keep(outcome: O) -> Self {
        Self {
            change: Change::Keep,
            outcome,
        }
    }
}

/// The record as the state machine sees it: expired records count as absent.
pub fn live(now: Timestamp, previous: Option<&Record>) -> Option<&Record> {
    previous.filter(|r| r.expires_at > now)
}

/// The next fence: above the previous one, and at least `floor` (a store-wide counter or a
/// clock reading that outlives expired records).
pub fn next_fence(previous: Option<u64>, floor: u64) -> u64 {
    previous
        .map_or(floor, |p| p.saturating_add(1))
        .max(floor)
        .max(1)
}

/// Decides a claim. `fence_floor` must exceed every fence this key has ever had, even on
/// records that expired or were removed; `previous` may be an expired record.
pub fn claim(
    now: Timestamp,
    previous: Option<&Record>,
    req: &ClaimRequest,
    fence_floor: u64,
) -> Transition<ClaimOutcome> {
    let previous_fence = previous.map(|r| r.fence);
    let Some(record) = live(now, previous) else {
        return fresh_claim(now, previous_fence, req, fence_floor, false);
    };
    if record.fingerprint != req.fingerprint {
        return Transition::keep(ClaimOutcome::Mismatch {
            stored: record.fingerprint,
        });
    }
    match &record.state {
        RecordState::Completed { response, .. } => Transition::keep(ClaimOutcome::Done {
            response: response.clone(),
        }),
        RecordState::Unknown { .. } => Transition::keep(unknown(now, record)),
        RecordState::Processing { lease_until, .. } if *lease_until > now => {
            Transition::keep(ClaimOutcome::Busy {
                retry_after: lease_until.since(now),
            })
        }
        RecordState::Processing { .. } => match req.takeover {
            TakeoverPolicy::Reexecute => fresh_claim(now, previous_fence, req, fence_floor, true),
            // `Hold`, and any policy added later: never run again blind.
            _ => {
                let mut held = record.clone();
                held.state = RecordState::Unknown {
                    since: now,
                    owner: holder(record),
                };
                Transition {
                    change: Change::Put(held),
                    outcome: unknown(now, record),
                }
            }
        },
    }
}

/// What a claim answers for an unknown record: its fence and its attempt's age.
fn unknown(now: Timestamp, record: &Record) -> ClaimOutcome {
    ClaimOutcome::Unknown {
        fence: record.fence,
        age: now.since(record.created_at),
    }
}

/// The holder a record names, processing or unknown.
fn holder(record: &Record) -> Option<OwnerId> {
    match &record.state {
        RecordState::Processing { owner, .. } => Some(*owner),
        RecordState::Unknown { owner, .. } => *owner,
        RecordState::Completed { .. } => None,
    }
}

/// A claim that writes a new attempt: a fresh key or a takeover. `created_at` is this claim's
/// time either way, since it dates the attempt.
fn fresh_claim(
    now: Timestamp,
    previous_fence: Option<u64>,
    req: &ClaimRequest,
    fence_floor: u64,
    takeover: bool,
) -> Transition<ClaimOutcome> {
    let fence = next_fence(previous_fence, fence_floor);
    let deadline = now.plus(req.lease);
    let record = Record {
        key: req.key.clone(),
        fingerprint: req.fingerprint,
        fence,
        request_id: req.request_id.clone(),
        created_at: now,
        expires_at: now.plus(req.ttl).max(deadline),
        state: RecordState::Processing {
            owner: req.owner,
            lease_until: deadline,
        },
    };
    Transition {
        change: Change::Put(record),
        outcome: ClaimOutcome::Claimed {
            lease: Lease {
                owner: req.owner,
                fence,
                deadline,
            },
            takeover,
        },
    }
}

/// The live record if `owner` and `fence` still hold it: processing, or unknown with that
/// holder named.
///
/// A holder whose lease ran out still holds the key until someone takes it over or settles
/// it: its late result is accepted rather than lost, also once a retry marked the record
/// unknown under `hold`.
pub fn held(
    now: Timestamp,
    previous: Option<&Record>,
    owner: OwnerId,
    fence: u64,
) -> Option<&Record> {
    live(now, previous).filter(|r| r.fence == fence && holder(r) == Some(owner))
}

/// The live record if `owner` and `fence` hold it under a lease (processing): the only
/// state a renewal extends. An unknown record stays unknown until it is settled.
fn leased(
    now: Timestamp,
    previous: Option<&Record>,
    owner: OwnerId,
    fence: u64,
) -> Option<&Record> {
    held(now, previous, owner, fence).filter(|r| matches!(r.state, RecordState::Processing { .. }))
}

/// Decides a renewal.
pub fn renew(
    now: Timestamp,
    previous: Option<&Record>,
    owner: OwnerId,
    fence: u64,
    lease: Duration,
) -> Transition<RenewOutcome> {
    let Some(record) = leased(now, previous, owner, fence) else {
        return Transition::keep(RenewOutcome::Lost);
    };
    let deadline = now.plus(lease);
    let mut next = record.clone();
    next.state = RecordState::Processing {
        owner,
        lease_until: deadline,
    };
    next.expires_at = next.expires_at.max(deadline);
    Transition {
        change: Change::Put(next),
        outcome: RenewOutcome::Renewed { deadline },
    }
}

/// Decides a completion.
pub fn complete(
    now: Timestamp,
    previous: Option<&Record>,
    owner: OwnerId,
    fence: u64,
    response: StoredResponse,
    ttl: Duration,
) -> Transition<SettleOutcome> {
    let Some(record) = held(now, previous, owner, fence) else {
        return Transition::keep(SettleOutcome::Fenced);
    };
    let mut next = record.clone();
    next.state = RecordState::Completed {
        response,
        completed_at: now,
    };
    next.expires_at = now.plus(ttl);
    Transition {
        change: Change::Put(next),
        outcome: SettleOutcome::Settled,
    }
}

/// Decides a release.
pub fn release(
    now: Timestamp,
    previous: Option<&Record>,
    owner: OwnerId,
    fence: u64,
    kind: ReleaseKind,
) -> Transition<SettleOutcome> {
    let Some(record) = held(now, previous, owner, fence) else {
        return Transition::keep(SettleOutcome::Fenced);
    };
    let change = match (kind, &record.state) {
        (ReleaseKind::Retryable, _) => Change::Remove,
        // Already unknown (a retry marked it on expiry): it stays as it is.
        (_, RecordState::Unknown { .. }) => Change::Keep,
        // The holder gave up on knowing: it names nobody who could still settle it.
        _ => {
            let mut next = record.clone();
            next.state = RecordState::Unknown {
                since: now,
                owner: None,
            };
            Change::Put(next)
        }
    };
    Transition {
        change,
        outcome: SettleOutcome::Settled,
    }
}

/// Decides a resolve (an operator's, a reconciler's, a status probe's): allowed on unknown
/// records and on processing records whose lease has run out, and with `fence` only while the
/// record has that fence.
pub fn resolve(
    now: Timestamp,
    previous: Option<&Record>,
    resolution: &Resolution,
    fence: Option<u64>,
) -> Transition<ResolveOutcome> {
    let Some(record) = live(now, previous) else {
        return Transition::keep(ResolveOutcome::NotFound);
    };
    if let Some(expected) = fence
        && expected != record.fence
    {
        return Transition::keep(ResolveOutcome::Fenced {
            fence: record.fence,
        });
    }
    match &record.state {
        RecordState::Unknown { .. } => {}
        RecordState::Processing { lease_until, .. } if *lease_until <= now => {}
        other => {
            return Transition::keep(ResolveOutcome::NotResolvable {
                state: other.kind(),
            });
        }
    }
    let change = match resolution {
        Resolution::Release => Change::Remove,
        Resolution::Complete { response, ttl } => {
            let mut next = record.clone();
            next.state = RecordState::Completed {
                response: response.clone(),
                completed_at: now,
            };
            next.expires_at = now.plus(*ttl);
            Change::Put(next)
        }
    };
    Transition {
        change,
        outcome: ResolveOutcome::Resolved,
    }
}

/// Whether a live record passes a list filter's state and age conditions.
pub fn matches_filter(now: Timestamp, record: &Record, filter: &crate::store::ListFilter) -> bool {
    let state_ok = filter.state.is_none_or(|s| record.state.kind() == s);
    let ns_ok = filter
        .namespace
        .as_deref()
        .is_none_or(|n| record.key.scope.namespace() == n);
    let principal_ok =
        filter.principal.is_none() || filter.principal.as_deref() == record.key.scope.principal();
    let age_ok = filter
        .older_than
        .is_none_or(|age| now.since(record.created_at) >= age);
    record.expires_at > now && state_ok && ns_ok && principal_ok && age_ok
}

/// The state's name, or `None` for absent.
pub fn state_of(now: Timestamp, previous: Option<&Record>) -> Option<StateKind> {
    live(now, previous).map(|r| r.state.kind())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::key::{Key, Scope, ScopedKey};

    fn req(fp: u8, takeover: TakeoverPolicy) -> ClaimRequest {
        ClaimRequest {
            key: ScopedKey::new(Scope::new("t").expect("ns"), Key::new("k").expect("key")),
            fingerprint: Fingerprint::of_bytes(1, &[fp]),
            owner: OwnerId::random(),
            lease: Duration::from_secs(10),
            ttl: Duration::from_secs(100),
            takeover,
            request_id: None,
        }
    }

    fn put(t: Transition<ClaimOutcome>) -> Record {
        match t.change {
            Change::Put(r) => r,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn claim_busy_takeover_and_hold() {
        let t0 = Timestamp(1_000);
        let first = put(claim(t0, None, &req(1, TakeoverPolicy::Reexecute), 1));
        assert_eq!(first.fence, 1);
        let busy = claim(
            Timestamp(2_000),
            Some(&first),
            &req(1, TakeoverPolicy::Reexecute),
            1,
        );
        assert_eq!(
            busy.outcome,
            ClaimOutcome::Busy {
                retry_after: Duration::from_secs(9)
            }
        );
        let other_fp = claim(
            Timestamp(2_000),
            Some(&first),
            &req(2, TakeoverPolicy::Reexecute),
            1,
        );
        assert!(matches!(other_fp.outcome, ClaimOutcome::Mismatch { .. }));
        let late = Timestamp(11_000);
        let taken = claim(late, Some(&first), &req(1, TakeoverPolicy::Reexecute), 1);
        assert!(
            matches!(taken.outcome, ClaimOutcome::Claimed { takeover: true, lease } if lease.fence == 2)
        );
        let held = claim(late, Some(&first), &req(1, TakeoverPolicy::Hold), 1);
        assert_eq!(
            held.outcome,
            ClaimOutcome::Unknown {
                fence: 1,
                age: Duration::from_secs(10)
            }
        );
        assert_eq!(put(held).state.kind(), StateKind::Unknown);
    }

    #[test]
    fn a_takeover_dates_its_own_attempt() {
        let first = put(claim(
            Timestamp(1_000),
            None,
            &req(1, TakeoverPolicy::Reexecute),
            1,
        ));
        let taken = put(claim(
            Timestamp(20_000),
            Some(&first),
            &req(1, TakeoverPolicy::Reexecute),
            1,
        ));
        assert_eq!(taken.created_at, Timestamp(20_000));
    }

    // Guards point 3 of "at most once across crashes": a holder paused past its lease, whose
    // record a retry marked unknown, completes it; a newer claim still fences it out.
    #[test]
    fn the_holder_completes_its_unknown_record_until_someone_settles_it() {
        let r = req(1, TakeoverPolicy::Hold);
        let rec = put(claim(Timestamp(0), None, &r, 1));
        let unknown = put(claim(
            Timestamp(11_000),
            Some(&rec),
            &req(1, TakeoverPolicy::Hold),
            1,
        ));
        let resp = StoredResponse::new(201, "late");
        let ttl = Duration::from_secs(100);
        assert_eq!(
            renew(Timestamp(11_001), Some(&unknown), r.owner, 1, ttl).outcome,
            RenewOutcome::Lost,
            "an unknown record is not renewed back to life"
        );
        assert_eq!(
            complete(
                Timestamp(11_001),
                Some(&unknown),
                OwnerId::random(),
                1,
                resp.clone(),
                ttl
            )
            .outcome,
            SettleOutcome::Fenced
        );
        let done = complete(
            Timestamp(11_001),
            Some(&unknown),
            r.owner,
            1,
            resp.clone(),
            ttl,
        );
        assert_eq!(done.outcome, SettleOutcome::Settled);
        let Change::Put(done) = done.change else {
            panic!("completion writes");
        };
        assert!(matches!(done.state, RecordState::Completed { .. }));
        assert_eq!(
            release(
                Timestamp(11_001),
                Some(&unknown),
                r.owner,
                1,
                ReleaseKind::Unknown
            )
            .change,
            Change::Keep
        );
        // Released as unknown by its holder, a record names nobody.
        let given_up = release(Timestamp(5), Some(&rec), r.owner, 1, ReleaseKind::Unknown);
        let Change::Put(given_up) = given_up.change else {
            panic!("release as unknown writes");
        };
        assert_eq!(
            complete(
                Timestamp(6),
                Some(&given_up),
                r.owner,
                1,
                StoredResponse::new(200, "x"),
                ttl
            )
            .outcome,
            SettleOutcome::Fenced
        );
        // Released by a probe and claimed again: the old holder is fenced out.
        let again = put(claim(
            Timestamp(11_002),
            None,
            &req(1, TakeoverPolicy::Hold),
            2,
        ));
        assert_eq!(
            complete(Timestamp(11_003), Some(&again), r.owner, 1, resp, ttl).outcome,
            SettleOutcome::Fenced
        );
    }

    #[test]
    fn a_resolve_naming_a_fence_settles_only_that_attempt() {
        let r = req(1, TakeoverPolicy::Hold);
        let rec = put(claim(Timestamp(0), None, &r, 1));
        let unknown = put(claim(Timestamp(11_000), Some(&rec), &r, 1));
        assert_eq!(
            resolve(
                Timestamp(11_001),
                Some(&unknown),
                &Resolution::Release,
                Some(2)
            ),
            Transition {
                change: Change::Keep,
                outcome: ResolveOutcome::Fenced { fence: 1 }
            }
        );
        assert_eq!(
            resolve(
                Timestamp(11_001),
                Some(&unknown),
                &Resolution::Release,
                Some(1)
            )
            .change,
            Change::Remove
        );
        assert_eq!(
            resolve(
                Timestamp(11_001),
                Some(&unknown),
                &Resolution::Release,
                None
            )
            .change,
            Change::Remove
        );
    }

    #[test]
    fn fence_survives_expiry_through_the_floor() {
        let first = put(claim(
            Timestamp(0),
            None,
            &req(1, TakeoverPolicy::Reexecute),
            7,
        ));
        let after_expiry = put(claim(
            Timestamp(200_000),
            Some(&first),
            &req(1, TakeoverPolicy::Reexecute),
            3,
        ));
        assert_eq!(after_expiry.fence, 8);
        assert_eq!(next_fence(None, 0), 1);
    }

    #[test]
    fn only_the_holder_settles() {
        let r = req(1, TakeoverPolicy::Reexecute);
        let rec = put(claim(Timestamp(0), None, &r, 1));
        let resp = StoredResponse::new(200, "ok");
        let ttl = Duration::from_secs(100);
        assert_eq!(
            complete(
                Timestamp(1),
                Some(&rec),
                OwnerId::random(),
                1,
                resp.clone(),
                ttl
            )
            .outcome,
            SettleOutcome::Fenced
        );
        assert_eq!(
            complete(Timestamp(1), Some(&rec), r.owner, 2, resp.clone(), ttl).outcome,
            SettleOutcome::Fenced
        );
        assert_eq!(
            complete(Timestamp(1), Some(&rec), r.owner, 1, resp.clone(), ttl).outcome,
            SettleOutcome::Settled
        );
        assert_eq!(
            release(Timestamp(1), Some(&rec), r.owner, 1, ReleaseKind::Retryable).change,
            Change::Remove
        );
        assert_eq!(
            renew(Timestamp(1), None, r.owner, 1, ttl).outcome,
            RenewOutcome::Lost
        );
    }
}
