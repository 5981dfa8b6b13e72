//! The status endpoint through the real `idem` binary: off by default, never proxied, scoped
//! by the caller's principal exactly as the route's records are, answering absent, processing,
//! completed (and the stored answer with `?answer=1`) and unknown.

mod common;

use common::{Gateway, Http, Upstream, configs, key};
use http::{Method, StatusCode};

fn config(upstream: &str, status: bool) -> String {
    let status = if status {
        "[status]\npath = \"/idem/status/\""
    } else {
        ""
    };
    configs::keyed(
        upstream,
        "memory:",
        &format!("unmatched = \"proxy\"\n{status}"),
        "upstream_failure = \"hold\"\ntimeout = \"2s\"",
        ROUTES,
    )
}

/// The routes of [`config`]: two keyed by the caller, one open to everyone.
const ROUTES: &str = r#"
[[routes]]
name = "charge"
method = "POST"
path = "/charge/*"

[[routes]]
name = "refund"
method = "POST"
path = "/refund/*"
namespace = "refunds"

[[routes]]
name = "open"
method = "POST"
path = "/open/*"
principal = { from = "none" }
"#;

/// The test upstream and a gateway in front of it on [`config`], the status endpoint on
/// when `status`.
async fn start(status: bool) -> (Upstream, Gateway, Http) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), status), &[]);
    (up, gw, Http::new())
}

async fn get(http: &Http, gw: &Gateway, path: &str, who: Option<&str>) -> common::Reply {
    let headers: Vec<(&str, &str)> = who.map(|w| ("x-api-key", w)).into_iter().collect();
    http.send(Method::GET, &gw.url(path), &headers, "").await
}

/// The status endpoint's answer on `key` with `query` (`route=…`, `answer=1`, …), asked as
/// `who`.
async fn status_of(
    http: &Http,
    gw: &Gateway,
    key: &str,
    query: &str,
    who: Option<&str>,
) -> common::Reply {
    get(http, gw, &format!("/idem/status/{key}?{query}"), who).await
}

async fn post(http: &Http, gw: &Gateway, path: &str, key: &str, who: &str) -> common::Reply {
    http.send(
        Method::POST,
        &gw.url(path),
        &[
            ("idempotency-key", key),
            ("x-api-key", who),
            ("content-type", "application/json"),
        ],
        r#"{"amount":100}"#,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_the_path_is_an_upstream_path() {
    let (up, gw, http) = start(false).await;
    let r = get(&http, &gw, "/idem/status/k-1?route=charge", Some("alice")).await;
    assert_eq!(r.status, StatusCode::CREATED, "the upstream answered");
    assert_eq!(up.seen.count("/idem/status/k-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reads_absent_then_completed_and_its_answer_replays() {
    let (up, gw, http) = start(true).await;
    let k = key();
    let at = format!("/idem/status/{k}?route=charge");

    let r = get(&http, &gw, &at, Some("alice")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["state"], "absent");
    assert_eq!(r.json()["key"], k.as_str());
    assert_eq!(r.json()["namespace"], "charge");

    let first = post(&http, &gw, "/charge/a", &k, "alice").await;
    assert_eq!(first.status, StatusCode::CREATED);

    let r = get(&http, &gw, &at, Some("alice")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["state"], "completed");
    assert_eq!(r.json()["status"], 201);

    // The stored answer, byte for byte, marked as a replay; the upstream does not run again.
    let r = get(&http, &gw, &format!("{at}&answer=1"), Some("alice")).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body, first.body);
    assert!(r.replayed());
    assert_eq!(r.header("idempotency-key"), Some(k.as_str()));
    assert_eq!(up.seen.total(), 1);

    // Another caller's view of the same key: absent, never alice's answer.
    let r = get(&http, &gw, &format!("{at}&answer=1"), Some("bob")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["state"], "absent");
    // No credential where the route requires one: refused like the route refuses it.
    let r = get(&http, &gw, &at, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Another namespace: absent.
    let r = status_of(&http, &gw, &k, "route=refund", Some("alice")).await;
    assert_eq!(r.json()["state"], "absent");
    let r = status_of(&http, &gw, &k, "namespace=charge", Some("alice")).await;
    assert_eq!(r.json()["state"], "completed");
    assert_eq!(up.seen.total(), 1, "no status query was proxied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_and_unknown_keys_say_so() {
    let (up, gw, http) = start(true).await;

    let k = key();
    let pending = up
        .in_flight_with(
            &http,
            gw.url("/charge/slow?delay_ms=1500"),
            &[("idempotency-key", &k), ("x-api-key", "alice")],
        )
        .await;
    let at = format!("/idem/status/{k}?route=charge&answer=1");
    let r = get(&http, &gw, &at, Some("alice")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["state"], "processing");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.json()["lease_until"].as_u64().is_some());
    let first = pending.await.expect("join").expect("answered");
    let r = get(&http, &gw, &at, Some("alice")).await;
    assert_eq!(r.body, first.body, "once done, the stored answer");

    // The upstream resets after the request was sent: the gateway holds the key as unknown.
    let k = key();
    let r = post(&http, &gw, "/charge/reset", &k, "alice").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let r = status_of(&http, &gw, &k, "route=charge&answer=1", Some("alice")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["state"], "unknown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_under_the_path_is_ever_proxied() {
    let (up, gw, http) = start(true).await;
    let k = key();
    // Two protected routes with principals: the route must be named.
    let r = get(&http, &gw, &format!("/idem/status/{k}"), Some("alice")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem_type(), "status-route");
    let r = status_of(&http, &gw, &k, "route=nope", Some("alice")).await;
    assert_eq!(r.problem_type(), "status-route");
    // Other spellings, other methods and a missing key are answered, not forwarded.
    for (method, path) in [
        (Method::GET, format!("/IDEM/status/{k}?route=charge")),
        (Method::GET, format!("/idem//status/{k}?route=charge")),
        (Method::GET, format!("/idem/./status/{k}?route=charge")),
        (Method::GET, "/idem/status".to_owned()),
        (Method::GET, "/idem/status/".to_owned()),
        (Method::GET, format!("/idem/status/{k}/more?route=charge")),
        (Method::POST, format!("/idem/status/{k}?route=charge")),
        (Method::DELETE, format!("/idem/status/{k}?route=charge")),
    ] {
        let r = http
            .send(
                method.clone(),
                &gw.url(&path),
                &[("x-api-key", "alice")],
                "",
            )
            .await;
        assert!(
            r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {}",
            r.status
        );
    }
    // A key holding `/` travels percent-encoded.
    let slashed = "order/42";
    let r = post(&http, &gw, "/charge/x", slashed, "alice").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = get(
        &http,
        &gw,
        "/idem/status/order%2F42?route=charge",
        Some("alice"),
    )
    .await;
    assert_eq!(r.json()["state"], "completed");
    assert_eq!(up.seen.total(), 1, "only the charge reached the upstream");
    // The route without a principal answers everyone.
    let k = key();
    let r = http.post_keyed(&gw.url("/open/x"), &k).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = status_of(&http, &gw, &k, "route=open", None).await;
    assert_eq!(r.json()["state"], "completed");
}

#[test]
fn check_config_shows_the_endpoint() {
    let run = common::check_config;
    let out = run(&config("http://127.0.0.1:9", true));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("status:    GET /idem/status/{key}")
            && text.contains("?route= (charge, refund, open)"),
        "{text}"
    );
    let out = run(&config("http://127.0.0.1:9", false));
    assert!(String::from_utf8_lossy(&out.stdout).contains("status:    off"));
    for bad in ["idem/status", "/", "/idem/{key}", "/idem/../x", "/a%20b"] {
        let out = run(&format!(
            "{}\n[status]\npath = \"{bad}\"\n",
            config("http://127.0.0.1:9", false)
        ));
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("status.path"),
            "{bad}"
        );
    }
}

fn token_config(upstream: &str) -> String {
    configs::with_status(
        upstream,
        "memory:",
        "",
        r#"[[routes]]
name = "checkout"
method = "POST"
path = "/checkout/*"
token = { issue = "/checkout/token" }

[[routes]]
name = "charge"
method = "POST"
path = "/charge/*"
"#,
    )
}

/// A status query with `headers` (the caller's key and, for a token route, its token).
async fn ask(http: &Http, gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> common::Reply {
    http.send(Method::GET, &gw.url(path), headers, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_routes_request_is_asked_about_with_the_token() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&token_config(&up.url()), &[]);
    let http = Http::new();
    let issued = http
        .send_as(Method::POST, &gw.url("/checkout/token"), "alice", &[], "")
        .await;
    assert_eq!(issued.status, StatusCode::CREATED);
    let t = issued.json()["token"].as_str().expect("token").to_owned();
    let alice = [("x-api-key", "alice"), ("idempotency-token", t.as_str())];
    let bob = [("x-api-key", "bob"), ("idempotency-token", t.as_str())];
    let at = "/idem/status?route=checkout";

    // Before use: absent, under the record key (the token's digest), never the token.
    let r = ask(&http, &gw, at, &alice).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["state"], "absent");
    assert_eq!(r.json()["namespace"], "checkout");
    let record = r.json()["key"].as_str().expect("key").to_owned();
    assert!(record.starts_with(&format!("tok-{}-", &t[..8])), "{record}");
    assert!(!String::from_utf8_lossy(&r.body).contains(&t));

    let token = [
        ("idempotency-token", t.as_str()),
        ("content-type", "application/json"),
    ];
    let first = http
        .send_as(
            Method::POST,
            &gw.url("/checkout/pay"),
            "alice",
            &token,
            r#"{"cart":9}"#,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);

    // After use: completed, and `?answer=1` replays the stored answer as a retry with the
    // token would (no key echoed); the trailing-slash spelling asks the same.
    let r = ask(&http, &gw, at, &alice).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["state"], "completed");
    assert_eq!(r.json()["status"], 201);
    assert_eq!(r.json()["key"], record.as_str());
    let r = ask(&http, &gw, "/idem/status/?route=checkout&answer=1", &alice).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body, first.body);
    assert!(r.replayed());
    assert_eq!(r.header("idempotency-key"), None);

    // Another principal holding alice's token: absent, never alice's answer.
    for path in [at, "/idem/status?route=checkout&answer=1"] {
        let r = ask(&http, &gw, path, &bob).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.json()["state"], "absent");
    }
    // No credential: refused as the route refuses it.
    let r = ask(&http, &gw, at, &[("idempotency-token", &t)]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // The record key itself, in the path, is a key like any other.
    let r = status_of(&http, &gw, &record, "route=checkout", Some("alice")).await;
    assert_eq!(r.json()["state"], "completed");

    // Refused: the token in the URL, a malformed token, a key and a token at once, a token
    // for a route without token mode. None echoes the token.
    let mut refusals = Vec::new();
    for (path, headers, slug) in [
        (
            format!("/idem/status?route=checkout&token={t}"),
            vec![("x-api-key", "alice")],
            "status-token",
        ),
        (
            at.to_owned(),
            vec![("x-api-key", "alice"), ("idempotency-token", "abc")],
            "status-token",
        ),
        (
            format!("/idem/status/{record}?route=checkout"),
            alice.to_vec(),
            "status-path",
        ),
        (
            "/idem/status?route=charge".to_owned(),
            alice.to_vec(),
            "status-path",
        ),
    ] {
        let r = ask(&http, &gw, &path, &headers).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(r.problem_type(), slug, "{path}");
        refusals.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    assert!(refusals.iter().all(|b| !b.contains(&t)), "{refusals:?}");
    assert_eq!(up.seen.total(), 1, "no status query was proxied");
    let logs = gw.logs();
    let leaks: Vec<&str> = logs.lines().filter(|l| l.contains(&t)).collect();
    assert!(leaks.is_empty(), "the token is in the logs: {leaks:?}");
    // The unguarded variant (last: it puts the token in a path, which the access log shows):
    // asking with the token as the key finds nothing, since the route keeps the record under
    // the token's digest.
    let r = status_of(&http, &gw, &t, "route=checkout", Some("alice")).await;
    assert_eq!(r.json()["state"], "absent");
}
