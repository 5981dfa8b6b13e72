//! The body types the gateway moves around: what the proxy answers, the one boxed body every
//! listener serves, and the problem+json answers the gateway makes itself.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use idem_http::{BoxError, Problem, ResponseBody};

/// The body of every response the gateway sends.
pub(crate) type ResBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the proxy answers: the upstream's body (held whole, or streamed after a buffered
/// prefix), or bytes the gateway holds (a problem).
pub(crate) type Upstream = Response<ResponseBody<UpstreamBody>>;

/// An upstream's response body as the proxy hands it on: held whole in memory (data and
/// trailers, exact size) or streamed from the connection after an optional prefix.
#[derive(Debug)]
pub enum UpstreamBody {
    /// The whole body, read inside the upstream timeout.
    Held {
        /// The data, if any is left to send.
        data: Option<Bytes>,
        /// The trailers, if the upstream sent any and they are left to send.
        trailers: Option<http::HeaderMap>,
    },
    /// Bytes already read, then the rest of the upstream's body (its trailers included).
    Streaming {
        /// Bytes already read.
        prefix: Option<Bytes>,
        /// The rest.
        body: Incoming,
    },
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Held { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(http_body::Frame::data(d))),
                None => trailers.take().map(|t| Ok(http_body::Frame::trailers(t))),
            }),
            Self::Streaming { prefix, body } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(http_body::Frame::data(p)))),
                None => Pin::new(body).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Held { data, trailers } => data.is_none() && trailers.is_none(),
            Self::Streaming { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Held { data, .. } => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Self::Streaming { prefix, body } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let h = body.size_hint();
                let mut out = http_body::SizeHint::new();
                out.set_lower(h.lower().saturating_add(extra));
                if let Some(u) = h.upper() {
                    out.set_upper(u.saturating_add(extra));
                }
                out
            }
        }
    }
}

impl UpstreamBody {
    pub(crate) fn streaming(body: Incoming) -> Self {
        Self::Streaming { prefix: None, body }
    }
}

/// A problem+json answer made by the gateway itself.
pub(crate) fn problem(problem: Problem) -> Upstream {
    problem.into_response()
}

/// Boxes any answer into the one body type the listener serves.
pub(crate) fn boxed<B>(res: Response<ResponseBody<B>>) -> Response<ResBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    res.map(BodyExt::boxed_unsync)
}
