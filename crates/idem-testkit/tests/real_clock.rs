//! The model test on a real clock: a case slowed down past the model's slack is inconclusive,
//! never a false failure.

use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, MemoryStore, OwnerId, Record, ReleaseKind,
    RenewOutcome, Resolution, ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError,
    StoredResponse,
};
use idem_testkit::ServerHarness;
use idem_testkit::model::{Op, run_case};

/// A memory store on the system clock whose every operation first waits `delay`, like a
/// server on a badly loaded machine.
#[derive(Clone, Debug)]
struct Slow {
    inner: MemoryStore,
    delay: Duration,
}

impl Store for Slow {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.claim(req).await
    }
    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.renew(key, owner, fence, lease).await
    }
    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.complete(key, owner, fence, response, ttl).await
    }
    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.release(key, owner, fence, kind).await
    }
    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.get(key).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.list(filter).await
    }
    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.resolve(key, resolution).await
    }
    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.delete(key).await
    }
}

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
    let slow = ServerHarness::new(
        Slow {
            inner: MemoryStore::new(1_000),
            delay: Duration::from_millis(120),
        },
        Duration::from_millis(300),
    );
    let ops = [claim(1), claim(1)];
    assert_eq!(run_case(&slow, &ops).await, Ok(()));

    // The same case on a prompt store is judged, and passes.
    let prompt = ServerHarness::new(MemoryStore::new(1_000), Duration::from_millis(300));
    assert_eq!(run_case(&prompt, &ops).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_real_clock_disagreement_still_fails() {
    // The real clock excuses slowness only: a prompt store that is wrong is reported.
    let ops = [claim(4), Op::Get { key: 0 }];
    let forgetful = ServerHarness::new(
        Forgetful(MemoryStore::new(1_000)),
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
    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.0.renew(key, owner, fence, lease).await
    }
    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        self.0.complete(key, owner, fence, response, ttl).await
    }
    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        self.0.release(key, owner, fence, kind).await
    }
    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        self.0.list(filter).await
    }
    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        self.0.resolve(key, resolution).await
    }
    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        self.0.delete(key).await
    }
}
