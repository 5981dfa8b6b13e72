//! Checks a [`RawConfig`] and turns it into the [`Settings`] the gateway runs on.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use http::{HeaderName, Method, Uri};
use idem_core::{JsonFields, Policy, ReleaseKind, Scope, TakeoverPolicy};

use super::{
    DEFAULT_LISTEN, DEFAULT_STORE, Dur, Methods, RawConfig, RawFingerprint, RawPrincipal, RawRoute,
    StatusPattern,
};
use crate::principal::JwtVerifier;
use crate::store::{StoreOptions, StoreSpec};

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Data listener.
    pub listen: SocketAddr,
    /// Default upstream, if any.
    pub upstream: Option<Uri>,
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
    /// Routes in match order.
    pub routes: Vec<Route>,
    /// True when no route was configured and one catch-all route was made from `defaults`.
    pub implicit_route: bool,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
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
}

impl fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminSettings")
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
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
    pub upstream: Option<Uri>,
    /// Its policy.
    pub policy: Arc<RoutePolicy>,
}

/// The policy of one route.
#[derive(Debug, Clone)]
pub struct RoutePolicy {
    /// False: plain proxy.
    pub idempotency: bool,
    /// Key header.
    pub key_header: HeaderName,
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
}

impl RoutePolicy {
    /// Whether a final upstream status is stored for replay.
    pub fn stores(&self, status: u16) -> bool {
        self.store_statuses.contains(status) && !self.release_statuses.contains(status)
    }
}

/// What an upstream timeout or reset after the request was sent becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The record becomes unknown; retries get 409 outcome-unknown.
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

    fn as_str(self) -> &'static str {
        match self {
            Self::Hold => "hold",
            Self::Retry => "retry",
        }
    }
}

/// Where a route's principal comes from.
#[derive(Debug, Clone)]
pub enum PrincipalSource {
    /// No principal: keys are shared by every caller of the route.
    None,
    /// A header's value, stored only as a hash.
    Header {
        /// The header.
        name: HeaderName,
        /// Missing header is 401.
        required: bool,
    },
    /// The claim of a verified JWT.
    Jwt(Arc<JwtSettings>),
}

/// A JWT principal source.
#[derive(Debug)]
pub struct JwtSettings {
    /// Header carrying `Bearer <token>`.
    pub header: HeaderName,
    /// Missing token is 401.
    pub required: bool,
    /// Key kind, for `check-config`.
    pub key: JwtKey,
    /// The verifier.
    pub verifier: JwtVerifier,
}

/// Which key verifies tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtKey {
    /// HMAC-SHA256 shared secret.
    Hs256,
    /// RSA-SHA256 public key.
    Rs256,
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

/// How the body takes part in the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FingerprintBody {
    /// Canonical JSON (falls back to raw bytes for non-JSON bodies).
    Json,
    /// Exact bytes.
    Raw,
    /// Not at all.
    Ignore,
}

/// The methods a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MethodSet {
    /// Any method.
    Any,
    /// These.
    Only(Vec<Method>),
}

impl MethodSet {
    /// Whether `m` is in the set.
    pub fn contains(&self, m: &Method) -> bool {
        match self {
            Self::Any => true,
            Self::Only(list) => list.contains(m),
        }
    }
}

impl fmt::Display for MethodSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Only(list) => {
                let names: Vec<&str> = list.iter().map(Method::as_str).collect();
                f.write_str(&names.join(","))
            }
        }
    }
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

    fn parse(patterns: &[StatusPattern]) -> anyhow::Result<Self> {
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

/// A path pattern: literal segments, `{name}` for any one segment, a trailing `*` for the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl PathPattern {
    /// Parses a pattern such as `/v1/orders/{id}/pay` or `/v1/*`.
    ///
    /// # Errors
    /// A message naming the problem.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some(body) = text.strip_prefix('/') else {
            bail!("path `{text}` must start with /");
        };
        let mut segments = Vec::new();
        let mut rest = false;
        let parts: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                if i + 1 != parts.len() {
                    bail!("path `{text}`: `*` may only be the last segment");
                }
                rest = true;
            } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
                segments.push(Segment::Param);
            } else if part.contains(['{', '}', '*', '?', '#']) {
                bail!("path `{text}`: segment `{part}` must be a literal, {{name}} or a final *");
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
            rest,
        })
    }

    /// Whether `path` (no query) matches. Runs on every request: walks the segments without
    /// collecting them.
    pub fn matches(&self, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        let mut parts = (!body.is_empty())
            .then(|| body.split('/'))
            .into_iter()
            .flatten();
        for seg in &self.segments {
            let Some(part) = parts.next() else {
                return false;
            };
            let ok = match seg {
                Segment::Literal(l) => l == part,
                Segment::Param => !part.is_empty(),
            };
            if !ok {
                return false;
            }
        }
        self.rest || parts.next().is_none()
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

const DEFAULT_REPLAY_HEADERS: &[&str] = &[
    "content-type",
    "content-language",
    "content-location",
    "location",
    "cache-control",
    "etag",
    "last-modified",
];

/// Checks `raw` and builds [`Settings`].
///
/// # Errors
/// The first problem found, naming the field.
pub fn compile(raw: &RawConfig) -> anyhow::Result<Settings> {
    let listen =
        socket_addr(raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN)).context("`listen`")?;
    let upstream = raw
        .upstream
        .as_deref()
        .map(upstream_uri)
        .transpose()
        .context("`upstream`")?;
    let store =
        StoreSpec::parse(raw.store.as_deref().unwrap_or(DEFAULT_STORE)).context("`store`")?;
    let store_options = StoreOptions {
        table: raw.store_table.clone(),
        prefix: raw.store_prefix.clone(),
        pool: match raw.store_pool {
            Some(0) => bail!("`store_pool` must be greater than zero"),
            Some(n) => n,
            None => crate::store::SQL_POOL_SIZE,
        },
    };
    let store_timeout = positive(
        raw.store_timeout.map(|d| d.0),
        Duration::from_secs(1),
        "store_timeout",
    )?;
    let store_cache = match raw.store_cache_entries {
        None | Some(0) => None,
        Some(n) => Some((
            n,
            raw.store_cache_max_age
                .map_or(Duration::from_secs(60), |d| d.0),
        )),
    };
    let request_id_header = header_name(raw.request_id_header.as_deref().unwrap_or("x-request-id"))
        .context("`request_id_header`")?;
    let log = raw.log.clone().unwrap_or_default();
    let log_format = match log.format.as_deref().unwrap_or("text") {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => bail!("`log.format`: `{other}` is neither `text` nor `json`"),
    };
    let admin = match &raw.admin {
        None => None,
        Some(a) => {
            let token = match (&a.token, &a.token_file) {
                (Some(t), None) => Some(t.trim().to_owned()),
                (None, Some(path)) => Some(
                    std::fs::read_to_string(path)
                        .with_context(|| {
                            format!("`admin.token_file`: cannot read {}", path.display())
                        })?
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_owned(),
                ),
                (Some(_), Some(_)) => bail!("`admin`: set `token` or `token_file`, not both"),
                (None, None) => None,
            };
            match (&a.listen, token) {
                (None, None) => None,
                (None, Some(_)) => bail!("`admin`: a token is set but no `admin.listen` address"),
                (Some(_), None) => bail!(
                    "`admin`: `admin.listen` is set but no `admin.token`; the admin API always requires a bearer token"
                ),
                (Some(l), Some(token)) => {
                    if token.len() < 16 {
                        bail!("`admin.token` must be at least 16 characters");
                    }
                    let admin_listen = socket_addr(l).context("`admin.listen`")?;
                    if admin_listen.port() != 0 && admin_listen.port() == listen.port() {
                        bail!(
                            "`admin.listen` must use another port than `listen`: the admin API is never served on the data listener"
                        );
                    }
                    Some(AdminSettings {
                        listen: admin_listen,
                        token,
                    })
                }
            }
        }
    };

    let defaults = raw.defaults.clone().unwrap_or_default();
    for (field, set) in [
        ("name", defaults.name.is_some()),
        ("method", defaults.method.is_some()),
        ("path", defaults.path.is_some()),
    ] {
        if set {
            bail!(
                "`defaults.{field}`: `defaults` holds policy fields only; give routes their own {field}"
            );
        }
    }
    let demo_upstream = raw.demo_upstream.unwrap_or(false);
    let (raw_routes, implicit_route) = match &raw.routes {
        Some(routes) if !routes.is_empty() => (routes.clone(), false),
        _ => (
            vec![RawRoute {
                name: Some("default".into()),
                path: Some("/*".into()),
                ..RawRoute::default()
            }],
            true,
        ),
    };
    let mut routes = Vec::with_capacity(raw_routes.len());
    for (i, r) in raw_routes.iter().enumerate() {
        let route = compile_route(r, &defaults, store_timeout).with_context(|| {
            let name = r
                .name
                .clone()
                .or_else(|| r.path.clone())
                .unwrap_or_else(|| "?".into());
            format!("route #{} ({name})", i + 1)
        })?;
        if route.upstream.is_none() && upstream.is_none() && !demo_upstream {
            bail!(
                "route `{}` has no upstream: set `upstream` (globally or on the route), or run with --demo-upstream",
                route.name
            );
        }
        routes.push(route);
    }
    Ok(Settings {
        listen,
        upstream,
        demo_upstream,
        store,
        store_timeout,
        store_options,
        store_cache,
        upstream_connect_timeout: positive(
            raw.upstream_connect_timeout.map(|d| d.0),
            Duration::from_secs(5),
            "upstream_connect_timeout",
        )?,
        upstream_pool_max_idle: raw.upstream_pool_max_idle.unwrap_or(256),
        shutdown_grace: raw.shutdown_grace.map_or(Duration::from_secs(30), |d| d.0),
        request_id_header,
        log_format,
        log_level: log.level.unwrap_or_else(|| "info".into()),
        admin,
        routes,
        implicit_route,
    })
}

fn compile_route(r: &RawRoute, d: &RawRoute, store_timeout: Duration) -> anyhow::Result<Route> {
    let path = r
        .path
        .as_deref()
        .ok_or_else(|| anyhow!("`path` is required"))?;
    let pattern = PathPattern::parse(path).context("`path`")?;
    let methods = match r.method.clone().unwrap_or(Methods::One("*".into())) {
        Methods::One(m) if m.trim() == "*" => MethodSet::Any,
        Methods::One(m) => MethodSet::Only(vec![method(&m)?]),
        Methods::Many(list) if list.is_empty() => bail!("`method` is an empty list"),
        Methods::Many(list) => MethodSet::Only(
            list.iter()
                .map(|m| method(m))
                .collect::<anyhow::Result<_>>()?,
        ),
    };
    let name = r
        .name
        .clone()
        .unwrap_or_else(|| format!("{methods} {path}"));
    let upstream = r
        .upstream
        .as_deref()
        .map(upstream_uri)
        .transpose()
        .context("`upstream`")?;

    macro_rules! pick {
        ($f:ident) => {
            r.$f.clone().or_else(|| d.$f.clone())
        };
    }
    let namespace = pick!(namespace).unwrap_or_else(|| match &r.name {
        Some(n) => n.clone(),
        None => format!("{methods}:{path}").replace(' ', ""),
    });
    Scope::new(namespace.clone()).map_err(|e| anyhow!("`namespace` `{namespace}`: {e}"))?;

    let timeout = positive(
        pick!(timeout).map(|d| d.0),
        Duration::from_secs(30),
        "timeout",
    )?;
    // The engine's handler timeout backs the proxy's own timeout up by a second, so the
    // proxy's 504 (handled per `upstream_failure`) always comes first.
    let handler_timeout = timeout + crate::app::HANDLER_BACKSTOP;
    let default_lease = handler_timeout + idem_core::engine::LEASE_MARGIN;
    let lease = pick!(lease).map_or(default_lease, |d| d.0);
    let ttl = pick!(ttl).map_or(Duration::from_secs(24 * 3600), |d| d.0);
    let takeover = match pick!(takeover).as_deref().unwrap_or("reexecute") {
        "reexecute" => TakeoverPolicy::Reexecute,
        "hold" => TakeoverPolicy::Hold,
        other => bail!("`takeover`: `{other}` is neither `reexecute` nor `hold`"),
    };
    let upstream_failure = match pick!(upstream_failure).as_deref().unwrap_or("hold") {
        "hold" => UpstreamFailure::Hold,
        "retry" => UpstreamFailure::Retry,
        other => bail!("`upstream_failure`: `{other}` is neither `hold` nor `retry`"),
    };
    let in_flight_wait = pick!(in_flight_wait).map(|d| d.0).filter(|d| !d.is_zero());
    let engine = Policy::builder()
        .handler_timeout(handler_timeout)
        .lease(lease)
        .record_ttl(ttl)
        .takeover(takeover)
        .store_timeout(store_timeout)
        .in_flight_wait(in_flight_wait)
        .build()
        .map_err(|e| anyhow!("policy: {e} (the lease must be at least `timeout` + 16s)"))?;

    let store_statuses = StatusSet::parse(&pick!(store_statuses).unwrap_or_else(|| {
        ["2xx", "3xx", "4xx"]
            .map(|s| StatusPattern::Text(s.into()))
            .to_vec()
    }))
    .context("`store_statuses`")?;
    let release_statuses = StatusSet::parse(
        &pick!(release_statuses)
            .unwrap_or_else(|| [401, 403, 408, 409, 429].map(StatusPattern::Code).to_vec()),
    )
    .context("`release_statuses`")?;
    let replay_headers = match pick!(replay_headers) {
        Some(list) => list
            .iter()
            .map(|h| header_name(h))
            .collect::<anyhow::Result<Vec<_>>>()
            .context("`replay_headers`")?,
        None => DEFAULT_REPLAY_HEADERS
            .iter()
            .map(|h| HeaderName::from_static(h))
            .collect(),
    };
    for h in &replay_headers {
        if matches!(
            h.as_str(),
            "set-cookie" | "www-authenticate" | "proxy-authenticate"
        ) {
            tracing::warn!(header = %h, "replay_headers replays a credential-bearing header to every retry");
        }
    }
    let principal = principal(pick!(principal).as_ref()).context("`principal`")?;
    let fingerprint = fingerprint(pick!(fingerprint).as_ref()).context("`fingerprint`")?;
    let max_request_body = size(
        pick!(max_request_body).map(|s| s.0),
        1 << 20,
        "max_request_body",
    )?;
    let max_stored_response = size(
        pick!(max_stored_response).map(|s| s.0),
        1 << 20,
        "max_stored_response",
    )?;

    let policy = RoutePolicy {
        idempotency: pick!(idempotency).unwrap_or(true),
        key_header: header_name(pick!(key_header).as_deref().unwrap_or("idempotency-key"))
            .context("`key_header`")?,
        key_required: pick!(key_required).unwrap_or(true),
        namespace,
        principal,
        fingerprint,
        engine,
        store_statuses,
        release_statuses,
        upstream_failure,
        max_request_body,
        max_stored_response,
        replay_headers,
    };
    Ok(Route {
        name,
        methods,
        pattern,
        upstream,
        policy: Arc::new(policy),
    })
}

fn principal(raw: Option<&RawPrincipal>) -> anyhow::Result<PrincipalSource> {
    let Some(p) = raw else {
        return Ok(PrincipalSource::None);
    };
    let from = p
        .from
        .as_deref()
        .unwrap_or(if p.header.is_some() { "header" } else { "none" });
    let jwt_fields = p.hs256_secret.is_some()
        || p.rs256_public_key.is_some()
        || p.rs256_public_key_file.is_some();
    match from {
        "none" => {
            if jwt_fields || p.header.is_some() {
                bail!("`from = \"none\"` but a header or key is set");
            }
            Ok(PrincipalSource::None)
        }
        "header" => {
            if jwt_fields {
                bail!("JWT keys are set but `from = \"header\"`; use `from = \"jwt\"`");
            }
            let name = p
                .header
                .as_deref()
                .ok_or_else(|| anyhow!("`from = \"header\"` needs `header`"))?;
            Ok(PrincipalSource::Header {
                name: header_name(name)?,
                required: p.required.unwrap_or(true),
            })
        }
        "jwt" => {
            let pem = match (&p.rs256_public_key, &p.rs256_public_key_file) {
                (Some(_), Some(_)) => {
                    bail!("set `rs256_public_key` or `rs256_public_key_file`, not both")
                }
                (Some(text), None) => Some(text.clone().into_bytes()),
                (None, Some(path)) => Some(std::fs::read(path).with_context(|| {
                    format!("cannot read `rs256_public_key_file` {}", path.display())
                })?),
                (None, None) => None,
            };
            let (key, verifier) = match (&p.hs256_secret, pem) {
                (Some(_), Some(_)) => {
                    bail!("set either `hs256_secret` or an RS256 public key, not both")
                }
                (None, None) => {
                    bail!("`from = \"jwt\"` needs `hs256_secret` or `rs256_public_key(_file)`")
                }
                (Some(secret), None) => {
                    if secret.len() < 32 {
                        bail!("`hs256_secret` must be at least 32 bytes");
                    }
                    (JwtKey::Hs256, JwtVerifier::hs256(secret.as_bytes(), p)?)
                }
                (None, Some(pem)) => (JwtKey::Rs256, JwtVerifier::rs256(&pem, p)?),
            };
            let header = header_name(p.header.as_deref().unwrap_or("authorization"))?;
            Ok(PrincipalSource::Jwt(Arc::new(JwtSettings {
                header,
                required: p.required.unwrap_or(true),
                key,
                verifier,
            })))
        }
        other => bail!("`from`: `{other}` is not one of none, header, jwt"),
    }
}

fn fingerprint(raw: Option<&RawFingerprint>) -> anyhow::Result<FingerprintSettings> {
    let f = raw.cloned().unwrap_or_default();
    let body = match f.body.as_deref().unwrap_or("json") {
        "json" => FingerprintBody::Json,
        "raw" => FingerprintBody::Raw,
        "ignore" => FingerprintBody::Ignore,
        other => bail!("`body`: `{other}` is not one of json, raw, ignore"),
    };
    let include = f.include.unwrap_or_default();
    let exclude = f.exclude.unwrap_or_default();
    if body != FingerprintBody::Json && (!include.is_empty() || !exclude.is_empty()) {
        bail!("`include`/`exclude` select JSON fields and need `body = \"json\"`");
    }
    let headers = f
        .headers
        .unwrap_or_default()
        .iter()
        .map(|h| header_name(h))
        .collect::<anyhow::Result<_>>()?;
    Ok(FingerprintSettings {
        body,
        fields: JsonFields::all().include(include).exclude(exclude),
        headers,
    })
}

fn positive(d: Option<Duration>, default: Duration, field: &str) -> anyhow::Result<Duration> {
    match d {
        Some(d) if d.is_zero() => bail!("`{field}` must be greater than zero"),
        Some(d) => Ok(d),
        None => Ok(default),
    }
}

fn size(v: Option<u64>, default: usize, field: &str) -> anyhow::Result<usize> {
    match v {
        None => Ok(default),
        Some(0) => bail!("`{field}` must be greater than zero"),
        Some(n) => usize::try_from(n).map_err(|_| anyhow!("`{field}` is too large")),
    }
}

fn method(text: &str) -> anyhow::Result<Method> {
    let upper = text.trim().to_ascii_uppercase();
    if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic()) {
        bail!("`{text}` is not an HTTP method");
    }
    Method::from_bytes(upper.as_bytes()).map_err(|_| anyhow!("`{text}` is not an HTTP method"))
}

fn header_name(text: &str) -> anyhow::Result<HeaderName> {
    HeaderName::from_bytes(text.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| anyhow!("`{text}` is not a valid header name"))
}

/// Parses `host:port` (a name such as `localhost` is resolved once).
fn socket_addr(text: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = text.parse() {
        return Ok(a);
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| anyhow!("`{text}` is not an address such as 127.0.0.1:8080 ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| anyhow!("`{text}` resolves to no address"))
}

fn upstream_uri(text: &str) -> anyhow::Result<Uri> {
    let uri: Uri = text
        .trim()
        .parse()
        .map_err(|e| anyhow!("`{text}` is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => bail!(
            "`{text}`: https upstreams are not supported by this build; terminate TLS in front of the upstream"
        ),
        _ => bail!("`{text}` must be an http:// URL such as http://127.0.0.1:3000"),
    }
    if uri.authority().is_none() {
        bail!("`{text}` has no host");
    }
    if uri.query().is_some() {
        bail!("`{text}`: an upstream URL cannot have a query");
    }
    Ok(uri)
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "listen:    {}", self.listen)?;
        match (&self.upstream, self.demo_upstream) {
            (_, true) => writeln!(f, "upstream:  built-in demo upstream")?,
            (Some(u), false) => writeln!(f, "upstream:  {u}")?,
            (None, false) => writeln!(f, "upstream:  (per route)")?,
        }
        writeln!(
            f,
            "store:     {} (timeout {})",
            self.store,
            Dur(self.store_timeout)
        )?;
        if let Some((n, age)) = self.store_cache {
            writeln!(
                f,
                "cache:     {n} completed responses, at most {} each",
                Dur(age)
            )?;
        }
        match &self.admin {
            Some(a) => writeln!(f, "admin:     {} (bearer token required)", a.listen)?,
            None => writeln!(f, "admin:     off")?,
        }
        writeln!(
            f,
            "shutdown:  drains in-flight requests for up to {}",
            Dur(self.shutdown_grace)
        )?;
        writeln!(
            f,
            "logs:      {:?}, level {}",
            self.log_format, self.log_level
        )?;
        if self.implicit_route {
            writeln!(
                f,
                "routes:    none configured; one catch-all route from `defaults`:"
            )?;
        } else {
            writeln!(
                f,
                "routes:    {} (first match wins; unmatched requests are proxied unprotected):",
                self.routes.len()
            )?;
        }
        for r in &self.routes {
            let p = &r.policy;
            writeln!(f, "  - {} {} [{}]", r.methods, r.pattern.as_str(), r.name)?;
            if let Some(u) = &r.upstream {
                writeln!(f, "      upstream:    {u}")?;
            }
            if !p.idempotency {
                writeln!(f, "      idempotency: off (plain proxy)")?;
                continue;
            }
            writeln!(
                f,
                "      key:         {} ({})",
                p.key_header,
                if p.key_required {
                    "required on POST/PUT/PATCH/DELETE"
                } else {
                    "optional"
                }
            )?;
            writeln!(f, "      namespace:   {}", p.namespace)?;
            let principal = match &p.principal {
                PrincipalSource::None => "none (keys shared by all callers)".to_owned(),
                PrincipalSource::Header { name, required } => {
                    format!(
                        "header {name}, stored hashed{}",
                        if *required { ", required" } else { "" }
                    )
                }
                PrincipalSource::Jwt(j) => format!(
                    "JWT ({:?}) in {}, claim `{}`{}",
                    j.key,
                    j.header,
                    j.verifier.claim(),
                    if j.required { ", required" } else { "" }
                ),
            };
            writeln!(f, "      principal:   {principal}")?;
            let fp = &p.fingerprint;
            let headers: Vec<&str> = fp.headers.iter().map(HeaderName::as_str).collect();
            writeln!(
                f,
                "      fingerprint: method + route + body ({:?}){}",
                fp.body,
                if headers.is_empty() {
                    String::new()
                } else {
                    format!(" + headers {}", headers.join(", "))
                }
            )?;
            let e = &p.engine;
            writeln!(
                f,
                "      timing:      upstream timeout {}, lease {} (renewed every {}), ttl {}",
                Dur(e
                    .handler_timeout()
                    .saturating_sub(crate::app::HANDLER_BACKSTOP)),
                Dur(e.lease()),
                Dur(e.renew_every()),
                Dur(e.record_ttl())
            )?;
            writeln!(
                f,
                "      on failure:  expired lease -> {:?}; upstream timeout/reset -> {}",
                e.takeover(),
                p.upstream_failure.as_str()
            )?;
            writeln!(
                f,
                "      stored:      {} except {}",
                p.store_statuses, p.release_statuses
            )?;
            match e.in_flight_wait() {
                Some(w) => writeln!(
                    f,
                    "      in flight:   wait up to {} for the first result, then 409",
                    Dur(w)
                )?,
                None => writeln!(f, "      in flight:   409 at once")?,
            }
            let replay: Vec<&str> = p.replay_headers.iter().map(HeaderName::as_str).collect();
            writeln!(
                f,
                "      limits:      request body {} bytes, stored response {} bytes; replayed headers: {}",
                p.max_request_body,
                p.max_stored_response,
                replay.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml;

    fn compiled(text: &str) -> anyhow::Result<Settings> {
        compile(&from_toml(text)?)
    }

    /// The matcher as first written (collects the segments); the allocation-free one must
    /// agree with it everywhere.
    fn collecting_match(p: &PathPattern, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        let mut parts = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect::<Vec<_>>()
        };
        if p.rest {
            if parts.len() < p.segments.len() {
                return false;
            }
            parts.truncate(p.segments.len());
        } else if parts.len() != p.segments.len() {
            return false;
        }
        p.segments.iter().zip(parts).all(|(seg, part)| match seg {
            Segment::Literal(l) => l == part,
            Segment::Param => !part.is_empty(),
        })
    }

    #[test]
    fn path_matching_agrees_with_the_collecting_matcher() {
        let patterns = [
            "/",
            "/*",
            "/a",
            "/a/*",
            "/a/b",
            "/{x}",
            "/{x}/*",
            "/a/{x}/b",
            "/a/{x}/b/*",
        ];
        let paths = [
            "", "/", "//", "/a", "/a/", "/a/b", "/a/b/", "/a//b", "/a/x/b", "/a/x/b/c", "/b",
            "/a/b/c/d", "a", "a/b", "/x/a",
        ];
        let mut checked = 0;
        for pattern in patterns {
            let p = PathPattern::parse(pattern).expect("valid");
            for path in paths {
                assert_eq!(
                    p.matches(path),
                    collecting_match(&p, path),
                    "{pattern} against {path:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, patterns.len() * paths.len());
    }

    #[test]
    fn path_patterns_match_segments() {
        let p = PathPattern::parse("/v1/orders/{id}/pay").expect("valid");
        assert!(p.matches("/v1/orders/42/pay"));
        assert!(!p.matches("/v1/orders//pay"));
        assert!(!p.matches("/v1/orders/42/pay/x"));
        let rest = PathPattern::parse("/v1/*").expect("valid");
        assert!(rest.matches("/v1/a/b"));
        assert!(rest.matches("/v1"));
        assert!(!rest.matches("/v2/a"));
        assert!(PathPattern::parse("/*").expect("valid").matches("/"));
        assert!(PathPattern::parse("/").expect("valid").matches("/"));
        assert!(!PathPattern::parse("/").expect("valid").matches("/a"));
        assert!(PathPattern::parse("v1").is_err());
        assert!(PathPattern::parse("/a/*/b").is_err());
        assert!(PathPattern::parse("/a{b").is_err());
    }

    #[test]
    fn routes_inherit_defaults_and_override_them() {
        let s = compiled(
            r#"
            upstream = "http://127.0.0.1:9000"
            [defaults]
            ttl = "1h"
            takeover = "hold"
            [[routes]]
            name = "charge"
            method = "post"
            path = "/charge"
            ttl = "2h"
            [[routes]]
            method = ["PUT", "PATCH"]
            path = "/orders/{id}"
            idempotency = false
            "#,
        )
        .expect("valid");
        assert_eq!(s.routes.len(), 2);
        let charge = &s.routes[0].policy;
        assert_eq!(charge.engine.record_ttl(), Duration::from_secs(7200));
        assert_eq!(charge.engine.takeover(), TakeoverPolicy::Hold);
        assert_eq!(charge.namespace, "charge");
        assert!(
            charge.stores(201) && charge.stores(404) && !charge.stores(429) && !charge.stores(500)
        );
        assert!(!s.routes[1].policy.idempotency);
        assert_eq!(
            s.routes[1].policy.engine.record_ttl(),
            Duration::from_secs(3600)
        );
        assert!(s.routes[1].methods.contains(&Method::PATCH));
        assert!(!s.routes[1].methods.contains(&Method::POST));
    }

    #[test]
    fn garbage_is_refused_with_the_field_named() {
        let cases = [
            ("listen = 5", "listen"),
            ("lisen = \"x\"", "lisen"),
            ("upstream = \"ftp://x\"", "http://"),
            ("upstream = \"https://x\"", "https"),
            ("upstream = \"http://x\"\nstore = \"mongo://x\"", "mongo"),
            ("upstream = \"http://x\"\n[defaults]\nttl = 5", "unit"),
            (
                "upstream = \"http://x\"\n[defaults]\ntakeover = \"maybe\"",
                "takeover",
            ),
            (
                "upstream = \"http://x\"\n[defaults]\nlease = \"10s\"",
                "lease",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nmethod = \"P O\"",
                "method",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\nmethod = \"POST\"",
                "path",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nttl = \"1h\"\nbogus = 1",
                "bogus",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nstore_statuses = [\"6xx\"]",
                "6xx",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nnamespace = \"a b\"",
                "namespace",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nprincipal = { from = \"jwt\" }",
                "hs256_secret",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nprincipal = { from = \"jwt\", hs256_secret = \"short\" }",
                "32",
            ),
            (
                "upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nprincipal = { from = \"jwt\", rs256_public_key = \"nope\" }",
                "RS256",
            ),
            (
                "upstream = \"http://x\"\n[admin]\nlisten = \"127.0.0.1:9\"",
                "token",
            ),
            (
                "upstream = \"http://x\"\n[admin]\nlisten = \"127.0.0.1:8080\"\ntoken = \"0123456789abcdef\"",
                "another port",
            ),
            ("[[routes]]\npath = \"/a\"", "no upstream"),
            (
                "upstream = \"http://x\"\n[defaults]\npath = \"/a\"",
                "defaults",
            ),
            ("this is not toml", "invalid"),
        ];
        for (text, needle) in cases {
            let err = match compiled(text) {
                Ok(_) => panic!("accepted garbage: {text}"),
                Err(e) => format!("{e:#}"),
            };
            assert!(
                err.contains(needle),
                "error for {text:?} should mention {needle:?}: {err}"
            );
        }
    }

    #[test]
    fn no_routes_means_one_catch_all_route() {
        let s = compiled("upstream = \"http://127.0.0.1:1\"").expect("valid");
        assert!(s.implicit_route);
        assert!(s.routes[0].pattern.matches("/anything/at/all"));
        assert_eq!(s.routes[0].policy.namespace, "default");
        assert_eq!(s.listen, "127.0.0.1:8080".parse().expect("addr"));
        let text = s.to_string();
        assert!(
            text.contains("catch-all") && text.contains("sqlite:./idem.db"),
            "{text}"
        );
    }
}
