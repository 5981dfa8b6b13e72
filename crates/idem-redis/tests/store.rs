//! Redis-specific behaviour on the shared local Redis (fences, tombstones, stored form), and
//! round trips counted on a private server.

mod common;

use std::time::Duration;

use common::{LOCAL_URL, Server, local_redis_up, redis_server_available, store_at};
use idem_core::audit::{AuditKind, AuditLevel, AuditQuery};
use idem_core::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome, SettleOutcome,
};
use idem_core::store::{Completion, Hold};
use idem_core::{
    Answer, CachedStore, Engine, Fingerprint, Key, OwnerId, Policy, RecordState, ReleaseKind,
    Scope, ScopedKey, Settlement, StateKind, Store, StoreError, StoredResponse, TakeoverPolicy,
};
use idem_redis::{RedisConfig, RedisStore};

fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("redis.tests").expect("ns").with_principal("p1"),
        Key::new(k).expect("key"),
    )
}

fn request(key: &ScopedKey, fp: u8, lease_ms: u64, takeover: TakeoverPolicy) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_bytes(1, &[fp]),
        owner: OwnerId::random(),
        lease: Duration::from_millis(lease_ms),
        ttl: Duration::from_secs(60),
        takeover,
        request_id: Some("req-1".into()),
    }
}

fn claimed(outcome: ClaimOutcome) -> idem_core::Lease {
    match outcome {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn lifecycle_on_one_record() {
    if !local_redis_up() {
        return;
    }
    let store = store_at(LOCAL_URL, Duration::from_millis(500)).await;
    let k = key("life");
    let req = request(&k, 1, 10_000, TakeoverPolicy::Reexecute);
    let lease = claimed(store.claim(&req).await.expect("claim"));
    assert!(matches!(
        store
            .claim(&request(&k, 1, 10_000, TakeoverPolicy::Reexecute))
            .await,
        Ok(ClaimOutcome::Busy { .. })
    ));
    assert!(matches!(
        store
            .claim(&request(&k, 2, 10_000, TakeoverPolicy::Reexecute))
            .await,
        Ok(ClaimOutcome::Mismatch { .. })
    ));
    let renewed = store
        .renew(&Hold::of(&k, &lease), Duration::from_secs(20))
        .await
        .expect("renew");
    assert!(matches!(renewed, RenewOutcome::Renewed { deadline } if deadline > lease.deadline));
    let record = store.get(&k).await.expect("get").expect("live");
    assert_eq!(record.key, k);
    assert_eq!(record.request_id.as_deref(), Some("req-1"));
    assert_eq!(record.state.kind(), StateKind::Processing);
    let response = StoredResponse::new(201, vec![0u8, 159, 146, 150, 10])
        .with_header("content-type", "application/octet-stream");
    let ttl = Duration::from_secs(30);
    assert_eq!(
        store
            .complete(&Completion::new(
                Hold::new(&k, OwnerId::random(), lease.fence),
                &response,
                ttl
            ))
            .await
            .expect("complete"),
        SettleOutcome::Fenced
    );
    assert_eq!(
        store
            .complete(&Completion::new(Hold::of(&k, &lease), &response, ttl))
            .await
            .expect("complete"),
        SettleOutcome::Settled
    );
    assert_eq!(
        store
            .complete(&Completion::new(Hold::of(&k, &lease), &response, ttl))
            .await
            .expect("complete"),
        SettleOutcome::Fenced
    );
    match store.claim(&req).await.expect("replay") {
        ClaimOutcome::Done { response: replayed } => assert_eq!(replayed, response),
        other => panic!("expected a replay, got {other:?}"),
    }
    let record = store.get(&k).await.expect("get").expect("live");
    assert!(
        matches!(record.state, RecordState::Completed { response: ref r, .. } if *r == response)
    );
    let listed = store
        .list(&ListFilter {
            namespace: Some("redis.tests".into()),
            state: Some(StateKind::Completed),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert!(store.delete(&k).await.expect("delete"));
    assert!(!store.delete(&k).await.expect("delete twice"));
    assert_eq!(store.get(&k).await.expect("get"), None);
}

// Guards against a fence repeating when a record is released or deleted and claimed again at
// once: the tombstone keeps the fence, and the next one is above it.
#[tokio::test]
async fn fences_climb_through_release_delete_and_resolve() {
    if !local_redis_up() {
        return;
    }
    let store = store_at(LOCAL_URL, Duration::from_millis(500)).await;
    let k = key("fences");
    let mut last = 0;
    for round in 0..30 {
        let lease = claimed(
            store
                .claim(&request(&k, 1, 10_000, TakeoverPolicy::Reexecute))
                .await
                .expect("claim"),
        );
        assert!(
            lease.fence > last,
            "round {round}: fence {} after {last}",
            lease.fence
        );
        last = lease.fence;
        match round % 3 {
            0 => assert_eq!(
                store
                    .release(&Hold::of(&k, &lease), ReleaseKind::Retryable)
                    .await
                    .expect("release"),
                SettleOutcome::Settled
            ),
            1 => assert!(store.delete(&k).await.expect("delete")),
            _ => {
                store
                    .release(&Hold::of(&k, &lease), ReleaseKind::Unknown)
                    .await
                    .expect("release unknown");
                assert_eq!(
                    store
                        .resolve(&k, &Resolution::Release, None)
                        .await
                        .expect("resolve"),
                    ResolveOutcome::Resolved
                );
            }
        }
        assert_eq!(
            store.get(&k).await.expect("get"),
            None,
            "tombstones read as absent"
        );
    }
    assert!(
        store
            .list(&ListFilter {
                namespace: Some("redis.tests".into()),
                ..Default::default()
            })
            .await
            .expect("list")
            .is_empty()
    );
}

/// Under `hold`, an expired lease becomes unknown naming its holder, with the record's fence
/// and the attempt's age in every claim's answer; the holder (alone) may still complete it,
/// and a resolve naming another fence changes nothing.
#[tokio::test]
async fn hold_policy_turns_an_expired_lease_unknown() {
    if !local_redis_up() {
        return;
    }
    let store = store_at(LOCAL_URL, Duration::from_millis(500)).await;
    let k = key("hold");
    let lease = claimed(
        store
            .claim(&request(&k, 1, 50, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
    );
    let claimed_at = store.get(&k).await.expect("get").expect("live").created_at;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let age = match store
        .claim(&request(&k, 1, 50, TakeoverPolicy::Hold))
        .await
        .expect("claim")
    {
        ClaimOutcome::Unknown { fence, age } => {
            assert_eq!(fence, lease.fence, "the record's fence");
            assert!(age >= Duration::from_millis(50), "age {age:?}");
            age
        }
        other => panic!("expected unknown, got {other:?}"),
    };
    let record = store.get(&k).await.expect("get").expect("live");
    let RecordState::Unknown { owner, .. } = record.state else {
        panic!("expected an unknown record, got {record:?}");
    };
    assert_eq!(
        owner,
        Some(lease.owner),
        "the unknown record names its holder"
    );
    assert_eq!(record.created_at, claimed_at, "marking keeps created_at");
    // Every later claim answers the same, under either policy, with a growing age.
    for takeover in [TakeoverPolicy::Reexecute, TakeoverPolicy::Hold] {
        match store
            .claim(&request(&k, 1, 50, takeover))
            .await
            .expect("claim")
        {
            ClaimOutcome::Unknown { fence, age: later } => {
                assert_eq!(fence, lease.fence);
                assert!(later >= age, "{later:?} after {age:?}");
            }
            other => panic!("{takeover:?}: expected unknown, got {other:?}"),
        }
    }
    assert_eq!(
        store
            .renew(&Hold::of(&k, &lease), Duration::from_secs(5))
            .await
            .expect("renew"),
        RenewOutcome::Lost,
        "an unknown record is not renewed"
    );
    let late = StoredResponse::new(200, "late");
    for (owner, fence) in [
        (OwnerId::random(), lease.fence),
        (lease.owner, lease.fence + 1),
        (OwnerId(0), lease.fence),
    ] {
        assert_eq!(
            store
                .complete(&Completion::new(
                    Hold::new(&k, owner, fence),
                    &late,
                    Duration::from_secs(5)
                ))
                .await
                .expect("complete"),
            SettleOutcome::Fenced,
            "{owner:?} at {fence}"
        );
    }
    let resolution = Resolution::Complete {
        response: StoredResponse::new(200, "fixed"),
        ttl: Duration::from_secs(5),
    };
    assert_eq!(
        store
            .resolve(&k, &resolution, Some(lease.fence - 1))
            .await
            .expect("resolve"),
        ResolveOutcome::Fenced { fence: lease.fence }
    );
    assert_eq!(store.get(&k).await.expect("get"), Some(record.clone()));
    assert_eq!(
        store
            .release(&Hold::of(&k, &lease), ReleaseKind::Unknown)
            .await
            .expect("release"),
        SettleOutcome::Settled,
        "its holder may release it as unknown: it stays as it is"
    );
    assert_eq!(store.get(&k).await.expect("get"), Some(record));
    assert_eq!(
        store
            .complete(&Completion::new(
                Hold::of(&k, &lease),
                &late,
                Duration::from_secs(5)
            ))
            .await
            .expect("complete"),
        SettleOutcome::Settled,
        "the holder completes its own attempt"
    );
    assert_eq!(
        store
            .claim(&request(&k, 1, 50, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
        ClaimOutcome::Done { response: late }
    );
    assert_eq!(
        store
            .resolve(&k, &resolution, Some(lease.fence))
            .await
            .expect("resolve"),
        ResolveOutcome::NotResolvable {
            state: StateKind::Completed
        }
    );
}

/// A release as unknown writes an all-zero owner (nobody may settle it but a resolve) and
/// keeps the fence and the header's width; a takeover dates its own attempt.
#[tokio::test]
async fn release_as_unknown_names_nobody_and_takeover_restarts_created() {
    if !local_redis_up() {
        return;
    }
    let store = store_at(LOCAL_URL, Duration::from_millis(500)).await;
    let k = key("given-up");
    let lease = claimed(
        store
            .claim(&request(&k, 1, 10_000, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
    );
    assert_eq!(
        store
            .release(&Hold::of(&k, &lease), ReleaseKind::Unknown)
            .await
            .expect("release"),
        SettleOutcome::Settled
    );
    let raw: Vec<u8> = redis::from_redis_value(
        store
            .connection()
            .query(redis::cmd("GET").arg(store.record_key(&k)))
            .await
            .expect("get"),
    )
    .expect("bytes");
    assert_eq!(&raw[..4], b"1 u ");
    assert_eq!(&raw[4..36], [b'0'; 32].as_slice(), "the owner is nobody");
    assert_eq!(raw[36], b' ');
    assert_eq!(&raw[37..57], format!("{:020}", lease.fence).as_bytes());
    assert_eq!(raw[193], b'\n', "the header keeps its width");
    let record = store.get(&k).await.expect("get").expect("live");
    assert!(
        matches!(record.state, RecordState::Unknown { owner: None, .. }),
        "{record:?}"
    );
    for kind in [ReleaseKind::Unknown, ReleaseKind::Retryable] {
        assert_eq!(
            store
                .release(&Hold::of(&k, &lease), kind)
                .await
                .expect("release"),
            SettleOutcome::Fenced,
            "{kind:?}: its former holder no longer holds it"
        );
    }
    assert_eq!(
        store
            .complete(&Completion::new(
                Hold::new(&k, OwnerId(0), lease.fence),
                &StoredResponse::new(200, "x"),
                Duration::from_secs(5)
            ))
            .await
            .expect("complete"),
        SettleOutcome::Fenced,
        "the all-zero owner is nobody, not a holder"
    );
    assert_eq!(store.get(&k).await.expect("get"), Some(record));
    assert_eq!(
        store
            .resolve(&k, &Resolution::Release, Some(lease.fence))
            .await
            .expect("resolve"),
        ResolveOutcome::Resolved
    );

    // A takeover under reexecute: created_at is the takeover's time.
    let first = claimed(
        store
            .claim(&request(&k, 1, 50, TakeoverPolicy::Reexecute))
            .await
            .expect("claim"),
    );
    let before = store.get(&k).await.expect("get").expect("live");
    tokio::time::sleep(Duration::from_millis(80)).await;
    let second = store
        .claim(&request(&k, 1, 10_000, TakeoverPolicy::Reexecute))
        .await
        .expect("claim");
    assert!(
        matches!(second, ClaimOutcome::Claimed { takeover: true, lease } if lease.fence > first.fence),
        "{second:?}"
    );
    let after = store.get(&k).await.expect("get").expect("live");
    assert!(
        after.created_at.0 >= before.created_at.0 + 50,
        "takeover dates its attempt: {:?} after {:?}",
        after.created_at,
        before.created_at
    );
}

#[tokio::test]
async fn corrupt_records_are_errors_not_answers() {
    if !local_redis_up() {
        return;
    }
    let store = store_at(LOCAL_URL, Duration::from_millis(500)).await;
    let k = key("corrupt");
    let rk = store.record_key(&k);
    store
        .connection()
        .query(
            redis::cmd("SET")
                .arg(&rk)
                .arg("garbage")
                .arg("PX")
                .arg(10_000),
        )
        .await
        .expect("set");
    assert!(matches!(
        store
            .claim(&request(&k, 1, 1000, TakeoverPolicy::Reexecute))
            .await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(store.get(&k).await, Err(StoreError::Codec(_))));
}

/// Round trips counted by the server: a first request through the engine runs two scripts,
/// a replay one, a replay through the local cache none.
#[tokio::test]
async fn round_trips_per_request() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), Duration::from_millis(500)).await;
    let direct = Engine::new(
        CachedStore::new(store.clone(), 1000, Duration::from_secs(60)),
        Policy::default(),
    );
    let plain = Engine::new(store.clone(), Policy::default());
    // Load the scripts first so NOSCRIPT retries do not count.
    run(direct.clone(), key("warm-up")).await;

    let count = |server: &Server| -> (u64, Vec<(String, u64)>) {
        let all = server.all_calls();
        let total = all
            .iter()
            .filter(|(n, _)| !n.starts_with("config") && n != "info")
            .map(|(_, c)| *c)
            .sum();
        (total, all)
    };
    server.cli(&["CONFIG", "RESETSTAT"]);
    let first = run(plain.clone(), key("rt-1")).await;
    assert!(matches!(first, Answer::Executed { .. }));
    let (_, calls) = count(&server);
    eprintln!("first request: {calls:?}");
    assert_eq!(server.calls("evalsha"), 2, "claim and complete");
    // Inside the scripts: GET, TIME, SET for the claim; GET, TIME, SET for the completion.
    assert_eq!(
        (
            server.calls("get"),
            server.calls("time"),
            server.calls("set")
        ),
        (2, 2, 2)
    );
    // The default audit level leaves a fresh claim and its completion to the record.
    assert_eq!(server.calls("xadd"), 0, "audit writes on a first request");

    server.cli(&["CONFIG", "RESETSTAT"]);
    assert!(matches!(
        run(plain.clone(), key("rt-1")).await,
        Answer::Replayed(_)
    ));
    let (_, calls) = count(&server);
    eprintln!("replay: {calls:?}");
    assert_eq!(server.calls("evalsha"), 1);
    assert_eq!(
        (
            server.calls("get"),
            server.calls("time"),
            server.calls("set")
        ),
        (1, 0, 0)
    );

    // A claim that finds an unknown record reads the clock for the attempt's age, and writes
    // nothing.
    let k = key("rt-unknown");
    let lease = claimed(
        store
            .claim(&request(&k, 1, 10_000, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
    );
    store
        .release(&Hold::of(&k, &lease), ReleaseKind::Unknown)
        .await
        .expect("release");
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert!(matches!(
        store
            .claim(&request(&k, 1, 10_000, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
        ClaimOutcome::Unknown { fence, .. } if fence == lease.fence
    ));
    assert_eq!(server.calls("evalsha"), 1);
    assert_eq!(
        (
            server.calls("get"),
            server.calls("time"),
            server.calls("set")
        ),
        (1, 1, 0)
    );

    // Through the cache: the first run fills it on completion, the replay costs nothing.
    run(direct.clone(), key("rt-2")).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert!(matches!(
        run(direct.clone(), key("rt-2")).await,
        Answer::Replayed(_)
    ));
    let (total, calls) = count(&server);
    eprintln!("cached replay: {calls:?}");
    assert_eq!(total, 0);
}

/// The audit level decides what a first request writes besides its record: at the default
/// nothing (no `XADD`, alone or batched, and an empty trail), at `all` one event for the
/// claim and one for the completion, as each script call's `XADD`.
#[tokio::test]
async fn the_audit_level_decides_what_a_first_request_writes() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    for level in AuditLevel::ALL {
        let config = RedisConfig::from_url(&server.url())
            .and_then(|c| c.prefix(common::unique_prefix()))
            .and_then(|c| c.op_timeout(Duration::from_secs(2)))
            .expect("config")
            .audit_level(level);
        let store = RedisStore::connect(config).await.expect("connect");
        let engine = Engine::new(store.clone(), Policy::default());
        // Load the scripts first so NOSCRIPT retries do not count.
        run(engine.clone(), key("warm-up")).await;
        let batch: Vec<ScopedKey> = (0..10).map(|i| key(&format!("batch-{i}"))).collect();
        futures::future::join_all(batch.iter().take(3).map(|k| run(engine.clone(), k.clone())))
            .await;

        server.cli(&["CONFIG", "RESETSTAT"]);
        assert!(matches!(
            run(engine.clone(), key("lone")).await,
            Answer::Executed { .. }
        ));
        assert_eq!(server.calls("evalsha"), 2, "{level}: claim and complete");
        let alone = server.calls("xadd");

        server.cli(&["CONFIG", "RESETSTAT"]);
        let fresh: Vec<ScopedKey> = (0..10).map(|i| key(&format!("fresh-{i}"))).collect();
        let answers =
            futures::future::join_all(fresh.iter().map(|k| run(engine.clone(), k.clone()))).await;
        assert!(answers.iter().all(|a| matches!(a, Answer::Executed { .. })));
        let batched = (server.calls("evalsha"), server.calls("xadd"));

        let trail = store
            .audit(&AuditQuery::for_key(&key("lone")))
            .await
            .expect("audit");
        let kinds: Vec<AuditKind> = trail.iter().map(|e| e.kind).collect();
        match level {
            AuditLevel::Operator => {
                assert_eq!(alone, 0, "audit writes on a first request");
                assert_eq!(batched.1, 0, "audit writes on batched first requests");
                assert_eq!(kinds, [], "{trail:#?}");
            }
            _ => {
                assert_eq!(alone, 2, "one event for the claim, one for the completion");
                assert_eq!(batched.1, 20);
                assert_eq!(kinds, [AuditKind::Completed, AuditKind::Claimed]);
            }
        }
        assert!(
            batched.0 < 20,
            "{level}: {} script calls for 20 operations",
            batched.0
        );
    }
}

async fn run<S: Store>(engine: Engine<S>, k: ScopedKey) -> Answer<()> {
    let fp = Fingerprint::of_bytes(1, b"body");
    engine
        .run(&k, &fp, |_| async {
            Settlement::complete((), StoredResponse::new(200, "ok"))
        })
        .await
        .expect("run")
}

/// Durability mode: with no replica to acknowledge, a claim is uncertain, nothing runs, and
/// the claim is given back; with one replica it goes through.
#[tokio::test]
async fn durability_wait_refuses_unreplicated_claims() {
    if !redis_server_available() {
        return;
    }
    let master = Server::start(&[]);
    let config = |url: &str| {
        RedisConfig::from_url(url)
            .and_then(|c| c.prefix(common::unique_prefix()))
            // Generous: on a loaded 2-core box a live replica can take well over 100 ms to
            // acknowledge (this test flaked at 100 ms).
            .and_then(|c| c.durability(1, Duration::from_secs(1)))
            .expect("config")
    };
    let store = RedisStore::connect(config(&master.url()))
        .await
        .expect("connect");
    // The engine's store timeout must outlast the replica wait, or it reports a timeout.
    let policy = Policy::builder()
        .store_timeout(Duration::from_secs(3))
        .build()
        .expect("policy");
    let engine = Engine::new(store.clone(), policy);
    let ran = std::sync::atomic::AtomicU32::new(0);
    let k = key("durable");
    let result = engine
        .run(&k, &Fingerprint::of_bytes(1, b"x"), |_| async {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Settlement::complete((), StoredResponse::new(200, "ok"))
        })
        .await;
    assert!(
        matches!(
            result,
            Err(idem_core::EngineError::Store(StoreError::Uncertain {
                acked: 0,
                wanted: 1
            }))
        ),
        "got {result:?}"
    );
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the handler must not run on an uncertain claim"
    );
    assert_eq!(
        store.get(&k).await.expect("get"),
        None,
        "the uncertain claim was given back"
    );

    let replica = master.start_replica().await;
    let lease = claimed(
        store
            .claim(&request(&k, 1, 5_000, TakeoverPolicy::Reexecute))
            .await
            .expect("claim with a replica"),
    );
    let done = store
        .complete(&Completion::new(
            Hold::of(&k, &lease),
            &StoredResponse::new(200, "ok"),
            Duration::from_secs(5),
        ))
        .await;
    assert_eq!(done.expect("complete"), SettleOutcome::Settled);
    drop(replica);
}
