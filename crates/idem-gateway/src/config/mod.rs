//! Configuration: a TOML file, then `IDEM_` environment variables, then flags (flags win).
//!
//! The raw, serde-shaped config lives here; [`compile`] turns it into the checked
//! [`Settings`] the server runs on, or an error that says which field is wrong and why.

mod compile;
mod display;
mod key;
mod listener;
mod parse;
mod risks;
mod route;
mod settings;
mod telemetry;
#[cfg(test)]
mod tests;
mod token;
mod units;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use figment::Figment;
use figment::providers::{Env, Format as _, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::path::TrailingSlash;
use crate::upstream::RawUpstream;

pub use compile::compile;
pub use listener::{Limits, RawLimits, RawTls};
pub use settings::{
    AdminSettings, AuditSettings, FingerprintBody, FingerprintSettings, LogFormat,
    ReconcileSettings, Route, RoutePolicy, Settings, StatusSet, StatusSettings, Unmatched,
    UpstreamFailure,
};
pub use telemetry::{OtelSettings, RawOtel};
pub use token::{Rate, RawToken, TokenSettings, supports_tokens};
pub use units::{ByteSize, Dur};

pub use crate::principal::{JwtKey, JwtSettings, PrincipalFrom, PrincipalSource, RawPrincipal};
pub use crate::tls::TlsFiles;

/// A table of the file kept as written, for the part of the gateway that reads it.
pub type RawTable = figment::value::Dict;

/// The default data listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default store: the embedded SQLite file.
pub const DEFAULT_STORE: &str = "sqlite:./idem.db";

/// The whole configuration as written by a user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Data listener address (default `127.0.0.1:8080`).
    pub listen: Option<String>,
    /// Default upstream: a URL (`http://`, `https://`, `h2c://`) or a table with TLS and
    /// HTTP/2 settings (see [`crate::upstream`]).
    pub upstream: Option<RawUpstream>,
    /// Store URL (default `sqlite:./idem.db`).
    pub store: Option<String>,
    /// Per-operation store timeout (default `1s`); past it the gateway answers 503.
    pub store_timeout: Option<Dur>,
    /// SQL stores: the table (default `idem_records`).
    pub store_table: Option<String>,
    /// Redis: the key prefix (default `idem:`).
    pub store_prefix: Option<String>,
    /// PostgreSQL and MySQL: connections per gateway (default 32).
    pub store_pool: Option<u32>,
    /// `memory:`: most bytes the records take (default `256MiB`); past it, and past the
    /// capacity in records, new keys get 503 rather than a live record being dropped.
    pub store_max_bytes: Option<ByteSize>,
    /// Redis: replicas that must acknowledge each claim and completion (`WAIT`) before the
    /// request goes on (default: none). With it, a failover cannot lose a claim the gateway
    /// acted on.
    pub store_wait_replicas: Option<u32>,
    /// Redis: how long `WAIT` may take (default `100ms`); a short acknowledgement answers 503.
    pub store_wait_timeout: Option<Dur>,
    /// `rediss://`: a PEM CA file trusted instead of the system roots.
    pub store_tls_ca_file: Option<PathBuf>,
    /// `rediss://`: a PEM client certificate chain, for servers that ask for one.
    pub store_tls_cert_file: Option<PathBuf>,
    /// `rediss://`: the client certificate's PEM private key.
    pub store_tls_key_file: Option<PathBuf>,
    /// Entries of the local cache of completed responses (default 0: off).
    pub store_cache_entries: Option<usize>,
    /// Longest a cached completed response is replayed from memory (default `60s`).
    pub store_cache_max_age: Option<Dur>,
    /// Upstream connect timeout (default `5s`).
    pub upstream_connect_timeout: Option<Dur>,
    /// Idle pooled upstream connections kept per host (default 256).
    pub upstream_pool_max_idle: Option<usize>,
    /// How long SIGTERM waits for in-flight requests (default `30s`).
    pub shutdown_grace: Option<Dur>,
    /// The request id header (default `x-request-id`).
    pub request_id_header: Option<String>,
    /// Logging.
    pub log: Option<RawLog>,
    /// The admin listener (off unless `listen` and a token are set).
    pub admin: Option<RawAdmin>,
    /// Export of request spans over OTLP (needs the `otlp` build feature).
    pub otel: Option<RawOtel>,
    /// TLS on the data listener: `{ cert_file, key_file }`.
    pub tls: Option<RawTls>,
    /// Resource limits of the data listener.
    pub limits: Option<RawLimits>,
    /// Policy fields every route starts from (no `name`, `method` or `path` here).
    pub defaults: Option<RawRoute>,
    /// Routes, matched in order; the first match wins.
    pub routes: Option<Vec<RawRoute>>,
    /// Serve the built-in demo upstream and proxy to it.
    pub demo_upstream: Option<bool>,
    /// What happens to a request no route matches: `reject` (default, 404), `protect` (a
    /// last catch-all route from `defaults`) or `proxy` (forwarded unprotected).
    pub unmatched: Option<Unmatched>,
    /// `ignore` (default: `/charge/` is `/charge`) or `strict`.
    pub trailing_slash: Option<TrailingSlash>,
    /// `insensitive` (default: route literals match `/CHARGE` too) or `sensitive`.
    pub path_case: Option<PathCase>,
    /// The status endpoint (off unless `status.path` is set).
    pub status: Option<RawStatus>,
    /// Reconciliation of unknown and stuck records (see `docs/operations.md`).
    pub reconcile: Option<RawReconcile>,
    /// What the audit trail records and how much of it the store keeps.
    pub audit: Option<RawAudit>,
    /// Relays run by `idem relay`: each consumes a queue and POSTs every message once. Kept
    /// as written: the relay reads and checks its own tables (`crate::relay::config`).
    pub relay: Option<Vec<RawTable>>,
}

/// Whether route literals match paths whatever their letter case (`path_case`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathCase {
    /// `/CHARGE` matches a route for `/charge` (default).
    #[default]
    Insensitive,
    /// Letter case counts.
    Sensitive,
}

/// What an expired lease becomes (`takeover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Takeover {
    /// Unknown, settled from the status webhook if there is one (default).
    #[default]
    Hold,
    /// Run again: only for an upstream that refuses stale fences.
    Reexecute,
}

impl From<Takeover> for idem_core::TakeoverPolicy {
    fn from(t: Takeover) -> Self {
        match t {
            Takeover::Hold => Self::Hold,
            Takeover::Reexecute => Self::Reexecute,
        }
    }
}

/// The status endpoint: `GET <path>/{key}` tells a caller what became of its key.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStatus {
    /// Where it answers, e.g. `/idem/status`; unset, there is no status endpoint.
    pub path: Option<String>,
}

/// Reconciliation settings: which records, how often (`idem serve`), how long to wait.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawReconcile {
    /// Run the reconciler inside `idem serve` this often (default: not at all).
    pub every: Option<Dur>,
    /// Processing records older than this count as stuck (default `5m`).
    pub after: Option<Dur>,
    /// Timeout of one status webhook call (default `10s`).
    pub timeout: Option<Dur>,
    /// Records checked per namespace and state in one pass (default 1000).
    pub limit: Option<usize>,
}

/// What the audit trail records, and how much of it the store keeps.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    /// `operator` (default: no event for a fresh claim or its completion, which the record
    /// tells) or `all` (every transition).
    pub level: Option<String>,
    /// Most events kept (memory: in all; Redis: per stream, about). Default 100 000.
    pub max_events: Option<usize>,
    /// Events older than this are dropped (memory and SQL). Default `30d`.
    pub max_age: Option<Dur>,
}

/// Logging settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// `text` (default) or `json`.
    pub format: Option<LogFormat>,
    /// A tracing filter such as `info` or `idem=debug` (default `info`); `RUST_LOG` wins.
    pub level: Option<String>,
}

/// Admin listener settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// Address of the admin listener.
    pub listen: Option<String>,
    /// Bearer token the admin API requires.
    pub token: Option<String>,
    /// A file holding the bearer token (first line).
    pub token_file: Option<PathBuf>,
    /// A read-only token that gets `/metrics` and nothing else (for a scraper).
    pub metrics_token: Option<String>,
    /// A file holding the metrics token (first line).
    pub metrics_token_file: Option<PathBuf>,
    /// TLS on the admin listener: `{ cert_file, key_file }`.
    pub tls: Option<RawTls>,
}

/// One route: a method and path pattern, and the policy fields that differ from `defaults`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// The upstream's status webhook for reconciliation: a path (on the route's upstream) or
    /// an absolute URL, with `{key}` (and optionally `{namespace}`, `{principal}`), e.g.
    /// `/charges?idempotency_key={key}`.
    pub status_url: Option<String>,
    /// A name for logs and the default namespace.
    pub name: Option<String>,
    /// `POST`, a list such as `["POST", "PUT"]`, or `*` (default).
    pub method: Option<Methods>,
    /// Path pattern: literal segments, `{name}` for one segment, a trailing `*` for the rest.
    pub path: Option<String>,
    /// Upstream for this route (default: the global upstream).
    pub upstream: Option<RawUpstream>,

    /// `false` proxies the route with no idempotency at all.
    pub idempotency: Option<bool>,
    /// The key header (default `Idempotency-Key`); a shortcut for `key = { from = "header" }`.
    pub key_header: Option<String>,
    /// Where the key comes from: one source or a list tried in order (default: the
    /// `Idempotency-Key` header).
    pub key: Option<RawKey>,
    /// Whether unsafe requests without a key get 400 (default true).
    pub key_required: Option<bool>,
    /// The namespace the keys live in (default: the route name).
    pub namespace: Option<String>,
    /// Where the principal comes from.
    pub principal: Option<RawPrincipal>,
    /// What the fingerprint covers.
    pub fingerprint: Option<RawFingerprint>,
    /// Lease length: how soon a dead gateway's claim is noticed. Default `4s` on a route with
    /// a `status_url` (the key is then settled from the webhook), else `timeout` + 16s; under
    /// `takeover = "reexecute"` it must be at least `timeout` + 16s.
    pub lease: Option<Dur>,
    /// Upstream timeout for the route (default `30s`).
    pub timeout: Option<Dur>,
    /// Record TTL: how long results are replayed (default `24h`).
    pub ttl: Option<Dur>,
    /// Statuses that are stored and replayed (default `["2xx", "3xx", "4xx"]`).
    pub store_statuses: Option<Vec<StatusPattern>>,
    /// Statuses that are never stored: the claim is released (default `[401, 403, 408, 409, 429]`).
    pub release_statuses: Option<Vec<StatusPattern>>,
    /// What an expired lease becomes: `hold` (default: unknown, settled from the status
    /// webhook if there is one) or `reexecute` (run again: only for an upstream that refuses
    /// stale fences, see `fenced_upstream`).
    pub takeover: Option<Takeover>,
    /// The header that carries the claim's fence to the upstream on every forwarded request
    /// (default `Idempotency-Fence`).
    pub fence_header: Option<String>,
    /// Whether the upstream refuses a request whose fence is not above the last one it acted
    /// on for the key (idem-sql's fenced write): then re-executing an expired lease cannot
    /// act twice, and `check-config` does not warn about `takeover = "reexecute"`.
    pub fenced_upstream: Option<bool>,
    /// How long a request that finds its key unknown waits for the status webhook before it
    /// is answered (default `2s`).
    pub status_timeout: Option<Dur>,
    /// What an upstream timeout or reset after sending becomes: `hold` (default) or `retry`.
    pub upstream_failure: Option<UpstreamFailure>,
    /// How long a duplicate waits for the in-flight result before answering 409 (default 0).
    pub in_flight_wait: Option<Dur>,
    /// Largest request body accepted (default `1MiB`); larger is 413.
    pub max_request_body: Option<ByteSize>,
    /// Largest response stored (default `1MiB`); larger is recorded as not kept.
    pub max_stored_response: Option<ByteSize>,
    /// Response headers replayed besides the body (default: content-type and a few more).
    pub replay_headers: Option<Vec<String>>,
    /// Token mode: the gateway issues one-time tokens at `issue`, and the token header
    /// replaces the idempotency key on this route (not in `defaults`).
    pub token: Option<RawToken>,
}

/// One key source or several, tried in order.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawKey {
    /// One source.
    One(RawKeySource),
    /// Several, the first present wins.
    Many(Vec<RawKeySource>),
}

/// One place the key comes from: `{ from = "header", header = "idempotency-key" }`,
/// `{ from = "json", path = "order.id" }`, `{ from = "path", param = "id" }`,
/// `{ from = "query", param = "ref" }` or `{ template = "{path.id}:pay" }`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeySource {
    /// `header`, `json`, `path` or `query` (not with `template`).
    pub from: Option<String>,
    /// With `from = "header"`: the header (default `idempotency-key`).
    pub header: Option<String>,
    /// With `from = "json"`: the dot path of the body field.
    pub path: Option<String>,
    /// With `from = "path"` or `"query"`: the parameter's name.
    pub param: Option<String>,
    /// Fields joined with literal text: `{path.id}:pay`, `{json.order.id}-{header.x-tenant}`.
    pub template: Option<String>,
}

/// One method or several.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Methods {
    /// One method, or `*`.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A status code or a class such as `4xx`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum StatusPattern {
    /// One status.
    Code(u16),
    /// `404` or `4xx`.
    Text(String),
}

/// What the fingerprint covers.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFingerprint {
    /// `json` (canonical JSON; default), `raw` (exact bytes) or `ignore`.
    pub body: Option<FingerprintBody>,
    /// With `json`: only these dot paths count.
    pub include: Option<Vec<String>>,
    /// With `json`: these dot paths never count.
    pub exclude: Option<Vec<String>>,
    /// Request headers that take part.
    pub headers: Option<Vec<String>>,
}

/// Values given as command-line flags; set ones override the file and the environment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overrides {
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// `--store`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// `--demo-upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo_upstream: Option<bool>,
    /// `--admin-listen` / `--admin-token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<OverrideAdmin>,
    /// `--log-format` / `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<OverrideLog>,
}

/// Admin flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideAdmin {
    /// `--admin-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--admin-token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Logging flags.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OverrideLog {
    /// `--log-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
}

/// Where the configuration came from, for `check-config`.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// `IDEM_*` variables that were set (names only).
    pub env: Vec<String>,
}

/// Reads the file (if any), the `IDEM_` environment and the flags, in rising precedence.
///
/// Nested fields are reached in the environment with `__`: `IDEM_ADMIN__TOKEN`,
/// `IDEM_DEFAULTS__TTL`. `IDEM_CONFIG` names the file and is not a field.
///
/// # Errors
/// A missing or unreadable file, TOML syntax errors, unknown fields and wrongly typed values,
/// each naming the field and where it came from.
pub fn load(file: Option<&Path>, overrides: &Overrides) -> anyhow::Result<(RawConfig, Sources)> {
    let mut figment = Figment::new();
    let mut sources = Sources::default();
    if let Some(path) = file {
        if !path.is_file() {
            anyhow::bail!(
                "config file {} does not exist or is not a file",
                path.display()
            );
        }
        figment = figment.merge(Toml::file_exact(path));
        sources.file = Some(path.to_path_buf());
    }
    let env = Env::prefixed("IDEM_").split("__").ignore(&["config"]);
    sources.env = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("IDEM_") && k != "IDEM_CONFIG")
        .collect();
    sources.env.sort();
    figment = figment.merge(env).merge(Flags(overrides));
    let raw: RawConfig = figment.extract().context("invalid configuration")?;
    Ok((raw, sources))
}

/// The command-line flags as a figment provider, named so in errors (`--log-format xml`
/// is "… for key log.format in command-line flags").
struct Flags<'a>(&'a Overrides);

impl figment::Provider for Flags<'_> {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("command-line flags")
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        Serialized::defaults(self.0).data()
    }
}

/// Parses TOML text alone (no environment, no flags): for tests and `check-config --stdin`.
///
/// # Errors
/// As [`load`].
pub fn from_toml(text: &str) -> anyhow::Result<RawConfig> {
    Figment::new()
        .merge(Toml::string(text))
        .extract()
        .context("invalid configuration")
}
