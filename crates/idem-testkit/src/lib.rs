//! The store conformance suite: every rule of idem's store contract as a test any store runs
//! with one line, plus a reference model, a model-based property test and a race test.
//!
//! A store crate writes a [`Harness`] (how to get a store, how to let time pass, which lease
//! to test with) and invokes [`conformance_tests!`] in an integration test:
//!
//! ```no_run
//! // crates/idem-<store>/tests/conformance.rs
//! idem_testkit::conformance_tests!(idem_testkit::MemoryHarness::new(), cases = 1000);
//! # fn main() {}
//! ```
//!
//! That expands to one `#[test]` per rule in [`rules`], the race tests, and
//! `model_matches_store`, each on its own two-worker tokio runtime. The harness expression is
//! evaluated inside that runtime, so it may `.await` (connect to a server) and may `return`
//! to skip the test when a server is missing:
//!
//! ```ignore
//! idem_testkit::conformance_tests!(
//!     match RedisHarness::connect().await {
//!         Some(h) => h,
//!         None => return, // not in CI and no Redis: skip loudly inside connect()
//!     },
//!     cases = 32,
//! );
//! ```
//!
//! The model test's case count is the `cases` argument (default [`model::DEFAULT_CASES`]),
//! overridden everywhere by the environment variable `IDEM_PROPTEST_CASES`. Failing cases
//! are saved next to the test file as `<file>.proptest-regressions`: commit them.
//!
//! [`broken::BrokenStore`] is a deliberately faulty store: this crate's own tests show that
//! each of its bugs makes the suite fail. See `docs/testkit.md` for the full guide.

pub mod broken;
mod ctx;
mod harness;
pub mod model;
pub mod rules;

pub use ctx::{fp, rich_response, unique_namespace};
pub use harness::{Harness, MemoryHarness, ServerHarness, sleep_for};

/// Expands to the whole conformance suite for a harness: one `#[test]` per rule, the race
/// tests and the model-based test.
///
/// `conformance_tests!(harness_expr)` or `conformance_tests!(harness_expr, cases = N)`.
/// Invoke it once per module; wrap it in `mod name { use super::*; … }` to run the suite
/// against several harnesses in one file.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr $(,)?) => {
        $crate::conformance_tests!($harness, cases = $crate::model::DEFAULT_CASES);
    };
    ($harness:expr, cases = $cases:expr $(,)?) => {
        $crate::__rules!(
            $harness;
            claim_absent_key_claims,
            busy_while_lease_live,
            done_replays_exact_response,
            mismatch_changes_nothing_in_any_state,
            fence_increases_across_takeovers,
            fence_increases_across_expiry,
            fence_increases_across_release_and_delete,
            stale_owner_is_fenced,
            late_holder_settles_until_taken_over,
            record_expires_after_ttl,
            renew_extends_lease,
            release_retryable_frees_key,
            release_unknown_holds_key,
            takeover_reexecute_claims_again,
            takeover_hold_marks_unknown,
            resolve_unknown_with_response_replays,
            resolve_unknown_with_release_frees_key,
            resolve_refuses_completed_and_live_processing,
            resolve_missing_is_not_found,
            resolve_expired_lease_processing,
            get_reports_every_state,
            delete_removes_record,
            list_filters_by_namespace_and_principal,
            list_filters_by_state,
            list_oldest_first_with_limit_and_age,
            request_id_kept_on_record,
            race_one_claim_wins,
            race_one_takeover_wins,
        );

        #[test]
        fn model_matches_store() {
            $crate::__private::run(async {
                let harness = $harness;
                $crate::model::check(&harness, $crate::model::cases($cases), ::core::option::Option::Some(file!())).await;
            });
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rules {
    ($harness:expr; $($rule:ident),* $(,)?) => {
        $(
            #[test]
            fn $rule() {
                $crate::__private::run(async {
                    let harness = $harness;
                    $crate::rules::$rule(&harness).await;
                });
            }
        )*
    };
}

#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    /// Runs a test body on a fresh two-worker tokio runtime with every driver enabled.
    pub fn run<F: Future<Output = ()>>(body: F) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build the test runtime")
            .block_on(body);
    }
}
