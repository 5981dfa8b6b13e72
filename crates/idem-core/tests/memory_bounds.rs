//! The memory store at its bounds: it drops only what expired, and past that refuses new keys
//! rather than a live record.

use std::time::Duration;

use idem_core::store::{Completion, Hold};
use idem_core::{
    AuditRetention, ClaimOutcome, ClaimRequest, Fingerprint, Key, ManualClock, MemoryStore,
    OwnerId, Scope, ScopedKey, SettleOutcome, Store, StoreError, StoredResponse, TakeoverPolicy,
    Timestamp,
};

fn request(name: &str, ttl: Duration) -> ClaimRequest {
    ClaimRequest {
        key: ScopedKey::new(
            Scope::new("bounds").expect("ns"),
            Key::new(name).expect("key"),
        ),
        fingerprint: Fingerprint::of_bytes(1, name.as_bytes()),
        owner: OwnerId::random(),
        lease: Duration::from_secs(10),
        ttl,
        takeover: TakeoverPolicy::Hold,
        request_id: None,
    }
}

/// Claims `name` and completes it with `body`; the claim's error if it is refused.
async fn run(store: &MemoryStore, name: &str, body: &'static [u8]) -> Result<(), StoreError> {
    let req = request(name, Duration::from_secs(100));
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await? else {
        panic!("{name} not claimed");
    };
    let done = store
        .complete(&Completion::new(
            Hold::of(&req.key, &lease),
            &StoredResponse::new(200, body),
            req.ttl,
        ))
        .await
        .expect("complete");
    assert_eq!(done, SettleOutcome::Settled);
    Ok(())
}

/// What a retry of `name` finds.
async fn retry(store: &MemoryStore, name: &str) -> ClaimOutcome {
    store
        .claim(&request(name, Duration::from_secs(100)))
        .await
        .expect("a retry of a held key is never refused")
}

// Bug guarded: at capacity the store evicted the oldest completed record although it had
// not expired, so a flood of cheap new keys turned a victim's retry into a second execution.
#[tokio::test]
async fn at_capacity_a_live_answer_is_kept_and_new_keys_are_refused() {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = MemoryStore::with_clock(3, clock.clone());
    run(&store, "victim", b"paid").await.expect("room");
    // A processing record, its lease live.
    let ClaimOutcome::Claimed { .. } = retry(&store, "running").await else {
        panic!("not claimed");
    };
    run(&store, "other", b"x").await.expect("room");
    for i in 0..10 {
        let refused = run(&store, &format!("flood-{i}"), b"x").await;
        assert!(
            matches!(refused, Err(StoreError::Full { capacity: 3 })),
            "flood-{i}: {refused:?}"
        );
    }
    assert!(
        matches!(retry(&store, "victim").await, ClaimOutcome::Done { response } if response.body == "paid"),
        "the victim's answer was dropped"
    );
    assert!(matches!(
        retry(&store, "running").await,
        ClaimOutcome::Busy { .. }
    ));
    // Once a record expired, its room is taken by the next new key.
    clock.advance(Duration::from_secs(101));
    run(&store, "after", b"x").await.expect("room after expiry");
}

// The byte bound: records whose answers take the room refuse new keys the same way, and a
// key already held still completes and replays.
#[tokio::test]
async fn past_its_bytes_the_store_refuses_new_keys_and_keeps_what_it_holds() {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let retention = AuditRetention {
        max_events: 100,
        max_age: Duration::from_secs(3600),
    };
    let store = MemoryStore::bounded(1_000, 8 * 1024, clock.clone(), retention);
    const BIG: &[u8] = &[b'x'; 2000];
    let mut held = 0;
    let refused = loop {
        match run(&store, &format!("big-{held}"), BIG).await {
            Ok(()) => held += 1,
            Err(e) => break e,
        }
        assert!(held < 100, "never refused");
    };
    assert!(
        matches!(refused, StoreError::FullBytes { max_bytes: 8192 }),
        "{refused:?}"
    );
    assert!(
        (2..=4).contains(&held),
        "{held} records of 2000 bytes in 8 KiB"
    );
    assert!(
        store.bytes() <= 8 * 1024 + BIG.len(),
        "{} bytes",
        store.bytes()
    );
    for i in 0..held {
        assert!(matches!(
            retry(&store, &format!("big-{i}")).await,
            ClaimOutcome::Done { .. }
        ));
    }
    // Deleting a record gives its bytes back.
    store
        .delete(&request("big-0", Duration::ZERO).key)
        .await
        .expect("delete");
    run(&store, "small", b"x")
        .await
        .expect("room after a delete");
    clock.advance(Duration::from_secs(101));
    assert_eq!(store.sweep(), held);
    assert_eq!(store.bytes(), 0, "the sweep gave every byte back");
}
