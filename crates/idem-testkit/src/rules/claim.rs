//! Claiming: a fresh claim, busy while the lease lives, replay of a completed key, and
//! mismatches in every state.

use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, RecordState, ReleaseKind, Scope, ScopedKey, SettleOutcome, StoredResponse,
    TakeoverPolicy,
};

use crate::ctx::{Ctx, fp, rich_response, unique_namespace};
use crate::harness::Harness;

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
                trailers: Vec::new(),
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
            Hold::of(&expired, &expired_lease),
            &StoredResponse::new(200, "late"),
        )
        .await;
    assert_eq!(
        still,
        SettleOutcome::Settled,
        "after mismatches the expired holder still holds the key"
    );
}
