//! The gRPC client: [`GrpcRetryLayer`], a tower layer for a tonic `Channel` (or any gRPC
//! client service) that gives every unary call one idempotency key and the shared retry
//! policy. Use it under a generated client:
//!
//! ```text
//! let channel = tower::ServiceBuilder::new()
//!     .layer(GrpcRetryLayer::new(RetryPolicy::default()))
//!     .service(channel);
//! let mut payments = PaymentsClient::new(channel);
//! ```
//!
//! Each call is one logical operation: its key is the `idempotency-key` metadata the caller
//! set, or a UUID v7 made for the call, and every attempt sends it, with the call's
//! `x-request-id` and `traceparent` (made once when absent) and a `grpc-timeout` of what is
//! left of the operation's deadline: the policy's, or the call's own (`Request::set_timeout`)
//! when that is shorter. The request message is buffered, so only unary calls
//! (and server-streaming calls whose answer fits in memory) belong behind the layer.
//!
//! The attempt timeout is how long the layer waits for one attempt's answer, not the
//! server's deadline: past it the layer asks the status service, and a slow handler that is
//! left to finish is found completed there. Sending the attempt timeout as the deadline
//! would have the server cancel every slow run when the attempt gives up, so a handler
//! slower than the attempt timeout would never finish.
//!
//! Classification follows the one table in [`crate::decide`]. What idem answered itself is
//! read from its `ErrorInfo` (domain `idem.dev`), the same from idem-grpc's layer and from
//! the idem gateway ([`idem_wire::grpc::LayerDetails`]): reason `OUTCOME_UNKNOWN` stops, `IN_FLIGHT`
//! is waited out. `UNAVAILABLE`, and `ABORTED` or `RESOURCE_EXHAUSTED` with a `RetryInfo`,
//! are retried after the server's delay; a transport failure after sending, a broken answer,
//! `DEADLINE_EXCEEDED` and `CANCELLED` are ambiguous and asked about ([`StatusLookup`]); a
//! replay (`idempotent-replayed: true`) and every other status are the answer.
//!
//! When the operation ends without an answer, the call fails with a `tonic::Status` whose
//! source is the [`ClientError`] (`status.source()`, downcast).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt as _;
use idem_wire::Reason;
use idem_wire::grpc::LayerDetails;
use idem_wire::header::{GRPC_TIMEOUT, IDEMPOTENT_REPLAYED as REPLAYED};
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;
use tower::{Layer, Service, ServiceExt as _};

use crate::decide::{Attempt, KeyState, Later};
use crate::error::ClientError;
use crate::ids::{Ids, key_header_value};
use crate::policy::RetryPolicy;
use crate::retry;

/// A boxed error, as tower services return them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The idempotency key metadata.
pub const IDEMPOTENCY_KEY: HeaderName = idem_wire::header::IDEMPOTENCY_KEY;

/// Asks what became of a key after an ambiguous failure.
pub trait StatusLookup: Clone + Send + Sync + 'static {
    /// The state of `key` of the method at `path` (`/pkg.Service/Method`), asked with the
    /// call's own `metadata` (its credentials scope the key); a completed key comes with its
    /// stored answer as a response the caller's generated client can decode. `Ok(None)`:
    /// there is no status service to ask.
    fn lookup(
        &self,
        path: String,
        key: String,
        metadata: HeaderMap,
        timeout: Duration,
    ) -> LookupFuture;
}

/// What [`StatusLookup::lookup`] returns.
pub type LookupFuture =
    Pin<Box<dyn Future<Output = Result<Option<KeyState<GrpcAnswer>>, ClientError>> + Send>>;

/// No status service: an ambiguous failure ends the call with [`ClientError::Ambiguous`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStatus;

impl StatusLookup for NoStatus {
    fn lookup(&self, _: String, _: String, _: HeaderMap, _: Duration) -> LookupFuture {
        Box::pin(async { Ok(None) })
    }
}

/// One whole gRPC answer: head, message bytes (framed as received) and trailers.
pub struct GrpcAnswer {
    head: http::response::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
    status: Option<Status>,
}

impl fmt::Debug for GrpcAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcAnswer")
            .field("code", &self.status.as_ref().map(Status::code))
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for GrpcAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            Some(s) => write!(f, "gRPC {:?}", s.code()),
            None => f.write_str("gRPC answer without a status"),
        }
    }
}

/// The status in `headers`. A `grpc-status-details-bin` that is not base64 (which tonic's
/// `Status::from_header_map` would panic on) is dropped: the answer keeps its code and
/// message, without details.
fn status_from(headers: &HeaderMap) -> Option<Status> {
    use base64::Engine as _;
    const DETAILS: &str = "grpc-status-details-bin";
    // tonic's own reading of the field: the standard alphabet, padding optional.
    const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match headers.get(DETAILS) {
        Some(v) if LENIENT.decode(v.as_bytes()).is_err() => {
            let mut clean = headers.clone();
            clean.remove(DETAILS);
            Status::from_header_map(&clean)
        }
        _ => Status::from_header_map(headers),
    }
}

impl GrpcAnswer {
    /// An answer from its parts: the response head, the framed message bytes and the
    /// trailers (`None` for a trailers-only answer, whose status is in the head).
    pub fn new(head: http::response::Parts, body: Bytes, trailers: Option<HeaderMap>) -> Self {
        let status = trailers
            .as_ref()
            .and_then(status_from)
            .or_else(|| status_from(&head.headers));
        Self {
            head,
            body,
            trailers,
            status,
        }
    }

    /// Whether the server replayed a stored answer.
    pub fn replayed(&self) -> bool {
        self.head
            .headers
            .get(REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }

    /// The gRPC status, when the answer carries one.
    pub fn status(&self) -> Option<&Status> {
        self.status.as_ref()
    }

    /// The response head and the body bytes.
    #[cfg(feature = "http")]
    pub(crate) fn parts(&self) -> (&http::response::Parts, &Bytes) {
        (&self.head, &self.body)
    }

    /// The response again, body and trailers as received, for the generated client.
    fn into_response(self) -> Response<Body> {
        let mut frames = vec![Ok::<_, std::convert::Infallible>(http_body::Frame::data(
            self.body,
        ))];
        if let Some(t) = self.trailers {
            frames.push(Ok(http_body::Frame::trailers(t)));
        }
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        Response::from_parts(self.head, Body::new(body))
    }
}

/// One call, as every attempt sends it.
struct OneCall {
    path: String,
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: HeaderMap,
    message: Bytes,
    key: String,
    key_value: HeaderValue,
    ids: Ids,
}

impl OneCall {
    /// The request of one attempt: the key, the ids, and a `grpc-timeout` of `deadline` (what
    /// is left of the operation's deadline).
    fn request(&self, deadline: Duration) -> Request<Body> {
        let mut headers = self.headers.clone();
        headers.insert(IDEMPOTENCY_KEY, self.key_value.clone());
        self.ids.stamp(&mut headers);
        headers.insert(GRPC_TIMEOUT, grpc_timeout(deadline));
        let mut req = Request::new(Body::new(http_body_util::Full::new(self.message.clone())));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = headers;
        req
    }
}

/// What an answer means for the loop.
fn classify(answer: GrpcAnswer) -> Attempt<GrpcAnswer> {
    if answer.replayed() {
        return Attempt::Final(answer);
    }
    let Some(status) = &answer.status else {
        return Attempt::Ambiguous("answer without grpc-status".into());
    };
    // The server's delay, from any `RetryInfo` (idem's, or a service's own); what idem
    // answered itself (idem-grpc's layer or the gateway, one mapping) from its `ErrorInfo`.
    let retry_after = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay);
    let idem = LayerDetails::of(status).and_then(|d| d.reason());
    match (status.code(), idem) {
        (_, Some(Reason::OutcomeUnknown)) => Attempt::OutcomeUnknown(answer),
        (Code::Aborted, Some(Reason::InFlight)) => Attempt::Retryable {
            answer,
            why: Later::InFlight,
            retry_after,
        },
        (Code::Unavailable, _) => Attempt::Retryable {
            answer,
            why: Later::Unavailable,
            retry_after,
        },
        (Code::Aborted, _) if retry_after.is_some() => Attempt::Retryable {
            answer,
            why: Later::InFlight,
            retry_after,
        },
        (Code::ResourceExhausted, _) if retry_after.is_some() => Attempt::Retryable {
            answer,
            why: Later::Throttled,
            retry_after,
        },
        (Code::DeadlineExceeded | Code::Cancelled, _) => {
            Attempt::Ambiguous(format!("server answered {:?}", status.code()))
        }
        _ => Attempt::Final(answer),
    }
}

/// A failure before any answer: safe to retry only when the connection was refused.
fn transport_failure<T>(e: &(dyn std::error::Error + 'static)) -> Attempt<T> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return Attempt::NotSent(format!("connect failed: {e}"));
        }
        source = err.source();
    }
    Attempt::Ambiguous(format!("transport failed: {e}"))
}

/// `grpc-timeout` for `d`, in milliseconds (at most 8 digits, as the spec allows).
fn grpc_timeout(d: Duration) -> HeaderValue {
    let ms = d.as_millis().clamp(1, 99_999_999);
    HeaderValue::from_str(&format!("{ms}m")).unwrap_or(HeaderValue::from_static("1000m"))
}

/// A gRPC status standing for a [`ClientError`], which it carries as its source.
fn status_for(e: ClientError) -> Status {
    let code = match &e {
        ClientError::Invalid(_) => Code::InvalidArgument,
        ClientError::OutcomeUnknown { .. } | ClientError::ResponseNotStored { .. } => {
            Code::FailedPrecondition
        }
        ClientError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        ClientError::AttemptsExhausted { .. } => Code::Unavailable,
        _ => Code::Unknown,
    };
    let mut status = Status::new(code, e.to_string());
    status.set_source(Arc::new(e));
    status
}

/// Gives every call one key and the shared retry policy.
#[derive(Debug, Clone)]
pub struct GrpcRetryLayer<L = NoStatus> {
    policy: Arc<RetryPolicy>,
    status: L,
}

impl GrpcRetryLayer {
    /// A layer retrying under `policy`, with no status service.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            status: NoStatus,
        }
    }
}

impl<L> GrpcRetryLayer<L> {
    /// Asks `status` after every ambiguous failure.
    pub fn status<M: StatusLookup>(self, status: M) -> GrpcRetryLayer<M> {
        GrpcRetryLayer {
            policy: self.policy,
            status,
        }
    }
}

impl<S, L: Clone> Layer<S> for GrpcRetryLayer<L> {
    type Service = GrpcRetry<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcRetry {
            inner,
            policy: Arc::clone(&self.policy),
            status: self.status.clone(),
        }
    }
}

/// A service [`GrpcRetry`] can wrap: it takes and answers tonic bodies, can be cloned for
/// every attempt, and its futures can move between threads.
pub trait GrpcInner:
    Service<Request<Body>, Response = Response<Body>, Future: Send, Error: Into<BoxError>>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> GrpcInner for S where
    S: Service<Request<Body>, Response = Response<Body>, Future: Send, Error: Into<BoxError>>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// A request body [`GrpcRetry`] can send: bytes, owned, its errors boxable.
pub trait CallBody: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

impl<B> CallBody for B where B: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{}

/// The service [`GrpcRetryLayer`] builds.
#[derive(Debug, Clone)]
pub struct GrpcRetry<S, L> {
    inner: S,
    policy: Arc<RetryPolicy>,
    status: L,
}

impl<S, L, B> Service<Request<B>> for GrpcRetry<S, L>
where
    S: GrpcInner,
    L: StatusLookup,
    B: CallBody,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let policy = Arc::clone(&self.policy);
        let status = self.status.clone();
        Box::pin(async move {
            match operation(inner, &policy, status, req).await {
                Ok(res) => Ok(res),
                Err(e) => Err(Box::new(status_for(e)) as BoxError),
            }
        })
    }
}

async fn operation<S, L, B>(
    inner: S,
    policy: &RetryPolicy,
    status: L,
    req: Request<B>,
) -> Result<Response<Body>, ClientError>
where
    S: GrpcInner,
    L: StatusLookup,
    B: CallBody,
{
    let (mut parts, body) = req.into_parts();
    // A deadline the caller set on the call (`Request::set_timeout`) bounds the whole
    // operation, retries and status queries included.
    let callers = parts
        .headers
        .remove(GRPC_TIMEOUT)
        .and_then(|v| idem_wire::header::grpc_timeout(&v));
    let bounded;
    let policy = match callers {
        Some(d) if d < policy.overall_deadline() => {
            bounded = policy.clone().deadline(d);
            &bounded
        }
        _ => policy,
    };
    // The operation's end as the server is told it; `retry::run` starts its own clock just
    // after this one, so the server never waits past the loop's deadline.
    let ends = tokio::time::Instant::now() + policy.overall_deadline();
    let message = body
        .collect()
        .await
        .map_err(|e| ClientError::Invalid(format!("request body: {}", e.into())))?
        .to_bytes();
    let mut headers = parts.headers;
    let key = match headers.remove(IDEMPOTENCY_KEY) {
        Some(v) => v
            .to_str()
            .map_err(|_| ClientError::Invalid("the idempotency-key is not text".into()))?
            .trim()
            .to_owned(),
        None => uuid::Uuid::now_v7().to_string(),
    };
    idem_core::Key::new(key.clone())
        .map_err(|e| ClientError::Invalid(format!("key `{key}`: {e}")))?;
    let key_value = key_header_value(&key)
        .ok_or_else(|| ClientError::Invalid(format!("key `{key}` cannot be sent")))?;
    let ids = Ids::for_operation(&headers);
    let call = Arc::new(OneCall {
        path: parts.uri.path().to_owned(),
        method: parts.method,
        uri: parts.uri,
        version: parts.version,
        headers,
        message,
        key: key.clone(),
        key_value,
        ids,
    });
    // The closures own what they use (an `Arc` of the call), so the call's future is `Send`.
    let for_send = Arc::clone(&call);
    let send = move |_: u32, timeout: Duration| {
        let left = ends.saturating_duration_since(tokio::time::Instant::now());
        let req = for_send.request(left.max(timeout));
        let svc = inner.clone();
        async move {
            let answer = tokio::time::timeout(timeout, async move {
                let res = match svc.oneshot(req).await {
                    Ok(res) => res,
                    Err(e) => {
                        let e: BoxError = e.into();
                        return transport_failure(&*e);
                    }
                };
                let (head, body) = res.into_parts();
                match body.collect().await {
                    Ok(collected) => {
                        let trailers = collected.trailers().cloned();
                        classify(GrpcAnswer::new(head, collected.to_bytes(), trailers))
                    }
                    Err(e) => Attempt::Ambiguous(format!("answer cut off: {e}")),
                }
            })
            .await;
            answer.unwrap_or_else(|_| Attempt::Ambiguous("timed out".into()))
        }
    };
    let lookup = move |timeout: Duration| {
        let mut h = call.headers.clone();
        call.ids.stamp(&mut h);
        status.lookup(call.path.clone(), call.key.clone(), h, timeout)
    };
    let done = retry::run(policy, &key, send, lookup).await?;
    Ok(done.answer.into_response())
}

#[cfg(test)]
mod tests;
