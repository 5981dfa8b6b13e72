//! [`GrpcIdempotencyLayer`]: wraps a service in [`GrpcIdempotency`].

use std::fmt;
use std::sync::Arc;

use idem_core::{Engine, Store};
use tower::Layer;

use super::{GrpcIdempotency, Shared};
use crate::config::GrpcIdempotencyConfig;
use crate::status::StatusService;

/// Applies [`GrpcIdempotency`] to a tonic server (`Server::builder().layer(..)`) or to one
/// generated service (`layer.layer(PaymentsServer::new(..))`). Cheap to clone.
pub struct GrpcIdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St: Store> GrpcIdempotencyLayer<St> {
    /// A layer over `engine`'s store; each method runs under its own policy if its
    /// configuration sets one, else under `engine`'s.
    pub fn new(engine: &Engine<St>, config: GrpcIdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared::new(engine, config)),
        }
    }

    /// The status service (`idem.status.v1.Status/Lookup`) for this layer's methods: a
    /// caller asks what became of one of its keys. Add it to the server to turn it on.
    pub fn status_service(&self) -> crate::proto::status_server::StatusServer<StatusService<St>> {
        crate::proto::status_server::StatusServer::new(StatusService::new(Arc::clone(&self.shared)))
    }
}

impl<St> Clone for GrpcIdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> fmt::Debug for GrpcIdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<&String> = self.shared.methods.keys().collect();
        methods.sort();
        f.debug_struct("GrpcIdempotencyLayer")
            .field("methods", &methods)
            .finish()
    }
}

impl<S, St> Layer<S> for GrpcIdempotencyLayer<St> {
    type Service = GrpcIdempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotency {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
