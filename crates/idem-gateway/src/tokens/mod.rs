//! Token routes: the gateway issues one-time tokens and the token header replaces the
//! idempotency key.
//!
//! - **Issue**: `POST <token.issue>` is answered here and never forwarded. The caller's
//!   principal is found by the route's principal source (refused with 401 as on the route),
//!   the issue is rate limited per principal ([`Limiter`]), and the answer is `201` with
//!   `{ "token", "expires_at", "header" }` and `Cache-Control: no-store`. The token lives in
//!   the route's namespace and the principal's scope, so it is unknown to anyone else.
//! - **Submit**: on the route, the token header is checked first (missing: 428, malformed or
//!   sent with an `Idempotency-Key`: 400). Then idem-http's layer claims the record keyed by
//!   the token's digest ([`gate::record_key`]) in the same scope; only a fresh claim reaches
//!   [`TokenGate`], which consumes the token and forwards. A retry with the same token finds
//!   the record and is replayed (or gets 409 while the first is in flight).
//! - A consume that fails (unknown 403, expired 410, used without a kept answer 409, store
//!   error 503) releases the claim, since nothing ran, and answers a problem; the table is in
//!   `docs/gateway.md`.
//!
//! Tokens never appear in full in logs, metrics or records: logs print [`Token`]'s `Debug`
//! (a prefix), records hold the digest key, metrics carry route and outcome only.

mod gate;
mod limit;
mod store;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use idem_core::token::{IssueRequest, Token};
use idem_core::{Engine, Outcome, Refusal, Scope};
use idem_http::buffer::BodyPace;
use idem_http::policy::ExtractPrincipal;
use idem_http::{Idempotency, IdempotencyLayer, Problem, Reason, ResponseBody};
use metrics::Counter;
use tower::Layer as _;

use crate::body::{self, ResBody};
use crate::config::{PrincipalSource, Route, TokenSettings};
use crate::observe::TimedProxy;
use crate::protect::layer_config;
use crate::shared::GatewayStore;

use gate::TokenKey;
pub(crate) use gate::{Presented, presented, record_key};
pub use gate::{TokenGate, TokenRefusal};
pub use limit::Limiter;
pub use store::GatewayTokens;

/// A token route's handler: idem-http's layer keyed by the token, over the gate that
/// consumes it in front of the proxy, and the check made before the layer.
pub struct TokenRoute {
    /// The layer.
    pub svc: Idempotency<TokenGate, GatewayStore>,
    /// The check before it.
    pub check: TokenCheck,
}

impl std::fmt::Debug for TokenRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRoute")
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

impl TokenRoute {
    /// The handler of `route` (with token mode `t`) over `proxy`, reading request bodies at
    /// `pace`, and its issue endpoint.
    ///
    /// # Errors
    /// A policy the layer refuses or an invalid namespace (both refused when the
    /// configuration compiled).
    pub fn build(
        route: &Route,
        t: &TokenSettings,
        engine: &Engine<GatewayStore>,
        proxy: TimedProxy,
        tokens: &GatewayTokens,
        pace: BodyPace,
    ) -> anyhow::Result<(Self, TokenIssuer)> {
        let counters = Counters::new(&route.name);
        let issuer = TokenIssuer::new(route, tokens.clone(), counters.clone())?;
        let gate = TokenGate {
            inner: proxy,
            tokens: tokens.clone(),
            header: t.header.clone(),
            namespace: issuer.namespace().clone(),
            principal: route.policy.principal.clone(),
            counters: counters.clone(),
        };
        let config = layer_config(&route.policy)?
            .key(TokenKey {
                header: t.header.clone(),
            })
            .body_pace(pace);
        let svc = IdempotencyLayer::new(engine, config).layer(gate);
        let check = TokenCheck::new(t, counters);
        Ok((Self { svc, check }, issuer))
    }
}

/// What became of a token request, the `outcome` label of `idem_tokens_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEvent {
    /// A token was issued.
    Issued,
    /// An issue was refused by the rate limit.
    RateLimited,
    /// An issue was refused: no principal.
    Unauthenticated,
    /// An issue failed in the store.
    IssueFailed,
    /// A token was consumed and the request forwarded.
    Consumed,
    /// A submit without a token.
    Missing,
    /// A submit with something that is not one token.
    Malformed,
    /// A submit with an `Idempotency-Key` besides the token.
    WithKey,
    /// A token unknown in the caller's scope.
    Unknown,
    /// A token past its TTL.
    Expired,
    /// A token used before, with no answer kept.
    Used,
    /// A token bound to another payload.
    Mismatch,
    /// The store failed during a consume.
    ConsumeFailed,
}

const EVENTS: [TokenEvent; 13] = [
    TokenEvent::Issued,
    TokenEvent::RateLimited,
    TokenEvent::Unauthenticated,
    TokenEvent::IssueFailed,
    TokenEvent::Consumed,
    TokenEvent::Missing,
    TokenEvent::Malformed,
    TokenEvent::WithKey,
    TokenEvent::Unknown,
    TokenEvent::Expired,
    TokenEvent::Used,
    TokenEvent::Mismatch,
    TokenEvent::ConsumeFailed,
];

impl TokenEvent {
    /// The label value: `issued`, `rate_limited`, `unauthenticated`, `issue_failed`,
    /// `consumed`, `missing`, `malformed`, `with_key`, `unknown`, `expired`, `used`,
    /// `mismatch`, `consume_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Issued => "issued",
            Self::RateLimited => "rate_limited",
            Self::Unauthenticated => "unauthenticated",
            Self::IssueFailed => "issue_failed",
            Self::Consumed => "consumed",
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::WithKey => "with_key",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
            Self::Used => "used",
            Self::Mismatch => "mismatch",
            Self::ConsumeFailed => "consume_failed",
        }
    }
}

/// The access log's detail for a token answer: which [`TokenEvent`] it was. Set as a response
/// extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenNote(pub TokenEvent);

/// One route's `idem_tokens_total{route, outcome}` counters, looked up once.
#[derive(Clone)]
pub struct Counters(Arc<Vec<Counter>>);

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters")
    }
}

impl Counters {
    /// The counters of route `route`, from whichever recorder is installed now.
    pub fn new(route: &str) -> Self {
        Self(Arc::new(
            EVENTS
                .iter()
                .map(|e| {
                    metrics::counter!("idem_tokens_total", "route" => route.to_owned(), "outcome" => e.as_str())
                })
                .collect(),
        ))
    }

    /// Counts one `event`.
    pub fn count(&self, event: TokenEvent) {
        if let Some(c) = EVENTS
            .iter()
            .position(|e| *e == event)
            .and_then(|i| self.0.get(i))
        {
            c.increment(1);
        }
    }
}

/// What a token route checks before its layer, and how it words its refusals.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    header: HeaderName,
    issue: String,
    counters: Counters,
}

/// The `Idempotency-Key` header, refused next to a token.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

impl TokenCheck {
    /// The check of a route with `settings`, counting into `counters`.
    pub fn new(settings: &TokenSettings, counters: Counters) -> Self {
        Self {
            header: settings.header.clone(),
            issue: settings.issue.clone(),
            counters,
        }
    }

    /// The refusal of an unsafe request without exactly one well-formed token, or with an
    /// `Idempotency-Key` besides it; `None` lets the request on. Safe methods pass (the layer
    /// forwards them unprotected).
    pub fn refusal(&self, method: &Method, headers: &HeaderMap) -> Option<Response<ResBody>> {
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return None;
        }
        if self.header != IDEMPOTENCY_KEY && headers.contains_key(IDEMPOTENCY_KEY) {
            return Some(self.refuse(TokenEvent::WithKey));
        }
        match gate::presented(headers, &self.header) {
            gate::Presented::Token(_) => None,
            gate::Presented::Missing => Some(self.refuse(TokenEvent::Missing)),
            gate::Presented::Malformed => Some(self.refuse(TokenEvent::Malformed)),
        }
    }

    /// The answer to the gate's refusal (the claim is already released).
    pub fn refused(&self, refusal: TokenRefusal) -> Response<ResBody> {
        let event = match refusal {
            TokenRefusal::Missing => TokenEvent::Missing,
            TokenRefusal::Malformed => TokenEvent::Malformed,
            TokenRefusal::Unknown => TokenEvent::Unknown,
            TokenRefusal::Expired => TokenEvent::Expired,
            TokenRefusal::Used => TokenEvent::Used,
            TokenRefusal::Mismatch => TokenEvent::Mismatch,
            TokenRefusal::Store(_) => TokenEvent::ConsumeFailed,
        };
        self.refuse(event)
    }

    fn refuse(&self, event: TokenEvent) -> Response<ResBody> {
        self.counters.count(event);
        let (h, new) = (&self.header, format!("POST {} for a new one", self.issue));
        let problem = match event {
            TokenEvent::Missing => Problem::new(Reason::TokenMissing, format!("this route takes a one-time token in `{h}`: POST {} to get one", self.issue),
            ),
            TokenEvent::WithKey => Problem::new(Reason::TokenWithKey, format!("this route takes its idempotency from the one-time token in `{h}`; send the token without Idempotency-Key"),
            ),
            TokenEvent::Unknown => Problem::new(Reason::TokenUnknown, format!("this token was not issued to this caller for this route, or it has been forgotten; {new}"),
            ),
            TokenEvent::Expired => Problem::new(Reason::TokenExpired, format!("this token expired before it was used; {new}"),
            ),
            TokenEvent::Used => Problem::new(Reason::TokenUsed, format!("this token was used and no answer is kept under it (the request it guarded failed or its answer was not stored); a used token is never restored: {new}"),
            ),
            TokenEvent::Mismatch => Problem::new(Reason::TokenMismatch, format!("this token is bound to another payload; {new}"),
            ),
            TokenEvent::ConsumeFailed => Problem::new(Reason::TokenStoreUnavailable, "the token store failed while using this token, so it may be used up: retry with the same token (it runs if the token was not used, else 409 token-used) or get a new one",
            )
            .retry_after(Duration::from_secs(1)),
            // Malformed, and anything the submit side never produces.
            _ => Problem::new(Reason::TokenMalformed, format!("`{h}` must hold exactly one token of 64 lowercase hex digits, as issued by POST {}", self.issue),
            ),
        };
        let outcome = match event {
            TokenEvent::ConsumeFailed => Outcome::StoreUnavailable,
            _ => Outcome::Refused(Refusal::Token),
        };
        answer(problem, outcome, event)
    }
}

/// A problem answer with its outcome and token note.
fn answer(problem: Problem, outcome: Outcome, event: TokenEvent) -> Response<ResBody> {
    let mut res = body::problem(problem);
    res.extensions_mut().insert(outcome);
    res.extensions_mut().insert(TokenNote(event));
    body::boxed(res)
}

/// The issue endpoint of one token route.
pub struct TokenIssuer {
    issue: String,
    header: HeaderName,
    ttl: Duration,
    namespace: Scope,
    principal: PrincipalSource,
    limiter: Limiter,
    /// The route's rate for all callers together: one bucket, checked after the caller's.
    global: Limiter,
    tokens: GatewayTokens,
    counters: Counters,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("issue", &self.issue)
            .field("namespace", &self.namespace.namespace())
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// The issue endpoint of `route` (which has token mode), issuing into `tokens`.
    ///
    /// # Errors
    /// The route has no token mode, or an invalid namespace (refused when the configuration
    /// compiled).
    pub fn new(route: &Route, tokens: GatewayTokens, counters: Counters) -> anyhow::Result<Self> {
        let p = &route.policy;
        let t = p
            .token
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("route `{}` has no token mode", route.name))?;
        Ok(Self {
            issue: t.issue.clone(),
            header: t.header.clone(),
            ttl: t.ttl,
            namespace: Scope::new(p.namespace.clone())?,
            principal: p.principal.clone(),
            limiter: Limiter::new(t.rate, limit::DEFAULT_CAPACITY)?,
            global: Limiter::new(t.global_rate, 1)?,
            tokens,
            counters,
        })
    }

    /// The base scope tokens of this route live in (before the principal).
    pub fn namespace(&self) -> &Scope {
        &self.namespace
    }

    /// Whether a request for `raw` (the path as sent; `normal`, its normalised spelling if
    /// it has one) is for this endpoint: either is the issue path, the latter in any letter
    /// case.
    pub fn owns(&self, raw: &str, normal: Option<&str>) -> bool {
        raw == self.issue || normal.is_some_and(|n| n.eq_ignore_ascii_case(&self.issue))
    }

    /// Answers one request to the issue path.
    pub async fn answer(&self, parts: &Parts) -> Response<ResBody> {
        if parts.method != Method::POST {
            let mut res = body::problem(Problem::new(
                Reason::MethodNotAllowed,
                format!(
                    "POST {} issues a token; nothing else is answered here",
                    self.issue
                ),
            ));
            res.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            res.extensions_mut()
                .insert(Outcome::Refused(Refusal::BadTarget));
            return body::boxed(res);
        }
        let principal = match self.principal.principal(parts) {
            Ok(p) => p,
            Err(r) => {
                let problem = Problem::new(r.reason(), r.detail());
                self.counters.count(TokenEvent::Unauthenticated);
                return answer(
                    problem,
                    Outcome::Refused(r.refusal()),
                    TokenEvent::Unauthenticated,
                );
            }
        };
        // The caller's own rate first, so a caller past it uses none of the route's; then the
        // route's for everyone, which bounds callers who invent a credential per request.
        let limited = match self.limiter.check(principal.as_deref()) {
            Err(wait) => Some((
                wait,
                "this caller asked for tokens faster than the route allows; retry after the time given",
            )),
            Ok(()) => self.global.check(None).err().map(|wait| {
                (
                    wait,
                    "this route is issuing tokens as fast as it allows for all callers together; retry after the time given",
                )
            }),
        };
        if let Some((wait, detail)) = limited {
            self.counters.count(TokenEvent::RateLimited);
            let problem = Problem::new(Reason::TokenRateLimited, detail).retry_after(wait);
            return answer(
                problem,
                Outcome::Refused(Refusal::Token),
                TokenEvent::RateLimited,
            );
        }
        let scope = match principal {
            Some(p) => self.namespace.clone().with_principal(p),
            None => self.namespace.clone(),
        };
        let issued = match IssueRequest::new(scope, self.ttl) {
            Ok(req) => self.tokens.issue(&req).await,
            // The TTL was checked when the configuration compiled.
            Err(e) => Err(idem_core::StoreError::unavailable(e.to_string())),
        };
        match issued {
            Ok(issued) => {
                self.counters.count(TokenEvent::Issued);
                self.issued(&issued.token, issued.expires_at.as_millis())
            }
            Err(e @ idem_core::StoreError::Full { .. }) => {
                // Full of live tokens: new ones wait for some to be used or expire, while
                // every live one keeps working (consuming one needs no room).
                tracing::warn!(error = %e, "token store full; no token issued");
                self.counters.count(TokenEvent::IssueFailed);
                let problem = Problem::new(Reason::TokenStoreFull, "the token store holds as many live tokens as it may; no token was issued, and tokens already issued still work. Retry later",
                )
                .retry_after(Duration::from_secs(5));
                answer(problem, Outcome::StoreUnavailable, TokenEvent::IssueFailed)
            }
            Err(e) => {
                tracing::warn!(error = %e, "token issue failed");
                self.counters.count(TokenEvent::IssueFailed);
                let problem = Problem::new(
                    Reason::TokenStoreUnavailable,
                    "the token store failed; no token was issued. Retry shortly",
                )
                .retry_after(Duration::from_secs(1));
                answer(problem, Outcome::StoreUnavailable, TokenEvent::IssueFailed)
            }
        }
    }

    fn issued(&self, token: &Token, expires_ms: u64) -> Response<ResBody> {
        let expires = UNIX_EPOCH + Duration::from_millis(expires_ms);
        let body = serde_json::json!({
            "token": token.as_str(),
            "expires_at": humantime::format_rfc3339_millis(expires.max(SystemTime::UNIX_EPOCH)).to_string(),
            "header": self.header.as_str(),
        });
        let mut res = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
        *res.status_mut() = StatusCode::CREATED;
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        res.extensions_mut().insert(Outcome::Queried);
        res.extensions_mut().insert(TokenNote(TokenEvent::Issued));
        body::boxed::<body::UpstreamBody>(res)
    }
}
