//! The [`Idempotency`] middleware: idempotency-key semantics for any `http` service (axum,
//! hyper), driving [`idem_core::Engine`]. Every response carries the request's
//! [`Outcome`](idem_core::Outcome) as an extension.
//!
//! A protected request (any method but `GET`/`HEAD`/`OPTIONS`, with a key) is handled as:
//!
//! 1. parse the key (400 if malformed, doubled or a list; 400 if missing on a required route),
//!    find the principal (part of the scope), buffer the body up to the cap (413), fingerprint;
//! 2. [`Engine::run_traced`]: claim, call the inner service (the request carries the claim's
//!    [`Lease`](idem_core::Lease) as an extension: its fence is the write token for downstream
//!    systems), then keep the response for replay or release the claim as
//!    [`StorePolicy`](crate::StorePolicy) says;
//! 3. answer: the handler's response, a replay (`Idempotent-Replayed: true`, key echoed), or a
//!    RFC 9457 problem (the table of statuses and `type` URIs is in `docs/http.md`).
//!
//! If the client disconnects mid-handler, the rest of the run moves to a spawned task (see
//! [`ResponseFuture`]): the handler is not cancelled, its result is still recorded, and no
//! lease is orphaned.
//!
//! Response bodies must be `Unpin` (axum's `Body`, hyper's `Incoming`, `Full` and boxed
//! bodies are). On a plain hyper server, wrap the request body in
//! [`RequestBody`](crate::RequestBody) so the layer can rebuild it after buffering.
//!
//! ```
//! use axum::{Router, routing::post};
//! use idem_core::{Engine, MemoryStore, Policy};
//! use idem_http::{IdempotencyConfig, IdempotencyLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new(100_000), Policy::default());
//! let charge = IdempotencyLayer::new(&engine, IdempotencyConfig::new("payments.charge")?);
//! let app: Router = Router::new().route("/charge", post(|| async { "charged" }).layer(charge));
//! # let _ = app; Ok(()) }
//! ```

mod bounds;
mod error;
mod future;
mod in_tx;
mod layer;

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use idem_core::{
    Answer, Engine, Fingerprint, Outcome, ReleaseKind, ScopedKey, Settled, Settlement, Store,
    StoredResponse,
};
use tower::Service;

pub use bounds::{IncomingBody, ServiceBody, Wrapped, take_ready};
pub(crate) use error::{Refused, key_rejection as key_problem, principal_refused};
pub use future::ResponseFuture;
pub use in_tx::{InTransaction, TxIdempotency, TxIdempotencyLayer};
pub use layer::IdempotencyLayer;

use crate::body::{BoxError, ResponseBody};
use crate::buffer::{
    BodyFailure, Collected, collect_body, fields_size, header_map, read_body, stored_fields,
};
use crate::config::{IdempotencyConfig, NEVER_REPLAYED, StreamingResponses};
use crate::guard::RunGuard;
use crate::policy::{AnswerHead, FoundKey, IDEMPOTENT_REPLAYED, StoreDecision, request_id};

pub(crate) struct Shared<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) config: IdempotencyConfig,
}

/// Middleware giving an HTTP service idempotency-key semantics, in the mode `M`:
/// [`Separate`] (the default) or [`InTransaction`]. Built by [`IdempotencyLayer`].
pub struct Idempotency<S, St, M = Separate> {
    inner: S,
    shared: Arc<Shared<St>>,
    mode: PhantomData<fn() -> M>,
}

/// The ordinary mode: the claim and the completion are the store's own operations, and the
/// handler's effects are its own business (the fence, in the request's
/// [`Lease`](idem_core::Lease), is the write token to hand them).
#[derive(Clone, Copy, Debug, Default)]
pub struct Separate;

impl<S: Clone, St, M> Clone for Idempotency<S, St, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, St, M> fmt::Debug for Idempotency<S, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, St>
where
    S: Wrapped<ReqB, Response = Response<ResB>> + Clone + Send + 'static,
    St: Store,
    ReqB: IncomingBody,
    ResB: ServiceBody,
{
    crate::__layer_service_items!(ResB);

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = take_ready(&mut self.inner);
        route(Arc::clone(&self.shared), inner, req, protect)
    }
}

/// Sends a request where it goes: past the layer (an unprotected method, no key on a route
/// that does not require one), refused (a malformed or missing key), or to `protect` (the
/// body may name the key: `protect` looks once it has read it).
pub(crate) fn route<S, St, ReqB, ResB, P, Fut>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    req: Request<ReqB>,
    protect: P,
) -> ResponseFuture<ResB, S::Error>
where
    S: Wrapped<ReqB, Response = Response<ResB>>,
    ResB: Send + 'static,
    P: FnOnce(Arc<Shared<St>>, S, http::request::Parts, ReqB, Option<FoundKey>) -> Fut,
    Fut: Future<Output = Result<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static,
{
    let config = &shared.config;
    if config.passthrough.contains(req.method()) {
        return ResponseFuture::passthrough(inner.call(req));
    }
    let (parts, body) = req.into_parts();
    if config.key.needs_body() {
        return ResponseFuture::detached_on_drop(protect(shared, inner, parts, body, None));
    }
    let found = match config.key.extract(&parts) {
        Ok(found) => found,
        Err(r) => return ready(error::key_rejection(&r)),
    };
    let Some(found) = found else {
        if config.protection.key_required {
            return ready(error::key_rejection(&config.key.missing()));
        }
        return ResponseFuture::passthrough(inner.call(Request::from_parts(parts, body)));
    };
    ResponseFuture::detached_on_drop(protect(shared, inner, parts, body, Some(found)))
}

/// Attaches what became of the request to its response, for whoever sits outside the layer.
pub(crate) fn with_outcome<B>(mut res: Response<B>, outcome: Outcome) -> Response<B> {
    res.extensions_mut().insert(outcome);
    res
}

/// A refusal answered before any claim.
fn ready<B, E: Send + 'static>(refused: Refused) -> ResponseFuture<B, E>
where
    B: Send + 'static,
{
    ResponseFuture::new(std::future::ready(Ok(refused.into_response())))
}

/// What the handler closure hands back through the engine.
type Handled<B, E> = Result<Response<ResponseBody<B>>, E>;

/// Reads and checks a protected request ([`admit`], the body, [`examine`]) and evaluates to
/// its [`Prepared`] run, or returns from the enclosing `async fn` with the refusal or, for a
/// request that turned out to have no key, the inner service's answer. A macro rather than
/// an async fn because every nested async fn is one more multi-kilobyte state built on the
/// stack and moved into its parent, on every protected request.
macro_rules! prepare_or_answer {
    ($config:expr, $inner:expr, $parts:expr, $body:expr, $found:expr) => {{
        let principal = match admit($config, &$parts, $found.as_ref()) {
            Ok(principal) => principal,
            Err(refused) => return Ok(refused.into_response()),
        };
        let bytes = match read_body($body, $config.max_request_body, $config.body_pace).await {
            Ok(bytes) => bytes,
            Err(failure) => {
                return Ok(body_refused($config, failure, $found.as_ref()).into_response());
            }
        };
        match examine($config, $parts, bytes, $found, principal) {
            Step::Run(prepared) => prepared,
            Step::Refuse(refused) => return Ok(refused.into_response()),
            Step::Pass(req) => {
                let res = $inner.call(req).await?;
                return Ok(with_outcome(
                    res.map(ResponseBody::inner),
                    Outcome::Passthrough,
                ));
            }
        }
    }};
}
pub(crate) use prepare_or_answer;

async fn protect<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    mut parts: http::request::Parts,
    body: ReqB,
    found: Option<FoundKey>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Wrapped<ReqB, Response = Response<ResB>> + Send + 'static,
    St: Store,
    ReqB: IncomingBody,
    ResB: ServiceBody,
{
    let config = &shared.config;
    // Held to the end of the run, which may go on in a spawned task after the client left.
    let _guard = parts.extensions.remove::<RunGuard>();
    let Prepared {
        found,
        fingerprint,
        scoped,
        request_id,
        mut req,
    } = prepare_or_answer!(config, inner, parts, body, found);

    // Dropping this future mid-run hands the rest to a spawned task (see `ResponseFuture`),
    // so a client that goes away neither cancels the handler nor loses its result.
    // (The engine is driven right here, not through a helper async fn: every nested async fn
    // is one more multi-kilobyte state built on the stack and then moved into its parent.)
    let key = &scoped.key;
    let outcome = shared
        .engine
        .run_traced(
            &scoped,
            &fingerprint,
            request_id.as_deref(),
            move |lease| async move {
                // The inner service sees the claim it runs under (its fence is the write
                // token to hand downstream) and the key it is for.
                req.extensions_mut().insert(lease);
                req.extensions_mut().insert(key.clone());
                match inner.call(req).await {
                    Err(e) => Settlement::release(Err(e), ReleaseKind::Retryable),
                    Ok(res) => settle(config, key, res).await,
                }
            },
        )
        .await;
    answer(&shared, &found, outcome)
}

/// A protected request, read and checked, ready to run.
pub(crate) struct Prepared<ReqB> {
    pub(crate) found: FoundKey,
    pub(crate) fingerprint: Fingerprint,
    /// The key in the route's scope for the request's principal.
    pub(crate) scoped: ScopedKey,
    pub(crate) request_id: Option<String>,
    /// The request, its body buffered.
    pub(crate) req: Request<ReqB>,
}

/// What to do with a request once its body is read.
pub(crate) enum Step<ReqB> {
    /// Protect it.
    Run(Prepared<ReqB>),
    /// Answer this refusal; nothing runs.
    Refuse(Refused),
    /// Pass it to the inner service unprotected (no key, none required).
    Pass(Request<ReqB>),
}

/// Before the body is read: the principal, and a declared length within the cap.
pub(crate) fn admit(
    config: &IdempotencyConfig,
    parts: &http::request::Parts,
    found: Option<&FoundKey>,
) -> Result<Option<String>, Refused> {
    let principal = config
        .protection
        .principal
        .principal(parts)
        .map_err(|r| error::principal_refused(&r))?;
    let limit = config.max_request_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(error::body_too_large(found.map(|f| &f.key), limit));
    }
    Ok(principal)
}

/// Why a body could not be read, as the answer to the client.
pub(crate) fn body_refused(
    config: &IdempotencyConfig,
    failure: BodyFailure,
    found: Option<&FoundKey>,
) -> Refused {
    let key = found.map(|f| &f.key);
    match failure {
        BodyFailure::TooLarge => error::body_too_large(key, config.max_request_body),
        BodyFailure::TimedOut => error::body_timeout(key),
        _ => error::body_unreadable(key),
    }
}

/// Once the body is read: the key the body names (if the key source needs it), the
/// fingerprint, and the key in the route's scope for the principal.
pub(crate) fn examine<ReqB: From<Bytes>>(
    config: &IdempotencyConfig,
    parts: http::request::Parts,
    bytes: Bytes,
    found: Option<FoundKey>,
    principal: Option<String>,
) -> Step<ReqB> {
    let found = match found {
        Some(found) => found,
        None => match body_key(config, &parts, &bytes) {
            Ok(Some(found)) => found,
            Err(refused) => return Step::Refuse(refused),
            Ok(None) => return Step::Pass(Request::from_parts(parts, ReqB::from(bytes))),
        },
    };
    let fingerprint = match config.fingerprint.fingerprint(&parts, &bytes) {
        Ok(fingerprint) => fingerprint,
        Err(why) => return Step::Refuse(error::body_ambiguous(&found.key, &why)),
    };
    let scoped = ScopedKey::new(config.protection.scope_for(principal), found.key.clone());
    let request_id = request_id(&parts.headers);
    Step::Run(Prepared {
        found,
        fingerprint,
        scoped,
        request_id,
        req: Request::from_parts(parts, ReqB::from(bytes)),
    })
}

/// The key of a request whose key source needs its body: `Ok(None)` when there is none and
/// none is required (the request passes through unprotected).
fn body_key(
    config: &IdempotencyConfig,
    parts: &http::request::Parts,
    bytes: &[u8],
) -> Result<Option<FoundKey>, error::Refused> {
    match config.key.extract_with_body(parts, bytes) {
        Ok(Some(found)) => Ok(Some(found)),
        Err(r) => Err(error::key_rejection(&r)),
        Ok(None) if config.protection.key_required => {
            Err(error::key_rejection(&config.key.missing()))
        }
        Ok(None) => Ok(None),
    }
}

/// Decides what to keep of the handler's response, buffering it if it is to be stored.
async fn settle<B, E>(
    config: &IdempotencyConfig,
    key: &idem_core::Key,
    res: Response<B>,
) -> Settlement<Handled<B, E>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (head, body) = res.into_parts();
    if let StoreDecision::Release(kind) = config
        .protection
        .store_policy
        .decide(&AnswerHead::of(&head))
    {
        return Settlement::release(
            Ok(Response::from_parts(head, ResponseBody::inner(body))),
            kind,
        );
    }
    let cap = config.protection.max_stored_response;
    let event_stream = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            let ct = ct.trim_start().as_bytes();
            let kind = b"text/event-stream";
            ct.len() >= kind.len() && ct[..kind.len()].eq_ignore_ascii_case(kind)
        });
    let exact = body.size_hint().exact();
    if (event_stream || exact.is_none()) && config.streaming == StreamingResponses::Release {
        // Streaming: never half-stored. The route is not protected for this response.
        tracing::debug!(key = %key, "streaming response passed through; claim released");
        return Settlement::release(
            Ok(Response::from_parts(head, ResponseBody::inner(body))),
            ReleaseKind::Retryable,
        );
    }
    let stored_headers = stored_fields(&head.headers, |name| config.replays(name));
    let budget = cap.saturating_sub(fields_size(&stored_headers));
    if exact.is_some_and(|n| n > budget as u64) {
        let stored = omitted(head.status.as_u16(), stored_headers);
        return Settlement::complete(
            Ok(Response::from_parts(head, ResponseBody::inner(body))),
            stored,
        );
    }
    // A single-chunk body (the usual case) is kept without copying.
    let (bytes, trailers) = match collect_body(body, budget).await {
        Collected::Whole { body, trailers } => (body, trailers),
        Collected::TooLarge { prefix, rest } => {
            // Larger than the cap: this client gets all of it, the record only the head.
            let stored = omitted(head.status.as_u16(), stored_headers);
            return Settlement::complete(
                Ok(Response::from_parts(
                    head,
                    ResponseBody::prefixed(prefix, rest),
                )),
                stored,
            );
        }
        Collected::Failed(e) => {
            tracing::warn!(key = %key, error = %e, "response body failed; claim released");
            return Settlement::release(
                Ok(error::response_failed(key).into_response()),
                ReleaseKind::Retryable,
            );
        }
    };
    // Trailers belong to the answer (checksums, gRPC status): every one is kept, but for
    // the hop-by-hop and framing fields that belong to one connection.
    let stored_trailers = stored_fields(&trailers, |name| !NEVER_REPLAYED.contains(name));
    if bytes.len() + fields_size(&stored_trailers) > budget {
        let stored = omitted(head.status.as_u16(), stored_headers);
        return Settlement::complete(
            Ok(Response::from_parts(
                head,
                ResponseBody::full_with_trailers(bytes, trailers),
            )),
            stored,
        );
    }
    let stored = StoredResponse {
        status: head.status.as_u16(),
        headers: stored_headers,
        body: bytes.clone(),
        trailers: stored_trailers,
        body_omitted: false,
    };
    Settlement::complete(
        Ok(Response::from_parts(
            head,
            ResponseBody::full_with_trailers(bytes, trailers),
        )),
        stored,
    )
}

fn omitted(status: u16, headers: Vec<(String, Bytes)>) -> StoredResponse {
    StoredResponse {
        status,
        headers,
        body: Bytes::new(),
        trailers: Vec::new(),
        body_omitted: true,
    }
}

/// Turns the engine's answer into the response for this caller, with its [`Outcome`].
fn answer<B, E, St: Store>(
    shared: &Shared<St>,
    found: &FoundKey,
    answer: Result<Answer<Handled<B, E>>, idem_core::EngineError>,
) -> Handled<B, E> {
    let key = &found.key;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "idempotent request failed");
            let outcome = e.outcome(shared.engine.policy().interrupted_release());
            let res = error::engine_error(key, &e, shared.config.protection.store_retry_after);
            return Ok(with_outcome(res.into_response(), outcome));
        }
    };
    let outcome = answer.outcome();
    let res = match answer {
        Answer::Executed {
            output,
            settled: Settled::Failed(e),
            ..
        } => {
            let res = output?;
            let head = AnswerHead::new(res.status(), res.headers(), res.extensions());
            if let StoreDecision::Release(_) = shared.config.protection.store_policy.decide(&head) {
                // Nothing was to be kept: the answer is the handler's.
                res
            } else {
                // Ran, but its answer is not recorded yet: handing it out would let a retry
                // find the key in flight or unknown. The engine keeps trying to record it.
                tracing::warn!(key = %key, error = %e, "answer not recorded; the client is told to retry");
                error::answer_not_recorded(key, shared.config.protection.store_retry_after)
                    .into_response()
            }
        }
        Answer::Executed { output, .. } => output?,
        Answer::Replayed(stored) => return Ok(replay(stored, found)),
        Answer::InFlight { retry_after } => error::in_flight(key, retry_after).into_response(),
        Answer::Mismatch => error::mismatch(key).into_response(),
        Answer::Unknown => error::outcome_unknown(key).into_response(),
        _ => error::internal(key).into_response(),
    };
    Ok(with_outcome(res, outcome))
}

pub(crate) fn replay<B>(stored: StoredResponse, found: &FoundKey) -> Response<ResponseBody<B>> {
    if stored.body_omitted {
        return error::response_not_stored(&found.key, stored.status).into_response();
    }
    let mut res = Response::new(ResponseBody::full_with_trailers(
        stored.body,
        header_map(stored.trailers),
    ));
    *res.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    *res.headers_mut() = header_map(stored.headers);
    let headers = res.headers_mut();
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if let Some((name, value)) = &found.echo {
        headers.insert(name.clone(), value.clone());
    }
    with_outcome(res, Outcome::Replayed)
}
