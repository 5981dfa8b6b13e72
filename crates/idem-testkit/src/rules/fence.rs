//! Fencing: fences only ever grow, and only the current holder may settle.

use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, OwnerId, RecordState, ReleaseKind, RenewOutcome, Resolution, ResolveOutcome,
    SettleOutcome, StoredResponse,
};

use crate::ctx::{Ctx, fp};
use crate::harness::Harness;

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
        c.complete_ttl(Hold::of(&k, &first), &StoredResponse::new(200, "a"), short)
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
                c.complete_as(Hold::new(k, owner, fence), resp).await,
                SettleOutcome::Fenced,
                "complete by {what}"
            );
            assert_eq!(
                c.renew(Hold::new(k, owner, fence), c.lease).await,
                RenewOutcome::Lost,
                "renew by {what}"
            );
            for kind in [ReleaseKind::Retryable, ReleaseKind::Unknown] {
                assert_eq!(
                    c.release_as(Hold::new(k, owner, fence), kind).await,
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
    let RenewOutcome::Renewed { deadline } = c.renew(Hold::of(&k, &a), c.lease).await else {
        panic!("renew by a holder whose lease ran out (no takeover yet) must succeed");
    };
    assert!(deadline > a.deadline);
    c.busy(&k).await;
    c.wait_out_lease().await;
    let response = StoredResponse::new(200, "late but fine");
    c.complete(&k, &a, &response).await;
    assert_eq!(c.claim_fp(&k, fp(1)).await, ClaimOutcome::Done { response });
}
