//! The reference model and the model-based property test.
//!
//! The model is written from `docs/design.md` (the record and its state machine, leases and
//! fencing), independently of `idem_core::decide`: a map of
//! plain records and a step counter for time. The property test generates random operation
//! sequences (claims on a few keys with a few fingerprints under both takeover policies,
//! renew, complete, release of both kinds, resolve, delete, get, list, and time steps), runs
//! each against a store and the model, and demands they agree on every outcome and on the
//! final state.
//!
//! Fences cannot be predicted (a store may derive a floor from its clock), so the test checks
//! relations instead: every new fence of a key is strictly above every earlier one, and later
//! operations use the fences the store handed out. Timestamps are checked against the model's
//! time, anchored at the first lease the store reports.
//!
//! Every lease, TTL and time step is a small multiple of [`Harness::model_step`]. On a
//! manual clock the model is exact; on a real server's clock each case must finish its round
//! trips within well under one step of latency, and harnesses that cannot time-travel get
//! shorter cases with fewer, smaller steps.
//!
//! The parts: the generated operations (`ops`), the reference model (`reference`), one case
//! run against store and model (`case`, `compare`), and branch coverage (`coverage`).

mod case;
mod compare;
mod coverage;
mod ops;
mod reference;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use idem_core::{Key, Scope, ScopedKey};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

pub use coverage::{BRANCHES, coverage};
pub use ops::{Forge, Op, op, ops, response};
pub use reference::{Model, ModelClaim, ModelRecord, ModelState};

use crate::ctx::unique_namespace;
use crate::harness::Harness;
use case::Case;
use ops::KEYS;

/// Cases the model test runs when the caller names no count.
pub const DEFAULT_CASES: u32 = 256;

/// Environment variable that overrides the case count everywhere.
pub const CASES_ENV: &str = "IDEM_PROPTEST_CASES";

/// The case count: [`CASES_ENV`] if set to a number, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var(CASES_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Returns early from a check with a formatted disagreement.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}
use ensure;

/// Runs one case against a fresh namespace of the harness's store.
///
/// On a real clock, a case that ran so slowly that store time may have drifted past the
/// model's slack is inconclusive: it says so on stderr and counts as passed (the property
/// test rejects it instead, which draws another case).
///
/// # Errors
/// A description of the first disagreement, with the operations so far.
pub async fn run_case<H: Harness>(h: &H, ops: &[Op]) -> Result<(), String> {
    run_counting(h, ops, &mut BTreeMap::new()).await
}

async fn run_counting<H: Harness>(
    h: &H,
    ops: &[Op],
    hits: &mut BTreeMap<&'static str, u64>,
) -> Result<(), String> {
    match run_judged(h, ops, hits).await {
        Ok(()) => Ok(()),
        Err(CaseError::Disagree(e)) => Err(e),
        Err(CaseError::TooSlow(e)) => {
            eprintln!("idem-testkit: model case inconclusive (too slow for the model step): {e}");
            Ok(())
        }
    }
}

/// Why a case did not pass.
enum CaseError {
    /// Store and model disagree.
    Disagree(String),
    /// A real-clock case ran so slowly that store time may have drifted past the model's
    /// slack; its verdict would be noise.
    TooSlow(String),
}

async fn run_judged<H: Harness>(
    h: &H,
    ops: &[Op],
    hits: &mut BTreeMap<&'static str, u64>,
) -> Result<(), CaseError> {
    let ns = unique_namespace("model");
    let scope = Scope::new(ns.clone()).map_err(|e| CaseError::Disagree(e.to_string()))?;
    let keys = (0..KEYS)
        .map(|i| ScopedKey::new(scope.clone(), Key::new(format!("k{i}")).expect("key")))
        .collect();
    let step_ms = idem_core::record::duration_ms(h.model_step()).max(1);
    let mut case = Case {
        h,
        store: h.store().await,
        model: Model::default(),
        keys,
        ns,
        step_ms,
        origin: None,
        slack_ms: if h.time_travel() {
            0
        } else {
            i128::from(step_ms) / 2
        },
        holders: Vec::new(),
        high_fence: BTreeMap::new(),
        log: String::new(),
        hits: BTreeMap::new(),
        started: std::time::Instant::now(),
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        let _ = write!(case.log, "\n  #{i} t={} {op:?}", case.model.now);
        result = case.apply(op).await;
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        // The final state: every key and the namespace listing.
        let _ = write!(case.log, "\n  final check t={}", case.model.now);
        for key in 0..KEYS {
            result = case.compare(key).await;
            if result.is_err() {
                break;
            }
        }
    }
    if result.is_ok() {
        result = case.compare_list(None, 0).await;
    }
    let result = result.map_err(|e| {
        let e = format!("{e}\noperations:{}", case.log);
        if case.too_slow() {
            CaseError::TooSlow(e)
        } else {
            CaseError::Disagree(e)
        }
    });
    for (branch, n) in case.hits {
        *hits.entry(branch).or_default() += n;
    }
    result
}

/// Runs `cases` generated cases against the harness and panics with a shrunk counterexample if
/// store and model ever disagree. `source_file` (the caller's `file!()`) turns on proptest's
/// regression file next to it.
///
/// Needs a multi-threaded tokio runtime (it blocks in place while proptest drives the cases).
pub async fn check<H: Harness>(h: &H, cases: u32, source_file: Option<&'static str>) {
    let failure_persistence: Option<Box<dyn proptest::test_runner::FailurePersistence>> =
        source_file
            .map(|_| Box::new(FileFailurePersistence::WithSource("proptest-regressions")) as _);
    let config = Config {
        cases,
        source_file,
        failure_persistence,
        max_shrink_iters: 4096,
        max_shrink_time: if h.time_travel() { 0 } else { 120_000 },
        ..Config::default()
    };
    let strategy = ops(h.time_travel());
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        let mut runner = TestRunner::new(config);
        runner.run(&strategy, |ops| {
            handle
                .block_on(run_judged(h, &ops, &mut BTreeMap::new()))
                .map_err(|e| match e {
                    CaseError::Disagree(e) => TestCaseError::fail(e),
                    CaseError::TooSlow(e) => TestCaseError::reject(e),
                })
        })
    });
    if let Err(e) = result {
        panic!("store disagrees with the reference model: {e}");
    }
}
