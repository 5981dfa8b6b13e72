//! The store conformance suite, race tests and model test against PostgreSQL with two
//! connections, so that concurrent claims and completions wait for one and are committed in
//! groups (one statement for the claims, one for the completions).

mod common;

idem_testkit::conformance_tests!(
    match common::PgHarness::with_connections(2).await {
        Some(h) => h,
        None => return,
    },
    cases = 12,
);
