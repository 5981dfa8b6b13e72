//! The store conformance suite: every rule of idem's store contract as a test any store runs
//! with one line, plus a reference model, a model-based property test and race tests.
//!
//! A store crate provides a [`Harness`] (how to get a store, how to let store time pass, which
//! lease to test with) and invokes [`conformance_tests!`] once in an integration test:
//!
//! ```no_run
//! // crates/idem-memory-like/tests/conformance.rs
//! idem_testkit::conformance_tests!(idem_testkit::MemoryHarness::new(), cases = 1000);
//! # fn main() {}
//! ```
//!
//! That expands to one `#[test]` per rule in [`rules`] (the race tests included) and
//! `model_matches_store`, each on its own two-worker tokio runtime, so the store crate needs
//! no tokio macros of its own. The harness expression is evaluated inside that runtime: it
//! may `.await` (connect to a server) and may `return` to skip when a server is missing. A
//! store judged by a server's clock can use [`ServerHarness`], which shares one store and
//! sleeps to let time pass:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use idem_core::{AuditLevel, MemoryStore};
//! use idem_testkit::ServerHarness;
//!
//! async fn connect() -> Option<ServerHarness<MemoryStore>> {
//!     // A real store connects here; without its server (and outside CI) it says so loudly
//!     // and returns None, which skips the test. The audit rules also need the store at
//!     // the level that records every transition.
//!     let store = MemoryStore::new(10_000);
//!     let all = store.clone().with_audit_level(AuditLevel::All);
//!     Some(ServerHarness::new(store, all, Duration::from_millis(500)))
//! }
//!
//! idem_testkit::conformance_tests!(
//!     match connect().await {
//!         Some(h) => h,
//!         None => return,
//!     },
//!     cases = 32,
//! );
//! # fn main() {}
//! ```
//!
//! The model test's case count is the `cases` argument (default [`model::DEFAULT_CASES`]),
//! overridden everywhere by the environment variable `IDEM_PROPTEST_CASES`. Failing cases are
//! saved next to the invoking test file as `<file>.proptest-regressions`: commit them.
//!
//! [`broken::BrokenStore`] is a deliberately faulty store; this crate's `tests/bites.rs` shows
//! that each of its bugs makes the suite fail. [`doubles`] holds wrappers for fault, count and
//! latency tests of code above a store ([`FaultyStore`], [`CountingStore`], [`SlowStore`]).
//! The guide is `docs/testkit.md`.

pub mod broken;
#[cfg(feature = "brokers")]
pub mod brokers;
pub mod counting_server;
mod ctx;
pub mod doubles;
mod fault_plan;
pub mod fault_proxy;
pub mod h2_fault;
mod harness;
pub mod hits;
pub mod model;
pub mod redis_server;
pub mod requests;
pub mod rules;
pub mod services;
pub mod tokens;

pub use ctx::{fp, rich_response, unique_namespace};
pub use doubles::{Calls, CountingStore, Fault, FaultyStore, SlowStore};
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
        $crate::__rules!(__rule_tests { $harness });

        #[test]
        fn model_matches_store() {
            $crate::__private::run(async {
                let harness = $harness;
                $crate::model::check(
                    &harness,
                    $crate::model::cases($cases),
                    ::core::option::Option::Some(file!()),
                )
                .await;
            });
        }
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
