//! The [`GrpcIdempotency`] middleware: idempotency-key semantics for the unary methods of a
//! tonic server, driving [`idem_core::Engine`]. Every response carries the call's
//! [`Outcome`] as an extension.
//!
//! A call to a protected method is handled as:
//!
//! 1. find the principal (part of the scope), read the request (one message, up to the cap),
//!    find the key (metadata, or a field of the message), fingerprint the method path and
//!    the message bytes;
//! 2. [`Engine::run_traced`], bounded by the caller's `grpc-timeout` when it is shorter than
//!    the method's handler timeout: claim, call the inner service, read its answer, then
//!    keep it (message, status, trailers) or release the claim as the
//!    store policy ([`StoreDeterministic`](crate::StoreDeterministic) by default) says of its
//!    head and trailers;
//! 3. answer: the handler's answer, a replay (the stored messages, metadata and trailers,
//!    with `idempotent-replayed: true`), or a status from the table in [`crate::codes`].
//!
//! Calls to methods that are not configured pass through untouched (streaming methods
//! included), with [`Outcome::Passthrough`].
//!
//! If the caller goes away mid-handler, the rest of the run moves to a spawned task
//! ([`idem_http::ResponseFuture`]): the handler is not cancelled, its answer is still
//! recorded, and no lease is orphaned.

mod answer;
mod layer;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use idem_core::engine::LEASE_MARGIN;
use idem_core::key_source::{FieldNumbers, KeyInputs, KeySourceError};
use idem_core::{Engine, Fingerprint, Outcome, Policy, Refusal, ScopedKey, Store};
use idem_http::buffer::{BodyFailure, BodyPace, read_body};
use idem_http::{ResponseBody, ResponseFuture, ServiceBody, Wrapped};
use tower::Service;

pub use layer::GrpcIdempotencyLayer;

use crate::codes::Reason;
use crate::config::{GrpcIdempotencyConfig, MethodConfig};
use crate::wire::{self, FieldError, Message};

/// One protected method: its configuration and the engine it runs under.
pub(crate) struct Method<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) config: MethodConfig,
}

pub(crate) struct Shared<St> {
    pub(crate) methods: HashMap<String, Arc<Method<St>>>,
}

impl<St: Store> Shared<St> {
    pub(crate) fn new(engine: &Engine<St>, config: GrpcIdempotencyConfig) -> Self {
        let methods = config
            .methods
            .into_iter()
            .map(|(path, config)| {
                if !config.protection.principal_chosen {
                    // Not silent: one key space for every caller is a choice to see.
                    tracing::warn!(
                        method = %path,
                        namespace = config.namespace(),
                        "no principal configured: every caller shares this method's keys; \
                         set MethodConfig::principal on a service with more than one tenant \
                         (or NoPrincipal explicitly for a single-tenant one)"
                    );
                }
                let engine = config.protection.engine(engine);
                (path, Arc::new(Method { engine, config }))
            })
            .collect();
        Self { methods }
    }
}

/// Middleware giving a tonic server's configured methods idempotency-key semantics. Built
/// by [`GrpcIdempotencyLayer`].
pub struct GrpcIdempotency<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for GrpcIdempotency<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for GrpcIdempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<&String> = self.shared.methods.keys().collect();
        methods.sort();
        f.debug_struct("GrpcIdempotency")
            .field("inner", &self.inner)
            .field("methods", &methods)
            .finish()
    }
}

/// A wrapped generated server keeps its name, so it can still be added to a tonic router.
impl<S: tonic::server::NamedService, St> tonic::server::NamedService for GrpcIdempotency<S, St> {
    const NAME: &'static str = S::NAME;
}

type GrpcBody = tonic::body::Body;

impl<S, St, ResB> Service<Request<GrpcBody>> for GrpcIdempotency<S, St>
where
    S: Wrapped<GrpcBody, Response = Response<ResB>> + Clone + Send + 'static,
    St: Store,
    ResB: ServiceBody,
{
    idem_http::__layer_service_items!(ResB);

    fn call(&mut self, req: Request<GrpcBody>) -> Self::Future {
        let mut inner = idem_http::take_ready(&mut self.inner);
        let Some(method) = self.shared.methods.get(req.uri().path()).cloned() else {
            return ResponseFuture::passthrough(inner.call(req));
        };
        ResponseFuture::detached_on_drop(protect(method, inner, req))
    }
}

/// A status answered by the layer itself, as a trailers-only response carrying `outcome`.
pub(crate) fn status_response<B>(s: tonic::Status, outcome: Outcome) -> Response<ResponseBody<B>> {
    let (parts, ()) = s.into_http::<()>().into_parts();
    let mut res = Response::from_parts(parts, ResponseBody::full(Bytes::new()));
    res.extensions_mut().insert(outcome);
    res
}

fn refused<B>(
    reason: Reason,
    message: impl Into<String>,
    why: Refusal,
) -> Response<ResponseBody<B>> {
    status_response(reason.status(message, None, None), Outcome::Refused(why))
}

/// The refusal of a request that could not be read whole.
fn body_refused<B>(failure: &BodyFailure, max_request: usize) -> Response<ResponseBody<B>> {
    match failure {
        BodyFailure::TooLarge => refused(
            Reason::RequestTooLarge,
            format!("the request exceeds the {max_request}-byte limit of this method; nothing ran"),
            Refusal::BodyTooLarge,
        ),
        _ => refused(
            Reason::RequestUnreadable,
            "the request could not be read; nothing ran",
            Refusal::BodyUnreadable,
        ),
    }
}

fn key_refused<B>(e: &KeySourceError) -> Response<ResponseBody<B>> {
    let (reason, why) = match e {
        KeySourceError::Repeated(_) => (Reason::KeyMultiple, Refusal::KeyMultiple),
        _ => (Reason::KeyMalformed, Refusal::KeyMalformed),
    };
    refused(reason, e.to_string(), why)
}

async fn protect<S, St, ResB>(
    method: Arc<Method<St>>,
    mut inner: S,
    req: Request<GrpcBody>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Wrapped<GrpcBody, Response = Response<ResB>> + Send + 'static,
    St: Store,
    ResB: ServiceBody,
{
    let config = &method.config;
    let (parts, body) = req.into_parts();
    let principal = match config.protection.principal.principal(&parts) {
        Ok(p) => p,
        Err(r) => {
            return Ok(refused(r.reason(), r.detail(), r.refusal()));
        }
    };
    // No pace here (as before): a server in front of this layer must bound slow bodies.
    let bytes = match read_body(body, config.max_request, BodyPace::UNBOUNDED).await {
        Ok(bytes) => bytes,
        Err(failure) => return Ok(body_refused(&failure, config.max_request)),
    };
    let message = match wire::messages(&bytes).as_deref() {
        Ok([one]) => *one,
        _ => {
            return Ok(refused(
                Reason::NotOneMessage,
                "a protected method takes exactly one request message; nothing ran",
                Refusal::BodyUnreadable,
            ));
        }
    };
    let inputs = Inputs {
        headers: &parts.headers,
        message,
    };
    let key = match config.key.resolve(&inputs) {
        Ok(Some(found)) => found.key,
        Ok(None) if config.protection.key_required => {
            return Ok(refused(
                Reason::KeyMissing,
                format!(
                    "the call has no idempotency key (looked for: {})",
                    config.key
                ),
                Refusal::KeyMissing,
            ));
        }
        Ok(None) => {
            let req = Request::from_parts(parts, GrpcBody::new(http_body_util::Full::new(bytes)));
            let mut res = inner.call(req).await?.map(ResponseBody::inner);
            res.extensions_mut().insert(Outcome::Passthrough);
            return Ok(res);
        }
        Err(e) => return Ok(key_refused(&e)),
    };
    let fingerprint = Fingerprint::builder(config.fingerprint_version)
        .part("grpc.method", parts.uri.path().as_bytes())
        .part("grpc.compressed", &[u8::from(message.compressed)])
        .part("grpc.message", message.bytes)
        .finish();
    let scoped = ScopedKey::new(config.protection.scope_for(principal), key);
    let request_id = idem_http::policy::request_id(&parts.headers);
    let engine = bounded_engine(&method.engine, deadline(&parts.headers));
    let mut req = Request::from_parts(parts, GrpcBody::new(http_body_util::Full::new(bytes)));

    let key = &scoped.key;
    let outcome = engine
        .run_traced(
            &scoped,
            &fingerprint,
            request_id.as_deref(),
            move |lease| async move {
                // The handler sees the claim it runs under (`tonic::Request::extensions`): its
                // fence is the write token for downstream systems.
                req.extensions_mut().insert(lease);
                req.extensions_mut().insert(key.clone());
                match inner.call(req).await {
                    Err(e) => {
                        idem_core::Settlement::release(Err(e), idem_core::ReleaseKind::Retryable)
                    }
                    Ok(res) => answer::settle(config, key, res).await,
                }
            },
        )
        .await;
    answer::answer(&engine, config, key, outcome)
}

/// The caller's deadline from `grpc-timeout`; `None` when absent or malformed, as tonic's
/// own server treats it.
pub(crate) fn deadline(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("grpc-timeout")
        .and_then(crate::codes::grpc_timeout)
}

/// The method's engine, or, when the caller waits less than the handler timeout, the same
/// store under a policy whose handler timeout is the caller's deadline and whose lease is
/// that plus [`LEASE_MARGIN`]: the handler stops when the caller stops waiting, and a
/// crashed holder's claim frees up that much sooner. An in-flight wait is cut to the
/// deadline too.
pub(crate) fn bounded_engine<St: Store>(
    engine: &Engine<St>,
    deadline: Option<Duration>,
) -> std::borrow::Cow<'_, Engine<St>> {
    let policy = engine.policy();
    let Some(deadline) = deadline.filter(|d| *d < policy.handler_timeout()) else {
        return std::borrow::Cow::Borrowed(engine);
    };
    // A zero deadline has already passed; the engine refuses zero durations.
    let handler_timeout = deadline.max(Duration::from_millis(1));
    let lease = (handler_timeout + LEASE_MARGIN).min(policy.lease());
    let bounded = Policy::builder()
        .handler_timeout(handler_timeout)
        .lease(lease)
        .renew_every(policy.renew_every().min(lease / 3))
        .record_ttl(policy.record_ttl())
        .takeover(policy.takeover())
        .store_timeout(policy.store_timeout())
        .probe_timeout(policy.probe_timeout())
        // A duplicate does not wait for the first call's answer longer than its caller waits.
        .in_flight_wait(policy.in_flight_wait().map(|w| w.min(handler_timeout)))
        .build();
    match bounded {
        Ok(p) => std::borrow::Cow::Owned(engine.with_policy(p)),
        // Unreachable for a valid engine policy; the method's own bounds still hold.
        Err(_) => std::borrow::Cow::Borrowed(engine),
    }
}

/// A gRPC call as key sources see it: metadata, and the request message's fields.
struct Inputs<'a> {
    headers: &'a HeaderMap,
    message: Message<'a>,
}

impl KeyInputs for Inputs<'_> {
    fn header(&self, name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        let mut values = self.headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (None, _) => Ok(None),
            (Some(v), None) => Ok(Some(v.as_bytes())),
            (Some(_), Some(_)) => Err(KeySourceError::Repeated(name.to_owned())),
        }
    }

    fn json(&self) -> Option<&serde_json::Value> {
        None
    }

    fn path_param(&self, _name: &str) -> Option<&str> {
        None
    }

    fn query(&self, _name: &str) -> Result<Option<&str>, KeySourceError> {
        Ok(None)
    }

    fn proto_field(
        &self,
        path: &FieldNumbers,
    ) -> Result<Option<std::borrow::Cow<'_, [u8]>>, KeySourceError> {
        let name = || path.as_str().to_owned();
        if self.message.compressed {
            return Err(KeySourceError::Unreadable(
                name(),
                "the request message is compressed".into(),
            ));
        }
        wire::field(self.message.bytes, path.numbers()).map_err(|e| match e {
            FieldError::Repeated => KeySourceError::Repeated(name()),
            FieldError::NotMessage => {
                KeySourceError::Unreadable(name(), "a field on the path is not a message".into())
            }
            FieldError::Malformed(why) => KeySourceError::Unreadable(name(), why.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_parses_as_the_spec_says() {
        let at = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v.parse().expect("value"));
            deadline(&h)
        };
        assert_eq!(at("100m"), Some(Duration::from_millis(100)));
        assert_eq!(at("2S"), Some(Duration::from_secs(2)));
        assert_eq!(at("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(at("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "123456789m", "10x", "-1S", "1.5S"] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
        assert_eq!(deadline(&HeaderMap::new()), None);
    }

    #[test]
    fn a_short_deadline_bounds_the_handler_and_the_lease() {
        let engine = Engine::new(idem_core::MemoryStore::new(10), Policy::default());
        assert!(matches!(
            bounded_engine(&engine, None),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(
            bounded_engine(&engine, Some(Duration::from_secs(60))),
            std::borrow::Cow::Borrowed(_)
        ));
        let short = bounded_engine(&engine, Some(Duration::from_secs(2)));
        let p = short.policy();
        assert_eq!(p.handler_timeout(), Duration::from_secs(2));
        // Under `hold` the engine's short lease already is below the deadline's bound.
        assert_eq!(p.lease(), engine.policy().lease());
        assert!(p.lease() <= Duration::from_secs(2) + LEASE_MARGIN);
        assert!(p.renew_every() < p.lease());
        assert_eq!(p.record_ttl(), engine.policy().record_ttl());
        // Under `reexecute` the lease is cut to the deadline plus the margin.
        let again = engine.with_policy(
            Policy::builder()
                .takeover(idem_core::TakeoverPolicy::Reexecute)
                .build()
                .expect("policy"),
        );
        let short = bounded_engine(&again, Some(Duration::from_secs(2)));
        assert_eq!(
            short.policy().lease(),
            Duration::from_secs(2) + LEASE_MARGIN
        );
        assert_eq!(
            short.policy().takeover(),
            idem_core::TakeoverPolicy::Reexecute
        );
        let waiting = engine.with_policy(
            Policy::builder()
                .in_flight_wait(Some(Duration::from_secs(10)))
                .build()
                .expect("policy"),
        );
        let short = bounded_engine(&waiting, Some(Duration::from_secs(2)));
        assert_eq!(
            short.policy().in_flight_wait(),
            Some(Duration::from_secs(2))
        );
        let zero = bounded_engine(&engine, Some(Duration::ZERO));
        assert_eq!(zero.policy().handler_timeout(), Duration::from_millis(1));
    }
}
