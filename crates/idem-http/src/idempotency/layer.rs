//! [`IdempotencyLayer`]: wraps a service in [`Idempotency`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use idem_core::{Engine, Store, TxStore};
use tower::Layer;

use super::{Idempotency, InTransaction, Separate, Shared};
use crate::config::IdempotencyConfig;

/// Applies [`Idempotency`] with one route configuration, in the mode `M`: [`Separate`] (the
/// default) or [`InTransaction`]. Cheap to clone.
pub struct IdempotencyLayer<St, M = Separate> {
    shared: Arc<Shared<St>>,
    mode: PhantomData<fn() -> M>,
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `engine`'s store (one store for many routes), under the route's own
    /// policy if [`IdempotencyConfig::policy`] set one, else under `engine`'s.
    pub fn new(engine: &Engine<St>, config: IdempotencyConfig) -> Self {
        let engine = config.protection.engine(engine);
        Self::with(Shared { engine, config })
    }

    /// A layer over its own engine on `store`, under the route's policy or the default one.
    pub fn from_store(store: St, config: IdempotencyConfig) -> Self {
        let engine = Engine::new(store, config.protection.policy.clone().unwrap_or_default());
        Self::with(Shared { engine, config })
    }
}

impl<St: TxStore> IdempotencyLayer<St> {
    /// The same route in same-transaction mode: the claim, the handler's writes and the
    /// completion commit in one database transaction, which the handler takes from the
    /// request as a [`SharedTx`](idem_core::SharedTx) (see [`InTransaction`]).
    pub fn in_transaction(self) -> IdempotencyLayer<St, InTransaction> {
        IdempotencyLayer {
            shared: self.shared,
            mode: PhantomData,
        }
    }
}

impl<St, M> IdempotencyLayer<St, M> {
    fn with(shared: Shared<St>) -> Self {
        Self {
            shared: Arc::new(shared),
            mode: PhantomData,
        }
    }

    /// The route configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }

    /// The engine (and through it the store), for status queries.
    pub fn engine(&self) -> &Engine<St> {
        &self.shared.engine
    }
}

impl<St, M> Clone for IdempotencyLayer<St, M> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            mode: PhantomData,
        }
    }
}

impl<St, M> fmt::Debug for IdempotencyLayer<St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St, M> Layer<S> for IdempotencyLayer<St, M> {
    type Service = Idempotency<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            shared: Arc::clone(&self.shared),
            mode: PhantomData,
        }
    }
}

impl<St: Store, M> IdempotencyLayer<St, M> {
    /// The status endpoint for this route's namespace and principal, under `prefix`.
    pub fn status_service(&self, prefix: &str) -> crate::IdempotencyStatus<St> {
        crate::IdempotencyStatus::new(&self.shared.engine, self.shared.config.clone(), prefix)
    }
}
