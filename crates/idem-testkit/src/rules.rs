//! The contract, one rule per function. Each panics on the first violation.
//!
//! Every rule runs in its own namespace, so rules can share one store and run in parallel.
//! Durations are multiples of [`Harness::lease`] (`L` below); waits past a deadline add half
//! a lease, and checks before a deadline keep at least half a lease in hand.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    ClaimOutcome, Key, ListFilter, OwnerId, RecordState, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, Scope, ScopedKey, SettleOutcome, StateKind, StoredResponse, TakeoverPolicy,
};
use tokio::sync::Barrier;

use crate::ctx::{Ctx, fp, names, rich_response, unique_namespace};
use crate::harness::Harness;

/// Every rule's name, in the order [`crate::conformance_tests!`] runs them.
pub const ALL: &[&str] = &[
    "claim_absent_key_claims",
    "busy_while_lease_live",
    "done_replays_exact_response",
    "mismatch_changes_nothing_in_any_state",
    "fence_increases_across_takeovers",
    "fence_increases_across_expiry",
    "fence_increases_across_release_and_delete",
    "stale_owner_is_fenced",
    "late_holder_settles_until_taken_over",
    "record_expires_after_ttl",
    "renew_extends_lease",
    "release_retryable_frees_key",
    "release_unknown_holds_key",
    "takeover_reexecute_claims_again",
    "takeover_hold_marks_unknown",
    "resolve_unknown_with_response_replays",
    "resolve_unknown_with_release_frees_key",
    "resolve_refuses_completed_and_live_processing",
    "resolve_missing_is_not_found",
    "resolve_expired_lease_processing",
    "get_reports_every_state",
    "delete_removes_record",
    "list_filters_by_namespace_and_principal",
    "list_filters_by_state",
    "list_oldest_first_with_limit_and_age",
    "list_orders_reclaimed_key_by_new_age",
    "request_id_kept_on_record",
    "race_one_claim_wins",
    "race_one_takeover_wins",
    "race_mixed_fingerprints_one_wins",
];

/// An absent key is claimed: a lease for the caller, fence at least 1, and a processing record
/// that names the owner, the fingerprint and the lease deadline. Scopes never meet.
pub async fn claim_absent_key_claims<H: Harness>(h: &H) {
    let c = Ctx::new(h, "claim").await;
    let k = c.key("k");
    let req = c.req(&k, fp(1));
    let lease = c.claimed_with(&req).await;
    let rec = c.record(&k).await;
    assert_eq!(rec.key, k);
    assert_eq!(rec.fingerprint, fp(1));
    assert_eq!(
        rec.fence, lease.fence,
        "record fence must be the lease's fence"
    );
    assert_eq!(
        rec.state,
        RecordState::Processing {
            owner: req.owner,
            lease_until: lease.deadline
        }
    );
    assert!(
        rec.expires_at >= lease.deadline,
        "a record must outlive its lease"
    );
    assert!(
        rec.created_at < lease.deadline,
        "created_at must precede the lease deadline"
    );

    // The same key text in another namespace or under a principal is another record.
    let other_ns = ScopedKey::new(
        Scope::new(unique_namespace("claim-other")).expect("ns"),
        k.key.clone(),
    );
    c.claimed(&other_ns).await;
    let with_principal = ScopedKey::new(k.scope.clone().with_principal("alice"), k.key.clone());
    c.claimed(&with_principal).await;
    let second = c.key("k2");
    c.claimed(&second).await;
    assert_eq!(
        c.record(&k).await,
        rec,
        "claims of other keys must not touch this record"
    );
}

/// While a lease is live every claim with the same fingerprint (the holder's own included) is
/// busy, with `0 < retry_after <= lease`, shrinking as time passes; nothing changes.
pub async fn busy_while_lease_live<H: Harness>(h: &H) {
    let c = Ctx::new(h, "busy").await;
    let k = c.key("k");
    let req = c.req(&k, fp(1));
    let lease = c.claimed_with(&req).await;
    let before = c.record(&k).await;
    let first = c.busy(&k).await;
    assert!(
        first <= c.lease,
        "retry_after {first:?} exceeds the lease {:?}",
        c.lease
    );
    let own = c.claim(&req).await;
    assert!(
        matches!(own, ClaimOutcome::Busy { .. }),
        "the holder's own second claim must be busy, got {own:?}"
    );
    let hold = c.claim(&c.hold_req(&k, fp(1))).await;
    assert!(
        matches!(hold, ClaimOutcome::Busy { .. }),
        "hold policy on a live lease must be busy, got {hold:?}"
    );
    assert_eq!(
        c.record(&k).await,
        before,
        "busy claims must not change the record"
    );

    c.advance(c.lease / 4).await;
    let later = c.busy(&k).await;
    assert!(
        later <= c.lease - c.lease / 4,
        "retry_after must shrink as time passes: {later:?} after a quarter lease"
    );
    assert_eq!(c.record(&k).await.fence, lease.fence);
}

/// A completed key replays exactly what was stored: status, headers in order (repeated and
/// binary ones included), body bytes, and `body_omitted`; to every later claim.
pub async fn done_replays_exact_response<H: Harness>(h: &H) {
    let c = Ctx::new(h, "done").await;
    let cases = [
        ("rich", rich_response()),
        (
            "omitted",
            StoredResponse {
                status: 200,
                headers: vec![],
                body: bytes::Bytes::new(),
                body_omitted: true,
            },
        ),
        ("empty", StoredResponse::new(599, "")),
        (
            "zero",
            StoredResponse::new(0, "plain function result").with_header("x-only", "one"),
        ),
    ];
    for (name, response) in &cases {
        let k = c.key(name);
        let lease = c.claimed(&k).await;
        c.complete(&k, &lease, response).await;
        for policy in [
            TakeoverPolicy::Reexecute,
            TakeoverPolicy::Hold,
            TakeoverPolicy::Reexecute,
        ] {
            let req = idem_core::ClaimRequest {
                takeover: policy,
                ..c.req(&k, fp(1))
            };
            match c.claim(&req).await {
                ClaimOutcome::Done { response: got } => {
                    assert_eq!(&got, response, "replay of {name} must be exact")
                }
                other => panic!("claim of completed {name}: expected Done, got {other:?}"),
            }
        }
        let rec = c.record(&k).await;
        match &rec.state {
            RecordState::Completed {
                response: got,
                completed_at,
            } => {
                assert_eq!(
                    got, response,
                    "get of {name} must return the stored response"
                );
                assert!(*completed_at >= rec.created_at);
            }
            other => panic!("get of completed {name}: state {other:?}"),
        }
        assert_eq!(rec.fence, lease.fence, "completion keeps the fence");
    }
    // Well past the lease the replay is the same: completion does not depend on the lease.
    c.wait_out_lease().await;
    for (name, response) in &cases {
        match c.claim_fp(&c.key(name), fp(1)).await {
            ClaimOutcome::Done { response: got } => assert_eq!(&got, response),
            other => {
                panic!("claim of completed {name} after its lease: expected Done, got {other:?}")
            }
        }
    }
}

/// A different fingerprint is a mismatch in every state (live processing, expired lease under
/// both policies, completed, unknown) and changes nothing.
pub async fn mismatch_changes_nothing_in_any_state<H: Harness>(h: &H) {
    let c = Ctx::new(h, "mismatch").await;
    let live = c.key("live");
    let done = c.key("done");
    let unknown = c.key("unknown");
    let expired = c.key("expired");
    let live_lease = c.claimed(&live).await;
    let done_lease = c.claimed(&done).await;
    c.complete(&done, &done_lease, &StoredResponse::new(200, "ok"))
        .await;
    let unknown_lease = c.claimed(&unknown).await;
    c.release(&unknown, &unknown_lease, ReleaseKind::Unknown)
        .await;
    let expired_lease = c.claimed(&expired).await;

    let check = |key: ScopedKey| {
        let c = &c;
        async move {
            let before = c.record(&key).await;
            for req in [c.req(&key, fp(2)), c.hold_req(&key, fp(2))] {
                match c.claim(&req).await {
                    ClaimOutcome::Mismatch { stored } => {
                        assert_eq!(stored, fp(1), "mismatch must report the stored fingerprint")
                    }
                    other => panic!(
                        "claim of {key} with another fingerprint: expected Mismatch, got {other:?}"
                    ),
                }
            }
            assert_eq!(
                c.record(&key).await,
                before,
                "a mismatch must change nothing on {key}"
            );
        }
    };
    for key in [&live, &done, &unknown] {
        check(key.clone()).await;
    }
    c.complete(&live, &live_lease, &StoredResponse::new(200, "live"))
        .await;

    c.wait_out_lease().await;
    // Processing with an expired lease: a different fingerprint neither takes over nor holds.
    check(expired.clone()).await;
    for key in [&done, &unknown] {
        check(key.clone()).await;
    }
    let still = c
        .complete_as(
            &expired,
            expired_lease.owner,
            expired_lease.fence,
            &StoredResponse::new(200, "late"),
        )
        .await;
    assert_eq!(
        still,
        SettleOutcome::Settled,
        "after mismatches the expired holder still holds the key"
    );
}

/// Each takeover of an expired lease gets a fence strictly above the last.
pub async fn fence_increases_across_takeovers<H: Harness>(h: &H) {
    let c = Ctx::new(h, "fence-takeover").await;
    let k = c.key("k");
    let mut last = c.claimed(&k).await.fence;
    for round in 0..3 {
        c.wait_out_lease().await;
        let lease = c.taken_over(&c.req(&k, fp(1))).await;
        assert!(
            lease.fence > last,
            "takeover {round}: fence {} must exceed {last}",
            lease.fence
        );
        assert_eq!(c.record(&k).await.fence, lease.fence);
        last = lease.fence;
    }
}

/// The fence outlives the record: after a completed or processing record expires, a new
/// claim's fence is still strictly above every earlier one.
pub async fn fence_increases_across_expiry<H: Harness>(h: &H) {
    let c = Ctx::new(h, "fence-expiry").await;
    let short = c.lease * 2;
    let k = c.key("k");
    let first = c.claimed(&k).await;
    assert_eq!(
        c.complete_ttl(
            &k,
            first.owner,
            first.fence,
            &StoredResponse::new(200, "a"),
            short
        )
        .await,
        SettleOutcome::Settled
    );
    c.advance(short + c.lease / 2).await;
    assert_eq!(
        c.get(&k).await,
        None,
        "completed record must be gone after its ttl"
    );
    let second = c.claimed(&k).await;
    assert!(
        second.fence > first.fence,
        "fence after a completed record expired: {} <= {}",
        second.fence,
        first.fence
    );

    // A processing record (never settled) that expires.
    let p = c.key("p");
    let mut req = c.req(&p, fp(1));
    req.ttl = short;
    let third = c.claimed_with(&req).await;
    c.advance(short + c.lease / 2).await;
    assert_eq!(
        c.get(&p).await,
        None,
        "processing record must be gone after its ttl"
    );
    let fourth = c.claimed(&p).await;
    assert!(
        fourth.fence > third.fence,
        "fence after a processing record expired: {} <= {}",
        fourth.fence,
        third.fence
    );
}

/// Retryable release, delete and resolve-by-release remove the record but never the fence
/// history: every later claim's fence is strictly greater.
pub async fn fence_increases_across_release_and_delete<H: Harness>(h: &H) {
    let c = Ctx::new(h, "fence-release").await;
    let k = c.key("k");
    let mut fences = vec![c.claimed(&k).await];
    c.release(&k, &fences[0], ReleaseKind::Retryable).await;
    fences.push(c.claimed(&k).await);
    assert!(
        c.delete(&k).await,
        "delete of a processing record must report it existed"
    );
    fences.push(c.claimed(&k).await);
    c.release(&k, &fences[2], ReleaseKind::Unknown).await;
    assert_eq!(
        c.resolve(&k, &Resolution::Release).await,
        ResolveOutcome::Resolved
    );
    fences.push(c.claimed(&k).await);
    c.complete(&k, &fences[3], &StoredResponse::new(200, "x"))
        .await;
    assert!(
        c.delete(&k).await,
        "delete of a completed record must report it existed"
    );
    fences.push(c.claimed(&k).await);
    for w in fences.windows(2) {
        assert!(
            w[1].fence > w[0].fence,
            "fences must strictly increase: {:?}",
            fences.iter().map(|l| l.fence).collect::<Vec<_>>()
        );
    }
}

/// Only the current owner with the current fence may renew, complete or release: a wrong
/// owner, a wrong fence, a holder that was taken over, or a holder that already settled gets
/// `Lost`/`Fenced`, and the record does not change.
pub async fn stale_owner_is_fenced<H: Harness>(h: &H) {
    let c = Ctx::new(h, "stale").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    let resp = StoredResponse::new(200, "stale");
    let refused = |owner: OwnerId, fence: u64, what: &'static str| {
        let c = &c;
        let k = &k;
        let resp = &resp;
        async move {
            let before = c.get(k).await;
            assert_eq!(
                c.complete_as(k, owner, fence, resp).await,
                SettleOutcome::Fenced,
                "complete by {what}"
            );
            assert_eq!(
                c.renew(k, owner, fence, c.lease).await,
                RenewOutcome::Lost,
                "renew by {what}"
            );
            for kind in [ReleaseKind::Retryable, ReleaseKind::Unknown] {
                assert_eq!(
                    c.release_as(k, owner, fence, kind).await,
                    SettleOutcome::Fenced,
                    "release {kind:?} by {what}"
                );
            }
            assert_eq!(
                c.get(k).await,
                before,
                "refused operations by {what} must change nothing"
            );
        }
    };
    refused(
        OwnerId::random(),
        a.fence,
        "another owner with the right fence",
    )
    .await;
    refused(a.owner, a.fence + 1, "the owner with a higher fence").await;
    refused(a.owner, a.fence - 1, "the owner with a lower fence").await;

    c.wait_out_lease().await;
    let b = c.taken_over(&c.req(&k, fp(1))).await;
    refused(a.owner, a.fence, "the taken-over holder").await;
    refused(a.owner, b.fence, "the old owner with the new fence").await;
    refused(b.owner, a.fence, "the new owner with the old fence").await;
    let rec = c.record(&k).await;
    assert_eq!(
        rec.state,
        RecordState::Processing {
            owner: b.owner,
            lease_until: b.deadline
        }
    );

    let final_response = StoredResponse::new(201, "b");
    c.complete(&k, &b, &final_response).await;
    refused(b.owner, b.fence, "a holder that already completed").await;
    match c.claim_fp(&k, fp(1)).await {
        ClaimOutcome::Done { response } => assert_eq!(response, final_response),
        other => panic!("expected the holder's response, got {other:?}"),
    }
}

/// A holder whose lease ran out still holds the key until someone takes it over: its renew
/// and its late completion are accepted rather than lost.
pub async fn late_holder_settles_until_taken_over<H: Harness>(h: &H) {
    let c = Ctx::new(h, "late").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.wait_out_lease().await;
    let RenewOutcome::Renewed { deadline } = c.renew(&k, a.owner, a.fence, c.lease).await else {
        panic!("renew by a holder whose lease ran out (no takeover yet) must succeed");
    };
    assert!(deadline > a.deadline);
    c.busy(&k).await;
    c.wait_out_lease().await;
    let response = StoredResponse::new(200, "late but fine");
    c.complete(&k, &a, &response).await;
    assert_eq!(c.claim_fp(&k, fp(1)).await, ClaimOutcome::Done { response });
}

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
        c.complete_ttl(&k, a.owner, a.fence, &response, ttl).await,
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
    let RenewOutcome::Renewed { deadline } = c.renew(&k, a.owner, a.fence, c.lease * 2).await
    else {
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
        c.release_as(&k, a.owner, a.fence, ReleaseKind::Retryable)
            .await,
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
    for _ in 0..2 {
        assert_eq!(c.claim_fp(&k, fp(1)).await, ClaimOutcome::Unknown);
        assert_eq!(c.claim(&c.hold_req(&k, fp(1))).await, ClaimOutcome::Unknown);
        assert!(matches!(
            c.claim_fp(&k, fp(2)).await,
            ClaimOutcome::Mismatch { .. }
        ));
        c.wait_out_lease().await;
    }
    assert_eq!(
        c.complete_as(&k, a.owner, a.fence, &StoredResponse::new(200, "x"))
            .await,
        SettleOutcome::Fenced
    );
    assert_eq!(
        c.renew(&k, a.owner, a.fence, c.lease).await,
        RenewOutcome::Lost
    );
    assert_eq!(
        c.release_as(&k, a.owner, a.fence, ReleaseKind::Retryable)
            .await,
        SettleOutcome::Fenced
    );
    assert_eq!(
        c.record(&k).await,
        rec,
        "nothing may move an unknown record but resolve or delete"
    );
}

/// Under `reexecute`, a claim on an expired lease takes over: `takeover: true`, a greater fence,
/// the new owner and request id on the record, and the original `created_at` kept.
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
    assert_eq!(
        rec.created_at, before.created_at,
        "takeover keeps created_at"
    );
    c.busy(&k).await;
}

/// Under `hold`, a claim on an expired lease marks the record unknown and answers `Unknown`;
/// later claims under either policy are `Unknown` and the old holder is fenced.
pub async fn takeover_hold_marks_unknown<H: Harness>(h: &H) {
    let c = Ctx::new(h, "hold").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.wait_out_lease().await;
    assert_eq!(c.claim(&c.hold_req(&k, fp(1))).await, ClaimOutcome::Unknown);
    let rec = c.record(&k).await;
    assert_eq!(rec.state.kind(), StateKind::Unknown);
    assert_eq!(rec.fence, a.fence, "marking unknown keeps the fence");
    assert_eq!(
        c.claim_fp(&k, fp(1)).await,
        ClaimOutcome::Unknown,
        "reexecute after hold"
    );
    assert_eq!(c.claim(&c.hold_req(&k, fp(1))).await, ClaimOutcome::Unknown);
    assert_eq!(
        c.complete_as(&k, a.owner, a.fence, &StoredResponse::new(200, "x"))
            .await,
        SettleOutcome::Fenced
    );
    assert_eq!(
        c.renew(&k, a.owner, a.fence, c.lease).await,
        RenewOutcome::Lost
    );
    assert_eq!(c.record(&k).await, rec);
}

/// Resolving an unknown record with a response completes it: later claims replay that
/// response, and resolving again is refused.
pub async fn resolve_unknown_with_response_replays<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-complete").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.release(&k, &a, ReleaseKind::Unknown).await;
    let response = rich_response();
    let resolution = Resolution::Complete {
        response: response.clone(),
        ttl: c.ttl,
    };
    assert_eq!(c.resolve(&k, &resolution).await, ResolveOutcome::Resolved);
    assert_eq!(
        c.claim_fp(&k, fp(1)).await,
        ClaimOutcome::Done {
            response: response.clone()
        }
    );
    match c.record(&k).await.state {
        RecordState::Completed { response: got, .. } => assert_eq!(got, response),
        other => panic!("resolved record: {other:?}"),
    }
    assert_eq!(
        c.resolve(&k, &resolution).await,
        ResolveOutcome::NotResolvable {
            state: StateKind::Completed
        }
    );
    assert_eq!(
        c.complete_as(&k, a.owner, a.fence, &StoredResponse::new(500, "x"))
            .await,
        SettleOutcome::Fenced
    );
}

/// Resolving an unknown record with a release removes it: the key can be claimed again.
pub async fn resolve_unknown_with_release_frees_key<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-release").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.release(&k, &a, ReleaseKind::Unknown).await;
    assert_eq!(
        c.resolve(&k, &Resolution::Release).await,
        ResolveOutcome::Resolved
    );
    assert_eq!(c.get(&k).await, None);
    let b = c.claimed(&k).await;
    assert!(b.fence > a.fence);
}

/// Completed records and processing records under a live lease are not resolvable, and the
/// attempt changes nothing.
pub async fn resolve_refuses_completed_and_live_processing<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-refuse").await;
    let done = c.key("done");
    let d = c.claimed(&done).await;
    c.complete(&done, &d, &StoredResponse::new(200, "kept"))
        .await;
    let live = c.key("live");
    let l = c.claimed(&live).await;
    for resolution in [
        Resolution::Release,
        Resolution::Complete {
            response: StoredResponse::new(500, "no"),
            ttl: c.ttl,
        },
    ] {
        let before = c.record(&done).await;
        assert_eq!(
            c.resolve(&done, &resolution).await,
            ResolveOutcome::NotResolvable {
                state: StateKind::Completed
            }
        );
        assert_eq!(c.record(&done).await, before);
        let before = c.record(&live).await;
        assert_eq!(
            c.resolve(&live, &resolution).await,
            ResolveOutcome::NotResolvable {
                state: StateKind::Processing
            }
        );
        assert_eq!(c.record(&live).await, before);
    }
    c.complete(&live, &l, &StoredResponse::new(200, "holder"))
        .await;
}

/// Resolving a key with no live record (never claimed, released, deleted) is `NotFound`.
pub async fn resolve_missing_is_not_found<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-missing").await;
    let never = c.key("never");
    assert_eq!(
        c.resolve(&never, &Resolution::Release).await,
        ResolveOutcome::NotFound
    );
    let released = c.key("released");
    let a = c.claimed(&released).await;
    c.release(&released, &a, ReleaseKind::Retryable).await;
    let deleted = c.key("deleted");
    c.claimed(&deleted).await;
    assert!(c.delete(&deleted).await);
    for k in [&never, &released, &deleted] {
        let complete = Resolution::Complete {
            response: StoredResponse::new(200, "x"),
            ttl: c.ttl,
        };
        assert_eq!(
            c.resolve(k, &complete).await,
            ResolveOutcome::NotFound,
            "resolve of {k}"
        );
        assert_eq!(
            c.get(k).await,
            None,
            "a refused resolve must not create {k}"
        );
    }
}

/// A processing record whose lease ran out is resolvable (stuck worker): with a response it
/// replays it, with a release the key is free; the old holder is fenced either way.
pub async fn resolve_expired_lease_processing<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-expired").await;
    let k1 = c.key("complete");
    let k2 = c.key("release");
    let a1 = c.claimed(&k1).await;
    let a2 = c.claimed(&k2).await;
    c.wait_out_lease().await;
    let response = StoredResponse::new(200, "operator says done");
    let resolution = Resolution::Complete {
        response: response.clone(),
        ttl: c.ttl,
    };
    assert_eq!(c.resolve(&k1, &resolution).await, ResolveOutcome::Resolved);
    assert_eq!(
        c.claim_fp(&k1, fp(1)).await,
        ClaimOutcome::Done { response }
    );
    assert_eq!(
        c.complete_as(&k1, a1.owner, a1.fence, &StoredResponse::new(500, "x"))
            .await,
        SettleOutcome::Fenced
    );

    assert_eq!(
        c.resolve(&k2, &Resolution::Release).await,
        ResolveOutcome::Resolved
    );
    assert_eq!(c.get(&k2).await, None);
    assert_eq!(
        c.release_as(&k2, a2.owner, a2.fence, ReleaseKind::Unknown)
            .await,
        SettleOutcome::Fenced
    );
    let b = c.claimed(&k2).await;
    assert!(b.fence > a2.fence);
}

/// `get` reports absent keys as `None` and each state with its details.
pub async fn get_reports_every_state<H: Harness>(h: &H) {
    let c = Ctx::new(h, "get").await;
    assert_eq!(c.get(&c.key("absent")).await, None);
    let p = c.key("processing");
    let lp = c.claimed(&p).await;
    let rec = c.record(&p).await;
    assert_eq!(
        rec.state,
        RecordState::Processing {
            owner: lp.owner,
            lease_until: lp.deadline
        }
    );

    let d = c.key("completed");
    let ld = c.claimed(&d).await;
    let response = StoredResponse::new(202, "accepted").with_header("location", "/x/1");
    c.complete(&d, &ld, &response).await;
    let rec = c.record(&d).await;
    assert_eq!(rec.key, d);
    assert_eq!(rec.fence, ld.fence);
    match rec.state {
        RecordState::Completed {
            response: got,
            completed_at,
        } => {
            assert_eq!(got, response);
            assert!(completed_at >= rec.created_at && completed_at < rec.expires_at);
        }
        other => panic!("completed record reads as {other:?}"),
    }

    let u = c.key("unknown");
    let lu = c.claimed(&u).await;
    c.release(&u, &lu, ReleaseKind::Unknown).await;
    let rec = c.record(&u).await;
    match rec.state {
        RecordState::Unknown { since } => {
            assert!(since >= rec.created_at && since < rec.expires_at)
        }
        other => panic!("unknown record reads as {other:?}"),
    }
    // Reads change nothing.
    assert_eq!(c.record(&u).await, c.record(&u).await);
    c.busy(&p).await;
}

/// `delete` removes a record in any state and reports whether a live one existed; the key can
/// be claimed afresh and a holder from before the delete is fenced.
pub async fn delete_removes_record<H: Harness>(h: &H) {
    let c = Ctx::new(h, "delete").await;
    let k = c.key("k");
    assert!(!c.delete(&k).await, "delete of an absent key");
    let a = c.claimed(&k).await;
    assert!(c.delete(&k).await);
    assert_eq!(c.get(&k).await, None);
    assert!(!c.delete(&k).await, "second delete");
    let b = c.claimed(&k).await;
    assert_eq!(
        c.complete_as(&k, a.owner, a.fence, &StoredResponse::new(200, "old"))
            .await,
        SettleOutcome::Fenced
    );
    c.complete(&k, &b, &StoredResponse::new(200, "new")).await;
    assert!(c.delete(&k).await, "delete of a completed record");
    let d = c.claimed(&k).await;
    c.release(&k, &d, ReleaseKind::Unknown).await;
    assert!(c.delete(&k).await, "delete of an unknown record");
    c.claimed(&k).await;
}

/// `list` filters by namespace, principal and both.
pub async fn list_filters_by_namespace_and_principal<H: Harness>(h: &H) {
    let c = Ctx::new(h, "list-scope").await;
    let ns1 = c.ns.clone();
    let ns2 = unique_namespace("list-scope-2");
    let p1 = unique_namespace("principal-1");
    let p2 = unique_namespace("principal-2");
    let key = |ns: &str, p: Option<&str>, name: &str| {
        let scope = Scope::new(ns).expect("ns");
        let scope = match p {
            Some(p) => scope.with_principal(p),
            None => scope,
        };
        ScopedKey::new(scope, Key::new(name).expect("key"))
    };
    let all = [
        key(&ns1, None, "a"),
        key(&ns1, Some(&p1), "b"),
        key(&ns1, Some(&p2), "c"),
        key(&ns2, Some(&p1), "d"),
    ];
    for k in &all {
        c.claimed(k).await;
    }
    let filter = |ns: Option<&str>, p: Option<&str>| ListFilter {
        namespace: ns.map(str::to_owned),
        principal: p.map(str::to_owned),
        ..ListFilter::default()
    };
    assert_eq!(
        c.list_keys(&filter(Some(&ns1), None)).await,
        names(&["a", "b", "c"])
    );
    assert_eq!(c.list_keys(&filter(Some(&ns2), None)).await, names(&["d"]));
    assert_eq!(
        c.list_keys(&filter(None, Some(&p1))).await,
        names(&["b", "d"])
    );
    assert_eq!(
        c.list_keys(&filter(Some(&ns1), Some(&p1))).await,
        names(&["b"])
    );
    assert_eq!(
        c.list_keys(&filter(Some(&ns2), Some(&p2))).await,
        BTreeSet::new()
    );
    for rec in c.list(&filter(Some(&ns1), None)).await {
        assert_eq!(
            Some(&rec),
            c.get(&rec.key).await.as_ref(),
            "list must return the same records as get"
        );
    }
}

/// `list` filters by state; a processing record with an expired lease is still processing;
/// released and deleted records are not listed.
pub async fn list_filters_by_state<H: Harness>(h: &H) {
    let c = Ctx::new(h, "list-state").await;
    let p = c.key("p");
    c.claimed(&p).await;
    let d = c.key("d");
    let ld = c.claimed(&d).await;
    c.complete(&d, &ld, &StoredResponse::new(200, "d")).await;
    let u = c.key("u");
    let lu = c.claimed(&u).await;
    c.release(&u, &lu, ReleaseKind::Unknown).await;
    let r = c.key("r");
    let lr = c.claimed(&r).await;
    c.release(&r, &lr, ReleaseKind::Retryable).await;
    let x = c.key("x");
    c.claimed(&x).await;
    assert!(c.delete(&x).await);
    let by = |state| ListFilter {
        state: Some(state),
        ..c.in_ns()
    };
    for round in 0..2 {
        assert_eq!(
            c.list_keys(&by(StateKind::Processing)).await,
            names(&["p"]),
            "round {round}"
        );
        assert_eq!(
            c.list_keys(&by(StateKind::Completed)).await,
            names(&["d"]),
            "round {round}"
        );
        assert_eq!(
            c.list_keys(&by(StateKind::Unknown)).await,
            names(&["u"]),
            "round {round}"
        );
        assert_eq!(
            c.list_keys(&c.in_ns()).await,
            names(&["p", "d", "u"]),
            "round {round}"
        );
        c.wait_out_lease().await;
    }
}

/// `list` answers oldest first, honours `limit` (0 meaning the default) and `older_than`.
pub async fn list_oldest_first_with_limit_and_age<H: Harness>(h: &H) {
    let c = Ctx::new(h, "list-order").await;
    // Created in this order, a lease apart, under names that do not sort by age.
    let order = ["m", "z", "a", "q"];
    for (i, name) in order.iter().enumerate() {
        if i > 0 {
            c.advance(c.lease).await;
        }
        let k = c.key(name);
        let l = c.claimed(&k).await;
        if i % 2 == 1 {
            c.complete(&k, &l, &StoredResponse::new(200, *name)).await;
        }
    }
    let listed = |f: ListFilter| {
        let c = &c;
        async move {
            c.list(&f)
                .await
                .into_iter()
                .map(|r| r.key.key.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    // Ages now: m 3 L, z 2 L, a 1 L, q 0 (plus latency): half a lease of margin either side.
    let old = ListFilter {
        older_than: Some(c.lease * 3 / 2),
        ..c.in_ns()
    };
    assert_eq!(listed(old.clone()).await, order[..2], "older_than");
    assert_eq!(
        listed(ListFilter { limit: 1, ..old }).await,
        order[..1],
        "older_than with limit"
    );
    assert_eq!(listed(c.in_ns()).await, order, "oldest first");
    assert_eq!(
        listed(ListFilter {
            limit: 2,
            ..c.in_ns()
        })
        .await,
        order[..2],
        "limit keeps the oldest"
    );
    assert_eq!(
        listed(ListFilter {
            limit: 1,
            ..c.in_ns()
        })
        .await,
        order[..1]
    );
    let all = ListFilter {
        older_than: Some(Duration::ZERO),
        ..c.in_ns()
    };
    assert_eq!(listed(all).await, order);
}

/// A key claimed again after its record expired is as young as that new claim: `list` orders
/// and limits it by the new `created_at`, not by when the key was first seen.
pub async fn list_orders_reclaimed_key_by_new_age<H: Harness>(h: &H) {
    let c = Ctx::new(h, "list-reclaimed").await;
    let short = c.lease * 2;
    let first = c.key("first");
    let mut req = c.req(&first, fp(1));
    req.ttl = short;
    let a = c.claimed_with(&req).await;
    assert_eq!(
        c.complete_ttl(
            &first,
            a.owner,
            a.fence,
            &StoredResponse::new(200, "a"),
            short
        )
        .await,
        SettleOutcome::Settled
    );
    c.advance(c.lease).await;
    let second = c.key("second");
    c.claimed(&second).await;
    c.advance(short).await;
    // `first` expired a lease ago; claimed again it is now the youngest record.
    c.claimed(&first).await;
    let listed = |limit: usize| {
        let c = &c;
        async move {
            c.list(&ListFilter { limit, ..c.in_ns() })
                .await
                .into_iter()
                .map(|r| r.key.key.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(0).await, ["second", "first"], "oldest first");
    assert_eq!(listed(1).await, ["second"], "limit keeps the oldest");
}

/// The claim's request id is kept on the record through completion and unknown release.
pub async fn request_id_kept_on_record<H: Harness>(h: &H) {
    let c = Ctx::new(h, "request-id").await;
    let k = c.key("k");
    let mut req = c.req(&k, fp(1));
    req.request_id = Some("req-0001 trace=abc".into());
    let a = c.claimed_with(&req).await;
    assert_eq!(c.record(&k).await.request_id, req.request_id);
    c.complete(&k, &a, &StoredResponse::new(200, "x")).await;
    assert_eq!(
        c.record(&k).await.request_id,
        req.request_id,
        "kept through completion"
    );
    let u = c.key("u");
    let mut req = c.req(&u, fp(1));
    req.request_id = Some("req-0002".into());
    let b = c.claimed_with(&req).await;
    c.release(&u, &b, ReleaseKind::Unknown).await;
    assert_eq!(
        c.record(&u).await.request_id,
        req.request_id,
        "kept through unknown release"
    );
    let n = c.key("none");
    c.claimed(&n).await;
    assert_eq!(c.record(&n).await.request_id, None);
}

/// How many tasks the race rules start.
pub const RACERS: usize = 64;

async fn race<H: Harness>(
    c: &Ctx<'_, H>,
    key: &ScopedKey,
    lease: Duration,
) -> Vec<(idem_core::ClaimRequest, ClaimOutcome)> {
    race_with(c, key, lease, |_| fp(1)).await
}

/// Starts `RACERS` claims of `key` at once; racer `i` sends fingerprint `fingerprint(i)`.
async fn race_with<H: Harness>(
    c: &Ctx<'_, H>,
    key: &ScopedKey,
    lease: Duration,
    fingerprint: impl Fn(usize) -> idem_core::Fingerprint,
) -> Vec<(idem_core::ClaimRequest, ClaimOutcome)> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let store = c.store.clone();
        let barrier = barrier.clone();
        let mut req = c.req(key, fingerprint(i));
        req.lease = lease;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = idem_core::Store::claim(&store, &req).await;
            (req, outcome)
        }));
    }
    let mut out = Vec::with_capacity(RACERS);
    for t in tasks {
        let (req, outcome) = t.await.expect("racer panicked");
        out.push((req, outcome.expect("store error in race")));
    }
    out
}

fn one_winner(
    results: &[(idem_core::ClaimRequest, ClaimOutcome)],
    takeover: bool,
) -> (OwnerId, u64) {
    let winners: Vec<_> = results
        .iter()
        .filter_map(|(req, o)| match o {
            ClaimOutcome::Claimed { lease, takeover: t } => Some((req.owner, lease.fence, *t)),
            _ => None,
        })
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {RACERS} racing claims may win, {} did: {winners:?}",
        winners.len()
    );
    assert_eq!(winners[0].2, takeover, "the winner's takeover flag");
    let losers = results
        .iter()
        .filter(|(_, o)| matches!(o, ClaimOutcome::Busy { .. }))
        .count();
    assert_eq!(losers, RACERS - 1, "every other racer must be busy");
    (winners[0].0, winners[0].1)
}

/// `RACERS` tasks claim one absent key at once: exactly one is `Claimed`, every other `Busy`,
/// and the record names the winner.
pub async fn race_one_claim_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race").await;
    // A race may by luck not interleave; three rounds on fresh keys give a broken store three
    // chances to show it.
    for round in ["r0", "r1"] {
        let k = c.key(round);
        one_winner(&race(&c, &k, c.lease * 10).await, false);
    }
    let k = c.key("k");
    let results = race(&c, &k, c.lease * 10).await;
    let (owner, fence) = one_winner(&results, false);
    let rec = c.record(&k).await;
    assert_eq!(rec.fence, fence);
    assert!(matches!(rec.state, RecordState::Processing { owner: o, .. } if o == owner));

    // Once the winner completes, every racer replays the same response.
    let response = StoredResponse::new(201, "the one execution");
    assert_eq!(
        c.complete_as(&k, owner, fence, &response).await,
        SettleOutcome::Settled
    );
    for (_, outcome) in race(&c, &k, c.lease * 10).await {
        assert_eq!(
            outcome,
            ClaimOutcome::Done {
                response: response.clone()
            }
        );
    }
}

/// `RACERS` tasks claim one absent key at once with two different fingerprints: exactly one
/// is `Claimed`; every racer with the winner's fingerprint is `Busy`, every other a
/// `Mismatch` naming the winner's fingerprint.
pub async fn race_mixed_fingerprints_one_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race-mixed").await;
    let k = c.key("k");
    let results = race_with(&c, &k, c.lease * 10, |i| fp(1 + (i % 2) as u8)).await;
    let winners: Vec<_> = results
        .iter()
        .filter(|(_, o)| matches!(o, ClaimOutcome::Claimed { .. }))
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one racing claim may win: {winners:?}"
    );
    let won_with = winners[0].0.fingerprint;
    for (req, outcome) in &results {
        match outcome {
            ClaimOutcome::Claimed { .. } => {}
            ClaimOutcome::Busy { .. } => {
                assert_eq!(req.fingerprint, won_with, "busy for another request")
            }
            ClaimOutcome::Mismatch { stored } => {
                assert_ne!(
                    req.fingerprint, won_with,
                    "mismatch for the winner's own request"
                );
                assert_eq!(
                    *stored, won_with,
                    "mismatch must name the winner's fingerprint"
                );
            }
            other => panic!("racing claim answered {other:?}"),
        }
    }
    assert_eq!(c.record(&k).await.fingerprint, won_with);
}

/// `RACERS` tasks claim one key whose lease has run out: exactly one takes it over.
pub async fn race_one_takeover_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race-takeover").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.wait_out_lease().await;
    let results = race(&c, &k, c.lease * 10).await;
    let (owner, fence) = one_winner(&results, true);
    assert!(fence > a.fence);
    let rec = c.record(&k).await;
    assert!(matches!(rec.state, RecordState::Processing { owner: o, .. } if o == owner));
}
