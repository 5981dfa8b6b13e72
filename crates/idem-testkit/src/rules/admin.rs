//! Reads and admin operations: get, delete, list and its filters, request ids.

use std::collections::BTreeSet;
use std::time::Duration;

use idem_core::store::Hold;
use idem_core::{
    Key, ListFilter, RecordState, ReleaseKind, Scope, ScopedKey, SettleOutcome, StateKind,
    StoredResponse,
};

use crate::ctx::{Ctx, fp, names, unique_namespace};
use crate::harness::Harness;

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
        RecordState::Unknown { since, owner } => {
            assert!(since >= rec.created_at && since < rec.expires_at);
            assert_eq!(
                owner, None,
                "a holder that released as unknown is not named"
            );
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
        c.complete_as(Hold::of(&k, &a), &StoredResponse::new(200, "old"))
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
        c.complete_ttl(Hold::of(&first, &a), &StoredResponse::new(200, "a"), short)
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
