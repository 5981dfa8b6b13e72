//! Checks a [`RawConfig`] and turns it into the [`Settings`] the gateway runs on.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};

use super::PathCase;
use super::parse::{header_name, plain_path, positive};
use super::route::compile_route;
use super::settings::{AdminSettings, Route, Settings, StatusSettings, Unmatched};
use super::{ByteSize, DEFAULT_LISTEN, DEFAULT_STORE, RawConfig, RawRoute, listener};
use crate::path::TrailingSlash;
use crate::store::{StoreOptions, StoreSpec};
use crate::upstream::UpstreamSpec;

/// `store_timeout` unset.
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// `store_cache_max_age` unset.
const DEFAULT_STORE_CACHE_MAX_AGE: Duration = Duration::from_secs(60);
/// `upstream_connect_timeout` unset.
const DEFAULT_UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `upstream_pool_max_idle` unset.
const DEFAULT_UPSTREAM_POOL_MAX_IDLE: usize = 256;
/// `shutdown_grace` unset.
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// `log.level` unset.
const DEFAULT_LOG_LEVEL: &str = "info";
/// `reconcile.after` unset: how old an in-flight record must be to count as stuck.
const DEFAULT_RECONCILE_AFTER: Duration = Duration::from_secs(300);
/// `reconcile.timeout` unset.
const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(10);

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
    let store_options = store_options(raw, &store)?;
    let store_timeout = positive(
        raw.store_timeout.map(|d| d.0),
        DEFAULT_STORE_TIMEOUT,
        "store_timeout",
    )?;
    let store_cache = match raw.store_cache_entries {
        None | Some(0) => None,
        Some(n) => Some((
            n,
            raw.store_cache_max_age
                .map_or(DEFAULT_STORE_CACHE_MAX_AGE, |d| d.0),
        )),
    };
    let request_id_header = header_name(
        raw.request_id_header
            .as_deref()
            .unwrap_or(idem_http::X_REQUEST_ID.as_str()),
    )
    .context("`request_id_header`")?;
    let log = raw.log.clone().unwrap_or_default();
    let log_format = log.format.unwrap_or_default();
    let admin = admin(raw, listen)?;

    let defaults = raw.defaults.clone().unwrap_or_default();
    policy_only(&defaults)?;
    let demo_upstream = raw.demo_upstream.unwrap_or(false);
    let (unmatched, trailing_slash, ignore_case) = path_rules(raw)?;
    let (routes, implicit_route) = routes(
        raw,
        &defaults,
        (trailing_slash, ignore_case),
        store_timeout,
        unmatched,
        upstream.is_some() || demo_upstream,
    )?;
    let status = status(raw.status.as_ref()).context("`status.path`")?;
    super::token::check_routes(&routes, &store, status.as_ref())?;
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
            DEFAULT_UPSTREAM_CONNECT_TIMEOUT,
            "upstream_connect_timeout",
        )?,
        upstream_pool_max_idle: raw
            .upstream_pool_max_idle
            .unwrap_or(DEFAULT_UPSTREAM_POOL_MAX_IDLE),
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        request_id_header,
        log_format,
        log_level: log.level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.into()),
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
    })
}

/// Refuses route fields in `[defaults]`: it holds policy fields only.
fn policy_only(defaults: &RawRoute) -> anyhow::Result<()> {
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
    Ok(())
}

/// How requests meet routes: what an unmatched request gets, the trailing-slash rule, and
/// whether paths ignore letter case.
fn path_rules(raw: &RawConfig) -> anyhow::Result<(Unmatched, TrailingSlash, bool)> {
    let unmatched = raw.unmatched.unwrap_or_default();
    let trailing_slash = raw.trailing_slash.unwrap_or_default();
    let ignore_case = raw.path_case.unwrap_or_default() == PathCase::Insensitive;
    Ok((unmatched, trailing_slash, ignore_case))
}

/// The store's options: table and key prefix, pool size, audit retention and level,
/// `WAIT` for Redis replicas, TLS, and the memory store's byte cap.
fn store_options(raw: &RawConfig, store: &StoreSpec) -> anyhow::Result<StoreOptions> {
    Ok(StoreOptions {
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
        audit_level: audit(raw.audit.as_ref())?.level,
        wait: match (raw.store_wait_replicas, store) {
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
        tls: store_tls(raw, store)?,
        memory_max_bytes: match (raw.store_max_bytes, store) {
            (None, _) => None,
            (Some(ByteSize(0)), _) => bail!("`store_max_bytes` must be greater than zero"),
            (Some(ByteSize(n)), StoreSpec::Memory { .. }) => {
                Some(usize::try_from(n).unwrap_or(usize::MAX))
            }
            (Some(_), other) => bail!(
                "`store_max_bytes` applies to the memory store only, not `{}`",
                other.kind()
            ),
        },
    })
}

/// The admin listener: none, or its address (apart from the data listener's port), its
/// bearer token and optional scrape token (each at least 16 characters, and different), and
/// its TLS.
fn admin(raw: &RawConfig, listen: SocketAddr) -> anyhow::Result<Option<AdminSettings>> {
    Ok(match &raw.admin {
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
    })
}

/// The routes as configured (or one catch-all `default` route when none is), with an
/// `unmatched` catch-all appended under `unmatched = "protect"`; and whether the route list
/// is the implicit one. Every route needs an upstream: its own, or `upstream_elsewhere`
/// (the global one or the demo upstream). `paths` is how paths match: the trailing-slash
/// rule and whether letter case is ignored.
fn routes(
    raw: &RawConfig,
    defaults: &RawRoute,
    paths: (TrailingSlash, bool),
    store_timeout: Duration,
    unmatched: Unmatched,
    upstream_elsewhere: bool,
) -> anyhow::Result<(Vec<Route>, bool)> {
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
    let (trailing_slash, ignore_case) = paths;
    let mut routes = Vec::with_capacity(raw_routes.len());
    for (i, r) in raw_routes.iter().enumerate() {
        let route = compile_route(r, defaults, store_timeout, trailing_slash, ignore_case)
            .with_context(|| {
                let name = r
                    .name
                    .clone()
                    .or_else(|| r.path.clone())
                    .unwrap_or_else(|| "?".into());
                format!("route #{} ({name})", i + 1)
            })?;
        if route.upstream.is_none() && !upstream_elsewhere {
            bail!(
                "route `{}` has no upstream: set `upstream` (globally or on the route), or run with --demo-upstream",
                route.name
            );
        }
        routes.push(route);
    }
    Ok((routes, implicit_route))
}

/// The status endpoint's path: absolute, plain (unreserved characters and `/` only), already
/// in canonical spelling, and not the root.
fn status(raw: Option<&super::RawStatus>) -> anyhow::Result<Option<StatusSettings>> {
    let Some(path) = raw.and_then(|s| s.path.as_deref()) else {
        return Ok(None);
    };
    let trimmed = path.trim().trim_end_matches('/');
    let normal = plain_path(path, trimmed, "/idem/status")?;
    Ok(Some(StatusSettings { path: normal }))
}

fn reconcile(raw: Option<&super::RawReconcile>) -> anyhow::Result<super::ReconcileSettings> {
    let raw = raw.cloned().unwrap_or_default();
    let every = match raw.every {
        Some(d) if d.0.is_zero() => bail!("`reconcile.every` must be greater than zero"),
        other => other.map(|d| d.0),
    };
    Ok(super::ReconcileSettings {
        every,
        after: raw.after.map_or(DEFAULT_RECONCILE_AFTER, |d| d.0),
        timeout: positive(
            raw.timeout.map(|d| d.0),
            DEFAULT_RECONCILE_TIMEOUT,
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
        level: match raw.level.as_deref() {
            None => idem_core::AuditLevel::default(),
            Some(name) => name.parse().context("`audit.level`")?,
        },
        max_events: match raw.max_events {
            Some(0) => bail!("`audit.max_events` must be greater than zero"),
            Some(n) => n,
            None => defaults.max_events,
        },
        max_age: positive(raw.max_age.map(|d| d.0), defaults.max_age, "audit.max_age")?,
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

/// Parses `host:port` (a name such as `localhost` is resolved once).
pub(super) fn socket_addr(text: &str) -> anyhow::Result<SocketAddr> {
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
