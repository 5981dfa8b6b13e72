//! [`FaultyStore`]: per-operation switchable failures in front of any store.

use std::future::{Future, pending};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_core::store::Hold;
use idem_core::store::{Around, StoreFuture};
use idem_core::{RenewOutcome, Store, StoreError, StoreOp, Timestamp};

/// What a [`FaultyStore`] does to one operation instead of forwarding it plainly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails with [`StoreError::Unavailable`] without reaching the store: a store that is
    /// down.
    Error,
    /// Never answers, and never reaches the store: a store that hangs.
    Hang,
    /// Applies the operation in the store, then fails with [`StoreError::Unavailable`]: a
    /// reply lost on its way back, so the caller cannot tell the operation happened.
    ErrorAfterApply,
    /// Applies the operation, then takes this long to answer.
    SlowAnswer(Duration),
    /// `renew` only: answers [`RenewOutcome::Lost`] without reaching the store.
    RenewLost,
    /// `renew` only: answers [`RenewOutcome::Renewed`] without reaching the store, so the
    /// lease never moves (an unguarded renewal).
    RenewPretend,
}

impl Fault {
    fn renew_only(self) -> bool {
        matches!(self, Fault::RenewLost | Fault::RenewPretend)
    }
}

/// Wraps a store with a switchable [`Fault`] per operation; operations without one are
/// forwarded. Clones share the switches.
#[derive(Clone, Debug)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Arc<Mutex<[Option<Fault>; StoreOp::ALL.len()]>>,
}

impl<S: Store> FaultyStore<S> {
    /// Forwards every operation to `inner` until a fault is set.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            faults: Arc::new(Mutex::new([None; StoreOp::ALL.len()])),
        }
    }

    /// As [`FaultyStore::set`], by value: `FaultyStore::new(store).with(op, fault)`.
    pub fn with(self, op: StoreOp, fault: Fault) -> Self {
        self.set(op, fault);
        self
    }

    /// As [`FaultyStore::set_all`], by value.
    pub fn with_all(self, fault: Fault) -> Self {
        self.set_all(fault);
        self
    }

    /// Makes `op` suffer `fault` from now on.
    ///
    /// # Panics
    /// When `fault` is a `renew`-only fault and `op` is not [`StoreOp::Renew`].
    pub fn set(&self, op: StoreOp, fault: Fault) {
        assert!(
            op == StoreOp::Renew || !fault.renew_only(),
            "{fault:?} is a renew-only fault, not one for {op}"
        );
        self.lock()[op.index()] = Some(fault);
    }

    /// Makes every operation suffer `fault` from now on.
    ///
    /// # Panics
    /// When `fault` is a `renew`-only fault.
    pub fn set_all(&self, fault: Fault) {
        for op in StoreOp::ALL {
            self.set(op, fault);
        }
    }

    /// Forwards `op` plainly again.
    pub fn clear(&self, op: StoreOp) {
        self.lock()[op.index()] = None;
    }

    /// Forwards every operation plainly again.
    pub fn clear_all(&self) {
        *self.lock() = [None; StoreOp::ALL.len()];
    }

    /// The fault `op` suffers now, if any.
    pub fn fault(&self, op: StoreOp) -> Option<Fault> {
        self.lock()[op.index()]
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Option<Fault>; StoreOp::ALL.len()]> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn injected() -> StoreError {
    StoreError::unavailable("injected failure")
}

/// Runs `call` as `fault` says; [`Fault::Error`] and [`Fault::Hang`] never call it.
async fn apply<T, F>(fault: Option<Fault>, call: impl FnOnce() -> F) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    match fault {
        None => call().await,
        Some(Fault::Error) => Err(injected()),
        Some(Fault::Hang) => pending().await,
        Some(Fault::ErrorAfterApply) => {
            // Whatever the store answered, the caller hears of a failure.
            let _ = call().await;
            Err(injected())
        }
        Some(Fault::SlowAnswer(d)) => {
            let answer = call().await;
            tokio::time::sleep(d).await;
            answer
        }
        // `set` keeps these on renew, which answers them itself.
        Some(Fault::RenewLost | Fault::RenewPretend) => {
            unreachable!("renew-only faults are answered by renew")
        }
    }
}

impl<S: Store> Around for FaultyStore<S> {
    async fn around<F: StoreFuture>(
        &self,
        op: StoreOp,
        call: impl FnOnce() -> F + Send,
    ) -> F::Output {
        let fault = self.fault(op);
        apply(fault, call).await
    }
}

impl<S: Store> Store for FaultyStore<S> {
    async fn renew(&self, hold: &Hold<'_>, lease: Duration) -> Result<RenewOutcome, StoreError> {
        match self.fault(StoreOp::Renew) {
            Some(Fault::RenewLost) => Ok(RenewOutcome::Lost),
            Some(Fault::RenewPretend) => Ok(RenewOutcome::Renewed {
                deadline: Timestamp(u64::MAX),
            }),
            fault => apply(fault, || self.inner.renew(hold, lease)).await,
        }
    }

    idem_core::forward_store!(|s| &s.inner, around = s;
        claim, complete, release, get, list, resolve, delete, audit);
}
