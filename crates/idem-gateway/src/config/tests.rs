//! Compilation tests: inheritance from `[defaults]`, and garbage refused with the field named.

use std::time::Duration;

use http::Method;
use idem_core::TakeoverPolicy;

use super::{Settings, compile, from_toml};

fn compiled(text: &str) -> anyhow::Result<Settings> {
    compile(&from_toml(text)?)
}

#[test]
fn routes_inherit_defaults_and_override_them() {
    let s = compiled(
        r#"
        upstream = "http://127.0.0.1:9000"
        [defaults]
        ttl = "1h"
        takeover = "hold"
        principal = { from = "none" }
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
    assert!(charge.stores(201) && charge.stores(404) && !charge.stores(429) && !charge.stores(500));
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
        (
            "upstream = { url = \"https://x\", client_cert_file = \"c.pem\" }",
            "go together",
        ),
        (
            "upstream = { url = \"http://x\", ca_file = \"ca.pem\" }",
            "https://",
        ),
        ("upstream = \"http://x\"\nstore = \"mongo://x\"", "mongo"),
        ("upstream = \"http://x\"\n[defaults]\nttl = 5", "unit"),
        (
            "upstream = \"http://x\"\n[defaults]\ntakeover = \"maybe\"",
            "takeover",
        ),
        (
            "upstream = \"http://x\"\n[defaults]\ntakeover = \"reexecute\"\nlease = \"10s\"",
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
        (
            "[[routes]]\npath = \"/a\"\nprincipal = { from = \"none\" }",
            "no upstream",
        ),
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
    let s =
        compiled("upstream = \"http://127.0.0.1:1\"\n[defaults]\nprincipal = { from = \"none\" }")
            .expect("valid");
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

/// A protected route that does not say whose keys they are would give every caller one key
/// space; it is refused, and the message names the choices and why a bearer token is a poor
/// one.
#[test]
fn a_protected_route_must_name_its_principal() {
    for text in [
        "upstream = \"http://x\"",
        "upstream = \"http://x\"\n[[routes]]\npath = \"/charge\"",
        "upstream = \"http://x\"\n[[routes]]\npath = \"/charge\"\nprincipal = {}",
    ] {
        let err = match compiled(text) {
            Ok(_) => panic!("accepted a shared key space: {text}"),
            Err(e) => format!("{e:#}"),
        };
        for needle in [
            "principal",
            "from = \"none\"",
            "from = \"header\"",
            "from = \"jwt\"",
            "single-tenant",
            "refreshed",
        ] {
            assert!(err.contains(needle), "{needle:?} not in: {err}");
        }
    }
    // Plain-proxy routes have no keys and need no principal.
    let s = compiled("upstream = \"http://x\"\n[[routes]]\npath = \"/a\"\nidempotency = false")
        .expect("valid");
    assert!(!s.routes[0].policy.idempotency);
}

#[test]
fn status_webhooks_reconcile_and_audit_settings_are_checked() {
    let base = |route: &str, extra: &str| {
        format!(
            r#"
            upstream = "http://127.0.0.1:9000"
            {extra}
            [defaults]
            principal = {{ from = "none" }}
            [[routes]]
            path = "/charges"
            {route}
            "#
        )
    };
    let s = compiled(&base(
        r#"status_url = "/charges?idempotency_key={key}&ns={namespace}""#,
        "[reconcile]\nevery = \"30s\"\nafter = \"2m\"\n[audit]\nlevel = \"all\"\nmax_events = 500\nmax_age = \"1d\"",
    ))
    .expect("valid");
    assert_eq!(s.audit.level, idem_core::AuditLevel::All);
    assert_eq!(s.store_options.audit_level, idem_core::AuditLevel::All);
    assert!(
        s.to_string()
            .contains("audit:     every transition (level all)")
    );
    assert_eq!(
        s.routes[0].policy.status_url.as_deref(),
        Some("/charges?idempotency_key={key}&ns={namespace}")
    );
    assert_eq!(s.reconcile.every, Some(Duration::from_secs(30)));
    assert_eq!(s.reconcile.after, Duration::from_secs(120));
    assert_eq!(s.audit.max_events, 500);
    assert_eq!(s.store_options.audit.max_age, Duration::from_secs(86_400));
    assert!(
        s.to_string()
            .contains("reconcile:   asks /charges?idempotency_key={key}")
    );

    let defaults = compiled(&base("", "")).expect("valid");
    assert_eq!(defaults.audit.level, idem_core::AuditLevel::Operator);
    assert_eq!(
        defaults.store_options.audit_level,
        idem_core::AuditLevel::Operator
    );
    assert_eq!(defaults.reconcile.every, None);
    assert_eq!(defaults.routes[0].policy.status_url, None);

    for (route, extra) in [
        (r#"status_url = "/charges""#, ""),
        (r#"status_url = "/charges/{key}/{id}""#, ""),
        (r#"status_url = "ftp://x/{key}""#, ""),
        (r#"status_url = "/c/{key}/{key""#, ""),
        ("", "[reconcile]\nevery = \"0s\""),
        ("", "[reconcile]\nlimit = 0"),
        ("", "[audit]\nmax_events = 0"),
        ("", "[audit]\nlevel = \"every\""),
        ("", "[reconcile]\nbogus = 1"),
    ] {
        assert!(compiled(&base(route, extra)).is_err(), "{route} {extra}");
    }
}

#[test]
fn the_metrics_token_is_checked() {
    let admin = |extra: &str| {
        compiled(&format!(
            "upstream = \"http://x\"\n[defaults]\nprincipal = {{ from = \"none\" }}\n[admin]\nlisten = \"127.0.0.1:9\"\ntoken = \"0123456789abcdef\"\n{extra}"
        ))
    };
    let ok = admin("metrics_token = \"scrape-0123456789\"").expect("valid");
    assert_eq!(
        ok.admin.and_then(|a| a.metrics_token).as_deref(),
        Some("scrape-0123456789")
    );
    let same = admin("metrics_token = \"0123456789abcdef\"").expect_err("same as the admin token");
    assert!(format!("{same:#}").contains("must differ"), "{same:#}");
    let short = admin("metrics_token = \"short\"").expect_err("too short");
    assert!(format!("{short:#}").contains("at least 16"), "{short:#}");
    let alone = compiled(
        "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }\n[admin]\nmetrics_token = \"scrape-0123456789\"",
    )
    .expect_err("no admin listener");
    assert!(format!("{alone:#}").contains("admin listener"), "{alone:#}");
}

#[test]
fn the_otel_endpoint_is_checked() {
    let otel = |section: &str| {
        compiled(&format!(
            "upstream = \"http://x\"\n[defaults]\nprincipal = {{ from = \"none\" }}\n[otel]\n{section}"
        ))
    };
    let bad = otel("endpoint = \"grpc://collector\"").expect_err("not http");
    assert!(format!("{bad:#}").contains("http://"), "{bad:#}");
    let lonely = otel("service_name = \"pay\"").expect_err("no endpoint");
    assert!(
        format!("{lonely:#}").contains("no `otel.endpoint`"),
        "{lonely:#}"
    );
    let good = otel("endpoint = \"http://127.0.0.1:4317\"\nservice_name = \"pay\"");
    if cfg!(feature = "otlp") {
        let s = good.expect("valid");
        let o = s.otel.expect("otel");
        assert_eq!(
            (o.endpoint.as_str(), o.service_name.as_str()),
            ("http://127.0.0.1:4317", "pay")
        );
    } else {
        let e = good.expect_err("no exporter in this build");
        assert!(format!("{e:#}").contains("feature `otlp`"), "{e:#}");
    }
}

#[test]
fn waiting_for_redis_replicas_is_checked() {
    let base =
        "upstream = \"http://127.0.0.1:9000\"\n[defaults]\nprincipal = { from = \"none\" }\n";
    let s = compiled(&format!(
        "store = \"redis+cluster://127.0.0.1:1,127.0.0.1:2\"\nstore_wait_replicas = 1\n{base}"
    ))
    .expect("valid");
    assert_eq!(
        s.store_options.wait,
        Some((1, crate::store::DEFAULT_WAIT_TIMEOUT))
    );
    assert!(s.to_string().contains("1 replica(s) acknowledge"), "{s}");
    for (bad, field) in [
        (
            "store = \"redis://a:1\"\nstore_wait_replicas = 0",
            "store_wait_replicas",
        ),
        (
            "store = \"postgres://u@h/db\"\nstore_wait_replicas = 1",
            "Redis stores only",
        ),
        (
            "store = \"redis://a:1\"\nstore_wait_timeout = \"1s\"",
            "needs `store_wait_replicas`",
        ),
        (
            "store = \"redis://a:1\"\nstore_wait_replicas = 1\nstore_wait_timeout = \"0s\"",
            "store_wait_timeout",
        ),
    ] {
        let e = compiled(&format!("{bad}\n{base}"))
            .expect_err(bad)
            .to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

#[test]
fn body_limits_default_to_a_protective_pace_and_can_be_set() {
    let base = "upstream = \"http://127.0.0.1:1\"\n[defaults]\nprincipal = { from = \"none\" }\n";
    let s = compiled(base).expect("valid");
    assert_eq!(s.limits.body_pace.timeout, Duration::from_secs(30));
    assert_eq!(s.limits.body_pace.min_rate, 16 * 1024);
    let s = compiled(&format!(
        "{base}[limits]\nbody_timeout = \"5s\"\nmin_body_rate = \"1KiB\"\n"
    ))
    .expect("valid");
    assert_eq!(s.limits.body_pace.timeout, Duration::from_secs(5));
    assert_eq!(s.limits.body_pace.min_rate, 1024);
    let zero = compiled(&format!("{base}[limits]\nbody_timeout = \"0s\"\n"));
    let e = zero.expect_err("a zero body timeout");
    assert!(format!("{e:#}").contains("body_timeout"), "{e:#}");
}

#[test]
fn the_tunnel_idle_timeout_defaults_to_five_minutes_and_is_checked() {
    let base = "upstream = \"http://127.0.0.1:1\"\n[defaults]\nprincipal = { from = \"none\" }\n";
    let s = compiled(base).expect("valid");
    assert_eq!(s.limits.tunnel_idle_timeout, Duration::from_secs(300));
    assert!(
        s.to_string().contains("tunnels idle 5m"),
        "check-config shows it: {s}"
    );
    let s = compiled(&format!("{base}[limits]\ntunnel_idle_timeout = \"90s\"\n")).expect("valid");
    assert_eq!(s.limits.tunnel_idle_timeout, Duration::from_secs(90));
    for bad in ["\"0s\"", "\"soon\"", "30"] {
        let e = compiled(&format!("{base}[limits]\ntunnel_idle_timeout = {bad}\n")).expect_err(bad);
        assert!(
            format!("{e:#}").contains("tunnel_idle_timeout"),
            "{bad}: {e:#}"
        );
    }
}

#[test]
fn named_settings_take_their_values_and_refuse_others_naming_the_allowed_ones() {
    let s = compiled(
        r#"
        upstream = "http://127.0.0.1:9000"
        unmatched = "proxy"
        trailing_slash = "strict"
        path_case = "sensitive"
        [log]
        format = "json"
        [defaults]
        principal = { from = "header", header = "x-api-key" }
        takeover = "reexecute"
        fenced_upstream = true
        upstream_failure = "retry"
        fingerprint = { body = "raw" }
        [[routes]]
        path = "/a"
        "#,
    )
    .expect("valid");
    assert_eq!(s.unmatched, super::Unmatched::Proxy);
    assert_eq!(s.trailing_slash, crate::path::TrailingSlash::Strict);
    assert_eq!(s.log_format, super::LogFormat::Json);
    let p = &s.routes[0].policy;
    assert_eq!(p.engine.takeover(), TakeoverPolicy::Reexecute);
    assert_eq!(p.upstream_failure, super::UpstreamFailure::Retry);
    assert_eq!(p.fingerprint.body, super::FingerprintBody::Raw);
    assert!(matches!(p.principal, super::PrincipalSource::Header(_)));
    assert!(s.to_string().contains("case-sensitive"), "{s}");

    let unset = compiled(
        "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }\n[[routes]]\npath = \"/a\"",
    )
    .expect("valid");
    assert_eq!(unset.unmatched, super::Unmatched::Reject);
    assert_eq!(unset.trailing_slash, crate::path::TrailingSlash::Ignore);
    assert_eq!(unset.log_format, super::LogFormat::Text);
    let p = &unset.routes[0].policy;
    assert_eq!(p.engine.takeover(), TakeoverPolicy::Hold);
    assert_eq!(p.upstream_failure, super::UpstreamFailure::Hold);
    assert_eq!(p.fingerprint.body, super::FingerprintBody::Json);
    assert!(unset.to_string().contains("case-insensitive"), "{unset}");

    for (text, key, allowed) in [
        (
            "unmatched = \"drop\"",
            "unmatched",
            &["reject", "protect", "proxy"][..],
        ),
        (
            "trailing_slash = \"x\"",
            "trailing_slash",
            &["ignore", "strict"],
        ),
        (
            "path_case = \"x\"",
            "path_case",
            &["insensitive", "sensitive"],
        ),
        ("[log]\nformat = \"xml\"", "log.format", &["text", "json"]),
        (
            "[defaults]\ntakeover = \"x\"",
            "takeover",
            &["hold", "reexecute"],
        ),
        (
            "[defaults]\nupstream_failure = \"x\"",
            "upstream_failure",
            &["hold", "retry"],
        ),
        (
            "[defaults]\nfingerprint = { body = \"x\" }",
            "fingerprint.body",
            &["json", "raw", "ignore"],
        ),
        (
            "[defaults]\nprincipal = { from = \"x\" }",
            "principal.from",
            &["none", "header", "jwt"],
        ),
    ] {
        let e = compiled(&format!("upstream = \"http://x\"\n{text}")).expect_err(text);
        let e = format!("{e:#}");
        assert!(e.contains(key), "{text}: {e}");
        for value in allowed {
            assert!(e.contains(&format!("`{value}`")), "{text}: {e}");
        }
    }
}
