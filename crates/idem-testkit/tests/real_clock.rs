//! The model test on a real clock: a case slowed down past the model's slack is inconclusive,
//! never a false failure.

use std::time::Duration;

use idem_core::{AuditLevel, ClaimOutcome, ClaimRequest, MemoryStore, Store, StoreError};
use idem_testkit::model::{Op, run_case};
use idem_testkit::{ServerHarness, SlowStore};

fn claim(lease: u8) -> Op {
    Op::Claim {
        key: 0,
        fp: 0,
        hold: false,
        lease,
        ttl: 8,
        request_id: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_case_is_inconclusive_not_failed() {
    // Lease 300 ms: model step 75 ms, slack 37 ms. Each operation takes 120 ms, so the second
    // claim finds the one-step lease already over although the model (rightly, on its own
    // time) expects Busy.
    // A memory store on the system clock whose every operation first waits 120 ms, like a
    // server on a badly loaded machine.
    let memory = MemoryStore::new(1_000);
    let slow = |store: MemoryStore| SlowStore::new(store, Duration::from_millis(120));
    let slow = ServerHarness::new(
        slow(memory.clone()),
        slow(memory.with_audit_level(AuditLevel::All)),
        Duration::from_millis(300),
    );
    let ops = [claim(1), claim(1)];
    assert_eq!(run_case(&slow, &ops).await, Ok(()));

    // The same case on a prompt store is judged, and passes.
    let memory = MemoryStore::new(1_000);
    let prompt = ServerHarness::new(
        memory.clone(),
        memory.with_audit_level(AuditLevel::All),
        Duration::from_millis(300),
    );
    assert_eq!(run_case(&prompt, &ops).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_real_clock_disagreement_still_fails() {
    // The real clock excuses slowness only: a prompt store that is wrong is reported.
    let ops = [claim(4), Op::Get { key: 0 }];
    let memory = MemoryStore::new(1_000);
    let forgetful = ServerHarness::new(
        Forgetful(memory.clone()),
        Forgetful(memory.with_audit_level(AuditLevel::All)),
        Duration::from_millis(300),
    );
    let verdict = run_case(&forgetful, &ops).await;
    assert!(
        verdict.as_ref().is_err_and(|e| e.contains("get k0")),
        "{verdict:?}"
    );
}

/// Claims succeed but nothing is ever kept.
#[derive(Clone, Debug)]
struct Forgetful(MemoryStore);

impl Store for Forgetful {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let out = self.0.claim(req).await?;
        self.0.delete(&req.key).await?;
        Ok(out)
    }

    idem_core::forward_store!(|f| &f.0; renew, complete, release, get, list, resolve, delete, audit);
}
