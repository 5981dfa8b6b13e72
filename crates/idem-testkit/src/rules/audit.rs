//! The audit trail: at `AuditLevel::All` every state change leaves one event, in order, with
//! who and what; at the default level every one but a fresh claim and the completion of a
//! processing record.

use idem_core::audit::{self, AuditEvent, AuditKind, AuditLevel, AuditQuery, instance_of};
use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, Lease, ReleaseKind, Resolution, ResolveOutcome, ScopedKey, SettleOutcome, Store,
    StoredResponse,
};
use std::time::Duration;

use crate::ctx::{Ctx, fp};
use crate::harness::Harness;

impl<H: Harness> Ctx<'_, H> {
    async fn audit(&self, query: &AuditQuery) -> Vec<AuditEvent> {
        self.store
            .audit(query)
            .await
            .unwrap_or_else(|e| panic!("audit {query:?}: store error: {e}"))
    }

    async fn trail(&self, key: &ScopedKey) -> Vec<AuditEvent> {
        self.audit(&AuditQuery::for_key(key)).await
    }
}

fn kinds(events: &[AuditEvent]) -> Vec<AuditKind> {
    events.iter().map(|e| e.kind).collect()
}

/// A first request's whole life on the key `done`: claim, renewal, busy duplicate,
/// completion (202), replay and read. Returns its claim and the key's trail, which each
/// level's rule checks against what that level records.
async fn first_request_life<H: Harness>(c: &Ctx<'_, H>) -> (Lease, Vec<AuditEvent>) {
    let done = c.key("done");
    let d = c.claimed(&done).await;
    c.renew(Hold::of(&done, &d), c.lease).await;
    c.busy(&done).await;
    c.complete(&done, &d, &StoredResponse::new(202, "ok")).await;
    assert!(matches!(
        c.claim_fp(&done, fp(1)).await,
        ClaimOutcome::Done { .. }
    ));
    c.get(&done).await;
    (d, c.trail(&done).await)
}

/// The key `freed` claimed and released retryable, claimed and released unknown, then
/// deleted by `rule:cleaner`. Returns both claims and the key's trail.
async fn released_twice_then_deleted<H: Harness>(
    c: &Ctx<'_, H>,
) -> (Lease, Lease, Vec<AuditEvent>) {
    let freed = c.key("freed");
    let f = c.claimed(&freed).await;
    c.release(&freed, &f, ReleaseKind::Retryable).await;
    let g = c.claimed(&freed).await;
    c.release(&freed, &g, ReleaseKind::Unknown).await;
    assert!(audit::acting_as("rule:cleaner", || c.delete(&freed)).await);
    (f, g, c.trail(&freed).await)
}

/// The trail of a key through claim → lease runs out under `hold` → unknown → resolve, at
/// `all`: three events, newest first, each with its fence, request id, instance and actor.
pub async fn audit_trail_follows_claim_timeout_unknown_resolve<H: Harness>(h: &H) {
    let c = Ctx::at(h, "audit-trail", AuditLevel::All).await;
    let k = c.key("k");
    let mut first = c.hold_req(&k, fp(1));
    first.request_id = Some("req-first".into());
    let ClaimOutcome::Claimed { lease, .. } = c.claim(&first).await else {
        panic!("first claim of {k} not granted");
    };
    c.wait_out_lease().await;
    let mut retry = c.hold_req(&k, fp(1));
    retry.request_id = Some("req-retry".into());
    c.unknown_with(&retry, lease.fence).await;
    let response = StoredResponse::new(201, "settled");
    let resolution = Resolution::Complete {
        response,
        ttl: c.ttl,
    };
    let resolved = audit::acting_as("rule:operator", || c.resolve(&k, &resolution)).await;
    assert_eq!(resolved, ResolveOutcome::Resolved);

    let trail = c.trail(&k).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Resolved, AuditKind::Unknown, AuditKind::Claimed],
        "trail of {k}: {trail:#?}"
    );
    let (resolve, unknown, claim) = (&trail[0], &trail[1], &trail[2]);
    for e in &trail {
        assert_eq!(e.namespace, c.ns);
        assert_eq!(e.scope, "");
        assert_eq!(e.key, "k");
        assert_eq!(
            e.fence, lease.fence,
            "every event concerns the one claim: {e:?}"
        );
    }
    assert_eq!(claim.request_id.as_deref(), Some("req-first"));
    assert_eq!(claim.instance, Some(instance_of(first.owner)));
    assert_eq!(claim.actor, None);
    assert_eq!(unknown.outcome.as_deref(), Some("lease_expired"));
    assert_eq!(resolve.outcome.as_deref(), Some("complete"));
    assert_eq!(resolve.status, Some(201));
    assert_eq!(resolve.actor.as_deref(), Some("rule:operator"));
    assert!(
        claim.at <= unknown.at && unknown.at <= resolve.at,
        "times go forward: {trail:#?}"
    );
}

/// At `all`, claims, completion, both releases, a takeover, a fenced settle and a delete
/// each leave their event; reads, renewals, busy claims and replays leave none.
pub async fn audit_records_every_change_and_nothing_else<H: Harness>(h: &H) {
    let c = Ctx::at(h, "audit-changes", AuditLevel::All).await;

    let (d, trail) = first_request_life(&c).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Completed, AuditKind::Claimed],
        "{trail:#?}"
    );
    assert_eq!(trail[0].status, Some(202));
    assert_eq!(trail[0].instance, Some(instance_of(d.owner)));

    let (f, g, trail) = released_twice_then_deleted(&c).await;
    assert_eq!(
        kinds(&trail),
        [
            AuditKind::Deleted,
            AuditKind::Unknown,
            AuditKind::Claimed,
            AuditKind::Released,
            AuditKind::Claimed
        ],
        "{trail:#?}"
    );
    assert_eq!(trail[0].actor.as_deref(), Some("rule:cleaner"));
    assert_eq!(trail[1].outcome.as_deref(), Some("ambiguous"));
    assert_eq!(trail[3].outcome.as_deref(), Some("retryable"));
    assert_eq!((trail[3].fence, trail[1].fence), (f.fence, g.fence));

    let stale = c.key("stale");
    let old = c.claimed(&stale).await;
    c.wait_out_lease().await;
    let new = c.taken_over(&c.req(&stale, fp(1))).await;
    assert_eq!(
        c.complete_as(Hold::of(&stale, &old), &StoredResponse::new(200, "late"))
            .await,
        SettleOutcome::Fenced
    );
    let trail = c.trail(&stale).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Fenced, AuditKind::TakenOver, AuditKind::Claimed],
        "{trail:#?}"
    );
    assert_eq!(
        trail[0].fence, old.fence,
        "fenced names the stale caller's fence"
    );
    assert_eq!(trail[0].outcome.as_deref(), Some("complete"));
    assert_eq!(trail[1].fence, new.fence);
}

/// Queries filter by namespace, principal, key, kind and time, and keep to the limit (at
/// `all`, where claims and completions give every key events to filter).
pub async fn audit_query_filters<H: Harness>(h: &H) {
    let c = Ctx::at(h, "audit-query", AuditLevel::All).await;
    let mut keys = Vec::new();
    for name in ["a", "b", "c"] {
        let k = c.key(name);
        let l = c.claimed(&k).await;
        c.complete(&k, &l, &StoredResponse::new(200, name)).await;
        keys.push(k);
    }
    let tenant = ScopedKey::new(
        keys[0].scope.clone().with_principal("tenant-1"),
        keys[0].key.clone(),
    );
    // Events are ordered by their store time in milliseconds; a store that keeps them in
    // several streams (one per cluster slot) cannot order two events of one millisecond, so
    // the newest is made a later one.
    c.advance(Duration::from_millis(5)).await;
    c.claimed(&tenant).await;

    let in_ns = AuditQuery {
        namespace: Some(c.ns.clone()),
        ..AuditQuery::default()
    };
    let all = c.audit(&in_ns).await;
    assert_eq!(all.len(), 7, "{all:#?}");
    assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "newest first");
    assert_eq!(all[0].scope, "tenant-1");

    let completed = c
        .audit(&AuditQuery {
            kind: Some(AuditKind::Completed),
            ..in_ns.clone()
        })
        .await;
    assert_eq!(completed.len(), 3);
    assert!(completed.iter().all(|e| e.scope.is_empty()));
    let no_principal = c
        .audit(&AuditQuery {
            scope: Some(String::new()),
            ..in_ns.clone()
        })
        .await;
    assert_eq!(no_principal.len(), 6);
    assert_eq!(c.audit(&AuditQuery::for_key(&tenant)).await.len(), 1);
    let limited = c
        .audit(&AuditQuery {
            limit: 2,
            ..in_ns.clone()
        })
        .await;
    assert_eq!(limited, all[..2]);

    let oldest = all[all.len() - 1].at;
    let newest = all[0].at;
    let before = c
        .audit(&AuditQuery {
            until: Some(oldest),
            ..in_ns.clone()
        })
        .await;
    assert!(!before.is_empty() && before.iter().all(|e| e.at <= oldest));
    let after = c
        .audit(&AuditQuery {
            since: Some(newest),
            ..in_ns.clone()
        })
        .await;
    assert!(!after.is_empty() && after.iter().all(|e| e.at >= newest));
    let elsewhere = AuditQuery {
        namespace: Some(format!("{}-other", c.ns)),
        ..AuditQuery::default()
    };
    assert!(c.audit(&elsewhere).await.is_empty());
}

/// At the default level a claim and its completion leave no event (the record tells them),
/// nor do reads, renewals, busy claims and replays; what an operator needs still does:
/// releases, unknowns, a takeover and the fenced settle after it, a late holder completing
/// its unknown record, resolves and deletes, each with its fence, outcome and actor.
pub async fn audit_default_level_records_what_an_operator_needs<H: Harness>(h: &H) {
    let c = Ctx::at(h, "audit-default", AuditLevel::default()).await;
    default_first_request_leaves_no_trail(&c).await;
    default_releases_and_delete_are_recorded(&c).await;
    default_takeover_and_fenced_settle_are_recorded(&c).await;
    default_late_holder_completing_is_recorded(&c).await;
    default_unknown_and_resolve_are_recorded(&c).await;
    default_namespace_has_no_claims(&c).await;
}

/// A claim, renewal, busy claim, completion, replay and read leave no event at the default
/// level.
async fn default_first_request_leaves_no_trail<H: Harness>(c: &Ctx<'_, H>) {
    let (_, trail) = first_request_life(c).await;
    assert_eq!(
        kinds(&trail),
        [],
        "a first request wrote to the trail: {trail:#?}"
    );
}

/// A retryable release, an unknown release and a delete each leave an event with its
/// outcome, fence, instance and actor.
async fn default_releases_and_delete_are_recorded<H: Harness>(c: &Ctx<'_, H>) {
    let (f, g, trail) = released_twice_then_deleted(c).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Deleted, AuditKind::Unknown, AuditKind::Released],
        "{trail:#?}"
    );
    assert_eq!(trail[0].actor.as_deref(), Some("rule:cleaner"));
    assert_eq!(trail[1].outcome.as_deref(), Some("ambiguous"));
    assert_eq!(trail[2].outcome.as_deref(), Some("retryable"));
    assert_eq!((trail[2].fence, trail[1].fence), (f.fence, g.fence));
    assert_eq!(trail[2].instance, Some(instance_of(f.owner)));
}

/// A takeover and the old holder's fenced completion after it each leave an event; the new
/// holder's completion does not.
async fn default_takeover_and_fenced_settle_are_recorded<H: Harness>(c: &Ctx<'_, H>) {
    let stale = c.key("stale");
    let old = c.claimed(&stale).await;
    c.wait_out_lease().await;
    let new = c.taken_over(&c.req(&stale, fp(1))).await;
    let late = StoredResponse::new(200, "late");
    assert_eq!(
        c.complete_as(Hold::of(&stale, &old), &late).await,
        SettleOutcome::Fenced
    );
    c.complete(&stale, &new, &StoredResponse::new(200, "new"))
        .await;
    let trail = c.trail(&stale).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Fenced, AuditKind::TakenOver],
        "{trail:#?}"
    );
    assert_eq!((trail[0].fence, trail[1].fence), (old.fence, new.fence));
    assert_eq!(trail[1].instance, Some(instance_of(new.owner)));
}

/// A holder completing its record after it went unknown leaves the unknown and the
/// completion in the trail.
async fn default_late_holder_completing_is_recorded<H: Harness>(c: &Ctx<'_, H>) {
    // The holder comes back after its lease ran out under `hold` and completes: the
    // completion is why the unknown in the trail never needed a resolve.
    let back = c.key("back");
    let first = c.hold_req(&back, fp(1));
    let lease = c.claimed_with(&first).await;
    c.wait_out_lease().await;
    c.unknown_with(&c.hold_req(&back, fp(1)), lease.fence).await;
    c.complete(&back, &lease, &StoredResponse::new(201, "late"))
        .await;
    let trail = c.trail(&back).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Completed, AuditKind::Unknown],
        "{trail:#?}"
    );
    assert_eq!(trail[0].status, Some(201));
    assert_eq!(trail[0].instance, Some(instance_of(lease.owner)));
    assert_eq!(trail[1].outcome.as_deref(), Some("lease_expired"));
}

/// An unknown release and the operator's resolve of it each leave an event with the
/// lease's fence, the actor, the outcome and the request id.
async fn default_unknown_and_resolve_are_recorded<H: Harness>(c: &Ctx<'_, H>) {
    let settled = c.key("settled");
    let mut req = c.hold_req(&settled, fp(1));
    req.request_id = Some("req-settled".into());
    let lease = c.claimed_with(&req).await;
    c.release(&settled, &lease, ReleaseKind::Unknown).await;
    let resolved = audit::acting_as("rule:operator", || {
        c.resolve(&settled, &Resolution::Release)
    })
    .await;
    assert_eq!(resolved, ResolveOutcome::Resolved);
    let trail = c.trail(&settled).await;
    assert_eq!(
        kinds(&trail),
        [AuditKind::Resolved, AuditKind::Unknown],
        "{trail:#?}"
    );
    assert!(trail.iter().all(|e| e.fence == lease.fence), "{trail:#?}");
    assert_eq!(trail[0].actor.as_deref(), Some("rule:operator"));
    assert_eq!(trail[0].outcome.as_deref(), Some("release"));
    assert_eq!(trail[1].request_id.as_deref(), Some("req-settled"));
}

/// The whole namespace's trail holds no claim and exactly the nine events of the phases.
async fn default_namespace_has_no_claims<H: Harness>(c: &Ctx<'_, H>) {
    let in_ns = AuditQuery {
        namespace: Some(c.ns.clone()),
        ..AuditQuery::default()
    };
    let everything = c.audit(&in_ns).await;
    assert!(
        everything.iter().all(|e| e.kind != AuditKind::Claimed),
        "{everything:#?}"
    );
    assert_eq!(everything.len(), 9, "{everything:#?}");
}
