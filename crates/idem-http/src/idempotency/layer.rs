//! [`IdempotencyLayer`]: wraps a service in [`Idempotency`].

use std::fmt;
use std::sync::Arc;

use idem_core::{Engine, Store};
use tower::Layer;

use super::{Idempotency, Shared};
use crate::config::IdempotencyConfig;

/// Applies [`Idempotency`] with one route configuration. Cheap to clone.
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `engine`'s store (one store for many routes), under the route's own
    /// policy if [`IdempotencyConfig::policy`] set one, else under `engine`'s.
    pub fn new(engine: &Engine<St>, config: IdempotencyConfig) -> Self {
        let engine = config.protection.engine(engine);
        Self {
            shared: Arc::new(Shared { engine, config }),
        }
    }

    /// A layer over its own engine on `store`, under the route's policy or the default one.
    pub fn from_store(store: St, config: IdempotencyConfig) -> Self {
        let engine = Engine::new(store, config.protection.policy.clone().unwrap_or_default());
        Self {
            shared: Arc::new(Shared { engine, config }),
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

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St: idem_core::TxStore> IdempotencyLayer<St> {
    /// The same route in same-transaction mode: the claim, the handler's writes and the
    /// completion commit in one database transaction, which the handler takes from the
    /// request as a [`SharedTx`](idem_core::SharedTx) (see [`TxIdempotency`](super::TxIdempotency)).
    pub fn in_transaction(self) -> super::TxIdempotencyLayer<St> {
        super::TxIdempotencyLayer {
            shared: self.shared,
        }
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// The status endpoint for this route's namespace and principal, under `prefix`.
    pub fn status_service(&self, prefix: &str) -> crate::IdempotencyStatus<St> {
        crate::IdempotencyStatus::new(&self.shared.engine, self.shared.config.clone(), prefix)
    }
}
