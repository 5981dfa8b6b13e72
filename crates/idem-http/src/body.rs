//! The response body the layer returns: the inner service's own body (passed through,
//! possibly after a buffered prefix) or bytes and trailers the layer holds (replays,
//! problems, buffered answers).

use std::error::Error as StdError;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

/// A boxed error, as bodies report them.
pub type BoxError = Box<dyn StdError + Send + Sync>;

pin_project_lite::pin_project! {
    /// The body of every response from [`Idempotency`](crate::Idempotency).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Full { bytes: Option<Bytes>, trailers: Option<HeaderMap> },
        Inner { prefix: Option<Bytes>, #[pin] inner: B },
    }
}

impl<B> ResponseBody<B> {
    /// A complete body held in memory.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::full_with_trailers(bytes, HeaderMap::new())
    }

    /// A complete body held in memory, then `trailers` (none sent when empty).
    pub fn full_with_trailers(bytes: impl Into<Bytes>, trailers: HeaderMap) -> Self {
        let bytes: Bytes = bytes.into();
        Self {
            kind: Kind::Full {
                bytes: (!bytes.is_empty()).then_some(bytes),
                trailers: (!trailers.is_empty()).then_some(trailers),
            },
        }
    }

    /// The inner service's body, passed through untouched.
    pub fn inner(inner: B) -> Self {
        Self {
            kind: Kind::Inner {
                prefix: None,
                inner,
            },
        }
    }

    /// Bytes already read from `inner`, then the rest of it.
    pub fn prefixed(prefix: Bytes, inner: B) -> Self {
        Self {
            kind: Kind::Inner {
                prefix: (!prefix.is_empty()).then_some(prefix),
                inner,
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { bytes, trailers } => Poll::Ready(
                bytes
                    .take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            KindProj::Inner { prefix, inner } => {
                if let Some(p) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                inner
                    .poll_frame(cx)
                    .map(|f| f.map(|r| r.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { bytes, trailers } => bytes.is_none() && trailers.is_none(),
            Kind::Inner { prefix, inner } => prefix.is_none() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { bytes, .. } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Inner { prefix, inner } => {
                let extra = prefix.as_ref().map_or(0, |b| b.len() as u64);
                let h = inner.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower().saturating_add(extra));
                if let Some(u) = h.upper() {
                    out.set_upper(u.saturating_add(extra));
                }
                out
            }
        }
    }
}

/// A request body the layer can rebuild from buffered bytes: wrap a server's body in it
/// (`req.map(RequestBody::new)`) to use the layer on a plain hyper stack, whose `Incoming`
/// body cannot be built from bytes. axum's `Body` already can.
#[derive(Debug)]
pub struct RequestBody {
    inner: UnsyncBoxBody<Bytes, BoxError>,
}

impl RequestBody {
    /// Wraps any body.
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self {
            inner: body.map_err(Into::into).boxed_unsync(),
        }
    }
}

impl From<Bytes> for RequestBody {
    fn from(bytes: Bytes) -> Self {
        Self::new(http_body_util::Full::new(bytes))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
