//! Checks one `[[routes]]` entry (with `[defaults]` under it): its methods, path, key,
//! principal, fingerprint and engine policy.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use idem_core::{JsonFields, Policy, Scope, TakeoverPolicy};

use super::parse::{header_name, method, positive, size};
use super::settings::{
    FingerprintBody, FingerprintSettings, Route, RoutePolicy, StatusSet, UpstreamFailure,
};
use super::{Methods, RawFingerprint, RawRoute, StatusPattern};
use crate::matcher::{MethodSet, PathPattern};
use crate::path::TrailingSlash;
use crate::principal::{
    JwtKey, JwtSettings, JwtVerifier, PrincipalFrom, PrincipalSource, RawPrincipal,
};
use crate::upstream::UpstreamSpec;

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

/// A route's own setting, else the `[defaults]` one.
/// `timeout` unset: how long the upstream may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// `ttl` unset: how long a record is kept.
const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// `status_timeout` unset: how long an unknown key waits for the status webhook.
const DEFAULT_STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// `principal.header` unset with `from = "jwt"`.
const DEFAULT_JWT_HEADER: &str = "authorization";

macro_rules! pick {
    ($r:ident, $d:ident, $f:ident) => {
        $r.$f.clone().or_else(|| $d.$f.clone())
    };
}

pub(super) fn compile_route(
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

    let namespace = pick!(r, d, namespace).unwrap_or_else(|| match &r.name {
        Some(n) => n.clone(),
        None => format!("{methods}:{path}").replace(' ', ""),
    });
    Scope::new(namespace.clone()).map_err(|e| anyhow!("`namespace` `{namespace}`: {e}"))?;

    let (engine, status_url, upstream_failure) = engine_policy(r, d, store_timeout)?;

    let (store_statuses, release_statuses, replay_headers) = answer_rules(r, d)?;
    let idempotency = pick!(r, d, idempotency).unwrap_or(true);
    // A plain-proxy route has no keys, so it needs no principal.
    let principal = match pick!(r, d, principal) {
        None if !idempotency => PrincipalSource::None,
        raw => principal(raw.as_ref()).context("`principal`")?,
    };
    let fingerprint = fingerprint(pick!(r, d, fingerprint).as_ref()).context("`fingerprint`")?;
    let (max_request_body, max_stored_response) = body_limits(r, d)?;

    let token = r.token.as_ref().map(super::token::compile).transpose()?;
    let (key, key_path_params) = route_key(r, d, token.is_some(), idempotency, &pattern)?;
    let policy = RoutePolicy {
        idempotency,
        key,
        key_path_params,
        key_required: token.is_some() || pick!(r, d, key_required).unwrap_or(true),
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
        status_url,
        fence_header: header_name(
            pick!(r, d, fence_header)
                .as_deref()
                .unwrap_or(idem_http::IDEMPOTENCY_FENCE.as_str()),
        )
        .context("`fence_header`")?,
        fenced_upstream: pick!(r, d, fenced_upstream).unwrap_or(false),
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

/// The engine policy of a route (its timeout backed up by the engine's, takeover, lease,
/// record TTL, in-flight wait, probe timeout), its status webhook, and what an upstream
/// failure leaves behind.
fn engine_policy(
    r: &RawRoute,
    d: &RawRoute,
    store_timeout: Duration,
) -> anyhow::Result<(Policy, Option<String>, UpstreamFailure)> {
    let timeout = positive(
        pick!(r, d, timeout).map(|d| d.0),
        DEFAULT_TIMEOUT,
        "timeout",
    )?;
    // The engine's handler timeout backs the proxy's own timeout up by a second, so the
    // proxy's 504 (handled per `upstream_failure`) always comes first.
    let handler_timeout = timeout + crate::shared::HANDLER_BACKSTOP;
    let takeover = TakeoverPolicy::from(pick!(r, d, takeover).unwrap_or_default());
    let status_url = pick!(r, d, status_url)
        .map(|t| status_url(&t))
        .transpose()
        .context("`status_url`")?;
    let lease = pick!(r, d, lease).map_or_else(
        || default_lease(takeover, status_url.is_some(), handler_timeout),
        |d| d.0,
    );
    let ttl = pick!(r, d, ttl).map_or(DEFAULT_TTL, |d| d.0);
    let upstream_failure = pick!(r, d, upstream_failure).unwrap_or_default();
    let in_flight_wait = pick!(r, d, in_flight_wait)
        .map(|d| d.0)
        .filter(|d| !d.is_zero());
    let engine = Policy::builder()
        .handler_timeout(handler_timeout)
        .lease(lease)
        .record_ttl(ttl)
        .takeover(takeover)
        .store_timeout(store_timeout)
        .in_flight_wait(in_flight_wait)
        .probe_timeout(positive(
            pick!(r, d, status_timeout).map(|d| d.0),
            DEFAULT_STATUS_TIMEOUT,
            "status_timeout",
        )?)
        .build()
        .map_err(|e| match takeover {
            TakeoverPolicy::Reexecute => anyhow!(
                "policy: {e} (under `takeover = \"reexecute\"` the lease must be at least `timeout` + 16s)"
            ),
            _ => anyhow!("policy: {e}"),
        })?;
    Ok((engine, status_url, upstream_failure))
}

/// The largest request body a route buffers and the largest answer it stores (1 MiB each
/// unless set).
fn body_limits(r: &RawRoute, d: &RawRoute) -> anyhow::Result<(usize, usize)> {
    let max_request_body = size(
        pick!(r, d, max_request_body).map(|s| s.0),
        1 << 20,
        "max_request_body",
    )?;
    let max_stored_response = size(
        pick!(r, d, max_stored_response).map(|s| s.0),
        1 << 20,
        "max_stored_response",
    )?;
    Ok((max_request_body, max_stored_response))
}

/// Which statuses a route stores and releases, and the headers it replays (warning about a
/// credential-bearing one).
fn answer_rules(
    r: &RawRoute,
    d: &RawRoute,
) -> anyhow::Result<(StatusSet, StatusSet, Vec<http::HeaderName>)> {
    let store_statuses = StatusSet::parse(&pick!(r, d, store_statuses).unwrap_or_else(|| {
        ["2xx", "3xx", "4xx"]
            .map(|s| StatusPattern::Text(s.into()))
            .to_vec()
    }))
    .context("`store_statuses`")?;
    let release_statuses = StatusSet::parse(
        &pick!(r, d, release_statuses)
            .unwrap_or_else(|| [401, 403, 408, 409, 429].map(StatusPattern::Code).to_vec()),
    )
    .context("`release_statuses`")?;
    let replay_headers = match pick!(r, d, replay_headers) {
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
    Ok((store_statuses, release_statuses, replay_headers))
}

/// Where a route's key comes from, and whether it names path parameters: the token header
/// on a token route (whose key fields are then refused), else the route's key settings.
fn route_key(
    r: &RawRoute,
    d: &RawRoute,
    token: bool,
    idempotency: bool,
    pattern: &PathPattern,
) -> anyhow::Result<(idem_core::key_source::KeySources, bool)> {
    Ok(if token {
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
        let key = super::key::sources(
            pick!(r, d, key_header).as_deref(),
            pick!(r, d, key).as_ref(),
        )
        .context("`key`")?;
        let params = super::key::check_path_params(&key, pattern).context("`key`")?;
        (key, params)
    })
}

/// How long a claim lives without renewal unless the route says: under `hold` with a
/// status webhook, short (a dead gateway's key is settled from the webhook soon after); else
/// the handler timeout plus [`LEASE_MARGIN`](idem_core::engine::LEASE_MARGIN), as
/// `reexecute` requires (and, without a webhook, in flight rather than unknown for longer).
fn default_lease(takeover: TakeoverPolicy, webhook: bool, handler_timeout: Duration) -> Duration {
    match takeover {
        TakeoverPolicy::Hold if webhook => HELD_WEBHOOK_LEASE,
        _ => handler_timeout + idem_core::engine::LEASE_MARGIN,
    }
}

/// The default lease of a `hold` route with a status webhook.
pub(crate) const HELD_WEBHOOK_LEASE: Duration = Duration::from_secs(4);

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
    let from = match (p.from, &p.header) {
        (Some(from), _) => from,
        (None, Some(_)) => PrincipalFrom::Header,
        (None, None) => bail!("`from` is not set; {PRINCIPAL_REQUIRED}"),
    };
    let jwt_fields = p.hs256_secret.is_some()
        || p.rs256_public_key.is_some()
        || p.rs256_public_key_file.is_some();
    match from {
        PrincipalFrom::None => {
            if jwt_fields || p.header.is_some() {
                bail!("`from = \"none\"` but a header or key is set");
            }
            Ok(PrincipalSource::None)
        }
        PrincipalFrom::Header => {
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
        PrincipalFrom::Jwt => {
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
            let header = header_name(p.header.as_deref().unwrap_or(DEFAULT_JWT_HEADER))?;
            Ok(PrincipalSource::Jwt(Arc::new(JwtSettings {
                header,
                required: p.required.unwrap_or(true),
                key,
                verifier,
            })))
        }
    }
}

fn fingerprint(raw: Option<&RawFingerprint>) -> anyhow::Result<FingerprintSettings> {
    let f = raw.cloned().unwrap_or_default();
    let body = f.body.unwrap_or_default();
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
