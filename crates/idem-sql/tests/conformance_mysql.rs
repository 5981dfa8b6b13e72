//! The store conformance suite, race tests and model test against MariaDB / MySQL.

mod common;

idem_testkit::conformance_tests!(
    match common::MySqlHarness::connect().await {
        Some(h) => h,
        None => return,
    },
    cases = 12,
);
