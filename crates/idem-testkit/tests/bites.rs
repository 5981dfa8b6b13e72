//! The suite bites: each bug of `BrokenStore` makes the rules that guard against it fail, and
//! the model test catches it too. `BrokenStore` without a bug passes everything (module
//! `faithful`), so every failure below is the bug's doing.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use idem_testkit::broken::{BrokenHarness, Bug};
use idem_testkit::{model, rules};

mod faithful {
    // The bug-free variant: shows the plumbing of BrokenStore is sound.
    idem_testkit::conformance_tests!(
        idem_testkit::broken::BrokenHarness::new(idem_testkit::broken::Bug::None),
        cases = 300
    );
}

/// True when the future panics (a rule or the model test reported a violation).
async fn fails(f: impl Future<Output = ()>) -> bool {
    AssertUnwindSafe(f).catch_unwind().await.is_err()
}

/// The model test with a fixed budget, without regression files (failures are expected).
async fn model_fails(bug: Bug) -> bool {
    let h = BrokenHarness::new(bug);
    fails(model::check(&h, 2000, None)).await
}

// Bug guarded: a stale holder (taken over, or with a forged owner/fence) overwrites the
// record with its late result: `complete` that checks neither owner nor fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_unconditionally_is_caught() {
    let h = BrokenHarness::new(Bug::CompleteUnconditionally);
    assert!(fails(rules::stale_owner_is_fenced(&h)).await);
    assert!(fails(rules::release_unknown_holds_key(&h)).await);
    assert!(model_fails(Bug::CompleteUnconditionally).await);
}

// Bug guarded: a fence counter that lives only inside the record, so after the record
// expires (or is released or deleted) a new holder reuses an old fence number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_reset_is_caught() {
    let h = BrokenHarness::new(Bug::FenceResetsAfterExpiry);
    assert!(fails(rules::fence_increases_across_expiry(&h)).await);
    assert!(fails(rules::fence_increases_across_release_and_delete(&h)).await);
    assert!(model_fails(Bug::FenceResetsAfterExpiry).await);
}

// Bug guarded: check-then-set claims (read, await, write), so concurrent duplicates all see
// the key absent and all run the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_set_claim_is_caught() {
    let h = BrokenHarness::new(Bug::CheckThenSetClaim);
    assert!(fails(rules::race_one_claim_wins(&h)).await);
    assert!(fails(rules::race_one_takeover_wins(&h)).await);
    assert!(fails(rules::race_mixed_fingerprints_one_wins(&h)).await);
}

// Bug guarded: a claim that ignores the fingerprint, replaying one request's response to a
// different request (or letting it take the key over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_fingerprint_is_caught() {
    let h = BrokenHarness::new(Bug::IgnoresFingerprint);
    assert!(fails(rules::mismatch_changes_nothing_in_any_state(&h)).await);
    assert!(fails(rules::race_mixed_fingerprints_one_wins(&h)).await);
    assert!(fails(rules::release_unknown_holds_key(&h)).await);
    assert!(model_fails(Bug::IgnoresFingerprint).await);
}

// Bug guarded: an ambiguous outcome released as retryable, so a retry re-runs an effect that
// may already have happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_release_removing_is_caught() {
    let h = BrokenHarness::new(Bug::UnknownReleaseRemoves);
    assert!(fails(rules::release_unknown_holds_key(&h)).await);
    assert!(fails(rules::resolve_unknown_with_response_replays(&h)).await);
    assert!(model_fails(Bug::UnknownReleaseRemoves).await);
}

// Bug guarded: an operator resolve that settles a key a live worker still holds, so the
// worker's effect and the operator's answer both happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_live_lease_is_caught() {
    let h = BrokenHarness::new(Bug::ResolvesLiveLease);
    assert!(fails(rules::resolve_refuses_completed_and_live_processing(&h)).await);
    assert!(model_fails(Bug::ResolvesLiveLease).await);
}

// Bug guarded: a store that never expires records (TTL ignored), so results are replayed
// forever and a key can never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_ttl_is_caught() {
    let h = BrokenHarness::new(Bug::IgnoresTtl);
    assert!(fails(rules::record_expires_after_ttl(&h)).await);
    assert!(fails(rules::fence_increases_across_expiry(&h)).await);
    assert!(model_fails(Bug::IgnoresTtl).await);
}

// Bug guarded: a renewal checked by owner only, so a holder with a forged or stale fence
// keeps extending a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_ignoring_fence_is_caught() {
    let h = BrokenHarness::new(Bug::RenewIgnoresFence);
    assert!(fails(rules::stale_owner_is_fenced(&h)).await);
    assert!(model_fails(Bug::RenewIgnoresFence).await);
}

// Bug guarded: the hold policy taking an expired lease over, re-running a handler whose
// earlier outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_taking_over_is_caught() {
    let h = BrokenHarness::new(Bug::HoldTakesOver);
    assert!(fails(rules::takeover_hold_marks_unknown(&h)).await);
    assert!(model_fails(Bug::HoldTakesOver).await);
}

#[test]
fn every_bug_has_a_test_here() {
    // Adding a bug to `Bug::ALL` without a test above should not go unnoticed.
    assert_eq!(Bug::ALL.len(), 12);
}

// Bug guarded: a resolve that ignores the fence it names, so a probe's or reconciler's
// answer about one attempt settles the next one: a "not done" read before a retry ran
// releases the retry's unknown record, and the key runs a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_ignoring_fence_is_caught() {
    let h = BrokenHarness::new(Bug::ResolveIgnoresFence);
    assert!(fails(rules::resolve_naming_a_fence_settles_only_that_attempt(&h)).await);
    assert!(model_fails(Bug::ResolveIgnoresFence).await);
}

// Bug guarded: operator settlements (resolve, delete) that change a record without leaving
// an event, so nobody can tell afterwards who settled a payment or how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaudited_settlements_are_caught() {
    let h = BrokenHarness::new(Bug::UnauditedSettlements);
    assert!(fails(rules::audit_trail_follows_claim_timeout_unknown_resolve(&h)).await);
    assert!(fails(rules::audit_records_every_change_and_nothing_else(&h)).await);
}

// Bug guarded: a store that ignores its audit level and writes an event for every claim
// and completion, the extra write on every first request the default level promises away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_the_audit_level_is_caught() {
    let h = BrokenHarness::new(Bug::IgnoresAuditLevel);
    assert!(
        fails(rules::audit_default_level_records_what_an_operator_needs(
            &h
        ))
        .await
    );
    // At `all` it is right.
    assert!(!fails(rules::audit_records_every_change_and_nothing_else(&h)).await);
}
