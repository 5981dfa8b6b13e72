//! What `idem check-config` prints: the checked settings, route by route.

use std::fmt;

use http::HeaderName;

use super::Dur;
use super::settings::{Route, RoutePolicy, Settings, Unmatched};
use crate::path::TrailingSlash;
use crate::principal::PrincipalSource;

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_listener(f)?;
        self.write_store(f)?;
        self.write_front_door(f)?;
        self.write_admin(f)?;
        self.write_reconcile_and_audit(f)?;
        self.write_telemetry(f)?;
        self.write_path_matching(f)?;
        self.write_status(f)?;
        self.write_routes(f)?;
        Ok(())
    }
}

impl Settings {
    /// The listening address and the default upstream.
    fn write_listener(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "listen:    {}", self.listen)?;
        match (&self.upstream, self.demo_upstream) {
            (_, true) => writeln!(f, "upstream:  built-in demo upstream")?,
            (Some(u), false) => writeln!(f, "upstream:  {u}")?,
            (None, false) => writeln!(f, "upstream:  (per route)")?,
        }
        Ok(())
    }

    /// The store: its address and timeout, TLS, memory bound, replica wait and response cache.
    fn write_store(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "store:     {} (timeout {})",
            self.store,
            Dur(self.store_timeout)
        )?;
        if let Some(tls) = &self.store_options.tls {
            writeln!(
                f,
                "store tls: {}{}",
                tls.ca_file.as_ref().map_or_else(
                    || "server verified against the system roots".to_owned(),
                    |ca| format!("server verified against {}", ca.display())
                ),
                tls.client
                    .as_ref()
                    .map_or_else(String::new, |(cert, _)| format!(
                        ", client certificate {}",
                        cert.display()
                    ))
            )?;
        }
        if matches!(self.store, crate::store::StoreSpec::Memory { .. }) {
            let bytes = self
                .store_options
                .memory_max_bytes
                .unwrap_or(idem_core::memory::DEFAULT_MAX_BYTES);
            writeln!(
                f,
                "store bound: records take at most {bytes} bytes; a full store refuses new keys (503), never drops a live record"
            )?;
        }
        if let Some((replicas, timeout)) = self.store_options.wait {
            writeln!(
                f,
                "store wait: {replicas} replica(s) acknowledge each claim and completion within {}",
                Dur(timeout)
            )?;
        }
        if let Some((n, age)) = self.store_cache {
            writeln!(
                f,
                "cache:     {n} completed responses, at most {} each",
                Dur(age)
            )?;
        }
        Ok(())
    }

    /// Client-facing TLS and the connection and request limits.
    fn write_front_door(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tls {
            Some(t) => writeln!(
                f,
                "tls:       on ({}, key {}; reloaded on SIGHUP)",
                t.cert.display(),
                t.key.display()
            )?,
            None => writeln!(f, "tls:       off (plain HTTP)")?,
        }
        let l = &self.limits;
        writeln!(
            f,
            "limits:    {} connections (upgraded tunnels included), {} requests in progress, headers within {}, idle {}, protected bodies within {} at {} bytes/s after 2s, tunnels idle {}",
            l.max_connections,
            l.max_concurrent_requests,
            Dur(l.header_read_timeout),
            Dur(l.idle_timeout),
            Dur(l.body_pace.timeout),
            l.body_pace.min_rate,
            Dur(l.tunnel_idle_timeout)
        )?;
        Ok(())
    }

    /// The admin listener and which tokens it accepts.
    fn write_admin(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.admin {
            Some(a) => writeln!(
                f,
                "admin:     {}{} (bearer token required; /metrics also with {}; /healthz, /readyz and the /ui page open)",
                a.listen,
                if a.tls.is_some() { ", TLS" } else { "" },
                if a.metrics_token.is_some() {
                    "the read-only metrics token"
                } else {
                    "no other token"
                }
            )?,
            None => writeln!(f, "admin:     off")?,
        }
        Ok(())
    }

    /// When reconciliation runs and what the audit log keeps.
    fn write_reconcile_and_audit(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.reconcile;
        match r.every {
            Some(every) => writeln!(
                f,
                "reconcile: every {} in serve: unknown records, and processing ones older than {}",
                Dur(every),
                Dur(r.after)
            )?,
            None => writeln!(
                f,
                "reconcile: on demand (`idem reconcile`): unknown records, and processing ones older than {}",
                Dur(r.after)
            )?,
        }
        writeln!(
            f,
            "audit:     {}, at most {} events, none older than {}",
            match self.audit.level {
                idem_core::AuditLevel::All => "every transition (level all)",
                _ => "operator events, not a fresh claim or its completion (level operator)",
            },
            self.audit.max_events,
            Dur(self.audit.max_age)
        )?;
        Ok(())
    }

    /// Trace export, the shutdown drain and logging.
    fn write_telemetry(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(o) = &self.otel {
            writeln!(
                f,
                "otel:      request spans to {} over OTLP/gRPC, service {}",
                o.endpoint, o.service_name
            )?;
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
        Ok(())
    }

    /// How paths are normalised and matched, and what happens to unmatched requests.
    fn write_path_matching(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "paths:     normalised before matching and forwarding; trailing slash {}; route literals {}",
            match self.trailing_slash {
                TrailingSlash::Ignore => "ignored",
                TrailingSlash::Strict => "significant",
            },
            match self.routes.first() {
                Some(r) if !r.pattern.ignores_case() => "case-sensitive",
                _ => "case-insensitive",
            }
        )?;
        writeln!(
            f,
            "unmatched: {}",
            match self.unmatched {
                Unmatched::Reject => "reject",
                Unmatched::Protect => "protect",
                Unmatched::Proxy => "proxy",
            }
        )?;
        Ok(())
    }

    /// The status endpoint and the token routes it can be asked about.
    fn write_status(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            Some(s) => {
                let protected: Vec<&str> = self
                    .routes
                    .iter()
                    .filter(|r| r.policy.idempotency)
                    .map(|r| r.name.as_str())
                    .collect();
                writeln!(
                    f,
                    "status:    GET {}/{{key}} (never proxied; each caller sees only its own keys, scoped as the route scopes them; ?answer=1 returns a completed key's stored answer){}",
                    s.path,
                    match protected.as_slice() {
                        [] => " - no protected route, every query is refused".to_owned(),
                        [one] => format!("; route `{one}`"),
                        many => format!("; pick the route with ?route= ({})", many.join(", ")),
                    }
                )?;
                for r in &self.routes {
                    if let Some(t) = &r.policy.token {
                        writeln!(
                            f,
                            "           GET {}?route={} with the token in `{}` asks about a request of token route `{}`",
                            s.path, r.name, t.header, r.name
                        )?;
                    }
                }
            }
            None => writeln!(f, "status:    off")?,
        }
        Ok(())
    }

    /// The route table header, then each route in match order.
    fn write_routes(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.implicit_route {
            writeln!(
                f,
                "routes:    none configured; one catch-all route from `defaults`:"
            )?;
        } else {
            let unmatched = match self.unmatched {
                Unmatched::Reject => "unmatched requests get 404 and are not forwarded",
                Unmatched::Protect => {
                    "unmatched requests are caught by the last route, `unmatched`"
                }
                Unmatched::Proxy => "unmatched requests are PROXIED UNPROTECTED",
            };
            writeln!(
                f,
                "routes:    {} (first match wins; {unmatched}):",
                self.routes.len()
            )?;
        }
        for r in &self.routes {
            write_route(f, r)?;
        }
        Ok(())
    }
}

/// One route: its match line, then its idempotency settings unless it is a plain proxy.
fn write_route(f: &mut fmt::Formatter<'_>, r: &Route) -> fmt::Result {
    let p = &r.policy;
    writeln!(f, "  - {} {} [{}]", r.methods, r.pattern.as_str(), r.name)?;
    if let Some(u) = &r.upstream {
        writeln!(f, "      upstream:    {u}")?;
    }
    if !p.idempotency {
        writeln!(f, "      idempotency: off (plain proxy)")?;
        return Ok(());
    }
    write_route_key(f, p)?;
    writeln!(f, "      namespace:   {}", p.namespace)?;
    writeln!(f, "      principal:   {}", principal_text(&p.principal))?;
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
    write_route_timing(f, p)?;
    let replay: Vec<&str> = p.replay_headers.iter().map(HeaderName::as_str).collect();
    writeln!(
        f,
        "      limits:      request body {} bytes, stored response {} bytes; replayed headers: {}",
        p.max_request_body,
        p.max_stored_response,
        replay.join(", ")
    )?;
    if let Some(url) = &p.status_url {
        writeln!(f, "      reconcile:   asks {url}")?;
    }
    Ok(())
}

/// Where a route's idempotency key comes from: a token header or the configured key source.
fn write_route_key(f: &mut fmt::Formatter<'_>, p: &RoutePolicy) -> fmt::Result {
    match &p.token {
        Some(t) => writeln!(
            f,
            "      token:       header {} replaces the key (required on POST/PUT/PATCH/DELETE); POST {} issues one, valid {}, at most {} per principal and {} for all callers together (never proxied)",
            t.header,
            t.issue,
            Dur(t.ttl),
            t.rate,
            t.global_rate
        )?,
        None => writeln!(
            f,
            "      key:         {} ({})",
            p.key,
            if p.key_required {
                "required on POST/PUT/PATCH/DELETE"
            } else {
                "optional"
            }
        )?,
    }
    Ok(())
}

/// How a route tells callers apart.
fn principal_text(principal: &PrincipalSource) -> String {
    match principal {
        PrincipalSource::None => {
            "none (single tenant: every caller shares one key space)".to_owned()
        }
        PrincipalSource::Header(h) => format!(
            "header {} (a stable credential, stored hashed){}",
            h.header(),
            if h.is_required() { ", required" } else { "" }
        ),
        PrincipalSource::Jwt(j) => format!(
            "JWT ({:?}) in {}, claim `{}`{}",
            j.key,
            j.header,
            j.verifier.claim(),
            if j.required { ", required" } else { "" }
        ),
    }
}

/// A route's timing, failure handling, stored statuses and in-flight behaviour.
fn write_route_timing(f: &mut fmt::Formatter<'_>, p: &RoutePolicy) -> fmt::Result {
    let e = &p.engine;
    writeln!(
        f,
        "      timing:      upstream timeout {}, lease {} (renewed every {}), ttl {}",
        Dur(e
            .handler_timeout()
            .saturating_sub(crate::shared::HANDLER_BACKSTOP)),
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
    Ok(())
}
