//! Per-route configuration, built at run time (the gateway builds one per configured route).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, header};
use idem_core::{Engine, Policy, Scope, Store};

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

/// The settings every carrier's configuration carries for one protected route (HTTP) or
/// method (gRPC): the scope, whether a key is required, whose key it is, which answers are
/// kept, the engine policy, the stored-answer cap and the store-failure retry delay.
///
/// [`IdempotencyConfig`] and `idem_grpc::MethodConfig` each hold one, and get their builder
/// methods for it from [`protection_builders!`](crate::protection_builders), so a setting
/// and its default are written once. What the carriers do not share (where the key comes
/// from, request caps, replayed fields) stays on their own types.
#[derive(Clone)]
#[non_exhaustive]
pub struct Protection {
    /// The namespace, without a principal.
    pub scope: Scope,
    /// Whether a request without a key is refused (`true`) or passed through unprotected.
    pub key_required: bool,
    /// Whose key it is: part of the scope.
    pub principal: Arc<dyn ExtractPrincipal>,
    /// Whether a principal was set: a layer over a configuration that still shares one key
    /// space between every caller may say so.
    pub principal_chosen: bool,
    /// Which answers are kept.
    pub store_policy: Arc<dyn StorePolicy>,
    /// The route's own engine policy; `None` runs it under the layer's engine's.
    pub policy: Option<Policy>,
    /// Largest answer stored.
    pub max_stored_response: usize,
    /// The retry delay sent when the store fails.
    pub store_retry_after: Duration,
}

impl Protection {
    /// The defaults for `namespace`: key required, [`NoPrincipal`] (not chosen), the
    /// carrier's `store_policy`, the engine's own policy, [`DEFAULT_MAX_STORED_RESPONSE`]
    /// and a 1 s store-failure retry delay.
    ///
    /// # Errors
    /// The namespace back, when it is not a valid [`Scope`] namespace.
    pub fn new(
        namespace: impl Into<String>,
        store_policy: Arc<dyn StorePolicy>,
    ) -> Result<Self, String> {
        let namespace = namespace.into();
        let scope = Scope::new(namespace.clone()).map_err(|_| namespace)?;
        Ok(Self {
            scope,
            key_required: true,
            principal: Arc::new(NoPrincipal),
            principal_chosen: false,
            store_policy,
            policy: None,
            max_stored_response: DEFAULT_MAX_STORED_RESPONSE,
            store_retry_after: Duration::from_secs(1),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.scope.namespace()
    }

    /// The scope for `principal` in this namespace.
    pub fn scope_for(&self, principal: Option<String>) -> Scope {
        match principal {
            Some(p) => self.scope.clone().with_principal(p),
            None => self.scope.clone(),
        }
    }

    /// `engine` under this route's own policy when it sets one, else `engine` itself (a
    /// clone sharing its store).
    pub fn engine<St: Store>(&self, engine: &Engine<St>) -> Engine<St> {
        match &self.policy {
            Some(policy) => engine.with_policy(policy.clone()),
            None => engine.clone(),
        }
    }
}

impl fmt::Debug for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Protection")
            .field("namespace", &self.scope.namespace())
            .field("key_required", &self.key_required)
            .field("principal", &self.principal)
            .field("store_policy", &self.store_policy)
            .field("policy", &self.policy)
            .field("max_stored_response", &self.max_stored_response)
            .finish_non_exhaustive()
    }
}

/// Writes, inside an `impl` block of a carrier's configuration type (a struct with a
/// `protection: Protection` field), the builder methods for the [`Protection`] settings
/// named, each under the doc comment written before its name: the carrier's docs say what
/// its callers see (a status, a code), the code is this one.
///
/// ```ignore
/// impl MethodConfig {
///     idem_http::protection_builders! {
///         /// Whether a call without a key is refused.
///         key_required;
///         /// Whose key it is.
///         principal;
///     }
/// }
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! protection_builders {
    () => {};
    ($(#[$doc:meta])* key_required; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn key_required(mut self, required: bool) -> Self {
            self.protection.key_required = required;
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* principal; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn principal(mut self, extract: impl $crate::ExtractPrincipal) -> Self {
            self.protection.principal = ::std::sync::Arc::new(extract);
            self.protection.principal_chosen = true;
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* store_policy; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn store_policy(mut self, policy: impl $crate::StorePolicy) -> Self {
            self.protection.store_policy = ::std::sync::Arc::new(policy);
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* policy; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn policy(mut self, policy: ::idem_core::Policy) -> Self {
            self.protection.policy = Some(policy);
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* max_stored_response; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn max_stored_response(mut self, bytes: usize) -> Self {
            self.protection.max_stored_response = bytes;
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* store_retry_after; $($rest:tt)*) => {
        $(#[$doc])*
        #[must_use]
        pub fn store_retry_after(mut self, d: ::std::time::Duration) -> Self {
            self.protection.store_retry_after = d;
            self
        }
        $crate::protection_builders! { $($rest)* }
    };
    ($(#[$doc:meta])* namespace; $($rest:tt)*) => {
        $(#[$doc])*
        pub fn namespace(&self) -> &str {
            self.protection.namespace()
        }
        $crate::protection_builders! { $($rest)* }
    };
}

/// How one route (or a group of routes sharing a namespace) is protected.
///
/// Cheap to clone; the layer keeps it in an `Arc`.
#[derive(Clone)]
pub struct IdempotencyConfig {
    pub(crate) protection: Protection,
    pub(crate) key: Arc<dyn ExtractKey>,
    pub(crate) fingerprint: Arc<dyn FingerprintRequest>,
    pub(crate) max_request_body: usize,
    pub(crate) body_pace: BodyPace,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) streaming: StreamingResponses,
    pub(crate) passthrough: Vec<Method>,
}

impl fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("namespace", &self.protection.namespace())
            .field("key_required", &self.protection.key_required)
            .field("key", &self.key)
            .field("principal", &self.protection.principal)
            .field("fingerprint", &self.fingerprint)
            .field("store_policy", &self.protection.store_policy)
            .field("policy", &self.protection.policy)
            .field("max_request_body", &self.max_request_body)
            .field("body_pace", &self.body_pace)
            .field("max_stored_response", &self.protection.max_stored_response)
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
        let protection = Protection::new(namespace, Arc::new(StoreUnless5xx::new()))
            .map_err(RouteConfigError::Namespace)?;
        Ok(Self {
            protection,
            key: Arc::new(HeaderKey::new()),
            fingerprint: Arc::new(CanonicalJson::new()),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            body_pace: BodyPace::default(),
            replay_headers: DEFAULT_REPLAY_HEADERS.to_vec(),
            streaming: StreamingResponses::Release,
            passthrough: vec![Method::GET, Method::HEAD, Method::OPTIONS],
        })
    }

    crate::protection_builders! {
        /// The namespace.
        namespace;
        /// Whether a request without a key is refused (400, the default) or passed through
        /// unprotected.
        key_required;
    }

    /// Where the key comes from (default: [`HeaderKey::new`]).
    #[must_use]
    pub fn key(mut self, extract: impl ExtractKey) -> Self {
        self.key = Arc::new(extract);
        self
    }

    crate::protection_builders! {
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
        principal;
    }

    /// What "the same request" means (default: [`CanonicalJson::new`]).
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: impl FingerprintRequest) -> Self {
        self.fingerprint = Arc::new(fingerprint);
        self
    }

    crate::protection_builders! {
        /// Which responses are stored (default: [`StoreUnless5xx::new`]).
        store_policy;
        /// Lease, handler timeout, record TTL, takeover, store timeout and in-flight wait for this
        /// route. Unset, the route runs under the policy of the engine the layer is built on.
        policy;
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

    crate::protection_builders! {
        /// Largest response body stored. A larger response reaches this client, and the record
        /// says `body_omitted`: replays answer 409 `response-not-stored` instead of re-running.
        max_stored_response;
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

    crate::protection_builders! {
        /// `Retry-After` sent with 503 when the store fails (default 1 s).
        store_retry_after;
    }

    /// Methods passed through unprotected (default `GET`, `HEAD`, `OPTIONS`).
    #[must_use]
    pub fn passthrough_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.passthrough = methods.into_iter().collect();
        self
    }

    /// The route's own engine policy, if it sets one.
    pub fn engine_policy(&self) -> Option<&Policy> {
        self.protection.policy.as_ref()
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
