//! The token route's two plug-ins into idem-http's layer: the key (a digest of the token, so
//! records, logs and the admin API never hold a usable token) and the gate in front of the
//! proxy that consumes the token. The layer calls the gate only after a fresh claim, so a
//! retry that finds the record is replayed (or told the first is in flight) without touching
//! the token; a refusal from the gate is an `Err`, on which the layer releases the claim
//! (nothing ran) and the app answers the refusal.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderMap, HeaderName, Request};
use idem_core::token::{ConsumeOutcome, Token};
use idem_core::{Key, Scope, StoreError};
use idem_http::policy::{ExtractKey, ExtractPrincipal, FoundKey};
use idem_http::{KeyRejection, RequestBody};
use tower::Service;

use super::{Counters, TokenEvent};
use crate::body::Upstream;
use crate::config::PrincipalSource;
use crate::observe::TimedProxy;

use super::store::GatewayTokens;

/// What a request's token header holds.
#[derive(Debug)]
pub(crate) enum Presented {
    /// No token header.
    Missing,
    /// More than one, or not a token.
    Malformed,
    /// One well-formed token.
    Token(Token),
}

/// Reads the token from `header`.
pub(crate) fn presented(headers: &HeaderMap, header: &HeaderName) -> Presented {
    let mut values = headers.get_all(header).iter();
    let Some(first) = values.next() else {
        return Presented::Missing;
    };
    if values.next().is_some() {
        return Presented::Malformed;
    }
    match first.to_str().map(|t| Token::parse(t.trim())) {
        Ok(Ok(token)) => Presented::Token(token),
        _ => Presented::Malformed,
    }
}

/// The record key of a token: `tok-`, the token's first 8 digits (as its `Debug` shows
/// them), `-`, and 32 digits of a keyed digest of the whole token. One-way: the key gives
/// nobody the token.
///
/// `None` cannot happen: the scope and the 45 printable characters are always valid.
pub(crate) fn record_key(token: &Token) -> Option<Key> {
    let scope = Scope::new("idem-gateway.token-record-key").ok()?;
    let digest = token.digest(&scope);
    let prefix = token.as_str().get(..8)?;
    Key::new(format!("tok-{prefix}-{}", hex::encode(&digest[..16]))).ok()
}

/// The layer's key on a token route: the token's record key.
#[derive(Debug)]
pub(crate) struct TokenKey {
    pub(crate) header: HeaderName,
}

impl ExtractKey for TokenKey {
    fn extract(&self, parts: &Parts) -> Result<Option<FoundKey>, KeyRejection> {
        match presented(&parts.headers, &self.header) {
            // The app answers a missing or malformed token before the layer sees it; these
            // arms keep the layer safe on its own.
            Presented::Missing => Ok(None),
            Presented::Malformed => Err(KeyRejection::Malformed),
            Presented::Token(token) => Ok(Some(FoundKey {
                key: record_key(&token).ok_or(KeyRejection::Malformed)?,
                // The token is not echoed on replays: the client has it.
                echo: None,
            })),
        }
    }
}

/// Why the gate let nothing through. The claim is released; the app answers this.
#[derive(Debug)]
pub enum TokenRefusal {
    /// No token (only reached if the app's check is bypassed).
    Missing,
    /// Not a token.
    Malformed,
    /// Not issued in this scope (never, to another principal or route, or forgotten).
    Unknown,
    /// Its TTL ran out before it was used.
    Expired,
    /// Consumed before, and no answer was kept under it.
    Used,
    /// Bound to another payload (a token not issued by the gateway).
    Mismatch,
    /// The store failed during the consume: the token may be consumed.
    Store(StoreError),
}

/// The proxy behind a token route's layer: consumes the token, then forwards.
#[derive(Clone)]
pub struct TokenGate {
    pub(crate) inner: TimedProxy,
    pub(crate) tokens: GatewayTokens,
    pub(crate) header: HeaderName,
    pub(crate) namespace: Scope,
    pub(crate) principal: PrincipalSource,
    pub(crate) counters: Counters,
}

impl std::fmt::Debug for TokenGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenGate")
            .field("header", &self.header)
            .field("namespace", &self.namespace.namespace())
            .finish_non_exhaustive()
    }
}

impl TokenGate {
    /// The scope a token of this request lives in: the route's namespace and the principal
    /// the route's principal source finds, exactly as the layer scopes the record.
    pub(crate) fn scope(
        namespace: &Scope,
        principal: &PrincipalSource,
        parts: &Parts,
    ) -> Option<Scope> {
        match principal.principal(parts) {
            Ok(Some(p)) => Some(namespace.clone().with_principal(p)),
            Ok(None) => Some(namespace.clone()),
            Err(_) => None,
        }
    }

    async fn pass(self, req: Request<RequestBody>) -> Result<Upstream, TokenRefusal> {
        let (parts, body) = req.into_parts();
        let token = match presented(&parts.headers, &self.header) {
            Presented::Token(t) => t,
            Presented::Missing => return Err(TokenRefusal::Missing),
            Presented::Malformed => return Err(TokenRefusal::Malformed),
        };
        // The layer found the principal from these same headers before it claimed, so this
        // finds it again; a refusal here would be a changed source, answered as unknown.
        let Some(scope) = Self::scope(&self.namespace, &self.principal, &parts) else {
            return Err(TokenRefusal::Unknown);
        };
        let refusal = match self.tokens.consume(&scope, &token).await {
            Ok(ConsumeOutcome::Consumed { .. }) => {
                self.counters.count(TokenEvent::Consumed);
                let req = Request::from_parts(parts, body);
                return Ok(self.inner.forward(req).await);
            }
            Ok(ConsumeOutcome::Unknown) => TokenRefusal::Unknown,
            Ok(ConsumeOutcome::Expired) => TokenRefusal::Expired,
            Ok(ConsumeOutcome::AlreadyConsumed) => TokenRefusal::Used,
            Ok(ConsumeOutcome::Mismatch) => TokenRefusal::Mismatch,
            Ok(_) => TokenRefusal::Unknown,
            Err(e) => {
                tracing::warn!(token = ?token, error = %e, "token consume failed; the token counts as used");
                TokenRefusal::Store(e)
            }
        };
        Err(refusal)
    }
}

impl Service<Request<RequestBody>> for TokenGate {
    type Response = Upstream;
    type Error = TokenRefusal;
    type Future = Pin<Box<dyn Future<Output = Result<Upstream, TokenRefusal>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), TokenRefusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody>) -> Self::Future {
        Box::pin(self.clone().pass(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::parts;

    #[test]
    fn tokens_are_read_strictly() {
        let name = HeaderName::from_static("idempotency-token");
        let t = "ab".repeat(32);
        let p = parts("POST", "/", &[("idempotency-token", &t)]);
        assert!(matches!(presented(&p.headers, &name), Presented::Token(x) if x.as_str() == t));
        let p = parts("POST", "/", &[]);
        assert!(matches!(presented(&p.headers, &name), Presented::Missing));
        for bad in ["", "abc", &"AB".repeat(32), &"zz".repeat(32)] {
            let p = parts("POST", "/", &[("idempotency-token", bad)]);
            assert!(
                matches!(presented(&p.headers, &name), Presented::Malformed),
                "{bad}"
            );
        }
        let p = parts(
            "POST",
            "/",
            &[("idempotency-token", &t), ("idempotency-token", &t)],
        );
        assert!(matches!(presented(&p.headers, &name), Presented::Malformed));
    }

    #[test]
    fn record_keys_never_hold_the_token() {
        let t = Token::parse(&"0123456789abcdef".repeat(4)).expect("token");
        let k = record_key(&t).expect("key");
        assert!(k.as_str().starts_with("tok-01234567-"), "{k}");
        assert_eq!(k.as_str().len(), 4 + 8 + 1 + 32);
        assert!(!k.as_str().contains(&t.as_str()[8..]));
        let other = Token::parse(&"cd".repeat(32)).expect("token");
        assert_ne!(record_key(&other), Some(k.clone()));
        assert_eq!(record_key(&t), Some(k));
    }
}
