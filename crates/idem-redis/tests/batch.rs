//! Coalescing of concurrent claims and completions: fewer script calls than operations, each
//! operation answered exactly as if it ran alone, operations on one key inside one batch
//! applied in order. Each test runs on its own private `redis-server` so `INFO commandstats`
//! counts only its own commands.
//!
//! The concurrent operations are polled together by `join_all` in one task: the first finds
//! the store idle and runs its own script, the rest queue behind it and leave as one batch
//! when its reply comes back. So the batches these tests see are deterministic.

mod common;

use std::time::Duration;

use common::{Server, redis_server_available, unique_prefix};
use futures::future::join_all;
use idem_core::audit::{AuditKind, AuditLevel, AuditQuery};
use idem_core::store::{ClaimOutcome, ClaimRequest, SettleOutcome};
use idem_core::store::{Completion, Hold};
use idem_core::{
    Fingerprint, Key, Lease, OwnerId, ReleaseKind, Scope, ScopedKey, Store, StoreError,
    StoredResponse, TakeoverPolicy,
};
use idem_redis::{RedisConfig, RedisStore};

fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("redis.batch").expect("ns").with_principal("p1"),
        Key::new(k).expect("key"),
    )
}

fn request(key: &ScopedKey, fp: u8) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_bytes(1, &[fp]),
        owner: OwnerId::random(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        takeover: TakeoverPolicy::Reexecute,
        request_id: Some("req".into()),
    }
}

async fn store(server: &Server, batching: bool) -> RedisStore {
    let config = RedisConfig::from_url(&server.url())
        .and_then(|c| c.prefix(unique_prefix()))
        .and_then(|c| c.op_timeout(Duration::from_secs(2)))
        // One script call in flight (the default, pinned here because the tests state exactly
        // how operations group: "one alone, then the rest in one batch").
        .and_then(|c| c.batches_in_flight(1))
        .map(|c| c.batching(batching))
        .expect("config");
    RedisStore::connect(config).await.expect("connect")
}

fn claimed(outcome: &Result<ClaimOutcome, StoreError>) -> Lease {
    match outcome {
        Ok(ClaimOutcome::Claimed { lease, .. }) => *lease,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// What must agree between the batched and the unbatched store: the outcome's kind and
/// everything in it that does not depend on time or on the random owner.
fn comparable(outcome: &Result<ClaimOutcome, StoreError>) -> String {
    match outcome {
        Ok(ClaimOutcome::Claimed { takeover, .. }) => format!("claimed takeover={takeover}"),
        Ok(ClaimOutcome::Busy { .. }) => "busy".into(),
        Ok(ClaimOutcome::Done { response }) => format!("done {:?}", response.body),
        Ok(ClaimOutcome::Mismatch { stored }) => format!("mismatch {stored:?}"),
        // The fence is the server's clock: each store has its own.
        Ok(ClaimOutcome::Unknown { .. }) => "unknown".into(),
        Ok(other) => format!("{other:?}"),
        Err(StoreError::Unavailable(_)) => "unavailable".into(),
        Err(e) => format!("error {e}"),
    }
}

/// Puts the records of `i`'s scenario in place on `store`: 0 absent, 1 completed (its own
/// response), 2 processing, 3 completed under another fingerprint, 4 unknown, 5 corrupt.
async fn prepare(store: &RedisStore, server: &Server, i: usize) -> Option<Lease> {
    let k = key(&format!("k{i}"));
    match i % 6 {
        1 | 3 => {
            let lease = claimed(&store.claim(&request(&k, 1)).await);
            let response = StoredResponse::new(200, format!("response {i}"));
            let ttl = Duration::from_secs(60);
            store
                .complete(&Completion::new(Hold::of(&k, &lease), &response, ttl))
                .await
                .expect("complete");
            None
        }
        2 => Some(claimed(&store.claim(&request(&k, 1)).await)),
        4 => {
            let lease = claimed(&store.claim(&request(&k, 1)).await);
            store
                .release(&Hold::of(&k, &lease), ReleaseKind::Unknown)
                .await
                .expect("release");
            None
        }
        5 => {
            let rk = store.record_key(&k);
            server.cli(&["SET", &rk, "garbage", "PX", "60000"]);
            None
        }
        _ => None,
    }
}

/// The fingerprint each scenario's claim is made with (3 asks with another one).
/// Loads the claim and batch scripts (three concurrent claims on fresh keys), so the
/// NOSCRIPT retries of a first call do not count in what a test measures next; then leaves
/// the store idle (see [`idle`]).
async fn load_claim_scripts(store: &RedisStore) {
    let warm: Vec<ClaimRequest> = (0..3)
        .map(|i| request(&key(&format!("warm{i}")), 1))
        .collect();
    for out in join_all(warm.iter().map(|r| store.claim(r))).await {
        claimed(&out);
    }
    idle().await;
}

/// Lets the task that sent the last batch run once more: it yields after each batch so that
/// the operations its callers submit next join it, and only then, finding nothing queued,
/// gives its slot back. Until it has, a new operation queues behind it instead of running
/// alone.
async fn idle() {
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

fn fp_of(i: usize) -> u8 {
    if i % 6 == 3 { 2 } else { 1 }
}

// Guards against a batch mixing up replies (each caller must get its own key's answer, in
// order) and against one failing operation (a corrupt record) failing its neighbours.
#[tokio::test]
async fn concurrent_claims_share_calls_and_each_gets_its_own_answer() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let batched = store(&server, true).await;
    let plain = store(&server, false).await;
    const N: usize = 30;
    for s in [&batched, &plain] {
        for i in 0..N {
            prepare(s, &server, i).await;
        }
    }
    let requests: Vec<ClaimRequest> = (0..N)
        .map(|i| request(&key(&format!("k{i}")), fp_of(i)))
        .collect();
    // Load the scripts first so NOSCRIPT retries do not count.
    join_all((0..3).map(|i| batched.claim(&requests[i]))).await;
    // The warm-up claimed the absent record 0 on the batched store: do the same on the
    // plain one so both start from the same state.
    claimed(&plain.claim(&request(&key("k0"), 1)).await);

    server.cli(&["CONFIG", "RESETSTAT"]);
    let together = join_all(requests.iter().map(|r| batched.claim(r))).await;
    let calls = server.calls("evalsha");
    eprintln!("{N} concurrent claims: {calls} script calls");
    assert!(calls < N as u64, "{calls} script calls for {N} claims");
    assert_eq!(calls, 2, "one alone, then the rest in one batch");

    let mut alone = Vec::new();
    for r in &requests {
        alone.push(plain.claim(r).await);
    }
    for (i, (b, p)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(comparable(b), comparable(p), "key k{i}: batched vs alone");
    }
    // And each answer is its own key's: the scenario says what it must be.
    for (i, outcome) in together.iter().enumerate() {
        let expected = match i % 6 {
            0 if i == 0 => "busy".to_owned(),
            0 => "claimed takeover=false".to_owned(),
            1 => format!(
                "done {:?}",
                StoredResponse::new(200, format!("response {i}")).body
            ),
            2 => "busy".to_owned(),
            3 => format!("mismatch {:?}", Fingerprint::of_bytes(1, &[1])),
            4 => "unknown".to_owned(),
            _ => "unavailable".to_owned(),
        };
        assert_eq!(comparable(outcome), expected, "key k{i}");
    }

    // Completions together too: the fresh claims' owners settle, a wrong owner is fenced.
    let ttl = Duration::from_secs(60);
    let response = StoredResponse::new(201, "done");
    let settles: Vec<(ScopedKey, OwnerId, u64)> = together
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Ok(ClaimOutcome::Claimed { lease, .. }) => {
                Some((key(&format!("k{i}")), lease.owner, lease.fence))
            }
            _ => None,
        })
        .flat_map(|(k, owner, fence)| [(k.clone(), OwnerId::random(), fence), (k, owner, fence)])
        .collect();
    assert!(settles.len() >= 8);
    server.cli(&["CONFIG", "RESETSTAT"]);
    let settled = join_all(settles.iter().map(|(k, owner, fence)| {
        let completion = Completion::new(Hold::new(k, *owner, *fence), &response, ttl);
        let batched = &batched;
        async move { batched.complete(&completion).await }
    }))
    .await;
    assert_eq!(server.calls("evalsha"), 2);
    for (j, result) in settled.iter().enumerate() {
        let expected = if j % 2 == 0 {
            SettleOutcome::Fenced
        } else {
            SettleOutcome::Settled
        };
        assert_eq!(result.as_ref().ok(), Some(&expected), "completion {j}");
    }
    for (k, _, _) in settles.iter().step_by(2) {
        match batched.claim(&request(k, 1)).await {
            Ok(ClaimOutcome::Done { response: r }) => assert_eq!(r, response),
            other => panic!("expected the stored response, got {other:?}"),
        }
    }
}

// Guards against a batch applying operations on one key as if they were independent (both
// claims granted) or out of order.
#[tokio::test]
async fn operations_on_one_key_inside_one_batch_are_sequential() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store(&server, true).await;
    load_claim_scripts(&store).await;

    let (blocker, k) = (key("blocker"), key("same"));
    let (first, second) = (request(&k, 1), request(&k, 1));
    server.cli(&["CONFIG", "RESETSTAT"]);
    let out = join_all([
        store.claim(&request(&blocker, 1)),
        store.claim(&first),
        store.claim(&second),
    ])
    .await;
    assert_eq!(
        server.calls("evalsha"),
        2,
        "the two claims went in one batch"
    );
    claimed(&out[0]);
    let lease = claimed(&out[1]);
    assert!(
        matches!(out[2], Ok(ClaimOutcome::Busy { .. })),
        "the second claim sees the first: {:?}",
        out[2]
    );
    assert_eq!(lease.owner, first.owner);

    // A completion and a claim of the same key in one batch: the claim replays it.
    let response = StoredResponse::new(200, "first");
    let ttl = Duration::from_secs(60);
    idle().await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    let blocker2 = key("blocker-2");
    let third = request(&k, 1);
    let completion = Completion::new(Hold::of(&k, &lease), &response, ttl);
    let (done, replies) = futures::join!(
        async {
            let b = store.claim(&request(&blocker2, 1)).await;
            claimed(&b);
        },
        async { futures::join!(store.complete(&completion), store.claim(&third)) }
    );
    let () = done;
    assert_eq!(
        server.calls("evalsha"),
        2,
        "completion and claim in one batch"
    );
    assert_eq!(replies.0.expect("complete"), SettleOutcome::Settled);
    match replies.1 {
        Ok(ClaimOutcome::Done { response: r }) => assert_eq!(r, response),
        other => panic!("expected a replay, got {other:?}"),
    }
}

// Guards the batch script's share of the hold rules: in one batch, a claim under hold marks
// an expired lease unknown and answers the record's fence, a stranger's completion is fenced,
// the holder's own completion settles the unknown record, and a claim after it replays.
#[tokio::test]
async fn hold_and_a_late_holder_inside_one_batch() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store(&server, true).await;
    load_claim_scripts(&store).await;
    let k = key("held");
    let mut first = request(&k, 1);
    first.lease = Duration::from_millis(50);
    let lease = claimed(&store.claim(&first).await);
    // Load the complete script too, on a key of its own.
    let warm = claimed(&store.claim(&request(&key("warm-done"), 1)).await);
    let ttl = Duration::from_secs(60);
    let response = StoredResponse::new(201, "late");
    store
        .complete(&Completion::new(
            Hold::of(&key("warm-done"), &warm),
            &response,
            ttl,
        ))
        .await
        .expect("complete");
    tokio::time::sleep(Duration::from_millis(80)).await;

    let mut hold = request(&k, 1);
    hold.takeover = TakeoverPolicy::Hold;
    let after = request(&k, 1);
    let blocker = request(&key("blocker"), 1);
    let by_stranger = Completion::new(
        Hold::new(&k, OwnerId::random(), lease.fence),
        &response,
        ttl,
    );
    let by_holder = Completion::new(Hold::of(&k, &lease), &response, ttl);
    server.cli(&["CONFIG", "RESETSTAT"]);
    let (blocked, (marked, stranger, holder, replay)) =
        futures::join!(store.claim(&blocker), async {
            futures::join!(
                store.claim(&hold),
                store.complete(&by_stranger),
                store.complete(&by_holder),
                store.claim(&after)
            )
        });
    claimed(&blocked);
    assert_eq!(
        server.calls("evalsha"),
        2,
        "one alone, then the rest in one batch"
    );
    match marked {
        Ok(ClaimOutcome::Unknown { fence, age }) => {
            assert_eq!(fence, lease.fence);
            assert!(age >= Duration::from_millis(50), "age {age:?}");
        }
        other => panic!("expected unknown, got {other:?}"),
    }
    assert_eq!(stranger.expect("complete"), SettleOutcome::Fenced);
    assert_eq!(holder.expect("complete"), SettleOutcome::Settled);
    match replay {
        Ok(ClaimOutcome::Done { response: r }) => assert_eq!(r, response),
        other => panic!("expected a replay, got {other:?}"),
    }
}

// Guards the batch driver's yield after each batch: the callers it answered submit their next
// operations at once, and those must leave together as the next batch. Without the yield the
// driver finds its queue empty and gives its slot back before they run; the first of them
// then runs alone and the other waits a whole call behind it (four script calls here, not
// three).
#[tokio::test]
async fn operations_submitted_by_the_callers_of_a_batch_join_the_next_batch() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store(&server, true).await;
    load_claim_scripts(&store).await;
    let then_claim = |first: &'static str, next: &'static str| {
        let store = &store;
        async move {
            claimed(&store.claim(&request(&key(first), 1)).await);
            store.claim(&request(&key(next), 1)).await
        }
    };
    let lone = request(&key("chain-alone"), 1);
    server.cli(&["CONFIG", "RESETSTAT"]);
    let (alone, a, b) = futures::join!(
        store.claim(&lone),
        then_claim("chain-a1", "chain-a2"),
        then_claim("chain-b1", "chain-b2"),
    );
    claimed(&alone);
    claimed(&a);
    claimed(&b);
    assert_eq!(
        server.calls("evalsha"),
        3,
        "one alone, the two first claims in one batch, the two next in the next batch"
    );
    assert_eq!(server.calls("get"), 5, "every claim read its record once");
}

// Guards the batch layout that sends each audit stream once: operations of two namespaces in
// one batch must each record their events in their own namespace's stream (a wrong stream
// position would put them in the other one, or fail the batch).
#[tokio::test]
async fn a_batch_records_each_event_in_its_own_namespace_stream() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let config = RedisConfig::from_url(&server.url())
        .and_then(|c| c.prefix(unique_prefix()))
        .and_then(|c| c.op_timeout(Duration::from_secs(2)))
        .and_then(|c| c.batches_in_flight(1))
        .map(|c| c.audit_level(AuditLevel::All))
        .expect("config");
    let store = RedisStore::connect(config).await.expect("connect");
    load_claim_scripts(&store).await;
    let in_ns = |ns: &str, k: &str| {
        ScopedKey::new(
            Scope::new(ns).expect("ns").with_principal("p1"),
            Key::new(k).expect("key"),
        )
    };
    let (a, b) = ("redis.batch.a", "redis.batch.b");
    let requests = [
        request(&in_ns(a, "alone"), 1),
        request(&in_ns(a, "a1"), 1),
        request(&in_ns(b, "b1"), 1),
        request(&in_ns(a, "a2"), 1),
        request(&in_ns(b, "b2"), 1),
    ];
    server.cli(&["CONFIG", "RESETSTAT"]);
    let out = join_all(requests.iter().map(|r| store.claim(r))).await;
    assert_eq!(
        server.calls("evalsha"),
        2,
        "one alone, then the rest in one batch"
    );
    let mut fences = std::collections::HashMap::new();
    for (r, o) in requests.iter().zip(&out) {
        fences.insert(r.key.key.as_str().to_owned(), claimed(o).fence);
    }
    for (ns, keys) in [(a, vec!["a1", "a2", "alone"]), (b, vec!["b1", "b2"])] {
        let events = store
            .audit(&AuditQuery {
                namespace: Some(ns.to_owned()),
                kind: Some(AuditKind::Claimed),
                ..AuditQuery::default()
            })
            .await
            .expect("audit");
        let mut seen: Vec<(String, u64)> = events
            .iter()
            .filter(|e| !e.key.starts_with("warm"))
            .map(|e| {
                assert_eq!(e.namespace, ns);
                (e.key.clone(), e.fence)
            })
            .collect();
        seen.sort();
        let expected: Vec<(String, u64)> =
            keys.iter().map(|k| ((*k).to_owned(), fences[*k])).collect();
        assert_eq!(seen, expected, "the claim events of {ns}");
    }
}

/// The round-trip rule still holds with batching on: an operation alone runs its own script.
#[tokio::test]
async fn a_lone_operation_runs_its_own_script() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store(&server, true).await;
    let ttl = Duration::from_secs(60);
    let response = StoredResponse::new(200, "ok");
    // Load the claim and complete scripts first so NOSCRIPT retries do not count.
    let warm = claimed(&store.claim(&request(&key("warm"), 1)).await);
    store
        .complete(&Completion::new(
            Hold::of(&key("warm"), &warm),
            &response,
            ttl,
        ))
        .await
        .expect("complete");
    server.cli(&["CONFIG", "RESETSTAT"]);
    let lease = claimed(&store.claim(&request(&key("lone"), 1)).await);
    assert_eq!(
        store
            .complete(&Completion::new(
                Hold::of(&key("lone"), &lease),
                &response,
                ttl
            ))
            .await
            .expect("complete"),
        SettleOutcome::Settled
    );
    assert_eq!(server.calls("evalsha"), 2);
    assert_eq!(
        (
            server.calls("get"),
            server.calls("time"),
            server.calls("set")
        ),
        (2, 2, 2)
    );
    assert_eq!(
        server.calls("script|load"),
        0,
        "the batch script was not needed"
    );
}

/// Durability mode with claims in one batch: one `WAIT` after the batch covers all its
/// writes, a short acknowledgement makes every claim in it uncertain (and each is given
/// back), and with a live replica every claim goes through.
#[tokio::test]
async fn a_short_ack_after_a_batch_makes_each_of_its_claims_uncertain() {
    if !redis_server_available() {
        return;
    }
    let master = Server::start(&[]);
    let config = RedisConfig::from_url(&master.url())
        .and_then(|c| c.prefix(unique_prefix()))
        .and_then(|c| c.op_timeout(Duration::from_secs(3)))
        // Generous for a loaded 2-core box (see the durability test in tests/store.rs).
        .and_then(|c| c.durability(1, Duration::from_millis(500)))
        // One call in flight, so the grouping below is exact (see `store`).
        .and_then(|c| c.batches_in_flight(1))
        .expect("config");
    let store = RedisStore::connect(config).await.expect("connect");
    let reqs: Vec<ClaimRequest> = (0..4)
        .map(|i| request(&key(&format!("durable-{i}")), 1))
        .collect();
    master.cli(&["CONFIG", "RESETSTAT"]);
    let outs = join_all(reqs.iter().map(|r| store.claim(r))).await;
    for out in &outs {
        assert!(
            matches!(
                out,
                Err(StoreError::Uncertain {
                    acked: 0,
                    wanted: 1
                })
            ),
            "got {out:?}"
        );
    }
    // The lone claim waited on its own, the batch of three once.
    assert_eq!(master.calls("wait"), 2, "{:?}", master.all_calls());
    for r in &reqs {
        assert_eq!(
            store.get(&r.key).await.expect("get"),
            None,
            "the uncertain claim was given back"
        );
    }

    let replica = master.start_replica().await;
    let reqs: Vec<ClaimRequest> = (0..4)
        .map(|i| request(&key(&format!("durable-{i}")), 1))
        .collect();
    for out in join_all(reqs.iter().map(|r| store.claim(r))).await {
        claimed(&out);
    }
    drop(replica);
}

// Guards against two ways a queue could strand or misapply work when callers give up: a
// queued claim whose caller is gone must not be sent (its caller was told nothing, so it must
// not hold the key), and a lone claim whose caller is gone must still let the claims queued
// behind it go (else they would wait until their timeouts for nothing).
#[tokio::test]
async fn callers_that_give_up_neither_run_late_nor_strand_the_queue() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store(&server, true).await;
    load_claim_scripts(&store).await;

    // A queued claim dropped before its batch leaves is left out.
    server.cli(&["CONFIG", "RESETSTAT"]);
    let (rb, rq) = (request(&key("lone-1"), 1), request(&key("dropped"), 1));
    let mut lone = Box::pin(store.claim(&rb));
    let mut queued = Box::pin(store.claim(&rq));
    assert!(futures::poll!(&mut lone).is_pending());
    assert!(futures::poll!(&mut queued).is_pending());
    drop(queued);
    claimed(&lone.await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.calls("evalsha"), 1, "only the lone claim was sent");
    assert_eq!(store.get(&rq.key).await.expect("get"), None);

    // A lone claim dropped in flight hands its slot on: the claims behind it are answered.
    let rl = request(&key("lone-2"), 1);
    let behind: Vec<ClaimRequest> = (0..3)
        .map(|i| request(&key(&format!("behind{i}")), 1))
        .collect();
    let mut lone = Box::pin(store.claim(&rl));
    assert!(futures::poll!(&mut lone).is_pending());
    let mut waiting = Box::pin(join_all(behind.iter().map(|r| store.claim(r))));
    assert!(futures::poll!(&mut waiting).is_pending());
    drop(lone);
    let outs = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the queued claims were stranded");
    for out in &outs {
        claimed(out);
    }
}
