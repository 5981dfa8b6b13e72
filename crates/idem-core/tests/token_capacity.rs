//! The memory token store at capacity: refusing an issue costs little, however many live
//! tokens it holds, and live tokens keep working.

use std::time::{Duration, Instant};

use idem_core::token::{ConsumeOutcome, IssueRequest, MemoryTokens, TokenStore};
use idem_core::{ManualClock, Scope, StoreError, Timestamp};

// Bug guarded: at capacity every issue scanned the whole map twice (`retain`) looking for
// spent tokens, so a full store of live tokens turned each refused issue into a walk over
// all of them: a flood of issue requests became a CPU flood. 5 000 refusals over 50 000
// live tokens took seconds; with an expiry index they take milliseconds. (The bound is
// generous: this is not a benchmark, it tells a scan from a lookup.)
#[tokio::test]
async fn a_refused_issue_does_not_scan_the_store() {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let tokens = MemoryTokens::with_clock(50_000, clock.clone());
    let scope = Scope::new("cap").expect("ns");
    let req = IssueRequest::new(scope.clone(), Duration::from_secs(3600)).expect("req");
    let mut first = None;
    for _ in 0..50_000 {
        let issued = tokens.issue(&req).await.expect("room");
        first.get_or_insert(issued.token);
    }
    let started = Instant::now();
    for _ in 0..5_000 {
        let refused = tokens.issue(&req).await;
        assert!(
            matches!(refused, Err(StoreError::Full { .. })),
            "{refused:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "5000 refused issues took {took:?}"
    );
    // A live token is redeemed in a full store.
    let first = first.expect("a token");
    let used = tokens.consume(&scope, &first, None).await.expect("consume");
    assert!(matches!(used, ConsumeOutcome::Consumed { .. }), "{used:?}");
    // Once some expire, their room is reused without a scan either.
    clock.advance(Duration::from_secs(3601));
    tokens.issue(&req).await.expect("room after expiry");
}
