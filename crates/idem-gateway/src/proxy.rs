//! Forwarding to the upstream over a pooled hyper client.
//!
//! Upstream failures become answers the idempotency layer can classify by status:
//!
//! | failure | answer | the claim |
//! |---|---|---|
//! | connect error (nothing was sent) | 503 `upstream-unavailable` | released, a retry runs |
//! | TLS handshake failed (nothing was sent) | 502 `upstream-tls` | released, a retry runs |
//! | timeout after sending | 504 `upstream-timeout` | per `upstream_failure` (`hold` / `retry`) |
//! | reset or broken response after sending | 502 `upstream-failed` | per `upstream_failure` |

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_http::{BoxError, Problem, Reason, RequestBody, ResponseBody};

use crate::body::{ResBody, Upstream, UpstreamBody, boxed, problem};
pub(crate) use crate::upstream::HttpClient;
use crate::upstream::{ConnectError, UpstreamSpec};

/// An HTTP/1.x client that accepts trailers (`TE: trailers`), whose answers may need
/// preparing: HTTP/1.1 carries trailers only after a chunked body, and only the fields the
/// `Trailer` header announces. HTTP/2 clients need none of this.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrailerClient(bool);

impl TrailerClient {
    /// Whether the request's client is one.
    pub(crate) fn of(parts: &http::request::Parts) -> Self {
        let accepts = parts.version < http::Version::HTTP_2
            && parts
                .headers
                .get_all(header::TE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
        Self(accepts)
    }

    /// An answer that announces trailers (an upstream's, streamed or held) gets its body's
    /// length hidden from the connection, which then chunks it. An answer held in memory of at
    /// most `held_cap` bytes (stored or replayed: the idempotency layer never replays
    /// `Trailer`) is read here, and trailers it ends with are announced.
    pub(crate) async fn prepare(
        self,
        res: Response<ResBody>,
        held_cap: usize,
    ) -> Response<ResBody> {
        if !self.0 {
            return res;
        }
        let (mut head, body) = res.into_parts();
        if head.headers.contains_key(header::TRAILER) {
            head.headers.remove(header::CONTENT_LENGTH);
            return Response::from_parts(head, UnsizedBody { inner: body }.boxed_unsync());
        }
        let in_memory = http_body::Body::size_hint(&body)
            .exact()
            .is_some_and(|n| n <= held_cap as u64);
        if !in_memory {
            return Response::from_parts(head, body);
        }
        // Held in memory: reading it costs no wait.
        let collected = match body.collect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "held answer unreadable");
                return boxed(problem(Problem::new(
                    Reason::AnswerUnreadable,
                    "the gateway could not read the answer it holds",
                )));
            }
        };
        let trailers = collected.trailers().cloned().filter(|t| !t.is_empty());
        let data = collected.to_bytes();
        let Some(trailers) = trailers else {
            return Response::from_parts(head, ResponseBody::<UpstreamBody>::full(data))
                .map(BodyExt::boxed_unsync);
        };
        let mut names: Vec<&str> = trailers.keys().map(HeaderName::as_str).collect();
        names.dedup();
        if let Ok(v) = HeaderValue::from_str(&names.join(", ")) {
            head.headers.insert(header::TRAILER, v);
        }
        head.headers.remove(header::CONTENT_LENGTH);
        let body = UpstreamBody::Held {
            data: (!data.is_empty()).then_some(data),
            trailers: Some(trailers),
        };
        let body = UnsizedBody {
            inner: body.map_err(BoxError::from),
        };
        Response::from_parts(head, body.boxed_unsync())
    }
}

pin_project_lite::pin_project! {
    /// A body whose length is not told to the connection.
    struct UnsizedBody<B> {
        #[pin]
        inner: B,
    }
}

impl<B: http_body::Body> http_body::Body for UnsizedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
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
    /// Speak HTTP/2 to the upstream.
    http2: bool,
    timeout: Duration,
    /// `Some(cap)`: buffer up to `cap` bytes of the response inside the timeout (protected
    /// routes, so a failure mid-body is still classified); `None`: stream it.
    buffer: Option<usize>,
    /// Protected routes: the header the claim's fence is forwarded in, and whether the
    /// claim's key goes in `Idempotency-Key` too.
    fence_header: Option<(HeaderName, bool)>,
}

/// Sets the claim's key and fence on a forwarded request (after the hop-by-hop strip, which
/// spares them anyway); removes any the client sent when the request runs under no claim.
fn claim_headers(parts: &mut http::request::Parts, fence: &HeaderName, key: bool) {
    match parts.extensions.get::<idem_core::Lease>() {
        Some(lease) => {
            parts
                .headers
                .insert(fence.clone(), HeaderValue::from(lease.fence));
        }
        None => {
            parts.headers.remove(fence);
        }
    }
    if !key {
        return;
    }
    // A key is printable ASCII, always a valid header value.
    let value = parts
        .extensions
        .get::<idem_core::Key>()
        .and_then(|k| HeaderValue::from_str(k.as_str()).ok());
    if let Some(value) = value {
        parts.headers.insert(idem_http::IDEMPOTENCY_KEY, value);
    }
}

/// Hop-by-hop headers a proxy must not forward (RFC 9110 §7.6.1). `Trailer` is not one of
/// them: it announces end-to-end trailer fields, and is forwarded with them.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::UPGRADE,
];

impl Proxy {
    /// A proxy to `upstream` (its path, if any, prefixes every request path).
    pub fn new(
        client: HttpClient,
        upstream: &UpstreamSpec,
        timeout: Duration,
        buffer: Option<usize>,
    ) -> anyhow::Result<Self> {
        let http2 = upstream.http2;
        let upstream = &upstream.uri;
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
                http2,
                timeout,
                buffer,
                fence_header: None,
            }),
        })
    }

    /// The same proxy, forwarding the claim a protected request runs under: its fence in
    /// `name` and, with `key`, its key in `Idempotency-Key`, so the upstream can refuse a
    /// stale or second effect. Whatever the client sent in the fence header is replaced (or
    /// removed, on a request that runs under no claim). A token route forwards no key: its
    /// record key is a digest of the token, which the upstream has no use for.
    #[must_use]
    pub fn with_fence_header(mut self, name: HeaderName, key: bool) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.fence_header = Some((name, key));
        }
        self
    }

    /// Forwards one request; every failure becomes a problem answer, never an `Err`.
    pub async fn forward(&self, req: Request<RequestBody>) -> Upstream {
        let p = &*self.inner;
        let (mut parts, body) = req.into_parts();
        let Some(uri) = p.target(&parts.uri) else {
            return problem(Problem::new(Reason::BadRequestTarget, "unusable path"));
        };
        // An unprotected route passes an HTTP/1.1 protocol upgrade (WebSocket and the like)
        // through: the upgrade headers go to the upstream, and after its `101` the client's
        // connection and the upstream's are joined byte for byte (see [`crate::tunnel`]).
        let upgrade = if p.buffer.is_none() && !p.http2 {
            crate::tunnel::take(&mut parts)
        } else {
            None
        };
        let fence = p.fence_header.as_ref().map(|(name, _)| name);
        strip_hop_by_hop(&mut parts.headers, |n| gateway_owned(n, fence));
        if let Some((name, key)) = &p.fence_header {
            claim_headers(&mut parts, name, *key);
        }
        p.forwarded_headers(&mut parts, upgrade.as_ref().map(|u| &u.protocol));
        parts.uri = uri;
        // The client's HTTP version is the gateway's business with the client; the upstream
        // gets the version its client speaks (HTTP/1.1, or HTTP/2 when configured), and the
        // client gets its answer in its own version.
        let client_version = parts.version;
        // A protected gRPC call's record follows its `grpc-status` (see [`crate::grpc`]).
        let grpc = p.buffer.is_some() && idem_wire::header::is_grpc(&parts.headers);
        parts.version = if p.http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        let req = Request::from_parts(parts, body);

        let exchange = async {
            let mut res = p.client.request(req).await.map_err(Failure::from_client)?;
            let switched = match upgrade {
                Some(upgrade) if res.status() == StatusCode::SWITCHING_PROTOCOLS => {
                    let upstream_side = hyper::upgrade::on(&mut res);
                    tokio::spawn(upgrade.tunnel(upstream_side));
                    res.headers().get(header::UPGRADE).cloned()
                }
                _ => None,
            };
            let (mut head, body) = res.into_parts();
            strip_hop_by_hop(&mut head.headers, |_| false);
            if let Some(protocol) = switched {
                head.headers
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                head.headers.insert(header::UPGRADE, protocol);
            }
            head.version = client_version;
            let body = match p.buffer {
                Some(cap) => buffer(body, cap)
                    .await
                    .map_err(|e| Failure::Reset(e.to_string()))?,
                None => UpstreamBody::streaming(body),
            };
            if grpc && head.status == StatusCode::OK {
                let trailers = match &body {
                    UpstreamBody::Held { trailers, .. } => trailers.as_ref(),
                    UpstreamBody::Streaming { .. } => None,
                };
                // The idempotency layer decides before it reads the body; the code in the
                // trailers held here is its typed note of what the call answered.
                if let Some(code) = idem_wire::GrpcCode::of_answer(&head.headers, trailers) {
                    head.extensions.insert(code);
                }
            }
            let body = ResponseBody::inner(body);
            Ok::<_, Failure>(Response::from_parts(head, body))
        };
        let failure = match tokio::time::timeout(p.timeout, exchange).await {
            Ok(Ok(res)) => return res,
            Ok(Err(f)) => f,
            Err(_) => Failure::Timeout,
        };
        metrics::counter!("idem_upstream_failures_total", "kind" => failure.kind()).increment(1);
        tracing::warn!(upstream = %p.authority, failure = %failure.detail(), "upstream failed");
        // Protected routes: the store policy releases a TLS failure (nothing reached the
        // upstream) by the reason the problem carries, where another 502 may be held.
        failure.into_response(p.timeout)
    }
}

const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

impl ProxyInner {
    /// The headers the upstream gets beside the client's: the upgrade asked for (on an
    /// unprotected HTTP/1.1 route), `X-Forwarded-Host` and `-Proto`, the configured `Host`,
    /// and `TE: trailers`.
    fn forwarded_headers(&self, parts: &mut http::request::Parts, upgrade: Option<&HeaderValue>) {
        if let Some(protocol) = upgrade {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol.clone());
        }
        if let Some(host) = parts.headers.remove(header::HOST).or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        }) {
            parts.headers.insert(X_FORWARDED_HOST, host);
        }
        // The data plane set it from the client's connection; other callers reach the
        // upstream as plain HTTP clients.
        if !parts.headers.contains_key(X_FORWARDED_PROTO) {
            parts
                .headers
                .insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        }
        if let Some(host) = &self.host {
            parts.headers.insert(header::HOST, host.clone());
        }
        // The gateway takes trailers whatever its client accepts: a protected route stores
        // them for every later replay, and an HTTP/2 upstream (gRPC) expects this.
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }

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

/// A `tower::Service` for a cloneable type whose `forward(req)` answers every request (a
/// failure is an answer too, so the service never fails and is always ready).
macro_rules! forwarding_service {
    ($t:ty) => {
        impl tower::Service<http::Request<idem_http::RequestBody>> for $t {
            type Response = $crate::body::Upstream;
            type Error = std::convert::Infallible;
            type Future =
                std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

            fn poll_ready(
                &mut self,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                std::task::Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: http::Request<idem_http::RequestBody>) -> Self::Future {
                let this = self.clone();
                Box::pin(async move { Ok(this.forward(req).await) })
            }
        }
    };
}
pub(crate) use forwarding_service;

forwarding_service!(Proxy);

/// The headers a message's `Connection` header names.
fn connection_named(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Takes the gateway's own headers out of a client's `Connection` header, as the request
/// arrives and before the gateway sets any of them, so naming one there can never remove
/// the value the gateway sets. A client that names `X-Forwarded-For` said its copy is for
/// the gateway alone: that copy is dropped, and the gateway's list starts at the client.
/// The other headers it names stay hop-by-hop: the gateway may read them (a key header), the
/// proxy does not forward them.
pub(crate) fn strip_client_connection(headers: &mut http::HeaderMap, request_id: &HeaderName) {
    if !headers.contains_key(header::CONNECTION) {
        return;
    }
    let named = connection_named(headers);
    let owned = |n: &HeaderName| gateway_owned(n, None) || n == request_id;
    if !named.iter().any(owned) {
        return;
    }
    if named.contains(&X_FORWARDED_FOR) {
        headers.remove(X_FORWARDED_FOR);
    }
    let rest: Vec<&str> = named
        .iter()
        .filter(|n| !owned(n))
        .map(HeaderName::as_str)
        .collect();
    match HeaderValue::from_str(&rest.join(", ")) {
        Ok(v) if !rest.is_empty() => {
            headers.insert(header::CONNECTION, v);
        }
        _ => {
            headers.remove(header::CONNECTION);
        }
    }
}

/// The headers the gateway sets on a forwarded request. A `Connection` header never removes
/// them, whoever wrote it: [`strip_client_connection`] already dropped the client's copies.
fn gateway_owned(name: &HeaderName, fence: Option<&HeaderName>) -> bool {
    name == X_FORWARDED_FOR
        || name == X_FORWARDED_HOST
        || name == X_FORWARDED_PROTO
        || name == idem_http::X_REQUEST_ID
        || name == idem_http::IDEMPOTENCY_KEY
        || fence.is_some_and(|f| f == name)
}

/// Removes hop-by-hop headers: the standard ones and those named in `Connection`, except the
/// gateway's own (`keep`) on a request.
fn strip_hop_by_hop(headers: &mut http::HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    // Most messages carry none of these: one pass over the names instead of a lookup each.
    let any = headers
        .keys()
        .any(|n| n == header::TRANSFER_ENCODING || HOP_BY_HOP.contains(n));
    if !any {
        return;
    }
    // Headers named in `Connection` are hop-by-hop too.
    let named = connection_named(headers);
    for name in HOP_BY_HOP.iter().chain(named.iter().filter(|n| !keep(n))) {
        headers.remove(name);
    }
    // Transfer-Encoding is framing: hyper sets its own.
    headers.remove(header::TRANSFER_ENCODING);
}

/// Reads up to `cap` bytes of `body`. A body that ends within the cap comes back whole
/// (exact size, with its trailers); a longer one comes back as the prefix followed by the
/// rest of the stream. A body that arrives in one chunk (the usual case) is kept as that
/// chunk, without a copy.
async fn buffer(mut body: Incoming, cap: usize) -> Result<UpstreamBody, hyper::Error> {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut trailers: Option<http::HeaderMap> = None;
    loop {
        let Some(frame) = body.frame().await else {
            let data = first.unwrap_or_else(|| buf.freeze());
            return Ok(UpstreamBody::Held {
                data: (!data.is_empty()).then_some(data),
                trailers,
            });
        };
        let data = match frame?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
                continue;
            }
        };
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
            return Ok(UpstreamBody::Streaming {
                prefix: Some(prefix),
                body,
            });
        }
    }
}

enum Failure {
    Connect(String),
    Tls(String),
    Timeout,
    Reset(String),
}

impl Failure {
    fn from_client(e: hyper_util::client::legacy::Error) -> Self {
        let detail = match e.source() {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        };
        let tls = e
            .source()
            .and_then(|s| s.downcast_ref::<ConnectError>())
            .is_some_and(|c| matches!(c, ConnectError::Tls(_)));
        if tls {
            Self::Tls(detail)
        } else if e.is_connect() {
            Self::Connect(detail)
        } else {
            Self::Reset(detail)
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Tls(_) => "tls",
            Self::Timeout => "timeout",
            Self::Reset(_) => "reset",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::Connect(d) | Self::Tls(d) | Self::Reset(d) => d.clone(),
            Self::Timeout => "timed out".into(),
        }
    }

    fn into_response(self, timeout: Duration) -> Upstream {
        problem(match self {
            Self::Connect(_) => Problem::new(
                Reason::UpstreamUnavailable,
                "the upstream could not be reached; nothing was sent, so a retry is safe",
            )
            .retry_after(Duration::from_secs(1)),
            Self::Timeout => Problem::new(
                Reason::UpstreamTimeout,
                format!("the upstream did not answer within {timeout:?}; its outcome is unknown"),
            ),
            Self::Tls(_) => Problem::new(
                Reason::UpstreamTls,
                "the upstream's certificate was not accepted (or it refused the gateway's); \
                 nothing was sent, so a retry is safe once the TLS settings are fixed",
            ),
            Self::Reset(_) => Problem::new(
                Reason::UpstreamFailed,
                "the upstream connection failed after the request was sent; its outcome is unknown",
            ),
        })
    }
}
