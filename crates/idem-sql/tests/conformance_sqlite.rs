//! The store conformance suite, race tests and model test against SQLite (a temporary file).

mod common;

idem_testkit::conformance_tests!(common::SqliteHarness::new().await, cases = 12);
