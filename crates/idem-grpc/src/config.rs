//! Per-method configuration: which methods are protected and how.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use idem_core::key_source::{KeySourceError, KeySources};
use idem_http::Protection;

use crate::codes::StoreDeterministic;

/// Default cap on a request message: 4 MiB, gRPC's default largest message.
pub const DEFAULT_MAX_REQUEST: usize = 4 << 20;
/// Default cap on a stored response (metadata, messages and trailers): 1 MiB, as over HTTP.
pub use idem_http::DEFAULT_MAX_STORED_RESPONSE;
/// The metadata key the idempotency key is read from by default.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response metadata stored and replayed by default (with every trailer): the framing of
/// the messages, and the status of a trailers-only answer.
pub const DEFAULT_REPLAY_METADATA: [HeaderName; 5] = [
    http::header::CONTENT_TYPE,
    HeaderName::from_static("grpc-encoding"),
    HeaderName::from_static("grpc-status"),
    HeaderName::from_static("grpc-message"),
    HeaderName::from_static("grpc-status-details-bin"),
];

/// An invalid method configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MethodConfigError {
    /// The namespace is not 1–255 printable ASCII characters without spaces.
    #[error("invalid namespace {0:?}: use 1-255 printable ASCII characters without spaces")]
    Namespace(String),
    /// A method path is not `/package.Service/Method`.
    #[error("invalid method path {0:?}: write /package.Service/Method")]
    MethodPath(String),
    /// A key source does not parse.
    #[error(transparent)]
    KeySource(#[from] KeySourceError),
}

/// How one protected method is handled. Cheap to clone.
#[derive(Clone)]
pub struct MethodConfig {
    /// The settings every carrier shares. Its `principal_chosen` says whether
    /// [`MethodConfig::principal`] was called: a layer built with a method that still shares
    /// one key space between every caller says so in its log.
    pub(crate) protection: Protection,
    pub(crate) key: KeySources,
    pub(crate) max_request: usize,
    pub(crate) replay_metadata: Vec<HeaderName>,
    pub(crate) fingerprint_version: u16,
}

impl fmt::Debug for MethodConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodConfig")
            .field("namespace", &self.protection.namespace())
            .field("key", &self.key.to_string())
            .field("key_required", &self.protection.key_required)
            .field("principal", &self.protection.principal)
            .field("store_policy", &self.protection.store_policy)
            .field("policy", &self.protection.policy)
            .field("max_request", &self.max_request)
            .field("max_stored_response", &self.protection.max_stored_response)
            .finish_non_exhaustive()
    }
}

impl MethodConfig {
    /// The defaults for `namespace`: key required in the `idempotency-key` metadata,
    /// **no principal** (one key space shared by every caller: set
    /// [`principal`](Self::principal) on any service with more than one tenant; a layer
    /// built with a method left so logs a warning),
    /// [`StoreDeterministic`], the engine's own [`Policy`](idem_core::Policy), 4 MiB request and 1 MiB stored
    /// response caps, [`DEFAULT_REPLAY_METADATA`] replayed with every trailer.
    ///
    /// # Errors
    /// [`MethodConfigError::Namespace`] for an invalid namespace.
    pub fn new(namespace: impl Into<String>) -> Result<Self, MethodConfigError> {
        let protection = Protection::new(namespace, Arc::new(StoreDeterministic::new()))
            .map_err(MethodConfigError::Namespace)?;
        Ok(Self {
            protection,
            key: KeySources::default(),
            max_request: DEFAULT_MAX_REQUEST,
            replay_metadata: DEFAULT_REPLAY_METADATA.to_vec(),
            fingerprint_version: 1,
        })
    }

    idem_http::protection_builders! {
        /// The namespace.
        namespace;
    }

    /// Where the key comes from, tried in order: `header:NAME` reads a metadata entry
    /// (`header:idempotency-key` is the default), `proto:1.2` a field of the request
    /// message by field-number path, and a template joins them (`{proto.1.1}:charge`).
    #[must_use]
    pub fn key(mut self, sources: KeySources) -> Self {
        self.key = sources;
        self
    }

    /// Reads the key from the metadata entry `name` instead of `idempotency-key`.
    ///
    /// # Errors
    /// [`MethodConfigError::KeySource`] for a name that is not a metadata key.
    pub fn key_metadata(self, name: &str) -> Result<Self, MethodConfigError> {
        let sources = KeySources::parse(&[&format!("header:{name}")])?;
        Ok(self.key(sources))
    }

    idem_http::protection_builders! {
        /// Whether a call without a key is refused (`INVALID_ARGUMENT`, the default) or passed
        /// through unprotected.
        key_required;
        /// Whose key it is, from the call's metadata or extensions: part of the scope, so two
        /// principals' keys never meet. The extractors of `idem-http` work unchanged (gRPC
        /// metadata are HTTP/2 headers): [`HeaderPrincipal`](idem_http::HeaderPrincipal) stores
        /// a credential only as [`credential_principal`](idem_core::key::credential_principal),
        /// the one scheme every carrier uses.
        principal;
        /// Which answers are stored (default: [`StoreDeterministic::new`]).
        store_policy;
        /// Lease, handler timeout, record TTL, takeover, store timeout and in-flight wait for
        /// this method. Unset, it runs under the policy of the engine the layer is built on.
        policy;
    }

    /// Largest request body (the message with its frame header); a larger one is
    /// `RESOURCE_EXHAUSTED` and nothing runs.
    #[must_use]
    pub fn max_request(mut self, bytes: usize) -> Self {
        self.max_request = bytes;
        self
    }

    idem_http::protection_builders! {
        /// Largest answer stored. A larger one reaches this caller, and the record keeps only
        /// its status: replays answer `FAILED_PRECONDITION` (`RESPONSE_NOT_STORED`) instead of
        /// running again.
        max_stored_response;
    }

    /// Also stores and replays the leading response metadata entry `name`.
    #[must_use]
    pub fn replay_metadata(mut self, name: HeaderName) -> Self {
        if !self.replay_metadata.contains(&name) {
            self.replay_metadata.push(name);
        }
        self
    }

    /// Fingerprint version: bump it together with a new namespace when what is hashed
    /// changes.
    #[must_use]
    pub fn fingerprint_version(mut self, version: u16) -> Self {
        self.fingerprint_version = version;
        self
    }

    idem_http::protection_builders! {
        /// The retry delay sent (in `RetryInfo`) when the store fails (default 1 s).
        store_retry_after;
    }
}

/// Which methods a layer protects, by full path (`/package.Service/Method`). Every other
/// method, streaming ones included, passes through unprotected.
#[derive(Clone, Debug, Default)]
pub struct GrpcIdempotencyConfig {
    pub(crate) methods: HashMap<String, MethodConfig>,
}

impl GrpcIdempotencyConfig {
    /// No method protected yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Protects the unary (or server-streaming) method at `path` with `config`.
    ///
    /// A protected call's request must be one message. A server-streaming method listed
    /// here has its whole response stream buffered, stored and replayed as one answer; a
    /// client- or bidirectional-streaming method must not be listed (its calls are refused
    /// with `INVALID_ARGUMENT` unless they hold exactly one message).
    ///
    /// # Errors
    /// [`MethodConfigError::MethodPath`] unless `path` is `/package.Service/Method`.
    pub fn method(
        mut self,
        path: impl Into<String>,
        config: MethodConfig,
    ) -> Result<Self, MethodConfigError> {
        let path = path.into();
        let ok = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .is_some_and(|(svc, m)| !svc.is_empty() && !m.is_empty() && !m.contains('/'));
        if !ok {
            return Err(MethodConfigError::MethodPath(path));
        }
        self.methods.insert(path, config);
        Ok(self)
    }

    /// The configuration of the method at `path`, if it is protected.
    pub fn get(&self, path: &str) -> Option<&MethodConfig> {
        self.methods.get(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_paths_and_key_metadata_are_checked() {
        let m = MethodConfig::new("ns").expect("namespace");
        for bad in [
            "Charge", "/Charge", "/a.B/", "//Charge", "/a.B/C/D", "a.B/C",
        ] {
            assert!(
                matches!(
                    GrpcIdempotencyConfig::new().method(bad, m.clone()),
                    Err(MethodConfigError::MethodPath(_))
                ),
                "{bad}"
            );
        }
        let config = GrpcIdempotencyConfig::new()
            .method("/a.B/C", m.clone())
            .expect("valid");
        assert!(config.get("/a.B/C").is_some() && config.get("/a.B/D").is_none());
        assert!(matches!(
            MethodConfig::new("has space"),
            Err(MethodConfigError::Namespace(_))
        ));
        let k = m.key_metadata("X-Request-Id").expect("name");
        assert_eq!(k.key.to_string(), "header x-request-id");
        assert!(
            MethodConfig::new("ns")
                .expect("ns")
                .key_metadata("")
                .is_err()
        );
    }
}
