//! [`CountingStore`]: counts the calls of each operation, and the claims granted.

use std::future::Future;
use std::ops::Index;
use std::sync::Arc;

use idem_core::store::{Around, StoreFuture};
use idem_core::{ClaimOutcome, ClaimRequest, Store, StoreError, StoreOp};
use tokio::sync::watch;

/// How many times each operation was called on a [`CountingStore`], and how many claims it
/// granted. Index it by [`StoreOp`]: `calls[StoreOp::Claim]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    per_op: [usize; StoreOp::ALL.len()],
    granted: usize,
}

impl Calls {
    /// Calls of every operation together.
    pub fn total(&self) -> usize {
        self.per_op.iter().sum()
    }

    /// Claims answered [`ClaimOutcome::Claimed`]: the most handler runs a store allows.
    pub fn granted(&self) -> usize {
        self.granted
    }
}

impl Index<StoreOp> for Calls {
    type Output = usize;

    fn index(&self, op: StoreOp) -> &usize {
        &self.per_op[op.index()]
    }
}

/// Wraps a store and counts the calls made to it, as they are made (a call that fails or
/// hangs further in counts too). Clones share the counts.
#[derive(Clone, Debug)]
pub struct CountingStore<S> {
    inner: S,
    calls: Arc<watch::Sender<Calls>>,
}

impl<S: Store> CountingStore<S> {
    /// Counts calls to `inner`, from zero.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: Arc::new(watch::Sender::new(Calls::default())),
        }
    }

    /// The counts so far.
    pub fn calls(&self) -> Calls {
        *self.calls.borrow()
    }

    /// Claims granted so far: [`Calls::granted`].
    pub fn granted(&self) -> usize {
        self.calls.borrow().granted
    }

    /// Waits, on calls rather than on time, until `enough` holds for the counts; returns
    /// them. Unbounded: a test that may miss a call bounds the wait itself.
    pub async fn wait_for(&self, enough: impl FnMut(&Calls) -> bool) -> Calls {
        let mut rx = self.calls.subscribe();
        let calls = rx.wait_for(enough).await.expect("the sender lives in self");
        *calls
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Store> Around for CountingStore<S> {
    fn around<F: StoreFuture>(
        &self,
        op: StoreOp,
        call: impl FnOnce() -> F + Send,
    ) -> impl Future<Output = F::Output> + Send {
        // Counted when called, not when first polled, like the call itself.
        self.calls.send_modify(|c| c.per_op[op.index()] += 1);
        call()
    }
}

impl<S: Store> Store for CountingStore<S> {
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send {
        let call = self.around(StoreOp::Claim, || self.inner.claim(req));
        async move {
            let outcome = call.await?;
            if matches!(outcome, ClaimOutcome::Claimed { .. }) {
                self.calls.send_modify(|c| c.granted += 1);
            }
            Ok(outcome)
        }
    }

    idem_core::forward_store!(|s| &s.inner, around = s;
        renew, complete, release, get, list, resolve, delete, audit);
}
