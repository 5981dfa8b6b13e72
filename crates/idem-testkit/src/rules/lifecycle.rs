//! How a claim ends: expiry, renewal, release of both kinds, and takeover under both
//! policies.

use std::time::Duration;

use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, OwnerId, RecordState, ReleaseKind, RenewOutcome, Resolution, ResolveOutcome,
    SettleOutcome, StateKind, StoredResponse,
};

use crate::ctx::{Ctx, fp, names};
use crate::harness::Harness;

/// A record goes away after its TTL: get finds nothing, list skips it, resolve and delete see
/// nothing, and a claim starts afresh. A processing record lives at least as long as its lease,
/// even with a shorter TTL.
pub async fn record_expires_after_ttl<H: Harness>(h: &H) {
    let c = Ctx::new(h, "ttl").await;
    let ttl = c.lease * 3;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    let response = StoredResponse::new(200, "short lived");
    assert_eq!(
        c.complete_ttl(Hold::of(&k, &a), &response, ttl).await,
        SettleOutcome::Settled
    );
    // A resolved record expires by the resolution's ttl, whatever ttl later claims carry
    // (a cache tier must not stretch it either).
    let r = c.key("resolved");
    let ra = c.claimed(&r).await;
    c.release(&r, &ra, ReleaseKind::Unknown).await;
    let resolution = Resolution::Complete {
        response: response.clone(),
        ttl,
    };
    assert_eq!(c.resolve(&r, &resolution).await, ResolveOutcome::Resolved);
    c.advance(c.lease).await;
    for key in [&k, &r] {
        let replay = c.claim_fp(key, fp(1)).await;
        assert_eq!(
            replay,
            ClaimOutcome::Done {
                response: response.clone()
            },
            "replayed within ttl"
        );
        assert!(c.get(key).await.is_some());
    }
    c.advance(ttl).await;
    assert_eq!(
        c.get(&r).await,
        None,
        "resolved record must be gone after its ttl"
    );
    c.claimed(&r).await;
    assert_eq!(c.get(&k).await, None, "record must be gone after its ttl");
    assert_eq!(
        c.list_keys(&c.in_ns()).await,
        names(&["resolved"]),
        "list must skip expired records"
    );
    assert_eq!(
        c.resolve(&k, &Resolution::Release).await,
        ResolveOutcome::NotFound
    );
    assert!(
        !c.delete(&k).await,
        "delete of an expired record must report none existed"
    );
    c.claimed(&k).await;

    // TTL shorter than the lease: the record must still outlive the lease.
    let p = c.key("p");
    let mut req = c.req(&p, fp(1));
    req.lease = c.lease * 2;
    req.ttl = c.lease / 2;
    let lease = c.claimed_with(&req).await;
    c.advance(c.lease).await;
    assert!(
        c.busy(&p).await <= c.lease,
        "still busy: the lease outlives the short ttl"
    );
    assert_eq!(c.record(&p).await.fence, lease.fence);
}

/// Renewing moves the deadline: busy answers grow, and no takeover is possible before the new
/// deadline, though it is after it.
pub async fn renew_extends_lease<H: Harness>(h: &H) {
    let c = Ctx::new(h, "renew").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.advance(c.lease / 2).await;
    let RenewOutcome::Renewed { deadline } = c.renew(Hold::of(&k, &a), c.lease * 2).await else {
        panic!("renew by the holder must succeed");
    };
    assert!(deadline > a.deadline, "renewed deadline must move later");
    let rec = c.record(&k).await;
    assert_eq!(
        rec.state,
        RecordState::Processing {
            owner: a.owner,
            lease_until: deadline
        }
    );
    assert_eq!(rec.fence, a.fence, "renew keeps the fence");
    assert!(
        rec.expires_at >= deadline,
        "the record must outlive the renewed lease"
    );
    let retry_after = c.busy(&k).await;
    assert!(
        retry_after > c.lease,
        "retry_after {retry_after:?} must reflect the longer lease"
    );
    assert!(retry_after <= c.lease * 2);

    // Past the first deadline, before the renewed one.
    c.advance(c.lease).await;
    c.busy(&k).await;
    let hold = c.claim(&c.hold_req(&k, fp(1))).await;
    assert!(
        matches!(hold, ClaimOutcome::Busy { .. }),
        "hold before the renewed deadline: {hold:?}"
    );
    // Past the renewed deadline.
    c.advance(c.lease + c.lease / 2).await;
    let b = c.taken_over(&c.req(&k, fp(1))).await;
    assert!(b.fence > a.fence);
}

/// A retryable release removes the record; the key can be claimed again at once.
pub async fn release_retryable_frees_key<H: Harness>(h: &H) {
    let c = Ctx::new(h, "release-retry").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.release(&k, &a, ReleaseKind::Retryable).await;
    assert_eq!(
        c.get(&k).await,
        None,
        "a retryable release must remove the record"
    );
    assert!(c.list_keys(&c.in_ns()).await.is_empty());
    assert_eq!(
        c.release_as(Hold::of(&k, &a), ReleaseKind::Retryable).await,
        SettleOutcome::Fenced,
        "second release"
    );
    let b = c.claimed(&k).await;
    assert!(b.fence > a.fence);
    // Even a different request may now use the key.
    c.release(&k, &b, ReleaseKind::Retryable).await;
    let other = c.claimed_with(&c.req(&k, fp(2))).await;
    assert_eq!(c.record(&k).await.fingerprint, fp(2));
    assert!(other.fence > b.fence);
}

/// An unknown release keeps the record as unknown: every later claim with its fingerprint is
/// `Unknown` (under both policies, before and after the lease would have run out), another
/// fingerprint is a mismatch, and the old holder can no longer settle.
pub async fn release_unknown_holds_key<H: Harness>(h: &H) {
    let c = Ctx::new(h, "release-unknown").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.release(&k, &a, ReleaseKind::Unknown).await;
    let rec = c.record(&k).await;
    assert_eq!(rec.state.kind(), StateKind::Unknown);
    assert_eq!(rec.fence, a.fence);
    assert_eq!(rec.fingerprint, fp(1));
    let mut age = Duration::ZERO;
    for _ in 0..2 {
        let now = c.unknown(&k, a.fence).await;
        assert!(now >= age, "the attempt's age grows");
        age = now;
        c.wait_out_lease().await;
    }
    assert!(
        age >= c.lease + c.lease / 2,
        "the age counts from the claim: {age:?}"
    );
    assert_eq!(
        c.complete_as(Hold::of(&k, &a), &StoredResponse::new(200, "x"))
            .await,
        SettleOutcome::Fenced
    );
    assert_eq!(c.renew(Hold::of(&k, &a), c.lease).await, RenewOutcome::Lost);
    assert_eq!(
        c.release_as(Hold::of(&k, &a), ReleaseKind::Retryable).await,
        SettleOutcome::Fenced
    );
    assert_eq!(
        c.record(&k).await,
        rec,
        "nothing may move a record its holder released as unknown but resolve or delete"
    );
}

/// Under `reexecute`, a claim on an expired lease takes over: `takeover: true`, a greater fence,
/// the new owner and request id on the record, and `created_at` dating the new attempt (its
/// age is what tells whether an attempt may still be running).
pub async fn takeover_reexecute_claims_again<H: Harness>(h: &H) {
    let c = Ctx::new(h, "reexecute").await;
    let k = c.key("k");
    let mut first = c.req(&k, fp(1));
    first.request_id = Some("first".into());
    let a = c.claimed_with(&first).await;
    let before = c.record(&k).await;
    c.wait_out_lease().await;
    let mut second = c.req(&k, fp(1));
    second.request_id = Some("second".into());
    let b = c.taken_over(&second).await;
    assert!(b.fence > a.fence);
    let rec = c.record(&k).await;
    assert_eq!(
        rec.state,
        RecordState::Processing {
            owner: b.owner,
            lease_until: b.deadline
        }
    );
    assert_eq!(rec.fence, b.fence);
    assert_eq!(
        rec.request_id.as_deref(),
        Some("second"),
        "the record names the latest claim's request id"
    );
    assert!(
        rec.created_at > before.created_at,
        "takeover dates the new attempt: created_at {:?}, first claim's {:?}",
        rec.created_at,
        before.created_at
    );
    assert!(rec.created_at < b.deadline);
    c.busy(&k).await;
}

/// Under `hold`, a claim on an expired lease marks the record unknown, naming its holder, and
/// answers `Unknown` with the record's fence and the attempt's age; later claims under either
/// policy answer the same. The holder cannot renew it back to life, but others are fenced and
/// it may still complete it: a holder paused past its lease finishes its own work.
pub async fn takeover_hold_marks_unknown<H: Harness>(h: &H) {
    let c = Ctx::new(h, "hold").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.wait_out_lease().await;
    let age = c.unknown_with(&c.hold_req(&k, fp(1)), a.fence).await;
    assert!(
        age >= c.lease,
        "the attempt is as old as its lease at least: {age:?}"
    );
    let rec = c.record(&k).await;
    assert_eq!(rec.fence, a.fence, "marking unknown keeps the fence");
    let RecordState::Unknown { owner, .. } = rec.state else {
        panic!("expected unknown, got {:?}", rec.state);
    };
    assert_eq!(owner, Some(a.owner), "the unknown record names its holder");
    c.unknown(&k, a.fence).await;
    assert_eq!(
        c.renew(Hold::of(&k, &a), c.lease).await,
        RenewOutcome::Lost,
        "an unknown record is not renewed"
    );
    for (owner, fence, who) in [
        (OwnerId::random(), a.fence, "another owner"),
        (a.owner, a.fence + 1, "a higher fence"),
    ] {
        assert_eq!(
            c.complete_as(Hold::new(&k, owner, fence), &StoredResponse::new(200, "x"))
                .await,
            SettleOutcome::Fenced,
            "{who} cannot complete it"
        );
    }
    assert_eq!(c.record(&k).await, rec);
    let late = StoredResponse::new(201, "late");
    c.complete(&k, &a, &late).await;
    match c.claim(&c.hold_req(&k, fp(1))).await {
        ClaimOutcome::Done { response } => assert_eq!(response, late),
        other => panic!("after the late completion: expected a replay, got {other:?}"),
    }
}
