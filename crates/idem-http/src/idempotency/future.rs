//! [`ResponseFuture`]: the future returned by [`Idempotency`](super::Idempotency).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::Response;

use crate::body::ResponseBody;

/// Response future of [`Idempotency`](super::Idempotency).
///
/// # Cancel safety
/// Protected requests run in a spawned task: dropping this future (the client went away)
/// does not cancel the handler, whose outcome is still recorded or released per policy.
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new(
        fut: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(fut),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
