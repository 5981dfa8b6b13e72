//! The checked configuration the gateway runs on, as [`compile`](super::compile) builds it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use http::HeaderName;
use idem_core::key_source::KeySources;
use idem_core::{JsonFields, Policy, ReleaseKind};
use serde::{Deserialize, Serialize};

use super::StatusPattern;
use crate::matcher::{MethodSet, PathPattern};
use crate::path::TrailingSlash;

use super::listener::Limits;
use crate::principal::PrincipalSource;
use crate::store::{StoreOptions, StoreSpec};
use crate::tls::TlsFiles;
use crate::upstream::UpstreamSpec;

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Data listener.
    pub listen: SocketAddr,
    /// Default upstream, if any.
    pub upstream: Option<UpstreamSpec>,
    /// Serve the built-in demo upstream (its address replaces a missing upstream).
    pub demo_upstream: bool,
    /// Which store.
    pub store: StoreSpec,
    /// Per-operation store timeout.
    pub store_timeout: Duration,
    /// Table, prefix and pool size.
    pub store_options: StoreOptions,
    /// Local cache of completed responses: entries and max age.
    pub store_cache: Option<(usize, Duration)>,
    /// Upstream connect timeout.
    pub upstream_connect_timeout: Duration,
    /// Idle pooled connections per upstream host.
    pub upstream_pool_max_idle: usize,
    /// How long SIGTERM waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// The request id header.
    pub request_id_header: HeaderName,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// Admin listener, if configured.
    pub admin: Option<AdminSettings>,
    /// OTLP export of request spans, if configured.
    pub otel: Option<super::OtelSettings>,
    /// Routes in match order.
    pub routes: Vec<Route>,
    /// True when no route was configured and one catch-all route was made from `defaults`.
    pub implicit_route: bool,
    /// What happens to a request no route matches.
    pub unmatched: Unmatched,
    /// TLS on the data listener.
    pub tls: Option<TlsFiles>,
    /// Resource limits of the data listener.
    pub limits: Limits,
    /// How paths are normalised before matching and forwarding.
    pub trailing_slash: TrailingSlash,
    /// The status endpoint, if configured.
    pub status: Option<StatusSettings>,
    /// Reconciliation of unknown and stuck records.
    pub reconcile: ReconcileSettings,
    /// What the audit trail records, and its retention.
    pub audit: AuditSettings,
}

/// The status endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSettings {
    /// Its path prefix, normalised, without a trailing slash (`/idem/status`); keys are
    /// asked for as `<path>/{key}`.
    pub path: String,
}

/// Reconciliation of unknown and stuck records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileSettings {
    /// How often `idem serve` runs a pass (`None`: never; `idem reconcile` still works).
    pub every: Option<Duration>,
    /// Processing records older than this count as stuck.
    pub after: Duration,
    /// Timeout of one status webhook call.
    pub timeout: Duration,
    /// Records checked per namespace and state in one pass.
    pub limit: usize,
}

/// What the audit trail records, and its retention, as the store applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSettings {
    /// Which changes the store records.
    pub level: idem_core::AuditLevel,
    /// Most events kept.
    pub max_events: usize,
    /// Longest an event is kept.
    pub max_age: Duration,
}

/// What happens to a request that no route matches (`unmatched`, default `reject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unmatched {
    /// Refused with 404 `no-route`; nothing is forwarded.
    #[default]
    Reject,
    /// Caught by a last catch-all route (named `unmatched`) with the `defaults` policy.
    Protect,
    /// Forwarded to the global upstream without protection.
    Proxy,
}

/// Log output format (`log.format`, default `text`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The admin listener.
#[derive(Clone)]
pub struct AdminSettings {
    /// Its address.
    pub listen: SocketAddr,
    /// The bearer token it requires.
    pub token: String,
    /// A read-only token for `/metrics` only, if set.
    pub metrics_token: Option<String>,
    /// TLS on the admin listener.
    pub tls: Option<TlsFiles>,
}

impl fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminSettings")
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Its name.
    pub name: String,
    /// Methods it matches.
    pub methods: MethodSet,
    /// Path pattern it matches.
    pub pattern: PathPattern,
    /// Its upstream (`None`: the global one, or the demo upstream).
    pub upstream: Option<UpstreamSpec>,
    /// Its policy.
    pub policy: Arc<RoutePolicy>,
}

/// The policy of one route.
#[derive(Debug, Clone)]
pub struct RoutePolicy {
    /// False: plain proxy.
    pub idempotency: bool,
    /// Where the key comes from.
    pub key: KeySources,
    /// Whether a key source reads the route's path parameters.
    pub key_path_params: bool,
    /// Key required on unsafe methods.
    pub key_required: bool,
    /// Namespace.
    pub namespace: String,
    /// Principal source.
    pub principal: PrincipalSource,
    /// Fingerprint settings.
    pub fingerprint: FingerprintSettings,
    /// Engine policy (lease, timeout, TTL, takeover, store timeout, in-flight wait).
    pub engine: Policy,
    /// Statuses stored.
    pub store_statuses: StatusSet,
    /// Statuses released even if `store_statuses` matches.
    pub release_statuses: StatusSet,
    /// What an ambiguous upstream failure becomes.
    pub upstream_failure: UpstreamFailure,
    /// Largest request body.
    pub max_request_body: usize,
    /// Largest response stored.
    pub max_stored_response: usize,
    /// Response headers replayed.
    pub replay_headers: Vec<HeaderName>,
    /// The upstream's status webhook template for reconciliation, if any. A claim that finds
    /// a key unknown asks it too, before it answers.
    pub status_url: Option<String>,
    /// The header the claim's fence is forwarded in.
    pub fence_header: HeaderName,
    /// Whether the upstream refuses stale fences (re-executing is then safe).
    pub fenced_upstream: bool,
    /// Token mode: the token header replaces the key, and the gateway issues tokens.
    pub token: Option<super::TokenSettings>,
}

impl RoutePolicy {
    /// Whether a final upstream status is stored for replay.
    pub fn stores(&self, status: u16) -> bool {
        self.store_statuses.contains(status) && !self.release_statuses.contains(status)
    }
}

/// What an upstream timeout or reset after the request was sent becomes
/// (`upstream_failure`, default `hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamFailure {
    /// The record becomes unknown; retries get 409 outcome-unknown.
    #[default]
    Hold,
    /// The claim is released; a retry runs again.
    Retry,
}

impl UpstreamFailure {
    /// The release kind.
    pub fn release_kind(self) -> ReleaseKind {
        match self {
            Self::Hold => ReleaseKind::Unknown,
            Self::Retry => ReleaseKind::Retryable,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Hold => "hold",
            Self::Retry => "retry",
        }
    }
}

/// What the fingerprint covers.
#[derive(Debug, Clone)]
pub struct FingerprintSettings {
    /// Body handling.
    pub body: FingerprintBody,
    /// JSON field selection.
    pub fields: JsonFields,
    /// Headers that take part.
    pub headers: Vec<HeaderName>,
}

/// How the body takes part in the fingerprint (`fingerprint.body`, default `json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FingerprintBody {
    /// Canonical JSON (falls back to raw bytes for non-JSON bodies).
    #[default]
    Json,
    /// Exact bytes.
    Raw,
    /// Not at all.
    Ignore,
}

/// A set of statuses: single codes and classes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusSet {
    codes: Vec<u16>,
    classes: Vec<u16>,
}

impl StatusSet {
    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        self.codes.contains(&status) || self.classes.contains(&(status / 100))
    }

    pub(super) fn parse(patterns: &[StatusPattern]) -> anyhow::Result<Self> {
        let mut set = Self::default();
        for p in patterns {
            match p {
                StatusPattern::Code(c) if (100..=599).contains(c) => set.codes.push(*c),
                StatusPattern::Code(c) => bail!("{c} is not an HTTP status"),
                StatusPattern::Text(t) => {
                    let t = t.trim();
                    if let Some(class) = t.strip_suffix("xx").or_else(|| t.strip_suffix("XX")) {
                        match class.parse::<u16>() {
                            Ok(c) if (1..=5).contains(&c) => set.classes.push(c),
                            _ => bail!("`{t}` is not a status class (1xx to 5xx)"),
                        }
                    } else {
                        match t.parse::<u16>() {
                            Ok(c) if (100..=599).contains(&c) => set.codes.push(c),
                            _ => bail!("`{t}` is not an HTTP status or class such as 404 or 4xx"),
                        }
                    }
                }
            }
        }
        Ok(set)
    }
}

impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.classes.iter().map(|c| format!("{c}xx")).collect();
        parts.extend(self.codes.iter().map(u16::to_string));
        if parts.is_empty() {
            return f.write_str("(none)");
        }
        f.write_str(&parts.join(", "))
    }
}
