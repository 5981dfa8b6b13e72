//! The test doubles do what their docs say: faults reach the store or not as documented,
//! counts are per operation, delays are per operation.

use std::time::Duration;

use idem_core::store::Hold;
use idem_core::{
    ClaimOutcome, ClaimRequest, Key, MemoryStore, OwnerId, RenewOutcome, Scope, ScopedKey, Store,
    StoreError, StoreOp, TakeoverPolicy,
};
use idem_testkit::{CountingStore, Fault, FaultyStore, SlowStore, fp};
use tokio::time::Instant;

fn key() -> ScopedKey {
    ScopedKey::new(
        Scope::new("doubles").expect("ns"),
        Key::new("k").expect("key"),
    )
}

fn request() -> ClaimRequest {
    ClaimRequest {
        key: key(),
        fingerprint: fp(1),
        owner: OwnerId::random(),
        lease: Duration::from_secs(10),
        ttl: Duration::from_secs(60),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

#[tokio::test(start_paused = true)]
async fn faults_reach_the_store_only_where_documented() {
    let memory = MemoryStore::new(100);
    let faulty = FaultyStore::new(memory.clone()).with(StoreOp::Claim, Fault::Error);
    assert!(matches!(
        faulty.claim(&request()).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(memory.is_empty(), "an error fault never reaches the store");

    faulty.set(StoreOp::Claim, Fault::Hang);
    let hung = tokio::time::timeout(Duration::from_secs(60), faulty.claim(&request())).await;
    assert!(hung.is_err(), "a hang never answers");
    assert!(memory.is_empty(), "a hang never reaches the store");

    faulty.set(StoreOp::Claim, Fault::ErrorAfterApply);
    assert!(faulty.claim(&request()).await.is_err());
    assert!(
        memory.get(&key()).await.expect("get").is_some(),
        "applied, though the caller heard of a failure"
    );

    faulty.clear(StoreOp::Claim);
    assert_eq!(faulty.fault(StoreOp::Claim), None);
    assert!(matches!(
        faulty.claim(&request()).await,
        Ok(ClaimOutcome::Busy { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn slow_answers_and_renew_answers() {
    let memory = MemoryStore::new(100);
    let faulty = FaultyStore::new(memory.clone())
        .with(StoreOp::Claim, Fault::SlowAnswer(Duration::from_secs(3)));
    let start = Instant::now();
    let ClaimOutcome::Claimed { lease, .. } = faulty.claim(&request()).await.expect("claim") else {
        panic!("claimed")
    };
    assert_eq!(start.elapsed(), Duration::from_secs(3));

    let k = key();
    let hold = Hold::of(&k, &lease);
    faulty.set(StoreOp::Renew, Fault::RenewLost);
    let renew = faulty.renew(&hold, Duration::from_secs(10));
    assert_eq!(renew.await.expect("renew"), RenewOutcome::Lost);
    faulty.set(StoreOp::Renew, Fault::RenewPretend);
    let before = memory.get(&k).await.expect("get");
    let renew = faulty.renew(&hold, Duration::from_secs(99));
    assert!(matches!(
        renew.await.expect("renew"),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        memory.get(&key()).await.expect("get"),
        before,
        "a pretended renewal never reaches the store"
    );
}

#[test]
#[should_panic(expected = "renew-only")]
fn renew_only_faults_are_refused_elsewhere() {
    FaultyStore::new(MemoryStore::new(1)).set(StoreOp::Claim, Fault::RenewLost);
}

#[tokio::test(start_paused = true)]
async fn counts_calls_per_operation_and_granted_claims() {
    let faults = FaultyStore::new(MemoryStore::new(100));
    let counting = CountingStore::new(faults.clone());
    let waiter = counting.clone();
    let waited = tokio::spawn(async move { waiter.wait_for(|c| c[StoreOp::Get] >= 1).await });
    counting.claim(&request()).await.expect("claim");
    counting.claim(&request()).await.expect("busy");
    faults.set(StoreOp::Get, Fault::Error);
    assert!(counting.get(&key()).await.is_err());
    let calls = counting.calls();
    assert_eq!(calls[StoreOp::Claim], 2);
    assert_eq!(calls[StoreOp::Get], 1, "a failed call counts too");
    assert_eq!((calls.granted(), counting.granted()), (1, 1));
    assert_eq!(calls.total(), 3);
    assert_eq!(waited.await.expect("waiter"), calls);
}

#[tokio::test(start_paused = true)]
async fn delays_are_per_operation() {
    let slow = SlowStore::new(MemoryStore::new(100), Duration::from_millis(120))
        .with_delay(StoreOp::Get, Duration::ZERO);
    let start = Instant::now();
    slow.claim(&request()).await.expect("claim");
    assert_eq!(start.elapsed(), Duration::from_millis(120));
    slow.get(&key()).await.expect("get");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(120),
        "get waits nothing"
    );
    assert_eq!(slow.delay(StoreOp::List), Duration::from_millis(120));
}
