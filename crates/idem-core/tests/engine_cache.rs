//! The engine over the local cache tier: replays that make no store call, processing records
//! never cached, and a replay from the store that fills the cache.
//!
//! Shown to bite: a cache that does not answer mismatches fails cached_replays… and
//! a_replay_from_the_store….

mod common;

use common::*;
use idem_core::store::{Completion, Hold};
use idem_core::{
    Answer, CachedStore, ClaimOutcome, Engine, Policy, Settled, Store, StoreOp, StoredResponse,
    TakeoverPolicy,
};

fn cached_rig() -> (Rig, Engine<CachedStore<Tested>>) {
    let rig = Rig::new();
    let cached = CachedStore::with_clock(rig.store.clone(), 100, secs(600), rig.clock.clone());
    let engine = Engine::new(cached, Policy::default());
    (rig, engine)
}

#[tokio::test(start_paused = true)]
async fn cached_replays_make_no_store_calls() {
    // Guards: a cache that still asks the store on a hit (a replay costing a round trip).
    let (rig, engine) = cached_rig();
    let k = key("cached");
    let first = engine
        .run(&k, &fp(b"x"), |_| async { ok("kept") })
        .await
        .expect("run");
    assert!(matches!(
        first,
        Answer::Executed {
            settled: Settled::Stored,
            ..
        }
    ));
    let before = rig.store.calls();
    assert_eq!((before[StoreOp::Claim], before[StoreOp::Complete]), (1, 1));
    for _ in 0..3 {
        let replay = engine
            .run(&k, &fp(b"x"), |_| async { ok("must not run") })
            .await
            .expect("run");
        assert!(
            matches!(&replay, Answer::Replayed(r) if r.body == "kept"),
            "{replay:?}"
        );
    }
    let mismatch = engine
        .run(&k, &fp(b"different"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(mismatch, Answer::Mismatch),
        "mismatch detected from the cache: {mismatch:?}"
    );
    assert_eq!(rig.store.calls(), before, "no call reached the inner store");
}

#[tokio::test(start_paused = true)]
async fn processing_records_are_never_cached() {
    // Guards: caching a claim or busy answer, which would let the cache decide who holds a key.
    let (rig, engine) = cached_rig();
    let k = key("in-flight");
    let holder = claim_request(&k, b"x", secs(45), TakeoverPolicy::Reexecute);
    let first = engine.store().claim(&holder).await.expect("claim");
    let ClaimOutcome::Claimed { lease, .. } = first else {
        panic!("{first:?}")
    };
    for n in 1..=2 {
        let dup = engine
            .run(&k, &fp(b"x"), |_| async { ok("must not run") })
            .await
            .expect("run");
        assert!(matches!(dup, Answer::InFlight { .. }), "{dup:?}");
        assert_eq!(
            rig.store.calls()[StoreOp::Claim],
            1 + n,
            "each duplicate asked the store"
        );
    }
    assert_eq!(engine.store().cached(), 0);
    // Completing through the cached store fills the cache; the next replay is local.
    engine
        .store()
        .complete(&Completion::new(
            Hold::of(&k, &lease),
            &StoredResponse::new(200, "done"),
            secs(60),
        ))
        .await
        .expect("complete");
    assert_eq!(engine.store().cached(), 1);
    let claims = rig.store.calls()[StoreOp::Claim];
    let replay = engine
        .run(&k, &fp(b"x"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(&replay, Answer::Replayed(r) if r.body == "done"),
        "{replay:?}"
    );
    assert_eq!(rig.store.calls()[StoreOp::Claim], claims);
}

#[tokio::test(start_paused = true)]
async fn a_replay_from_the_store_fills_the_cache_and_mismatch_is_still_caught() {
    // Guards: a replay from the store not filling the cache (every retry pays a round trip),
    // and a cached entry answering a different fingerprint with a replay.
    let (rig, engine) = cached_rig();
    let k = key("warm");
    // Completed by another process, straight on the shared store.
    let other = Engine::new(rig.memory.clone(), Policy::default());
    other
        .run(&k, &fp(b"x"), |_| async { ok("remote") })
        .await
        .expect("run");
    let replay = engine
        .run(&k, &fp(b"x"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(
        matches!(&replay, Answer::Replayed(r) if r.body == "remote"),
        "{replay:?}"
    );
    let calls = rig.store.calls();
    assert_eq!(calls[StoreOp::Claim], 1);
    let mismatch = engine
        .run(&k, &fp(b"y"), |_| async { ok("must not run") })
        .await
        .expect("run");
    assert!(matches!(mismatch, Answer::Mismatch), "{mismatch:?}");
    assert_eq!(rig.store.calls(), calls, "answered from the cache");
}
