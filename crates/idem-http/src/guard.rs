//! [`RunGuard`]: something a request carries that the layer keeps alive until the request's
//! run is over, including when the run finishes in the background after its client left.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A value kept alive for as long as the protected run of the request carrying it lasts.
///
/// Put one in a request's extensions (`req.extensions_mut().insert(guard)`) and the layer
/// takes it out and holds it until the run is settled. A run whose client went away goes on
/// in a spawned task (see [`ResponseFuture`](crate::ResponseFuture)); the guard goes with
/// it. A server's concurrency permit held this way keeps counting that run: without it, a
/// client that abandons its requests could have any number of them running at once.
///
/// Clones share one value, which is dropped with the last clone; so a server can keep a
/// clone for its own part of the request and hand another to the layer.
#[derive(Clone)]
pub struct RunGuard {
    /// Never read: it is here to be dropped last.
    _held: Arc<dyn Any + Send + Sync>,
}

impl RunGuard {
    /// A guard holding `value` until its last clone is dropped.
    pub fn new(value: impl Any + Send + Sync) -> Self {
        Self {
            _held: Arc::new(value),
        }
    }
}

impl fmt::Debug for RunGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunGuard").finish_non_exhaustive()
    }
}
