//! The store conformance suite, race tests and model test against PostgreSQL.

mod common;

idem_testkit::conformance_tests!(
    match common::PgHarness::connect().await {
        Some(h) => h,
        None => return,
    },
    cases = 12,
);
