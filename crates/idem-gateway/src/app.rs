//! The data plane: request ids, route matching, and per route either a plain proxy or the
//! idem-http layer in front of the proxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_core::fingerprint::canonical_json_filtered;
use idem_core::{BoxStore, Engine, Fingerprint, Policy};
use idem_http::policy::{
    ExtractPrincipal, FingerprintRequest, HeaderKey, PrincipalRejection, StoreDecision, StorePolicy,
};
use idem_http::{
    Idempotency, IdempotencyConfig, IdempotencyLayer, ResponseBody, StreamingResponses,
};
use tower::{Layer as _, Service as _};

use crate::config::{
    FingerprintBody, FingerprintSettings, PrincipalSource, Route, RoutePolicy, Settings,
    UpstreamFailure,
};
use crate::metrics::{MeteredStore, OutcomeCounters, PROBLEM_SLUG, RequestOutcome, classify};
use crate::principal;
use crate::proxy::{self, HttpClient, Proxy, ReqBody, ResBody};

/// The store as the gateway uses it: any backend, measured.
pub type GatewayStore = MeteredStore<BoxStore>;

type Protected = Idempotency<Proxy, GatewayStore>;

enum Handler {
    Plain(Proxy),
    Protected {
        svc: Protected,
        policy: Arc<RoutePolicy>,
    },
}

struct Entry {
    route: Route,
    handler: Handler,
}

/// The data-plane application. Cheap to share behind an `Arc`.
pub struct App {
    entries: Vec<Entry>,
    fallback: Option<Proxy>,
    request_id: HeaderName,
    outcomes: OutcomeCounters,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("routes", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// Methods the layer passes through unprotected.
const SAFE: [Method; 3] = [Method::GET, Method::HEAD, Method::OPTIONS];

impl App {
    /// Builds the routes over `store`. `upstream` is the default upstream (the configured one
    /// or the demo upstream's address).
    ///
    /// # Errors
    /// A route without any upstream, or a policy the layer refuses.
    pub fn new(
        settings: &Settings,
        store: GatewayStore,
        upstream: Option<&Uri>,
        client: &HttpClient,
    ) -> anyhow::Result<Self> {
        let engine = Engine::new(store, Policy::default());
        let mut entries = Vec::with_capacity(settings.routes.len());
        for route in &settings.routes {
            let target = route
                .upstream
                .as_ref()
                .or(upstream)
                .ok_or_else(|| anyhow::anyhow!("route `{}` has no upstream", route.name))?;
            let p = &route.policy;
            let timeout = p.engine.handler_timeout().saturating_sub(HANDLER_BACKSTOP);
            let handler = if p.idempotency {
                // Buffer protected responses inside the upstream timeout, so a reset mid-body
                // is classified like any other failure after sending.
                let proxy =
                    Proxy::new(client.clone(), target, timeout, Some(p.max_stored_response))?;
                let layer = IdempotencyLayer::new(&engine, layer_config(p)?);
                Handler::Protected {
                    svc: layer.layer(proxy),
                    policy: Arc::clone(p),
                }
            } else {
                Handler::Plain(Proxy::new(client.clone(), target, timeout, None)?)
            };
            entries.push(Entry {
                route: route.clone(),
                handler,
            });
        }
        let fallback = upstream
            .map(|u| Proxy::new(client.clone(), u, Duration::from_secs(30), None))
            .transpose()?;
        Ok(Self {
            entries,
            fallback,
            request_id: settings.request_id_header.clone(),
            outcomes: OutcomeCounters::new(),
        })
    }

    /// Handles one request from `remote`.
    pub async fn handle(&self, req: Request<Incoming>, remote: SocketAddr) -> Response<ResBody> {
        self.handle_from(req, &Peer::new(remote)).await
    }

    /// Handles one request from `peer` (what [`service`] calls: the peer's address is
    /// rendered once per connection, not per request).
    pub async fn handle_from(&self, req: Request<Incoming>, peer: &Peer) -> Response<ResBody> {
        // Everything only the access log needs is skipped when it is off.
        let log = tracing::enabled!(tracing::Level::INFO);
        let started = log.then(Instant::now);
        let (mut parts, body) = req.into_parts();
        let request_id = request_id(&mut parts, &self.request_id);
        append_forwarded_for(&mut parts, peer);
        let method = parts.method.clone();
        let path = log.then(|| parts.uri.path().to_owned());
        let entry = self.entries.iter().find(|e| {
            e.route.methods.contains(&parts.method) && e.route.pattern.matches(parts.uri.path())
        });
        let req = Request::from_parts(parts, ReqBody::Incoming(body));

        let (mut res, outcome, route) = match entry {
            None => match &self.fallback {
                Some(proxy) => (proxy.forward(req).await, RequestOutcome::Passthrough, "-"),
                None => (
                    proxy::problem(
                        StatusCode::NOT_FOUND,
                        "no-route",
                        "No route",
                        "no route matches this request",
                        None,
                    ),
                    RequestOutcome::Refused,
                    "-",
                ),
            },
            Some(Entry {
                route,
                handler: Handler::Plain(proxy),
            }) => (
                proxy.forward(req).await,
                RequestOutcome::Passthrough,
                route.name.as_str(),
            ),
            Some(Entry {
                route,
                handler: Handler::Protected { svc, policy },
            }) => {
                let passthrough = SAFE.contains(&method)
                    || (!policy.key_required && !req.headers().contains_key(&policy.key_header));
                let res = match svc.clone().call(req).await {
                    Ok(res) => res,
                    Err(never) => match never {},
                };
                let (res, outcome) = if passthrough {
                    (res.map(|b| b.boxed_unsync()), RequestOutcome::Passthrough)
                } else {
                    classified(res).await
                };
                (res, outcome, route.name.as_str())
            }
        };
        self.outcomes.record(outcome);
        res.headers_mut().remove(PROBLEM_SLUG);
        if let Some(started) = started {
            tracing::info!(
                request_id = request_id.to_str().unwrap_or("-"),
                %method,
                path = path.as_deref().unwrap_or("-"),
                route,
                status = res.status().as_u16(),
                outcome = outcome.as_str(),
                micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                "request"
            );
        }
        res.headers_mut()
            .insert(self.request_id.clone(), request_id);
        res
    }
}

/// The client end of one connection, with its `X-Forwarded-For` entry rendered once.
#[derive(Debug, Clone)]
pub struct Peer {
    ip: HeaderValue,
}

impl Peer {
    /// The peer at `remote`.
    pub fn new(remote: SocketAddr) -> Self {
        // An IP address always renders as a valid header value.
        let ip = HeaderValue::from_str(&remote.ip().to_string())
            .unwrap_or(HeaderValue::from_static("unknown"));
        Self { ip }
    }
}

/// The engine's handler timeout is the proxy's plus this, so the proxy's own timeout (and its
/// 504, handled per `upstream_failure`) always fires first.
pub const HANDLER_BACKSTOP: Duration = Duration::from_secs(1);

/// Reads the answer's problem type (if it is a small problem+json made in memory) and
/// classifies the outcome.
fn classified(
    res: Response<ResponseBody<ResBody>>,
) -> impl Future<Output = (Response<ResBody>, RequestOutcome)> + Send {
    // Boxed before any await: the layer's body type is not provably `Send` across one.
    let (head, body) = res.into_parts();
    classified_boxed(head, body.boxed_unsync())
}

async fn classified_boxed(
    head: http::response::Parts,
    body: ResBody,
) -> (Response<ResBody>, RequestOutcome) {
    if let Some(slug) = head.headers.get(PROBLEM_SLUG).and_then(|v| v.to_str().ok()) {
        let outcome = classify(head.status, &head.headers, Some(slug));
        return (Response::from_parts(head, body), outcome);
    }
    let is_problem = head
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    let small = body.size_hint().exact().is_some_and(|n| n <= 8192);
    if !(is_problem && small) {
        let outcome = classify(head.status, &head.headers, None);
        return (Response::from_parts(head, body), outcome);
    }
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let slug = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| {
            v.get("type")?
                .as_str()?
                .strip_prefix(idem_http::PROBLEM_BASE)
                .map(str::to_owned)
        });
    let outcome = classify(
        head.status,
        &head.headers,
        Some(slug.as_deref().unwrap_or("upstream-problem")),
    );
    // A problem from the upstream itself (not idem's) is still an execution.
    let outcome = if slug.is_none() {
        classify(head.status, &head.headers, None)
    } else {
        outcome
    };
    (Response::from_parts(head, proxy::full(bytes)), outcome)
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

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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

fn layer_config(p: &RoutePolicy) -> anyhow::Result<IdempotencyConfig> {
    Ok(IdempotencyConfig::new(p.namespace.clone())
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .key_required(p.key_required)
        .key(HeaderKey::names([p.key_header.clone()]))
        .principal(GatewayPrincipal(p.principal.clone()))
        .fingerprint(GatewayFingerprint(p.fingerprint.clone()))
        .store_policy(GatewayStorePolicy {
            policy: StatusPolicy::from(p),
        })
        .policy(p.engine.clone())
        .max_request_body(p.max_request_body)
        .max_stored_response(p.max_stored_response)
        .replay_headers(p.replay_headers.iter().cloned())
        .streaming(StreamingResponses::Buffer)
        .store_retry_after(Duration::from_secs(1)))
}

/// The principal of a protected request, from the route's configured source.
#[derive(Debug)]
struct GatewayPrincipal(PrincipalSource);

impl ExtractPrincipal for GatewayPrincipal {
    fn principal(&self, parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        principal::extract(&self.0, &parts.headers).map_err(|e| PrincipalRejection(e.to_string()))
    }
}

/// Method + path and query + selected headers + the body (canonical JSON, raw or ignored).
#[derive(Debug)]
struct GatewayFingerprint(FingerprintSettings);

impl FingerprintRequest for GatewayFingerprint {
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        let route = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut fp = Fingerprint::builder(1)
            .part("method", parts.method.as_str().as_bytes())
            .part("route", route.as_bytes());
        for name in &self.0.headers {
            fp = fp.part("header", name.as_str().as_bytes());
            for value in parts.headers.get_all(name) {
                fp = fp.part("value", value.as_bytes());
            }
        }
        match self.0.body {
            FingerprintBody::Ignore => fp,
            FingerprintBody::Raw => fp.part("body", body),
            FingerprintBody::Json => match canonical_json_filtered(body, &self.0.fields) {
                Ok(canonical) if !body.is_empty() => fp.part("json", &canonical),
                _ => fp.part("body", body),
            },
        }
        .finish()
    }
}

#[derive(Debug, Clone)]
struct StatusPolicy {
    store: crate::config::StatusSet,
    release: crate::config::StatusSet,
    upstream_failure: UpstreamFailure,
}

impl From<&RoutePolicy> for StatusPolicy {
    fn from(p: &RoutePolicy) -> Self {
        Self {
            store: p.store_statuses.clone(),
            release: p.release_statuses.clone(),
            upstream_failure: p.upstream_failure,
        }
    }
}

/// Stores the configured statuses; 502 and 504 (the upstream may have acted) follow
/// `upstream_failure`; everything else is released so a retry runs again.
#[derive(Debug)]
struct GatewayStorePolicy {
    policy: StatusPolicy,
}

impl StorePolicy for GatewayStorePolicy {
    fn decide(&self, status: StatusCode) -> StoreDecision {
        let p = &self.policy;
        match status.as_u16() {
            502 | 504 => StoreDecision::Release(p.upstream_failure.release_kind()),
            s if s < 200 => StoreDecision::Release(idem_core::ReleaseKind::Retryable),
            s if p.store.contains(s) && !p.release.contains(s) => StoreDecision::Store,
            _ => StoreDecision::Release(idem_core::ReleaseKind::Retryable),
        }
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

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn fingerprints_follow_the_settings() {
        let json = GatewayFingerprint(FingerprintSettings {
            body: FingerprintBody::Json,
            fields: idem_core::JsonFields::all().exclude(["client_time"]),
            headers: vec![HeaderName::from_static("x-tenant")],
        });
        let p = parts("POST", "/charge", &[("x-tenant", "a")]);
        let a = json.fingerprint(&p, br#"{"amount":1,"client_time":5}"#);
        assert_eq!(
            a,
            json.fingerprint(&p, br#"{ "client_time": 6, "amount": 1 }"#)
        );
        assert_ne!(a, json.fingerprint(&p, br#"{"amount":2}"#));
        assert_ne!(
            a,
            json.fingerprint(
                &parts("POST", "/charge", &[("x-tenant", "b")]),
                br#"{"amount":1}"#
            )
        );
        assert_ne!(
            a,
            json.fingerprint(
                &parts("PUT", "/charge", &[("x-tenant", "a")]),
                br#"{"amount":1}"#
            )
        );
        let ignore = GatewayFingerprint(FingerprintSettings {
            body: FingerprintBody::Ignore,
            fields: idem_core::JsonFields::all(),
            headers: vec![],
        });
        assert_eq!(
            ignore.fingerprint(&p, b"one"),
            ignore.fingerprint(&p, b"two")
        );
    }

    #[test]
    fn statuses_decide_what_is_kept() {
        let s = crate::config::compile(
            &crate::config::from_toml("upstream = \"http://x\"").expect("toml"),
        )
        .expect("valid");
        let hold = GatewayStorePolicy {
            policy: StatusPolicy::from(&*s.routes[0].policy),
        };
        let kind = |code: u16| hold.decide(StatusCode::from_u16(code).expect("status"));
        assert_eq!(kind(201), StoreDecision::Store);
        assert_eq!(kind(422), StoreDecision::Store);
        assert_eq!(
            kind(429),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(500),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(503),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(504),
            StoreDecision::Release(idem_core::ReleaseKind::Unknown)
        );
        let retry = GatewayStorePolicy {
            policy: StatusPolicy {
                upstream_failure: UpstreamFailure::Retry,
                ..StatusPolicy::from(&*s.routes[0].policy)
            },
        };
        assert_eq!(
            retry.decide(StatusCode::BAD_GATEWAY),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
    }

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
