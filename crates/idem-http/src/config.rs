//! Per-route configuration, built at run time (the gateway builds one per configured route).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, header};
use idem_core::{Policy, Scope};

use crate::buffer::BodyPace;
use crate::policy::{
    CanonicalJson, ExtractKey, ExtractPrincipal, FingerprintRequest, HeaderKey, NoPrincipal,
    StorePolicy, StoreUnless5xx,
};

/// Default cap on a buffered request body: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1 << 20;
/// Default cap on a stored response (headers and body): 1 MiB.
pub const DEFAULT_MAX_STORED_RESPONSE: usize = 1 << 20;

/// Response headers stored and replayed by default: the representation's own headers, so a
/// replay is byte-for-byte the first answer (a gzip body keeps its `content-encoding`, a
/// negotiated one its `vary`). Credentials (`set-cookie`, `www-authenticate`) are not among
/// them.
pub const DEFAULT_REPLAY_HEADERS: [HeaderName; 10] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::VARY,
    header::LOCATION,
    header::CACHE_CONTROL,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
];

/// Headers never replayed, whatever the allow-list says: hop-by-hop headers and framing,
/// which belong to one connection, not to the response.
pub const NEVER_REPLAYED: [HeaderName; 9] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
];

/// What happens to a response that streams: `text/event-stream`, or a body whose length is
/// not known in advance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamingResponses {
    /// Pass it through untouched and release the claim (retryable): the route is not
    /// idempotency-protected for such responses, and nothing is half-stored.
    #[default]
    Release,
    /// Buffer it up to the stored-response cap and store it; a stream that ends above the
    /// cap is passed through and recorded with `body_omitted`.
    Buffer,
}

/// An invalid route configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteConfigError {
    /// The namespace is not 1–255 printable ASCII characters without spaces.
    #[error("invalid namespace {0:?}: use 1-255 printable ASCII characters without spaces")]
    Namespace(String),
}

/// How one route (or a group of routes sharing a namespace) is protected.
///
/// Cheap to clone; the layer keeps it in an `Arc`.
#[derive(Clone)]
pub struct IdempotencyConfig {
    pub(crate) scope: Scope,
    pub(crate) key_required: bool,
    pub(crate) key: Arc<dyn ExtractKey>,
    pub(crate) principal: Arc<dyn ExtractPrincipal>,
    pub(crate) fingerprint: Arc<dyn FingerprintRequest>,
    pub(crate) store_policy: Arc<dyn StorePolicy>,
    pub(crate) policy: Option<Policy>,
    pub(crate) max_request_body: usize,
    pub(crate) body_pace: BodyPace,
    pub(crate) max_stored_response: usize,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) streaming: StreamingResponses,
    pub(crate) store_retry_after: Duration,
    pub(crate) passthrough: Vec<Method>,
}

impl fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("namespace", &self.scope.namespace())
            .field("key_required", &self.key_required)
            .field("key", &self.key)
            .field("principal", &self.principal)
            .field("fingerprint", &self.fingerprint)
            .field("store_policy", &self.store_policy)
            .field("policy", &self.policy)
            .field("max_request_body", &self.max_request_body)
            .field("body_pace", &self.body_pace)
            .field("max_stored_response", &self.max_stored_response)
            .field("replay_headers", &self.replay_headers)
            .field("streaming", &self.streaming)
            .finish_non_exhaustive()
    }
}

impl IdempotencyConfig {
    /// The defaults for `namespace`: key required in `Idempotency-Key`, **no principal** (one
    /// key space shared by every caller: set [`principal`](Self::principal) on any service
    /// with more than one tenant), canonical-JSON fingerprint v1, [`StoreUnless5xx`], the engine's own [`Policy`],
    /// 1 MiB request and stored-response caps, request bodies at [`BodyPace::default`], [`DEFAULT_REPLAY_HEADERS`] replayed, streaming
    /// responses released, `GET`/`HEAD`/`OPTIONS` passed through.
    ///
    /// # Errors
    /// [`RouteConfigError::Namespace`] for an invalid namespace.
    pub fn new(namespace: impl Into<String>) -> Result<Self, RouteConfigError> {
        let namespace = namespace.into();
        let scope =
            Scope::new(namespace.clone()).map_err(|_| RouteConfigError::Namespace(namespace))?;
        Ok(Self {
            scope,
            key_required: true,
            key: Arc::new(HeaderKey::new()),
            principal: Arc::new(NoPrincipal),
            fingerprint: Arc::new(CanonicalJson::new()),
            store_policy: Arc::new(StoreUnless5xx::new()),
            policy: None,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            body_pace: BodyPace::default(),
            max_stored_response: DEFAULT_MAX_STORED_RESPONSE,
            replay_headers: DEFAULT_REPLAY_HEADERS.to_vec(),
            streaming: StreamingResponses::Release,
            store_retry_after: Duration::from_secs(1),
            passthrough: vec![Method::GET, Method::HEAD, Method::OPTIONS],
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.scope.namespace()
    }

    /// Whether a request without a key is refused (400, the default) or passed through
    /// unprotected.
    #[must_use]
    pub fn key_required(mut self, required: bool) -> Self {
        self.key_required = required;
        self
    }

    /// Where the key comes from (default: [`HeaderKey::new`]).
    #[must_use]
    pub fn key(mut self, extract: impl ExtractKey) -> Self {
        self.key = Arc::new(extract);
        self
    }

    /// Whose key it is: part of the scope, so two principals' keys never meet.
    ///
    /// The default, [`NoPrincipal`], gives every caller one shared key space: two customers
    /// who both send `order-1` would see each other's answers. Choose:
    /// - [`NoPrincipal`] for a single-tenant service;
    /// - [`HeaderPrincipal`](crate::HeaderPrincipal) for a stable credential such as an API
    ///   key (stored only as [`credential_principal`](idem_core::key::credential_principal));
    /// - [`ExtensionPrincipal`](crate::ExtensionPrincipal) for the identity your own
    ///   authentication layer verified (a JWT claim, a session's user id).
    ///
    /// A raw bearer token is a poor principal: refreshed between two attempts, the retry lands
    /// in another scope and runs again.
    #[must_use]
    pub fn principal(mut self, extract: impl ExtractPrincipal) -> Self {
        self.principal = Arc::new(extract);
        self
    }

    /// What "the same request" means (default: [`CanonicalJson::new`]).
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: impl FingerprintRequest) -> Self {
        self.fingerprint = Arc::new(fingerprint);
        self
    }

    /// Which responses are stored (default: [`StoreUnless5xx::new`]).
    #[must_use]
    pub fn store_policy(mut self, policy: impl StorePolicy) -> Self {
        self.store_policy = Arc::new(policy);
        self
    }

    /// Lease, handler timeout, record TTL, takeover, store timeout and in-flight wait for this
    /// route. Unset, the route runs under the policy of the engine the layer is built on.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Largest request body buffered; a larger one gets 413 and nothing runs.
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// How fast a request body must arrive while it is buffered (default
    /// [`BodyPace::default`]: in full within 30 s, and at 16 KiB/s on average after the first
    /// 2 s). A slower one gets 408 `body-timeout` and nothing is claimed: the body is read
    /// before the claim, so the key stays free for a retry.
    #[must_use]
    pub fn body_pace(mut self, pace: BodyPace) -> Self {
        self.body_pace = pace;
        self
    }

    /// Largest response body stored. A larger response reaches this client, and the record
    /// says `body_omitted`: replays answer 409 `response-not-stored` instead of re-running.
    #[must_use]
    pub fn max_stored_response(mut self, bytes: usize) -> Self {
        self.max_stored_response = bytes;
        self
    }

    /// Exactly these response headers are stored and replayed (hop-by-hop and framing
    /// headers never are). `Set-Cookie` and `WWW-Authenticate` only if listed here.
    #[must_use]
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_headers = names.into_iter().filter(replayable).collect();
        self
    }

    /// Adds one header to the replay allow-list.
    #[must_use]
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        if replayable(&name) && !self.replay_headers.contains(&name) {
            self.replay_headers.push(name);
        }
        self
    }

    /// What happens to streaming responses.
    #[must_use]
    pub fn streaming(mut self, streaming: StreamingResponses) -> Self {
        self.streaming = streaming;
        self
    }

    /// `Retry-After` sent with 503 when the store fails (default 1 s).
    #[must_use]
    pub fn store_retry_after(mut self, d: Duration) -> Self {
        self.store_retry_after = d;
        self
    }

    /// Methods passed through unprotected (default `GET`, `HEAD`, `OPTIONS`).
    #[must_use]
    pub fn passthrough_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.passthrough = methods.into_iter().collect();
        self
    }

    /// The route's own engine policy, if it sets one.
    pub fn engine_policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }

    /// The scope for `principal` in this namespace.
    pub(crate) fn scope_for(&self, principal: Option<String>) -> Scope {
        match principal {
            Some(p) => self.scope.clone().with_principal(p),
            None => self.scope.clone(),
        }
    }

    pub(crate) fn replays(&self, name: &HeaderName) -> bool {
        // The list never holds a `NEVER_REPLAYED` name: they are dropped when it is set.
        self.replay_headers.contains(name)
    }
}

fn replayable(name: &HeaderName) -> bool {
    !NEVER_REPLAYED.contains(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_never_replayed_even_when_listed() {
        let config = IdempotencyConfig::new("t")
            .expect("namespace")
            .replay_headers([header::CONNECTION, header::CONTENT_TYPE])
            .replay_header(header::TRANSFER_ENCODING)
            .replay_header(HeaderName::from_static("keep-alive"))
            .replay_header(header::SET_COOKIE);
        assert!(config.replays(&header::CONTENT_TYPE));
        assert!(config.replays(&header::SET_COOKIE), "listed explicitly");
        for never in &NEVER_REPLAYED {
            assert!(!config.replays(never), "{never} must never be replayed");
        }
        assert!(!config.replays(&header::LOCATION), "not listed");
    }
}
