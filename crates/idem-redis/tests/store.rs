//! Redis-specific behaviour on the shared local Redis (fences, tombstones, stored form), and
//! round trips counted on a private server.

mod common;

use std::time::Duration;

use common::{LOCAL_URL, Server, local_redis_up, redis_server_available, store_at};
use idem_core::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome, SettleOutcome,
};
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
        .renew(&k, lease.owner, lease.fence, Duration::from_secs(20))
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
            .complete(&k, OwnerId::random(), lease.fence, &response, ttl)
            .await
            .expect("complete"),
        SettleOutcome::Fenced
    );
    assert_eq!(
        store
            .complete(&k, lease.owner, lease.fence, &response, ttl)
            .await
            .expect("complete"),
        SettleOutcome::Settled
    );
    assert_eq!(
        store
            .complete(&k, lease.owner, lease.fence, &response, ttl)
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
                    .release(&k, lease.owner, lease.fence, ReleaseKind::Retryable)
                    .await
                    .expect("release"),
                SettleOutcome::Settled
            ),
            1 => assert!(store.delete(&k).await.expect("delete")),
            _ => {
                store
                    .release(&k, lease.owner, lease.fence, ReleaseKind::Unknown)
                    .await
                    .expect("release unknown");
                assert_eq!(
                    store
                        .resolve(&k, &Resolution::Release)
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
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        store
            .claim(&request(&k, 1, 50, TakeoverPolicy::Hold))
            .await
            .expect("claim"),
        ClaimOutcome::Unknown
    );
    assert_eq!(
        store.get(&k).await.expect("get").map(|r| r.state.kind()),
        Some(StateKind::Unknown)
    );
    assert_eq!(
        store
            .complete(
                &k,
                lease.owner,
                lease.fence,
                &StoredResponse::new(200, "late"),
                Duration::from_secs(5)
            )
            .await
            .expect("complete"),
        SettleOutcome::Fenced
    );
    let resolution = Resolution::Complete {
        response: StoredResponse::new(200, "fixed"),
        ttl: Duration::from_secs(5),
    };
    assert_eq!(
        store.resolve(&k, &resolution).await.expect("resolve"),
        ResolveOutcome::Resolved
    );
    assert!(matches!(
        store.claim(&request(&k, 1, 50, TakeoverPolicy::Hold)).await,
        Ok(ClaimOutcome::Done { .. })
    ));
    assert_eq!(
        store.resolve(&k, &resolution).await.expect("resolve"),
        ResolveOutcome::NotResolvable {
            state: StateKind::Completed
        }
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
    let plain = Engine::new(store, Policy::default());
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
        .complete(
            &k,
            lease.owner,
            lease.fence,
            &StoredResponse::new(200, "ok"),
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(done.expect("complete"), SettleOutcome::Settled);
    drop(replica);
}
