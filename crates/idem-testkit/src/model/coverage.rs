//! Which branches of the contract the generated cases reach.

use std::collections::BTreeMap;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

use super::ops::ops;
use super::reference::{ModelClaim, ModelRecord, ModelState};
use super::run_counting;
use crate::harness::Harness;

/// The branches of the contract the model test counts (see [`coverage`]).
pub const BRANCHES: &[&str] = &[
    "claim: absent key",
    "claim: after expiry",
    "claim: takeover",
    "claim: busy",
    "claim: replay",
    "claim: unknown record",
    "claim: hold marks unknown",
    "claim: mismatch",
    "renew: renewed",
    "renew: lost",
    "complete: settled",
    "complete: fenced",
    "release: retryable",
    "release: unknown",
    "release: fenced",
    "late holder settles",
    "forged holder",
    "resolve: unknown completed",
    "resolve: unknown released",
    "resolve: expired lease",
    "resolve: not resolvable",
    "resolve: not found",
    "resolve: fenced",
    "delete: existed",
    "delete: absent",
    "get",
    "list",
    "list: limited",
];

/// The branch of [`BRANCHES`] a claim the model answers `want` exercises.
pub(super) fn claim_branch(want: &ModelClaim, pre: Option<&ModelRecord>, now: u64) -> &'static str {
    let expired = pre.is_some_and(|r| r.expires <= now);
    match want {
        ModelClaim::Claimed { takeover: true } => "claim: takeover",
        ModelClaim::Claimed { .. } if expired => "claim: after expiry",
        ModelClaim::Claimed { .. } => "claim: absent key",
        ModelClaim::Busy { .. } => "claim: busy",
        ModelClaim::Done { .. } => "claim: replay",
        ModelClaim::Unknown { .. }
            if matches!(pre.map(|r| &r.state), Some(ModelState::Processing { .. })) =>
        {
            "claim: hold marks unknown"
        }
        ModelClaim::Unknown { .. } => "claim: unknown record",
        ModelClaim::Mismatch { .. } => "claim: mismatch",
    }
}

/// Runs `cases` cases drawn deterministically from the generator (no shrinking) and counts
/// how often each of [`BRANCHES`] was exercised: evidence that the generated sequences reach
/// every corner of the contract.
///
/// # Panics
/// When the store disagrees with the model.
pub async fn coverage<H: Harness>(h: &H, cases: u32) -> BTreeMap<&'static str, u64> {
    let strategy = ops(h.time_travel());
    let mut runner = TestRunner::deterministic();
    let mut hits = BTreeMap::new();
    for _ in 0..cases {
        let case = strategy
            .new_tree(&mut runner)
            .expect("generate a case")
            .current();
        if let Err(e) = run_counting(h, &case, &mut hits).await {
            panic!("store disagrees with the reference model: {e}");
        }
    }
    hits
}
