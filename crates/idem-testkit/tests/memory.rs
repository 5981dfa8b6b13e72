//! MemoryStore passes the whole conformance suite, with 1 000 model-test cases.

idem_testkit::conformance_tests!(idem_testkit::MemoryHarness::new(), cases = 1000);
