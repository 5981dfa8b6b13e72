//! Fault tests, each against its own private `redis-server` on a spare loopback port: killed
//! under load, restarted empty, frozen with SIGSTOP, and a holder that loses its lease.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{Server, redis_server_available, store_at};
use idem_core::store::{ClaimOutcome, ClaimRequest, RenewOutcome, SettleOutcome};
use idem_core::store::{Completion, Hold};
use idem_core::{
    Engine, EngineError, Fingerprint, Key, OwnerId, Policy, ReleaseKind, Scope, ScopedKey,
    Settlement, Store, StoreError, StoredResponse, TakeoverPolicy,
};
use idem_testkit::CountingStore;

const OP_TIMEOUT: Duration = Duration::from_millis(250);
/// Scheduling allowance on a loaded two-core machine on top of the op timeout.
const SLACK: Duration = Duration::from_millis(400);

fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("redis.faults").expect("ns"),
        Key::new(k).expect("key"),
    )
}

fn request(key: &ScopedKey, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_bytes(1, b"f"),
        owner: OwnerId::random(),
        lease,
        ttl: Duration::from_secs(60),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

/// The server dies in the middle of a load: every request made during the outage fails
/// within the op timeout, and no handler runs without a claim the store granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_under_load_fails_fast_and_never_runs_unclaimed() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    // Counts the claims the store granted, so handler runs can be checked against them.
    let store = CountingStore::new(store_at(&server.url(), OP_TIMEOUT).await);
    let engine = Engine::new(store.clone(), Policy::default());
    let runs = Arc::new(AtomicU32::new(0));
    let down = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    // Errors seen during the outage, by all workers: the outage lasts until there are a few
    // (a request in flight at the kill may take its whole timeout on a loaded machine).
    let met = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (engine, runs, down, stop, met) = (
            engine.clone(),
            Arc::clone(&runs),
            Arc::clone(&down),
            Arc::clone(&stop),
            Arc::clone(&met),
        );
        workers.push(tokio::spawn(async move {
            let (mut ok, mut outage_errors) = (0u32, 0u32);
            for i in 0..100_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let during_outage = down.load(Ordering::SeqCst);
                let started = Instant::now();
                let k = key(&format!("load-{w}-{i}"));
                let result = engine
                    .run(&k, &Fingerprint::of_bytes(1, b"f"), |_| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Settlement::complete((), StoredResponse::new(200, "ok"))
                    })
                    .await;
                let took = started.elapsed();
                if during_outage {
                    assert!(
                        matches!(result, Err(EngineError::Store(_))),
                        "request during the outage answered {result:?}"
                    );
                    assert!(took < OP_TIMEOUT + SLACK, "error took {took:?}");
                    outage_errors += 1;
                    met.fetch_add(1, Ordering::SeqCst);
                } else if result.is_ok() {
                    ok += 1;
                }
            }
            (ok, outage_errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::spawn_blocking(move || server.kill())
        .await
        .expect("kill");
    down.store(true, Ordering::SeqCst);
    let outage = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    while met.load(Ordering::SeqCst) < 8 && outage.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut outage_errors) = (0, 0);
    for w in workers {
        let (o, e) = w.await.expect("worker");
        ok += o;
        outage_errors += e;
    }
    eprintln!("before the kill: {ok} requests served; during the outage: {outage_errors} errors");
    assert!(ok > 0, "the load ran before the kill");
    assert!(outage_errors >= 4, "every worker met the outage");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        u32::try_from(store.granted()).expect("granted claims fit u32"),
        "a handler ran without a granted claim"
    );
}

/// The server restarts empty (scripts forgotten): service resumes without any manual action,
/// through the `NOSCRIPT` fallback. Without that fallback every `EVALSHA` would fail forever.
#[tokio::test]
async fn restarted_empty_resumes_and_reloads_scripts() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), OP_TIMEOUT).await;
    let before = key("before-restart");
    assert!(matches!(
        store
            .claim(&request(&before, Duration::from_secs(30)))
            .await,
        Ok(ClaimOutcome::Claimed { .. })
    ));
    let server = tokio::task::spawn_blocking(move || server.restart_empty())
        .await
        .expect("restart");
    assert_eq!(
        server.calls("script|load"),
        0,
        "the new server has never seen a script"
    );

    let after = key("after-restart");
    let give_up = Instant::now() + Duration::from_secs(10);
    let mut failures = 0;
    loop {
        let started = Instant::now();
        match store.claim(&request(&after, Duration::from_secs(30))).await {
            Ok(outcome) => {
                assert!(
                    matches!(outcome, ClaimOutcome::Claimed { .. }),
                    "got {outcome:?}"
                );
                break;
            }
            Err(e) => {
                assert!(
                    started.elapsed() < OP_TIMEOUT + SLACK,
                    "an attempt took {:?}",
                    started.elapsed()
                );
                failures += 1;
                eprintln!("attempt failed while reconnecting: {e}");
                assert!(
                    Instant::now() < give_up,
                    "service did not resume after the restart"
                );
                // Reconnection happens in the background; give it a moment between attempts.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!("resumed after {failures} failed attempts");
    assert!(
        server.calls("script|load") >= 1,
        "NOSCRIPT made the client load the script"
    );
    assert_eq!(
        store.get(&before).await.expect("get"),
        None,
        "the server restarted empty"
    );
}

/// A frozen server (SIGSTOP) makes requests time out within the op timeout; they never hang.
/// The outer 5 s bound only exists to turn a hang into a failure: see
/// `unbounded_call_hangs_on_frozen_server` for what happens without the op timeout.
#[tokio::test]
async fn frozen_server_times_out_within_the_op_timeout() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), OP_TIMEOUT).await;
    let engine = Engine::new(store.clone(), Policy::default());
    assert!(matches!(
        store
            .claim(&request(&key("warm"), Duration::from_secs(30)))
            .await,
        Ok(ClaimOutcome::Claimed { .. })
    ));
    server.freeze();
    let runs = AtomicU32::new(0);
    for i in 0..3 {
        let started = Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            store.claim(&request(
                &key(&format!("frozen-{i}")),
                Duration::from_secs(30),
            )),
        )
        .await
        .expect("the claim hung past 5 s");
        assert!(
            matches!(result, Err(StoreError::Timeout(t)) if t == OP_TIMEOUT),
            "got {result:?}"
        );
        assert!(
            started.elapsed() < OP_TIMEOUT + SLACK,
            "took {:?}",
            started.elapsed()
        );

        let (k, fp) = (
            key(&format!("frozen-engine-{i}")),
            Fingerprint::of_bytes(1, b"f"),
        );
        let run = engine.run(&k, &fp, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Settlement::complete((), StoredResponse::new(200, "ok"))
        });
        let result = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("the engine hung past 5 s");
        assert!(
            matches!(result, Err(EngineError::Store(StoreError::Timeout(_)))),
            "got {result:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no handler runs while the store is frozen"
    );
    server.resume();
    let give_up = Instant::now() + Duration::from_secs(10);
    while store
        .claim(&request(&key("thawed"), Duration::from_secs(30)))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < give_up,
            "service did not resume after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// The unguarded variant of the test above: a redis-rs call with no response timeout and no
// op timeout against a frozen server. It would wait forever; the 1 s outer bound elapsing is
// the proof, so the SIGSTOP test bites on a store without its op timeout.
#[tokio::test]
async fn unbounded_call_hangs_on_frozen_server() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let client = redis::Client::open(server.url()).expect("client");
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut conn = redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect");
    let _: () = redis::cmd("SET")
        .arg("x")
        .arg("1")
        .query_async(&mut conn)
        .await
        .expect("set");
    server.freeze();
    let hung = tokio::time::timeout(
        Duration::from_secs(1),
        redis::cmd("GET")
            .arg("x")
            .query_async::<Option<String>>(&mut conn),
    )
    .await;
    assert!(
        hung.is_err(),
        "an unbounded call returned from a frozen server: {hung:?}"
    );
    // Dropping `server` thaws and kills it.
}

/// A holder paused past its lease loses the key to a new claimer; its late completion,
/// renewal and release are all refused as fenced, and the new holder's result is the one
/// replayed.
///
/// Shown to bite by deleting the owner/fence check (`holds`) from `lua/complete.lua`: the
/// stale holder's completion is then accepted and its response replayed, failing the asserts.
#[tokio::test]
async fn paused_holder_loses_to_a_new_claimer() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), OP_TIMEOUT).await;
    let k = key("lease-lost");
    let lease = Duration::from_millis(300);
    let ClaimOutcome::Claimed { lease: stale, .. } =
        store.claim(&request(&k, lease)).await.expect("claim")
    else {
        panic!("first claim must succeed")
    };
    // The holder stalls (GC pause, slow downstream) past its lease.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let ClaimOutcome::Claimed {
        lease: fresh,
        takeover,
    } = store
        .claim(&request(&k, Duration::from_secs(30)))
        .await
        .expect("claim")
    else {
        panic!("the expired lease must be taken over")
    };
    assert!(takeover);
    assert!(fresh.fence > stale.fence);
    let ttl = Duration::from_secs(30);
    let late = StoredResponse::new(200, "stale");
    assert_eq!(
        store
            .complete(&Completion::new(Hold::of(&k, &stale), &late, ttl))
            .await
            .expect("complete"),
        SettleOutcome::Fenced
    );
    assert_eq!(
        store
            .renew(&Hold::of(&k, &stale), lease)
            .await
            .expect("renew"),
        RenewOutcome::Lost
    );
    assert_eq!(
        store
            .release(&Hold::of(&k, &stale), ReleaseKind::Retryable)
            .await
            .expect("release"),
        SettleOutcome::Fenced
    );
    let winner = StoredResponse::new(200, "fresh");
    assert_eq!(
        store
            .complete(&Completion::new(Hold::of(&k, &fresh), &winner, ttl))
            .await
            .expect("complete"),
        SettleOutcome::Settled
    );
    match store.claim(&request(&k, lease)).await.expect("replay") {
        ClaimOutcome::Done { response } => assert_eq!(response, winner),
        other => panic!("expected the new holder's response, got {other:?}"),
    }
}

/// The same restart with claims coalesced into batches: the batch script is forgotten too,
/// and `NOSCRIPT` → `SCRIPT LOAD` → retry brings it back. Without that fallback every batch
/// would fail for as long as the server runs (shown by removing the retry from
/// `NamedScript::run_command`: this test then never resumes).
#[tokio::test]
async fn restarted_empty_reloads_the_batch_script() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), OP_TIMEOUT).await;
    let claims = |round: u32| -> Vec<ClaimRequest> {
        (0..5)
            .map(|i| request(&key(&format!("batch-{round}-{i}")), Duration::from_secs(30)))
            .collect()
    };
    let before = claims(0);
    for out in futures::future::join_all(before.iter().map(|r| store.claim(r))).await {
        assert!(
            matches!(out, Ok(ClaimOutcome::Claimed { .. })),
            "got {out:?}"
        );
    }
    let server = tokio::task::spawn_blocking(move || server.restart_empty())
        .await
        .expect("restart");

    let give_up = Instant::now() + Duration::from_secs(10);
    let mut round = 1;
    loop {
        let started = Instant::now();
        let reqs = claims(round);
        round += 1;
        // The first claim runs alone, the other four queue behind it as one batch.
        let outs = futures::future::join_all(reqs.iter().map(|r| store.claim(r))).await;
        assert!(
            started.elapsed() < OP_TIMEOUT + SLACK,
            "a round took {:?}",
            started.elapsed()
        );
        if outs.iter().all(Result::is_ok) {
            for out in outs {
                assert!(
                    matches!(out, Ok(ClaimOutcome::Claimed { .. })),
                    "got {out:?}"
                );
            }
            break;
        }
        eprintln!(
            "round failed while reconnecting: {:?}",
            outs.iter().find(|o| o.is_err())
        );
        assert!(
            Instant::now() < give_up,
            "batches did not resume after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once for the claim script, once for the batch script.
    assert!(
        server.calls("script|load") >= 2,
        "NOSCRIPT made the client load both scripts: {:?}",
        server.all_calls()
    );
}

/// A frozen server with claims queued behind one in flight: every one of them fails with a
/// timeout within the op timeout; none waits for the batch ahead of it to come back.
#[tokio::test]
async fn frozen_server_fails_every_queued_operation_in_time() {
    if !redis_server_available() {
        return;
    }
    let server = Server::start(&[]);
    let store = store_at(&server.url(), OP_TIMEOUT).await;
    let warm: Vec<ClaimRequest> = (0..3)
        .map(|i| request(&key(&format!("warm-{i}")), Duration::from_secs(30)))
        .collect();
    for out in futures::future::join_all(warm.iter().map(|r| store.claim(r))).await {
        assert!(
            matches!(out, Ok(ClaimOutcome::Claimed { .. })),
            "got {out:?}"
        );
    }
    server.freeze();
    for round in 0..3 {
        let reqs: Vec<ClaimRequest> = (0..8)
            .map(|i| {
                request(
                    &key(&format!("frozen-{round}-{i}")),
                    Duration::from_secs(30),
                )
            })
            .collect();
        let started = Instant::now();
        let outs = tokio::time::timeout(
            Duration::from_secs(5),
            futures::future::join_all(reqs.iter().map(|r| store.claim(r))),
        )
        .await
        .expect("queued claims hung past 5 s");
        assert!(
            started.elapsed() < OP_TIMEOUT + SLACK,
            "round {round} took {:?}",
            started.elapsed()
        );
        for out in outs {
            assert!(
                matches!(out, Err(StoreError::Timeout(t)) if t == OP_TIMEOUT),
                "got {out:?}"
            );
        }
    }
    server.resume();
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let reqs: Vec<ClaimRequest> = (0..4)
            .map(|i| {
                request(
                    &key(&format!("thawed-{i}-{:?}", Instant::now())),
                    Duration::from_secs(30),
                )
            })
            .collect();
        let outs = futures::future::join_all(reqs.iter().map(|r| store.claim(r))).await;
        if outs
            .iter()
            .all(|o| matches!(o, Ok(ClaimOutcome::Claimed { .. })))
        {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "service did not resume after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
