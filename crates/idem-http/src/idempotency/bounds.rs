//! What the layers ask of the service they wrap and of its bodies, named once. Each trait is
//! implemented for every type that meets its bounds, so it is only a name for them: a service
//! or body that met the written-out bounds meets these.

use bytes::Bytes;
use http::Request;
use http_body::Body;
use tower::Service;

use crate::body::BoxError;

/// A service the layers can wrap: it answers `Request<ReqB>`, and its futures and errors may
/// move to the task that finishes a run after its client left. Bounds name its response as
/// `Wrapped<ReqB, Response = Response<ResB>>`.
pub trait Wrapped<ReqB>:
    Service<Request<ReqB>, Future: Send + 'static, Error: Send + 'static>
{
}

impl<S, ReqB> Wrapped<ReqB> for S where
    S: Service<Request<ReqB>, Future: Send + 'static, Error: Send + 'static>
{
}

/// A request body the HTTP layer can read and then rebuild from the bytes it read (axum's
/// `Body`, or [`RequestBody`](crate::RequestBody) around any other).
pub trait IncomingBody:
    Body<Data: Send, Error: Into<BoxError>> + From<Bytes> + Send + 'static
{
}

impl<B> IncomingBody for B where
    B: Body<Data: Send, Error: Into<BoxError>> + From<Bytes> + Send + 'static
{
}

/// A response body the layers can stream to the client while they keep a copy for replay.
pub trait ServiceBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B> ServiceBody for B where B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{}

/// The part of a layer's `Service` impl that every layer writes the same: its answers are the
/// wrapped service's (`S`, in a field `inner`) behind [`ResponseBody`](crate::ResponseBody),
/// its errors are `S`'s, and it is ready when `S` is.
#[doc(hidden)]
#[macro_export]
macro_rules! __layer_service_items {
    ($res_body:ty) => {
        type Response = ::http::Response<$crate::ResponseBody<$res_body>>;
        type Error = S::Error;
        type Future = $crate::ResponseFuture<$res_body, S::Error>;

        fn poll_ready(
            &mut self,
            cx: &mut ::std::task::Context<'_>,
        ) -> ::std::task::Poll<::std::result::Result<(), Self::Error>> {
            ::tower::Service::poll_ready(&mut self.inner, cx)
        }
    };
}

/// Takes the service that was driven to readiness out of `slot` and leaves a clone for the
/// next call (tower's rule: the clone may not be ready yet).
#[doc(hidden)]
pub fn take_ready<S: Clone>(slot: &mut S) -> S {
    let clone = slot.clone();
    std::mem::replace(slot, clone)
}
