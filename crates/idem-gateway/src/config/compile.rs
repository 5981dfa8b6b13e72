//! Checks a [`RawConfig`] and turns it into the [`Settings`] the gateway runs on.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use http::{HeaderName, Method};
use idem_core::{JsonFields, Policy, Scope, TakeoverPolicy};

use super::settings::{
    AdminSettings, FingerprintBody, FingerprintSettings, JwtKey, JwtSettings, LogFormat,
    PrincipalSource, Route, RoutePolicy, Settings, StatusSet, StatusSettings, Unmatched,
    UpstreamFailure,
};
use super::{
    DEFAULT_LISTEN, DEFAULT_STORE, Methods, RawConfig, RawFingerprint, RawPrincipal, RawRoute,
    StatusPattern, listener,
};
use crate::matcher::{MethodSet, PathPattern};
use crate::path::TrailingSlash;
use crate::principal::JwtVerifier;
use crate::store::{StoreOptions, StoreSpec};
use crate::upstream::UpstreamSpec;

/// A bearer token given inline (`admin.NAME`) or in a file (`admin.NAME_file`, first line).
fn read_token(
    inline: Option<&str>,
    file: Option<&std::path::Path>,
    name: &str,
) -> anyhow::Result<Option<String>> {
    match (inline, file) {
        (Some(t), None) => Ok(Some(t.trim().to_owned())),
        (None, Some(path)) => Ok(Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("`admin.{name}_file`: cannot read {}", path.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned(),
        )),
        (Some(_), Some(_)) => bail!("`admin`: set `{name}` or `{name}_file`, not both"),
        (None, None) => Ok(None),
    }
}

/// Checks `raw` and builds [`Settings`].
///
/// # Errors
/// The first problem found, naming the field.
pub fn compile(raw: &RawConfig) -> anyhow::Result<Settings> {
    let listen =
        socket_addr(raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN)).context("`listen`")?;
    let upstream = raw
        .upstream
        .as_ref()
        .map(UpstreamSpec::compile)
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
        audit: {
            let a = audit(raw.audit.as_ref())?;
            idem_core::AuditRetention {
                max_events: a.max_events,
                max_age: a.max_age,
            }
        },
        wait: match (raw.store_wait_replicas, &store) {
            (None, _) => {
                if raw.store_wait_timeout.is_some() {
                    bail!("`store_wait_timeout` needs `store_wait_replicas`");
                }
                None
            }
            (Some(0), _) => bail!("`store_wait_replicas` must be greater than zero"),
            (Some(n), StoreSpec::Redis { .. }) => Some((
                n,
                positive(
                    raw.store_wait_timeout.map(|d| d.0),
                    crate::store::DEFAULT_WAIT_TIMEOUT,
                    "store_wait_timeout",
                )?,
            )),
            (Some(_), other) => bail!(
                "`store_wait_replicas` applies to Redis stores only, not `{}`",
                other.kind()
            ),
        },
        tls: store_tls(raw, &store)?,
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
    let request_id_header = header_name(
        raw.request_id_header
            .as_deref()
            .unwrap_or(idem_http::X_REQUEST_ID.as_str()),
    )
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
            let token = read_token(a.token.as_deref(), a.token_file.as_deref(), "token")?;
            let metrics_token = read_token(
                a.metrics_token.as_deref(),
                a.metrics_token_file.as_deref(),
                "metrics_token",
            )?;
            if metrics_token.is_some() && token.is_none() {
                bail!(
                    "`admin.metrics_token` needs the admin listener (`admin.listen` and `admin.token`)"
                );
            }
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
                    if let Some(m) = &metrics_token {
                        if m.len() < 16 {
                            bail!("`admin.metrics_token` must be at least 16 characters");
                        }
                        if *m == token {
                            bail!(
                                "`admin.metrics_token` must differ from `admin.token`: a scraper must not hold the write token"
                            );
                        }
                    }
                    Some(AdminSettings {
                        listen: admin_listen,
                        token,
                        metrics_token,
                        tls: listener::tls(a.tls.as_ref(), "admin.tls")?,
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
        ("token", defaults.token.is_some()),
    ] {
        if set {
            bail!(
                "`defaults.{field}`: `defaults` holds policy fields only; give routes their own {field}"
            );
        }
    }
    let demo_upstream = raw.demo_upstream.unwrap_or(false);
    let unmatched = match raw.unmatched.as_deref().unwrap_or("reject") {
        "reject" => Unmatched::Reject,
        "protect" => Unmatched::Protect,
        "proxy" => Unmatched::Proxy,
        other => bail!("`unmatched`: `{other}` is not one of reject, protect, proxy"),
    };
    let trailing_slash = match raw.trailing_slash.as_deref().unwrap_or("ignore") {
        "ignore" => TrailingSlash::Ignore,
        "strict" => TrailingSlash::Strict,
        other => bail!("`trailing_slash`: `{other}` is neither `ignore` nor `strict`"),
    };
    let ignore_case = match raw.path_case.as_deref().unwrap_or("insensitive") {
        "insensitive" => true,
        "sensitive" => false,
        other => bail!("`path_case`: `{other}` is neither `insensitive` nor `sensitive`"),
    };
    let catch_all = |name: &str| RawRoute {
        name: Some(name.into()),
        path: Some("/*".into()),
        ..RawRoute::default()
    };
    let (mut raw_routes, implicit_route) = match &raw.routes {
        Some(routes) if !routes.is_empty() => (routes.clone(), false),
        _ => (vec![catch_all("default")], true),
    };
    if unmatched == Unmatched::Protect && !implicit_route {
        raw_routes.push(catch_all("unmatched"));
    }
    let mut routes = Vec::with_capacity(raw_routes.len());
    for (i, r) in raw_routes.iter().enumerate() {
        let route = compile_route(r, &defaults, store_timeout, trailing_slash, ignore_case)
            .with_context(|| {
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
    let status = status(raw.status.as_ref()).context("`status.path`")?;
    super::token::check_routes(&routes, &store, status.as_ref())?;
    let relays = crate::relay::compile(raw.relay.as_deref().unwrap_or_default(), &routes)?;
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
        otel: super::telemetry::compile(raw.otel.as_ref())?,
        routes,
        implicit_route,
        unmatched,
        trailing_slash,
        tls: listener::tls(raw.tls.as_ref(), "tls")?,
        limits: listener::limits(raw.limits.as_ref())?,
        status,
        reconcile: reconcile(raw.reconcile.as_ref())?,
        audit: audit(raw.audit.as_ref())?,
        relays,
    })
}

/// The status endpoint's path: absolute, plain (unreserved characters and `/` only), already
/// in canonical spelling, and not the root.
fn status(raw: Option<&super::RawStatus>) -> anyhow::Result<Option<StatusSettings>> {
    let Some(path) = raw.and_then(|s| s.path.as_deref()) else {
        return Ok(None);
    };
    let trimmed = path.trim().trim_end_matches('/');
    if !trimmed.starts_with('/') {
        bail!("`{path}` must start with /");
    }
    if !trimmed
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
    {
        bail!("`{path}` may hold only letters, digits, `-`, `.`, `_`, `~` and `/`");
    }
    let normal = crate::path::normalize(trimmed, TrailingSlash::Ignore)
        .map_err(|e| anyhow!("`{path}`: {e}"))?;
    if normal != trimmed || normal == "/" {
        bail!("`{path}` must be a plain path below the root, such as /idem/status");
    }
    Ok(Some(StatusSettings {
        path: normal.into_owned(),
    }))
}

fn reconcile(raw: Option<&super::RawReconcile>) -> anyhow::Result<super::ReconcileSettings> {
    let raw = raw.cloned().unwrap_or_default();
    let every = match raw.every {
        Some(d) if d.0.is_zero() => bail!("`reconcile.every` must be greater than zero"),
        other => other.map(|d| d.0),
    };
    Ok(super::ReconcileSettings {
        every,
        after: raw.after.map_or(Duration::from_secs(300), |d| d.0),
        timeout: positive(
            raw.timeout.map(|d| d.0),
            Duration::from_secs(10),
            "reconcile.timeout",
        )?,
        limit: match raw.limit {
            Some(0) => bail!("`reconcile.limit` must be greater than zero"),
            Some(n) => n.min(10_000),
            None => 1000,
        },
    })
}

fn audit(raw: Option<&super::RawAudit>) -> anyhow::Result<super::AuditSettings> {
    let raw = raw.cloned().unwrap_or_default();
    let defaults = idem_core::AuditRetention::default();
    Ok(super::AuditSettings {
        max_events: match raw.max_events {
            Some(0) => bail!("`audit.max_events` must be greater than zero"),
            Some(n) => n,
            None => defaults.max_events,
        },
        max_age: positive(raw.max_age.map(|d| d.0), defaults.max_age, "audit.max_age")?,
    })
}

/// Checks a status webhook template: a path or an http(s) URL that names `{key}`, with no
/// placeholder but `{key}`, `{namespace}` and `{principal}`.
fn status_url(template: &str) -> anyhow::Result<String> {
    if !template.contains("{key}") {
        bail!("`{template}` must contain `{{key}}`");
    }
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| anyhow!("`{template}`: unclosed `{{`"))?;
        let name = &rest[open + 1..open + close];
        if !matches!(name, "key" | "namespace" | "principal") {
            bail!(
                "`{template}`: unknown placeholder `{{{name}}}`; use {{key}}, {{namespace}} or {{principal}}"
            );
        }
        rest = &rest[open + close + 1..];
    }
    let probe = template
        .replace("{key}", "k")
        .replace("{namespace}", "n")
        .replace("{principal}", "p");
    if probe.starts_with('/') {
        probe
            .parse::<http::uri::PathAndQuery>()
            .map_err(|e| anyhow!("`{template}`: {e}"))?;
    } else {
        crate::upstream::upstream_uri(&probe).map_err(|e| anyhow!("`{template}`: {e}"))?;
    }
    Ok(template.to_owned())
}

fn compile_route(
    r: &RawRoute,
    d: &RawRoute,
    store_timeout: Duration,
    trailing: TrailingSlash,
    ignore_case: bool,
) -> anyhow::Result<Route> {
    let path = r
        .path
        .as_deref()
        .ok_or_else(|| anyhow!("`path` is required"))?;
    // Patterns are spelled the way request paths are normalised, so they can match them.
    let normal =
        crate::path::normalize(path, trailing).map_err(|e| anyhow!("`path` `{path}`: {e}"))?;
    let pattern = PathPattern::parse(&normal).context("`path`")?;
    let pattern = if ignore_case {
        pattern
    } else {
        pattern.case_sensitive()
    };
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
        .as_ref()
        .map(UpstreamSpec::compile)
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
        None => idem_http::DEFAULT_REPLAY_HEADERS.to_vec(),
    };
    for h in &replay_headers {
        if matches!(
            h.as_str(),
            "set-cookie" | "www-authenticate" | "proxy-authenticate"
        ) {
            tracing::warn!(header = %h, "replay_headers replays a credential-bearing header to every retry");
        }
    }
    let idempotency = pick!(idempotency).unwrap_or(true);
    // A plain-proxy route has no keys, so it needs no principal.
    let principal = match pick!(principal) {
        None if !idempotency => PrincipalSource::None,
        raw => principal(raw.as_ref()).context("`principal`")?,
    };
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

    let token = r.token.as_ref().map(super::token::compile).transpose()?;
    let (key, key_path_params) = if token.is_some() {
        // The token header is the key; the key fields (the route's or `defaults`') do not
        // apply, and setting them on the route is a mistake worth naming.
        for (field, set) in [
            ("key", r.key.is_some()),
            ("key_header", r.key_header.is_some()),
            ("key_required", r.key_required.is_some()),
        ] {
            if set {
                bail!(
                    "`{field}`: a route with `token` takes its key from the token header; remove `{field}`"
                );
            }
        }
        if !idempotency {
            bail!("`token` needs idempotency: remove `idempotency = false` or `token`");
        }
        (super::key::sources(None, None).context("`key`")?, false)
    } else {
        let key = super::key::sources(pick!(key_header).as_deref(), pick!(key).as_ref())
            .context("`key`")?;
        let params = super::key::check_path_params(&key, &pattern).context("`key`")?;
        (key, params)
    };
    let policy = RoutePolicy {
        idempotency,
        key,
        key_path_params,
        key_required: token.is_some() || pick!(key_required).unwrap_or(true),
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
        status_url: pick!(status_url)
            .map(|t| status_url(&t))
            .transpose()
            .context("`status_url`")?,
        token,
    };
    Ok(Route {
        name,
        methods,
        pattern,
        upstream,
        policy: Arc::new(policy),
    })
}

/// Why a protected route must say whose keys they are, and the choices.
pub(crate) const PRINCIPAL_REQUIRED: &str = "a protected route must say whose keys they are: \
set `principal` in `[defaults]` or on the route. Without it every caller would share one key \
space, and two customers who pick the same key would see each other's answers. Choose \
`principal = { from = \"none\" }` for a single-tenant service, \
`principal = { from = \"header\", header = \"x-api-key\" }` for a stable credential such as an \
API key (stored hashed), or `principal = { from = \"jwt\", … }` for a verified claim. A raw \
bearer token is a poor principal: when the token is refreshed between two attempts, the retry \
lands in another scope and runs again";

fn principal(raw: Option<&RawPrincipal>) -> anyhow::Result<PrincipalSource> {
    let Some(p) = raw else {
        bail!("{PRINCIPAL_REQUIRED}");
    };
    let from = match (p.from.as_deref(), &p.header) {
        (Some(from), _) => from,
        (None, Some(_)) => "header",
        (None, None) => bail!("`from` is not set; {PRINCIPAL_REQUIRED}"),
    };
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
            let header = idem_http::HeaderPrincipal::new(header_name(name)?);
            Ok(PrincipalSource::Header(if p.required.unwrap_or(true) {
                header.required()
            } else {
                header
            }))
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

/// The `store_tls_*` files: only for a `rediss://` store, a certificate only with its key, and
/// every file readable PEM now (so `check-config` finds a wrong path).
fn store_tls(raw: &RawConfig, store: &StoreSpec) -> anyhow::Result<Option<crate::store::StoreTls>> {
    let client = match (&raw.store_tls_cert_file, &raw.store_tls_key_file) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        (None, None) => None,
        _ => bail!("`store_tls_cert_file` and `store_tls_key_file` go together"),
    };
    if client.is_none() && raw.store_tls_ca_file.is_none() {
        return Ok(None);
    }
    match store {
        StoreSpec::Redis { url, .. } if url.to_ascii_lowercase().starts_with("rediss") => {}
        StoreSpec::Postgres { .. } | StoreSpec::Mysql { .. } => bail!(
            "`store_tls_*` are for rediss:// stores; PostgreSQL and MySQL take their TLS settings in the URL (sslmode=verify-full&sslrootcert=…, ssl-mode=VERIFY_IDENTITY&ssl-ca=…)"
        ),
        _ => bail!("`store_tls_*` need a rediss:// or rediss+cluster:// store"),
    }
    let tls = crate::store::StoreTls {
        ca_file: raw.store_tls_ca_file.clone(),
        client,
    };
    tls.read()?;
    Ok(Some(tls))
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
