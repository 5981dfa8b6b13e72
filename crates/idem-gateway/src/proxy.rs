//! Forwarding to the upstream over a pooled hyper client, and the body types the gateway
//! moves around.
//!
//! Upstream failures become answers the idempotency layer can classify by status:
//!
//! | failure | answer | the claim |
//! |---|---|---|
//! | connect error (nothing was sent) | 503 `upstream-unavailable` | released, a retry runs |
//! | timeout after sending | 504 `upstream-timeout` | per `upstream_failure` (`hold` / `retry`) |
//! | reset or broken response after sending | 502 `upstream-failed` | per `upstream_failure` |

use std::convert::Infallible;
use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::metrics::PROBLEM_SLUG;

/// A boxed error.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The body of every response the gateway sends.
pub type ResBody = UnsyncBoxBody<Bytes, BoxError>;

/// A request body: the client's stream, or bytes the idempotency layer already buffered.
#[derive(Debug)]
pub enum ReqBody {
    /// Streamed from the client.
    Incoming(Incoming),
    /// Held in memory.
    Full(Full<Bytes>),
}

impl From<Bytes> for ReqBody {
    fn from(b: Bytes) -> Self {
        Self::Full(Full::new(b))
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Self::Full(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming(b) => b.is_end_stream(),
            Self::Full(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming(b) => b.size_hint(),
            Self::Full(b) => b.size_hint(),
        }
    }
}

/// A complete body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> ResBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A problem+json answer made by the gateway itself, tagged with its slug for metrics.
pub fn problem(
    status: StatusCode,
    slug: &'static str,
    title: &str,
    detail: &str,
    retry_after: Option<u64>,
) -> Response<ResBody> {
    let mut body = serde_json::json!({
        "type": format!("https://idem.dev/problems/{slug}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(s) = retry_after {
        body["retry_after"] = s.into();
    }
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res.headers_mut()
        .insert(PROBLEM_SLUG, HeaderValue::from_static(slug));
    if let Some(s) = retry_after {
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    res
}

/// The pooled upstream client, shared by every route.
pub type HttpClient = Client<HttpConnector, ReqBody>;

/// Builds the pooled client.
pub fn client(connect_timeout: Duration, max_idle: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(max_idle)
        .build(connector)
}

/// Forwards requests to one upstream.
#[derive(Clone, Debug)]
pub struct Proxy {
    inner: Arc<ProxyInner>,
}

#[derive(Debug)]
struct ProxyInner {
    client: HttpClient,
    scheme: Scheme,
    authority: Authority,
    /// `Host` for the upstream, rendered once.
    host: Option<HeaderValue>,
    prefix: String,
    timeout: Duration,
    /// `Some(cap)`: buffer up to `cap` bytes of the response inside the timeout (protected
    /// routes, so a failure mid-body is still classified); `None`: stream it.
    buffer: Option<usize>,
}

/// Hop-by-hop headers a proxy must not forward (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

impl Proxy {
    /// A proxy to `upstream` (its path, if any, prefixes every request path).
    pub fn new(
        client: HttpClient,
        upstream: &Uri,
        timeout: Duration,
        buffer: Option<usize>,
    ) -> anyhow::Result<Self> {
        let scheme = upstream.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = upstream
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("upstream {upstream} has no host"))?;
        let prefix = upstream.path().trim_end_matches('/').to_owned();
        let host = HeaderValue::from_str(authority.as_str()).ok();
        Ok(Self {
            inner: Arc::new(ProxyInner {
                client,
                scheme,
                host,
                authority,
                prefix,
                timeout,
                buffer,
            }),
        })
    }

    /// Forwards one request; every failure becomes a problem answer, never an `Err`.
    pub async fn forward(&self, req: Request<ReqBody>) -> Response<ResBody> {
        let p = &*self.inner;
        let (mut parts, body) = req.into_parts();
        let Some(uri) = p.target(&parts.uri) else {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad-request-target",
                "Bad request target",
                "unusable path",
                None,
            );
        };
        strip_hop_by_hop(&mut parts.headers);
        if let Some(host) = parts.headers.remove(header::HOST).or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        }) {
            parts.headers.insert(X_FORWARDED_HOST, host);
        }
        parts
            .headers
            .insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        if let Some(host) = &p.host {
            parts.headers.insert(header::HOST, host.clone());
        }
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let req = Request::from_parts(parts, body);

        let exchange = async {
            let res = p.client.request(req).await.map_err(Failure::from_client)?;
            let (mut head, body) = res.into_parts();
            strip_hop_by_hop(&mut head.headers);
            let body = match p.buffer {
                Some(cap) => buffer(body, cap)
                    .await
                    .map_err(|e| Failure::Reset(e.to_string()))?,
                None => body.map_err(Into::into).boxed_unsync(),
            };
            Ok::<_, Failure>(Response::from_parts(head, body))
        };
        let failure = match tokio::time::timeout(p.timeout, exchange).await {
            Ok(Ok(res)) => return res,
            Ok(Err(f)) => f,
            Err(_) => Failure::Timeout,
        };
        metrics::counter!("idem_upstream_failures_total", "kind" => failure.kind()).increment(1);
        tracing::warn!(upstream = %p.authority, failure = %failure.detail(), "upstream failed");
        failure.into_response(p.timeout)
    }
}

const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

impl ProxyInner {
    /// The upstream URI for a request to `uri`: the upstream's scheme and authority, its path
    /// prefix, then the request's path and query. `None` if that is not a valid URI.
    fn target(&self, uri: &Uri) -> Option<Uri> {
        let path_and_query = match uri.path_and_query() {
            // No prefix: the request's own path and query, shared rather than re-parsed.
            Some(pq) if self.prefix.is_empty() => pq.clone(),
            pq => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                PathAndQuery::try_from(format!("{}{}", self.prefix, pq)).ok()?
            }
        };
        let mut target = http::uri::Parts::default();
        target.scheme = Some(self.scheme.clone());
        target.authority = Some(self.authority.clone());
        target.path_and_query = Some(path_and_query);
        Uri::from_parts(target).ok()
    }
}

impl tower::Service<Request<ReqBody>> for Proxy {
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<ResBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    // Most messages carry none of these: one pass over the names instead of a lookup each.
    let any = headers
        .keys()
        .any(|n| n == header::TRANSFER_ENCODING || HOP_BY_HOP.contains(n));
    if !any {
        return;
    }
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
    // Transfer-Encoding is framing: hyper sets its own.
    headers.remove(header::TRANSFER_ENCODING);
}

/// Reads up to `cap` bytes of `body`. A body that ends within the cap comes back whole (exact
/// size); a longer one comes back as the prefix followed by the rest of the stream.
/// A body that arrives in one chunk (the usual case) is kept as that chunk, without a copy.
async fn buffer(mut body: Incoming, cap: usize) -> Result<ResBody, hyper::Error> {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Ok(full(first.unwrap_or_else(|| buf.freeze()))),
            Some(frame) => {
                let frame = frame?;
                if let Ok(data) = frame.into_data() {
                    if first.is_none() && buf.is_empty() {
                        first = Some(data);
                    } else {
                        if let Some(f) = first.take() {
                            buf.extend_from_slice(&f);
                        }
                        buf.extend_from_slice(&data);
                    }
                    let len = first.as_ref().map_or(buf.len(), Bytes::len);
                    if len > cap {
                        let prefix = first.take().unwrap_or_else(|| buf.freeze());
                        let rest = body.map_err(BoxError::from);
                        let chained = Prefixed {
                            prefix: Some(prefix),
                            rest,
                        };
                        return Ok(chained.boxed_unsync());
                    }
                }
            }
        }
    }
}

/// A buffered prefix, then the rest of a stream.
struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: B,
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Body for Prefixed<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(p) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }
}

enum Failure {
    Connect(String),
    Timeout,
    Reset(String),
}

impl Failure {
    fn from_client(e: hyper_util::client::legacy::Error) -> Self {
        let detail = match e.source() {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        };
        if e.is_connect() {
            Self::Connect(detail)
        } else {
            Self::Reset(detail)
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Timeout => "timeout",
            Self::Reset(_) => "reset",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::Connect(d) | Self::Reset(d) => d.clone(),
            Self::Timeout => "timed out".into(),
        }
    }

    fn into_response(self, timeout: Duration) -> Response<ResBody> {
        match self {
            Self::Connect(_) => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream-unavailable",
                "Upstream unavailable",
                "the upstream could not be reached; nothing was sent, so a retry is safe",
                Some(1),
            ),
            Self::Timeout => problem(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
                &format!("the upstream did not answer within {timeout:?}; its outcome is unknown"),
                None,
            ),
            Self::Reset(_) => problem(
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream failed",
                "the upstream connection failed after the request was sent; its outcome is unknown",
                None,
            ),
        }
    }
}
