//! The store conformance suite, race tests and model test against MariaDB with the claim
//! forced onto the portable path MySQL 8 takes: the upsert without `RETURNING`, then a
//! locking read of the row, in one transaction.

mod common;

idem_testkit::conformance_tests!(
    match common::MySqlHarness::connect_then_read().await {
        Some(h) => h,
        None => return,
    },
    cases = 12,
);
