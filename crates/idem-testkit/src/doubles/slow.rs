//! [`SlowStore`]: a delay before each operation.

use std::time::Duration;

use idem_core::store::{Around, StoreFuture};
use idem_core::{Store, StoreOp};

/// Wraps a store so each operation first waits its delay (tokio time), like a server on a
/// badly loaded machine or at the far end of a slow link.
#[derive(Clone, Debug)]
pub struct SlowStore<S> {
    inner: S,
    delays: [Duration; StoreOp::ALL.len()],
}

impl<S: Store> SlowStore<S> {
    /// Every operation waits `delay` before it reaches `inner`.
    pub fn new(inner: S, delay: Duration) -> Self {
        Self {
            inner,
            delays: [delay; StoreOp::ALL.len()],
        }
    }

    /// Operation `op` waits `delay` instead.
    pub fn with_delay(mut self, op: StoreOp, delay: Duration) -> Self {
        self.delays[op.index()] = delay;
        self
    }

    /// The delay before `op`.
    pub fn delay(&self, op: StoreOp) -> Duration {
        self.delays[op.index()]
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Store> Around for SlowStore<S> {
    async fn around<F: StoreFuture>(
        &self,
        op: StoreOp,
        call: impl FnOnce() -> F + Send,
    ) -> F::Output {
        let delay = self.delay(op);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        call().await
    }
}

impl<S: Store> Store for SlowStore<S> {
    idem_core::forward_store!(|s| &s.inner, around = s; all);
}
