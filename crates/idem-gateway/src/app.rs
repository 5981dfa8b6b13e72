//! The data plane: request ids, route matching, and per route either a plain proxy or
//! idem-http's layer in front of the proxy. Metrics and the access log read the
//! [`Outcome`] the layer attaches to every answer.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri};
use hyper::body::Incoming;
use idem_core::{Engine, Kept, Outcome, Policy, Refusal};
use idem_http::{
    Idempotency, IdempotencyLayer, PathParams, Problem, Reason, RequestBody, X_REQUEST_ID,
};
use tower::{Layer as _, Service as _};

use tracing::Instrument as _;

use crate::body::{self, ResBody};
use crate::config::{Route, Settings, Unmatched};
use crate::matcher::MethodSet;
use crate::metrics::{NO_ROUTE, RequestMetrics};
use crate::observe::{RequestSpan, TimedProxy};
use crate::path::{self, PathRejection, TrailingSlash};
use crate::protect::layer_config;
use crate::proxy::{self, Proxy, X_FORWARDED_FOR};
use crate::shared::{GatewayStore, HANDLER_BACKSTOP};
use crate::status::StatusEndpoint;
use crate::tokens::{GatewayTokens, TokenIssuer, TokenNote, TokenRoute};
use crate::upstream::{Clients, UpstreamSpec};

type Protected = Idempotency<TimedProxy, GatewayStore>;

enum Handler {
    Plain(TimedProxy),
    Protected(Protected),
    Token(Box<TokenRoute>),
}

struct Entry {
    route: Route,
    handler: Handler,
}

/// The `route` label of the status endpoint's answers.
const STATUS_ROUTE: &str = "status";

/// The data-plane application. Cheap to share behind an `Arc`.
pub struct App {
    entries: Vec<Entry>,
    /// Where unmatched requests go when `unmatched = "proxy"`.
    fallback: Option<TimedProxy>,
    /// The status endpoint, answered before any route and never forwarded.
    status: Option<StatusEndpoint>,
    /// The token routes' issue endpoints with their routes' indexes, answered before any
    /// route and never forwarded.
    issuers: Vec<(usize, TokenIssuer)>,
    trailing_slash: TrailingSlash,
    request_id: HeaderName,
    metrics: RequestMetrics,
    /// The standard methods and every method a route names: one of them spelled in another
    /// case is refused ([`App::miscased`]).
    methods: Vec<Method>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("routes", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl App {
    /// Builds the routes over `store`. `upstream` is the default upstream (the configured one
    /// or the demo upstream's address).
    ///
    /// # Errors
    /// A route without any upstream, a policy the layer refuses, or a token route (which
    /// needs [`App::with_tokens`]).
    pub fn new(
        settings: &Settings,
        store: GatewayStore,
        upstream: Option<&UpstreamSpec>,
        clients: &mut Clients,
    ) -> anyhow::Result<Self> {
        Self::with_tokens(settings, store, upstream, clients, None)
    }

    /// As [`App::new`], with the token store token routes issue into and consume from.
    ///
    /// # Errors
    /// As [`App::new`]; a token route without `tokens`.
    pub fn with_tokens(
        settings: &Settings,
        store: GatewayStore,
        upstream: Option<&UpstreamSpec>,
        clients: &mut Clients,
        tokens: Option<&GatewayTokens>,
    ) -> anyhow::Result<Self> {
        let engine = Engine::new(store, Policy::default());
        let mut entries = Vec::with_capacity(settings.routes.len());
        let mut issuers = Vec::new();
        for (index, route) in settings.routes.iter().enumerate() {
            let target = route
                .upstream
                .as_ref()
                .or(upstream)
                .ok_or_else(|| anyhow::anyhow!("route `{}` has no upstream", route.name))?;
            let p = &route.policy;
            let client = clients.get(target);
            let timeout = p.engine.handler_timeout().saturating_sub(HANDLER_BACKSTOP);
            let handler = if let Some(t) = p.token.as_ref().filter(|_| p.idempotency) {
                let tokens = tokens.ok_or_else(|| {
                    anyhow::anyhow!(
                        "route `{}` has token mode but no token store is open",
                        route.name
                    )
                })?;
                let proxy = Proxy::new(client, target, timeout, Some(p.max_stored_response))?
                    .with_fence_header(p.fence_header.clone(), false);
                let proxy = TimedProxy::new(proxy, &route.name);
                let engine = with_webhook(&engine, settings, route, clients)?;
                let (token_route, issuer) =
                    TokenRoute::build(route, t, &engine, proxy, tokens, settings.limits.body_pace)?;
                issuers.push((index, issuer));
                Handler::Token(Box::new(token_route))
            } else if p.idempotency {
                // Buffer protected responses inside the upstream timeout, so a reset mid-body
                // is classified like any other failure after sending.
                let proxy = Proxy::new(client, target, timeout, Some(p.max_stored_response))?
                    .with_fence_header(p.fence_header.clone(), true);
                let engine = with_webhook(&engine, settings, route, clients)?;
                let config = layer_config(p)?.body_pace(settings.limits.body_pace);
                let layer = IdempotencyLayer::new(&engine, config);
                Handler::Protected(layer.layer(TimedProxy::new(proxy, &route.name)))
            } else {
                let proxy = Proxy::new(client, target, timeout, None)?;
                Handler::Plain(TimedProxy::new(proxy, &route.name))
            };
            entries.push(Entry {
                route: route.clone(),
                handler,
            });
        }
        let fallback = match settings.unmatched {
            Unmatched::Proxy => upstream
                .map(|u| Proxy::new(clients.get(u), u, Duration::from_secs(30), None))
                .transpose()?
                .map(|proxy| TimedProxy::new(proxy, NO_ROUTE)),
            Unmatched::Reject | Unmatched::Protect => None,
        };
        let status = settings
            .status
            .as_ref()
            .map(|s| StatusEndpoint::new(s, &settings.routes, &engine))
            .transpose()?;
        let mut methods = STANDARD_METHODS.to_vec();
        for e in &entries {
            if let MethodSet::Only(list) = &e.route.methods {
                methods.extend(
                    list.iter()
                        .filter(|m| !STANDARD_METHODS.contains(m))
                        .cloned(),
                );
            }
        }
        Ok(Self {
            methods,
            entries,
            fallback,
            status,
            issuers,
            trailing_slash: settings.trailing_slash,
            request_id: settings.request_id_header.clone(),
            // Route indexes are the routes' in match order, then the status endpoint's.
            metrics: RequestMetrics::new(
                settings
                    .routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .chain(settings.status.is_some().then_some(STATUS_ROUTE)),
            ),
        })
    }

    /// Handles one request from `remote`.
    pub async fn handle(&self, req: Request<Incoming>, remote: SocketAddr) -> Response<ResBody> {
        self.handle_from(req, &Peer::new(remote)).await
    }

    /// Handles one request from `peer` (what [`service`] calls: the peer's address is
    /// rendered once per connection, not per request).
    pub async fn handle_from(&self, req: Request<Incoming>, peer: &Peer) -> Response<ResBody> {
        let started = Instant::now();
        // Everything only the access log needs is skipped when it is off.
        let log = tracing::enabled!(tracing::Level::INFO);
        let (mut parts, body) = req.into_parts();
        let grpc = idem_wire::header::is_grpc(&parts.headers);
        // First, so `Connection` can drop only the client's headers, never the gateway's.
        crate::proxy::strip_client_connection(&mut parts.headers, &self.request_id);
        let request_id = request_id(&mut parts, &self.request_id);
        let span = RequestSpan::new(&request_id, &parts.headers);
        append_forwarded_for(&mut parts, peer);
        // The scheme is what this gateway saw, never what a client claims.
        parts
            .headers
            .insert(crate::proxy::X_FORWARDED_PROTO, peer.proto.clone());
        let method = log.then(|| parts.method.clone());
        let path = log.then(|| parts.uri.path().to_owned());
        let issuer = self.issuer(parts.uri.path());
        let (mut res, route) = match (&self.status, issuer) {
            // An issue path is answered here whatever its method, and never forwarded.
            (_, Some((index, issuer))) => (
                issuer.answer(&parts).instrument(span.span().clone()).await,
                *index,
            ),
            (Some(status), None) if status.owns(parts.uri.path(), self.trailing_slash) => (
                status.answer(parts).instrument(span.span().clone()).await,
                self.entries.len(),
            ),
            // Routes match the normalised path, and the upstream receives that same path.
            _ => match normalize_uri(&mut parts.uri, self.trailing_slash) {
                Ok(()) => {
                    self.route(parts, body)
                        .instrument(span.span().clone())
                        .await
                }
                Err(rejection) => (
                    body::boxed(path_rejected(rejection)),
                    self.metrics.no_route(),
                ),
            },
        };
        // The layer and the branches above attach one to every answer; a missing one would
        // be a bug, counted as an execution rather than hidden.
        let outcome = res
            .extensions()
            .get::<Outcome>()
            .copied()
            .unwrap_or(Outcome::Executed(Kept::Stored));
        let elapsed = started.elapsed();
        self.metrics.record(route, outcome, elapsed);
        let route = match self.entries.get(route) {
            Some(e) => e.route.name.as_str(),
            None if route == self.entries.len() && self.status.is_some() => STATUS_ROUTE,
            None => NO_ROUTE,
        };
        let status = res.status().as_u16();
        span.finish(route, outcome, status);
        if log {
            let _in = span.span().enter();
            tracing::info!(
                request_id = request_id.to_str().unwrap_or("-"),
                method = method.as_ref().map_or("-", |m| m.as_str()),
                path = path.as_deref().unwrap_or("-"),
                route,
                status,
                outcome = outcome.as_str(),
                detail = res
                    .extensions()
                    .get::<TokenNote>()
                    .map_or_else(|| detail(outcome), |n| n.0.as_str()),
                micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                "request"
            );
        }
        if grpc {
            res = crate::grpc::refusal(res).await;
        }
        res.headers_mut()
            .insert(self.request_id.clone(), request_id);
        res
    }
}

impl App {
    /// The token route whose issue path `raw` (the path as sent) is, in its spelling as sent
    /// or normalised in any letter case.
    fn issuer(&self, raw: &str) -> Option<&(usize, TokenIssuer)> {
        if self.issuers.is_empty() {
            return None;
        }
        let normal = path::normalize(raw, self.trailing_slash).ok();
        self.issuers
            .iter()
            .find(|(_, i)| i.owns(raw, normal.as_deref()))
    }

    /// Finds the request's route and answers through it: the layer, a plain proxy, the
    /// unmatched proxy, or 404. Also says which route answered (its index, or
    /// [`RequestMetrics::no_route`]).
    async fn route(&self, mut parts: Parts, body: Incoming) -> (Response<ResBody>, usize) {
        if let Some(canonical) = self.miscased(&parts.method) {
            let res = method_not_canonical(&parts.method, canonical);
            return (body::boxed(res), self.metrics.no_route());
        }
        let trailers = proxy::TrailerClient::of(&parts);
        let found = self.entries.iter().position(|e| {
            e.route.methods.contains(&parts.method) && e.route.pattern.matches(parts.uri.path())
        });
        let entry = found.and_then(|i| self.entries.get(i));
        let index = found.unwrap_or(self.metrics.no_route());
        if let Some(spelled) = entry.and_then(|e| e.route.pattern.respell(parts.uri.path())) {
            // The same path, and a valid one: only letters changed case.
            let _ = set_path(&mut parts.uri, spelled);
        }
        if let Some(e) = entry.filter(|e| e.route.policy.key_path_params) {
            let params = e.route.pattern.params(parts.uri.path());
            parts.extensions.insert(PathParams(params));
        }
        let req = Request::from_parts(parts, RequestBody::new(body));
        let res = match entry {
            None => match &self.fallback {
                Some(proxy) => {
                    let res = body::boxed(passthrough(proxy.forward(req).await));
                    trailers.prepare(res, 0).await
                }
                None => body::boxed(no_route()),
            },
            Some(Entry {
                handler: Handler::Plain(proxy),
                ..
            }) => {
                let res = body::boxed(passthrough(proxy.forward(req).await));
                trailers.prepare(res, 0).await
            }
            Some(Entry {
                route,
                handler: Handler::Protected(svc),
            }) => {
                let res = match svc.clone().call(req).await {
                    Ok(res) => res,
                    Err(never) => match never {},
                };
                protected_answer(res, route, trailers).await
            }
            Some(Entry {
                route,
                handler: Handler::Token(token),
            }) => match token.check.refusal(req.method(), req.headers()) {
                Some(refused) => refused,
                None => match token.svc.clone().call(req).await {
                    Ok(res) => protected_answer(res, route, trailers).await,
                    Err(refusal) => token.check.refused(refusal),
                },
            },
        };
        (res, index)
    }
}

impl App {
    /// The answer when the gateway is at its limit of requests in progress: 503 with
    /// `Retry-After`, counted, and nothing forwarded.
    pub fn overloaded(&self) -> Response<ResBody> {
        let mut res = body::problem(
            Problem::new(
                Reason::Overloaded,
                "the gateway is at its limit of requests in progress; retry shortly",
            )
            .retry_after(Duration::from_secs(1)),
        );
        let outcome = Outcome::Refused(Refusal::Overloaded);
        res.extensions_mut().insert(outcome);
        self.metrics
            .record(self.metrics.no_route(), outcome, Duration::ZERO);
        body::boxed(res)
    }
}

/// A protected route's answer as sent: trailers prepared for the client (a held answer within the route's stored size).
async fn protected_answer<B>(
    res: Response<idem_http::ResponseBody<B>>,
    route: &Route,
    trailers: proxy::TrailerClient,
) -> Response<ResBody>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<idem_http::BoxError>,
{
    let held = matches!(
        res.extensions().get::<Outcome>(),
        Some(Outcome::Replayed | Outcome::Executed(Kept::Stored))
    );
    let cap = if held {
        route.policy.max_stored_response
    } else {
        0
    };
    trailers.prepare(body::boxed(res), cap).await
}

/// The part of an outcome the access log adds to its name: what was kept of an execution,
/// or why a request was refused.
fn detail(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Executed(kept) => kept.as_str(),
        Outcome::Refused(why) => why.as_str(),
        _ => "-",
    }
}

/// Rewrites the request target's path to its canonical spelling, keeping the query.
fn normalize_uri(uri: &mut Uri, trailing: TrailingSlash) -> Result<(), PathRejection> {
    match path::normalize(uri.path(), trailing)? {
        Cow::Borrowed(_) => Ok(()),
        Cow::Owned(normal) => set_path(uri, normal),
    }
}

/// Replaces the path of `uri`, keeping its query.
fn set_path(uri: &mut Uri, path: String) -> Result<(), PathRejection> {
    let target = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query =
        Some(PathAndQuery::try_from(target).map_err(|_| PathRejection::NotAbsolute)?);
    *uri = Uri::from_parts(parts).map_err(|_| PathRejection::NotAbsolute)?;
    Ok(())
}

/// Methods every route set is compared with, whatever the configuration names.
const STANDARD_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

impl App {
    /// The method `m` spells in another case, if it does. Methods are case-sensitive
    /// (RFC 9110 section 9.1), so `post` matches no `POST` route, yet many servers read it as
    /// `POST`: forwarded, it would be an unprotected charge. It is refused instead of
    /// matched, because the upstream may equally treat it as another method; either way
    /// the gateway cannot know what it will do.
    fn miscased(&self, m: &Method) -> Option<&Method> {
        self.methods
            .iter()
            .find(|c| c.as_str() != m.as_str() && c.as_str().eq_ignore_ascii_case(m.as_str()))
    }
}

#[cold]
fn method_not_canonical(got: &Method, canonical: &Method) -> body::Upstream {
    let mut res = body::problem(Problem::new(
        Reason::MethodNotCanonical,
        format!("methods are case-sensitive: send `{canonical}`, not `{got}`"),
    ));
    res.extensions_mut()
        .insert(Outcome::Refused(Refusal::BadTarget));
    res
}

#[cold]
fn path_rejected(rejection: PathRejection) -> body::Upstream {
    let mut res = body::problem(Problem::new(Reason::PathRejected, rejection.to_string()));
    res.extensions_mut()
        .insert(Outcome::Refused(Refusal::BadTarget));
    res
}

fn passthrough<B>(mut res: Response<B>) -> Response<B> {
    res.extensions_mut().insert(Outcome::Passthrough);
    res
}

fn no_route() -> body::Upstream {
    let mut res = body::problem(Problem::new(
        Reason::NoRoute,
        "no route matches this request",
    ));
    res.extensions_mut()
        .insert(Outcome::Refused(Refusal::NoRoute));
    res
}

/// The client end of one connection, with its `X-Forwarded-For` entry rendered once and the
/// scheme it reached the gateway by (`X-Forwarded-Proto`).
#[derive(Debug, Clone)]
pub struct Peer {
    ip: HeaderValue,
    proto: HeaderValue,
}

impl Peer {
    /// The peer at `remote`, over plain TCP.
    pub fn new(remote: SocketAddr) -> Self {
        // An IP address always renders as a valid header value.
        let ip = HeaderValue::from_str(&remote.ip().to_string())
            .unwrap_or(HeaderValue::from_static("unknown"));
        Self {
            ip,
            proto: HeaderValue::from_static("http"),
        }
    }

    /// The same peer, over TLS when `tls` is true.
    #[must_use]
    pub fn over_tls(mut self, tls: bool) -> Self {
        if tls {
            self.proto = HeaderValue::from_static("https");
        }
        self
    }
}

/// The engine a protected route runs on: the shared one, asking the route's status webhook
/// (if it has one) before it answers that a key is unknown.
///
/// # Errors
/// An absolute `status_url` that is not a usable origin.
pub(crate) fn with_webhook(
    engine: &Engine<GatewayStore>,
    settings: &Settings,
    route: &Route,
    clients: &mut Clients,
) -> anyhow::Result<Engine<GatewayStore>> {
    let timeout = route.policy.engine.probe_timeout();
    Ok(
        match crate::webhook::Webhook::of_route(settings, route, clients, timeout)? {
            Some(hook) => engine.with_probe(Arc::new(hook)),
            None => engine.clone(),
        },
    )
}

/// The request id: the client's if it is a sane one, else a fresh UUID v7. Set on the
/// request so the upstream sees it.
fn request_id(parts: &mut Parts, name: &HeaderName) -> HeaderValue {
    let given = parts
        .headers
        .get(name)
        .filter(|v| {
            !v.is_empty() && v.len() <= 200 && v.as_bytes().iter().all(|b| b.is_ascii_graphic())
        })
        .cloned();
    let id = match given {
        // Already on the request; only a repeated header needs collapsing to this one value.
        Some(id) if parts.headers.get_all(name).iter().nth(1).is_none() => id,
        Some(id) => {
            parts.headers.insert(name.clone(), id.clone());
            id
        }
        None => {
            let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
            let text = uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf);
            let id = HeaderValue::from_str(text).unwrap_or(HeaderValue::from_static("invalid"));
            parts.headers.insert(name.clone(), id.clone());
            id
        }
    };
    if name != X_REQUEST_ID {
        // The idempotency layer records `x-request-id` on the claim.
        parts.headers.insert(X_REQUEST_ID, id.clone());
    }
    id
}

fn append_forwarded_for(parts: &mut Parts, peer: &Peer) {
    let joined = match parts.headers.get(&X_FORWARDED_FOR) {
        None => {
            parts.headers.insert(X_FORWARDED_FOR, peer.ip.clone());
            return;
        }
        Some(prev) => match (prev.to_str(), peer.ip.to_str()) {
            (Ok(prev), Ok(ip)) => format!("{prev}, {ip}"),
            // An unreadable earlier value is replaced, as before.
            _ => {
                parts.headers.insert(X_FORWARDED_FOR, peer.ip.clone());
                return;
            }
        },
    };
    if let Ok(v) = HeaderValue::from_str(&joined) {
        parts.headers.insert(X_FORWARDED_FOR, v);
    }
}

/// Answers every request with `app`, for hyper.
pub fn service(
    app: Arc<App>,
    remote: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<ResBody>,
    Error = Infallible,
    Future: Send,
> + Clone {
    let peer = Arc::new(Peer::new(remote));
    hyper::service::service_fn(move |req| {
        let app = Arc::clone(&app);
        let peer = Arc::clone(&peer);
        async move { Ok::<_, Infallible>(app.handle_from(req, &peer).await) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::parts;

    #[test]
    fn request_ids_are_kept_or_made() {
        let name = HeaderName::from_static("x-request-id");
        let mut p = parts("POST", "/", &[("x-request-id", "abc-123")]);
        assert_eq!(request_id(&mut p, &name), "abc-123");
        let mut p = parts("POST", "/", &[]);
        let made = request_id(&mut p, &name);
        assert_eq!(made.len(), 36);
        assert_eq!(p.headers.get(&name), Some(&made));
        let mut p = parts("POST", "/", &[("x-request-id", "has space")]);
        assert_ne!(request_id(&mut p, &name), "has space");
        // A repeated header collapses to the first (sane) value.
        let mut p = parts(
            "POST",
            "/",
            &[("x-request-id", "first"), ("x-request-id", "second")],
        );
        assert_eq!(request_id(&mut p, &name), "first");
        let all: Vec<_> = p.headers.get_all(&name).iter().collect();
        assert_eq!(all, ["first"]);
        // Under another header name, the id is copied to `x-request-id` for the layer.
        let trace = HeaderName::from_static("x-trace");
        let mut p = parts(
            "POST",
            "/",
            &[("x-trace", "t-1"), ("x-request-id", "other")],
        );
        assert_eq!(request_id(&mut p, &trace), "t-1");
        assert_eq!(
            p.headers.get("x-request-id").map(|v| v.as_bytes()),
            Some(&b"t-1"[..])
        );
        let made = request_id(&mut parts("POST", "/", &[]), &trace);
        assert!(uuid::Uuid::parse_str(made.to_str().expect("ascii")).is_ok());
    }

    #[test]
    fn forwarded_for_is_appended() {
        let peer = Peer::new(SocketAddr::from(([10, 0, 0, 7], 5000)));
        let mut p = parts("POST", "/", &[]);
        append_forwarded_for(&mut p, &peer);
        assert_eq!(
            p.headers.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"10.0.0.7"[..])
        );
        let mut p = parts("POST", "/", &[("x-forwarded-for", "1.2.3.4")]);
        append_forwarded_for(&mut p, &peer);
        assert_eq!(
            p.headers.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"1.2.3.4, 10.0.0.7"[..])
        );
        let v6 = Peer::new("[::1]:80".parse().expect("addr"));
        let mut p = parts("POST", "/", &[]);
        append_forwarded_for(&mut p, &v6);
        assert_eq!(
            p.headers.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"::1"[..])
        );
    }
}
