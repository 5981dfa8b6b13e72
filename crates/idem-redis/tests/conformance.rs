//! The idem-testkit conformance suite, race tests and model test against the shared local
//! Redis (127.0.0.1:6379). Every store instance writes under its own random key prefix.

mod common;

idem_testkit::conformance_tests!(
    match common::RedisHarness::local().await {
        Some(h) => h,
        None => return,
    },
    cases = 24,
);
