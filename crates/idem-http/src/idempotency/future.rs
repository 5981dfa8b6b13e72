//! [`ResponseFuture`]: the future returned by [`Idempotency`](super::Idempotency).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::Response;

use idem_core::Outcome;

use crate::body::ResponseBody;

/// Response future of [`Idempotency`](super::Idempotency).
///
/// # Cancel safety
/// A protected request runs inline, in the caller's task, while it is polled. If this
/// future is dropped before it finishes (the client went away), the rest of the run is
/// handed to a spawned task: the handler is not cancelled, and its outcome is still recorded
/// or released per policy, so no lease is orphaned. (Running inline and detaching only on
/// drop spares the common path a task spawn and a cross-thread wake-up.)
pub struct ResponseFuture<B: 'static, E: 'static> {
    inner: Option<BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>>,
    detach_on_drop: bool,
}

impl<B: 'static, E: 'static> ResponseFuture<B, E> {
    /// A future that may simply be dropped (nothing claimed).
    pub fn new(
        fut: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Some(Box::pin(fut)),
            detach_on_drop: false,
        }
    }

    /// A future that must run to completion even if its caller goes away: dropped before it
    /// finishes, the rest of it runs on a spawned task. Other carriers built on this crate
    /// (the gRPC layer) use it for the same guarantee.
    pub fn detached_on_drop(
        fut: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Some(Box::pin(fut)),
            detach_on_drop: true,
        }
    }

    /// The inner service's response, unprotected, marked [`Outcome::Passthrough`]: what every
    /// carrier answers for a request it does not protect.
    pub fn passthrough(fut: impl Future<Output = Result<Response<B>, E>> + Send + 'static) -> Self
    where
        B: Send,
        E: Send,
    {
        Self::new(async move {
            let res = fut.await?.map(ResponseBody::inner);
            Ok(super::with_outcome(res, Outcome::Passthrough))
        })
    }
}

impl<B: 'static, E: 'static> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(fut) = self.inner.as_mut() else {
            panic!("ResponseFuture polled after completion");
        };
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            self.inner = None;
        }
        out
    }
}

impl<B: 'static, E: 'static> Drop for ResponseFuture<B, E> {
    fn drop(&mut self) {
        let Some(rest) = self.inner.take() else {
            return;
        };
        if !self.detach_on_drop {
            return;
        }
        // Type-erase the output so the spawned task is `'static + Send` whatever `B`/`E` are.
        let rest: BoxFuture<'static, ()> = Box::pin(async move {
            let _ = rest.await;
        });
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                tracing::debug!(
                    "client went away mid-request; finishing the run in the background"
                );
                runtime.spawn(rest);
            }
            Err(_) => tracing::error!(
                "response dropped outside a runtime; the run is abandoned and its lease released"
            ),
        }
    }
}

impl<B: 'static, E: 'static> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("detach_on_drop", &self.detach_on_drop)
            .finish_non_exhaustive()
    }
}
