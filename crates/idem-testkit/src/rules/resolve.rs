//! Operator resolves of unknown and stuck records.

use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, RecordState, ReleaseKind, Resolution, ResolveOutcome, SettleOutcome, StateKind,
    StoredResponse,
};

use crate::ctx::{Ctx, fp, rich_response};
use crate::harness::Harness;

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
        c.complete_as(Hold::of(&k, &a), &StoredResponse::new(500, "x"))
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
        c.complete_as(Hold::of(&k1, &a1), &StoredResponse::new(500, "x"))
            .await,
        SettleOutcome::Fenced
    );

    assert_eq!(
        c.resolve(&k2, &Resolution::Release).await,
        ResolveOutcome::Resolved
    );
    assert_eq!(c.get(&k2).await, None);
    assert_eq!(
        c.release_as(Hold::of(&k2, &a2), ReleaseKind::Unknown).await,
        SettleOutcome::Fenced
    );
    let b = c.claimed(&k2).await;
    assert!(b.fence > a2.fence);
}

/// A resolve that names a fence settles only the attempt that holds it: one decided from a
/// read of an earlier attempt (a probe's or a reconciler's answer about it) must not settle
/// the key's next attempt, which may have run since.
pub async fn resolve_naming_a_fence_settles_only_that_attempt<H: Harness>(h: &H) {
    let c = Ctx::new(h, "resolve-fenced").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.release(&k, &a, ReleaseKind::Unknown).await;
    assert_eq!(
        c.resolve_at(&k, &Resolution::Release, Some(a.fence)).await,
        ResolveOutcome::Resolved
    );
    // The next attempt runs and its outcome is unknown too.
    let b = c.claimed(&k).await;
    c.release(&k, &b, ReleaseKind::Unknown).await;
    let before = c.record(&k).await;
    for resolution in [
        Resolution::Release,
        Resolution::Complete {
            response: StoredResponse::new(200, "about the first attempt"),
            ttl: c.ttl,
        },
    ] {
        assert_eq!(
            c.resolve_at(&k, &resolution, Some(a.fence)).await,
            ResolveOutcome::Fenced { fence: b.fence },
            "a resolve naming the earlier attempt's fence"
        );
    }
    assert_eq!(
        c.record(&k).await,
        before,
        "a fenced resolve changes nothing"
    );
    let response = StoredResponse::new(201, "about this attempt");
    let resolution = Resolution::Complete {
        response: response.clone(),
        ttl: c.ttl,
    };
    assert_eq!(
        c.resolve_at(&k, &resolution, Some(b.fence)).await,
        ResolveOutcome::Resolved
    );
    assert_eq!(c.claim_fp(&k, fp(1)).await, ClaimOutcome::Done { response });
    assert_eq!(
        c.resolve_at(&c.key("absent"), &Resolution::Release, Some(1))
            .await,
        ResolveOutcome::NotFound
    );
}
