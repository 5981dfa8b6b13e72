//! What operators read about a running gateway: open probes, `/metrics` behind the admin or
//! the read-only scrape token, request metrics by route with latency histograms, claims held,
//! cache hits and misses, the build, request spans in the logs, and `--version`.

mod common;

use std::process::Command;

use common::{ADMIN_TOKEN, Gateway, Http, Upstream, bin, key};
use http::{Method, StatusCode};
use idem_core::{Key, Scope, ScopedKey};

const SCRAPE_TOKEN: &str = "scrape-token-0123456789";

/// The charge, refund and reads routes on the memory store, with an admin listener whose
/// metrics also take [`SCRAPE_TOKEN`].
fn config(upstream: &str, extra: &str) -> String {
    let admin = common::configs::admin_table(&format!("metrics_token = \"{SCRAPE_TOKEN}\""));
    common::configs::anonymous(
        upstream,
        "memory:",
        extra,
        r#"namespace = "obs""#,
        &format!("{admin}\n{ROUTES}"),
    )
}

/// The routes of [`config`].
const ROUTES: &str = r#"
[[routes]]
name = "charge"
method = "POST"
path = "/charge"

[[routes]]
name = "refund"
method = "POST"
path = "/refund"

[[routes]]
name = "reads"
method = "GET"
path = "/reads/*"
idempotency = false
"#;

/// The value of the sample `name{…}` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            if !(rest.is_empty() || rest.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse().ok())?
        })
}

async fn scrape(http: &Http, gw: &Gateway) -> String {
    let r = http
        .send(
            Method::GET,
            &gw.admin_url("/metrics"),
            &[("authorization", &format!("Bearer {SCRAPE_TOKEN}"))],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_open_and_the_scrape_token_opens_metrics_only() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), ""), &[]);
    let http = Http::new();
    for path in ["/healthz", "/readyz"] {
        let r = http.get(&gw.admin_url(path)).await;
        assert_eq!(r.status, StatusCode::OK, "{path} needs no token");
    }
    let bearer = |t: &str| format!("Bearer {t}");
    let metrics = gw.admin_url("/metrics");
    for (auth, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (
            Some(bearer("wrong-token-0123456789")),
            StatusCode::UNAUTHORIZED,
        ),
        (Some(bearer(SCRAPE_TOKEN)), StatusCode::OK),
        (Some(bearer(ADMIN_TOKEN)), StatusCode::OK),
    ] {
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let r = http.send(Method::GET, &metrics, &headers, "").await;
        assert_eq!(r.status, want, "{auth:?}");
        if want == StatusCode::UNAUTHORIZED {
            assert!(r.header("www-authenticate").is_some());
        }
    }
    // The scrape token is read-only: it opens nothing of the admin API.
    let scrape = bearer(SCRAPE_TOKEN);
    for (method, path) in [
        (Method::GET, "/admin/records"),
        (Method::GET, "/admin/record?namespace=obs&key=a"),
        (Method::DELETE, "/admin/record?namespace=obs&key=a"),
        (Method::POST, "/admin/record/resolve?namespace=obs&key=a"),
        (Method::POST, "/admin/reload"),
    ] {
        let r = http
            .send(
                method.clone(),
                &gw.admin_url(path),
                &[("authorization", &scrape)],
                r#"{"outcome":"release"}"#,
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_metrics_carry_the_route_and_latencies() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), ""), &[]);
    let http = Http::new();
    let k = key();
    http.post(&gw.url("/charge"), Some(&k), "{}").await;
    http.post(&gw.url("/charge"), Some(&k), "{}").await;
    http.post(&gw.url("/charge"), Some(&k), r#"{"other":1}"#)
        .await;
    http.post(&gw.url("/refund"), Some(&key()), "{}").await;
    http.get(&gw.url("/reads/1")).await;
    http.get(&gw.url("/nowhere")).await;
    let text = scrape(&http, &gw).await;
    let requests = |route: &str, outcome: &str| {
        sample(
            &text,
            "idem_requests_total",
            &[("route", route), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("charge", "executed"), Some(1.0), "{text}");
    assert_eq!(requests("charge", "replayed"), Some(1.0), "{text}");
    assert_eq!(requests("charge", "mismatch"), Some(1.0), "{text}");
    assert_eq!(requests("refund", "executed"), Some(1.0), "{text}");
    assert_eq!(requests("refund", "replayed"), Some(0.0), "{text}");
    assert_eq!(requests("reads", "passthrough"), Some(1.0), "{text}");
    assert_eq!(requests("-", "refused"), Some(1.0), "unmatched: {text}");
    assert_eq!(
        sample(&text, "idem_refusals_total", &[("reason", "no_route")]),
        Some(1.0)
    );
    for (series, labels) in [
        // One latency sample per request, under the same labels.
        (
            "idem_request_duration_seconds_count",
            &[("route", "charge"), ("outcome", "replayed")][..],
        ),
        (
            "idem_request_duration_seconds_bucket",
            &[("route", "charge"), ("outcome", "executed"), ("le", "+Inf")],
        ),
        // The upstream ran for the execution only (a replay and a mismatch never reach it).
        (
            "idem_upstream_duration_seconds_count",
            &[("route", "charge")],
        ),
        (
            "idem_upstream_duration_seconds_count",
            &[("route", "reads")],
        ),
    ] {
        assert_eq!(
            sample(&text, series, labels),
            Some(1.0),
            "{series} {labels:?}: {text}"
        );
    }
    // Counters that only repeated idem_requests_total{outcome} are gone.
    for gone in [
        "idem_replays_total",
        "idem_conflicts_total",
        "idem_mismatches_total",
        "idem_fenced_total",
    ] {
        assert!(!text.contains(gone), "{gone} is still exported:\n{text}");
    }
    let info = text
        .lines()
        .find(|l| l.starts_with("idem_build_info{"))
        .unwrap_or_else(|| panic!("no idem_build_info:\n{text}"));
    assert!(info.ends_with(" 1"), "{info}");
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    assert!(info.contains("memory"), "{info}");
    assert_eq!(
        info.contains("postgres"),
        cfg!(feature = "postgres"),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_gauge_counts_requests_in_flight() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), ""), &[]);
    let http = Http::new();
    assert_eq!(
        sample(&scrape(&http, &gw).await, "idem_claims_held", &[]),
        Some(0.0)
    );
    let pending = up
        .in_flight(&http, gw.url("/charge?delay_ms=1500"), &key())
        .await;
    assert_eq!(
        sample(&scrape(&http, &gw).await, "idem_claims_held", &[]),
        Some(1.0),
        "a claim is held while the upstream works"
    );
    let done = pending.await.expect("join").expect("answer");
    assert_eq!(done.status, StatusCode::CREATED);
    assert_eq!(
        sample(&scrape(&http, &gw).await, "idem_claims_held", &[]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_hits_and_misses_are_counted_and_hits_are_not_store_calls() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &config(
            &up.url(),
            "store_cache_entries = 100\nstore_cache_max_age = \"1m\"",
        ),
        &[],
    );
    let http = Http::new();
    let k = key();
    for _ in 0..4 {
        let r = http.post(&gw.url("/charge"), Some(&k), "{}").await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let text = scrape(&http, &gw).await;
    // The first claim goes to the store and runs; its completion fills the cache, and the
    // three replays are answered from it.
    assert_eq!(
        sample(&text, "idem_cache_misses_total", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "idem_cache_hits_total", &[]),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "idem_store_op_seconds_count", &[("op", "claim")]),
        Some(1.0),
        "only the miss is a store call: {text}"
    );
    assert_eq!(up.seen.count("/charge"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_runs_in_a_span_with_route_outcome_hashed_key_and_fence() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), ""), &["--log-format", "json"]);
    let http = Http::new();
    let k = key();
    let charge = |request_id: &'static str| {
        let headers = [
            ("idempotency-key", k.as_str()),
            ("x-request-id", request_id),
        ];
        let (http, url) = (http.clone(), gw.url("/charge"));
        async move { http.send(Method::POST, &url, &headers, "{}").await }
    };
    let first = charge("req-span-1").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = charge("req-span-2").await;
    assert!(again.replayed());
    assert!(gw.logged("req-span-2").await, "{}", gw.logs());

    let span_of = |request_id: &str| -> serde_json::Value {
        gw.logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message"] == "request" && v["request_id"] == request_id)
            .map(|v| v["span"].clone())
            .unwrap_or_else(|| panic!("no access log line for {request_id}:\n{}", gw.logs()))
    };
    let digest = ScopedKey::new(
        Scope::new("obs").expect("namespace"),
        Key::new(k.clone()).expect("key"),
    )
    .digest_hex();
    let span = span_of("req-span-1");
    assert_eq!(span["name"], "request");
    assert_eq!(span["route"], "charge");
    assert_eq!(span["outcome"], "executed");
    assert_eq!(span["status"], 201);
    assert_eq!(span["idem.key"], digest.as_str(), "{span}");
    assert_eq!(span["idem.fence"], 1, "{span}");
    let span = span_of("req-span-2");
    assert_eq!(span["outcome"], "replayed");
    assert_eq!(span["idem.key"], digest.as_str());
    assert!(
        span.get("idem.fence").is_none(),
        "a replay claims nothing: {span}"
    );
    assert!(
        !gw.logs().contains(&k),
        "the key itself is never logged, only its digest"
    );
}

#[test]
fn version_names_the_compiled_in_store_backends() {
    let out = Command::new(bin()).arg("--version").output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("idem {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    for (store, built) in [
        ("memory", true),
        ("sqlite", cfg!(feature = "sqlite")),
        ("redis+cluster", cfg!(feature = "redis")),
        ("postgres", cfg!(feature = "postgres")),
        ("mysql", cfg!(feature = "mysql")),
    ] {
        assert_eq!(text.contains(store), built, "{store}: {text}");
    }
}
