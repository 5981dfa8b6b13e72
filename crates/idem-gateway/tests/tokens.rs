//! Token routes through the real `idem serve` binary: the gateway issues one-time tokens at a
//! route's issue path (never forwarded), and the token header replaces the idempotency key.
//! One suite runs on the memory store, on Redis, on PostgreSQL and on MariaDB (the servers on
//! their standard local ports: a missing one fails under CI and skips loudly otherwise).

mod cleanup;
mod common;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use cleanup::{Sql, sql_table};
use common::{Gateway, Http, REDIS, Reply, Upstream, service_up};
use http::{Method, StatusCode};

fn config(upstream: &str, store: &str, extra: &str) -> String {
    common::configs::keyed(
        upstream,
        store,
        extra,
        "",
        &format!("{}\n{ROUTES}", common::configs::admin_table("")),
    )
}

/// The routes of [`config`]: three token modes, and keys without tokens.
const ROUTES: &str = r#"
[[routes]]
name = "checkout"
method = "POST"
path = "/checkout/*"
token = { issue = "/checkout/token", ttl = "15m", rate = "1000/min" }

[[routes]]
name = "quick"
method = "POST"
path = "/quick/*"
token = { header = "x-form-token", issue = "/quick/token", ttl = "300ms", rate = "1000/min" }

[[routes]]
name = "limited"
method = "POST"
path = "/limited/*"
token = { issue = "/limited/token", rate = "2/min" }

# No token mode, keys optional: the unguarded variant.
[[routes]]
name = "keyed"
method = "POST"
path = "/keyed/*"
key_required = false
"#;

/// Issues a token at `path` for `principal`; checks the answer's shape.
async fn issue(http: &Http, gw: &Gateway, path: &str, principal: &str) -> (String, Reply) {
    let r = http
        .send_as(Method::POST, &gw.url(path), principal, &[], "")
        .await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let body = r.json();
    let token = body["token"].as_str().expect("token").to_owned();
    assert_eq!(token.len(), 64);
    assert!(
        body["expires_at"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z'))
    );
    assert!(body["header"].as_str().is_some());
    (token, r)
}

async fn submit(http: &Http, gw: &Gateway, path: &str, principal: &str, token: &str) -> Reply {
    let headers = [
        ("idempotency-token", token),
        ("content-type", "application/json"),
    ];
    http.send_as(
        Method::POST,
        &gw.url(path),
        principal,
        &headers,
        r#"{"cart":9}"#,
    )
    .await
}

fn problem(r: &Reply, status: StatusCode, slug: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.problem_type(), slug);
}

/// Each of many concurrent submits of one token either got the answer or was told the first
/// is in flight.
fn assert_answered_or_in_flight(replies: &[Reply]) {
    for r in replies {
        let ok = (r.status == StatusCode::CREATED)
            || (r.status == StatusCode::CONFLICT && r.problem_type() == "in-flight");
        assert!(ok, "{} {}", r.status, String::from_utf8_lossy(&r.body));
    }
}

/// The admin API's answer to `GET path`, with the admin token.
async fn admin_get(http: &Http, gw: &Gateway, path: &str) -> Reply {
    http.admin(Method::GET, &gw.admin_url(path), "").await
}

/// Everything a token route promises, on one gateway over `store`.
async fn suite(store: &str, extra: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), store, extra), &[]);
    let http = Http::new();
    let mut issued = Vec::new();

    // The issue path is answered by the gateway, whatever the method, and never forwarded
    // (the route's own pattern `/checkout/*` matches it).
    let (t, _) = issue(&http, &gw, "/checkout/token", "alice").await;
    issued.push(t.clone());
    let r = http
        .send_as(Method::GET, &gw.url("/checkout/token"), "alice", &[], "")
        .await;
    problem(&r, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
    let r = http
        .send(Method::POST, &gw.url("/checkout/token"), &[], "")
        .await;
    problem(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    assert_eq!(up.seen.total(), 0, "the issue path reached the upstream");

    // Issue then submit: one execution. A retry with the same token replays it.
    let first = submit(&http, &gw, "/checkout/pay", "alice", &t).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let again = submit(&http, &gw, "/checkout/pay", "alice", &t).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(up.seen.count("/checkout/pay"), 1);
    // The upstream never sees the token as an idempotency key it could confuse.
    assert!(
        up.seen.headers.lock()[0].get("idempotency-key").is_none(),
        "the gateway added an Idempotency-Key"
    );

    // 50 concurrent submits with one token: exactly one execution; the rest replay or are
    // told the first is in flight.
    let (t, _) = issue(&http, &gw, "/checkout/token", "alice").await;
    issued.push(t.clone());
    let url = "/checkout/race?delay_ms=300";
    let replies: Vec<Reply> =
        futures::future::join_all((0..50).map(|_| submit(&http, &gw, url, "alice", &t))).await;
    assert_eq!(up.seen.count("/checkout/race"), 1);
    let executed = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .count();
    assert_eq!(executed, 1);
    assert_answered_or_in_flight(&replies);

    // Refusals, each a clear problem, none forwarded.
    let before = up.seen.total();
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/pay"), "alice", &[], "{}")
        .await;
    problem(&r, StatusCode::PRECONDITION_REQUIRED, "token-missing");
    let r = submit(&http, &gw, "/checkout/pay", "alice", "not-a-token").await;
    problem(&r, StatusCode::BAD_REQUEST, "token-malformed");
    let r = submit(&http, &gw, "/checkout/pay", "alice", &"0".repeat(64)).await;
    problem(&r, StatusCode::FORBIDDEN, "token-unknown");
    let (t, _) = issue(&http, &gw, "/checkout/token", "alice").await;
    issued.push(t.clone());
    let both = [
        ("idempotency-token", t.as_str()),
        ("idempotency-key", "k-1"),
    ];
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/pay"), "alice", &both, "{}")
        .await;
    problem(&r, StatusCode::BAD_REQUEST, "token-with-key");
    // A token issued to alice is unknown to bob, and stays usable by alice.
    let r = submit(&http, &gw, "/checkout/pay", "bob", &t).await;
    problem(&r, StatusCode::FORBIDDEN, "token-unknown");
    // ...and a token of one route is unknown on another.
    let form = [("x-form-token", t.as_str())];
    let r = http
        .send_as(Method::POST, &gw.url("/quick/pay"), "alice", &form, "{}")
        .await;
    problem(&r, StatusCode::FORBIDDEN, "token-unknown");
    assert_eq!(
        up.seen.total(),
        before,
        "a refused token reached the upstream"
    );
    let r = submit(&http, &gw, "/checkout/pay2", "alice", &t).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(up.seen.count("/checkout/pay2"), 1);

    // Used without a record: the first attempt's 500 is not kept, the token is spent.
    let (t, _) = issue(&http, &gw, "/checkout/token", "alice").await;
    issued.push(t.clone());
    let r = submit(&http, &gw, "/checkout/status/500", "alice", &t).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let r = submit(&http, &gw, "/checkout/status/500", "alice", &t).await;
    problem(&r, StatusCode::CONFLICT, "token-used");
    assert_eq!(up.seen.count("/checkout/status/500"), 1);

    // Expired: wait until the store's expiry (as the issue answer gave it) has passed.
    let (t, reply) = issue(&http, &gw, "/quick/token", "alice").await;
    issued.push(t.clone());
    assert_eq!(reply.json()["header"], "x-form-token");
    let expires = humantime::parse_rfc3339(reply.json()["expires_at"].as_str().expect("at"))
        .expect("rfc3339");
    if let Ok(left) = expires.duration_since(SystemTime::now()) {
        tokio::time::sleep(left + Duration::from_millis(100)).await;
    }
    let form = [("x-form-token", t.as_str())];
    let r = http
        .send_as(Method::POST, &gw.url("/quick/pay"), "alice", &form, "{}")
        .await;
    problem(&r, StatusCode::GONE, "token-expired");
    assert_eq!(up.seen.count("/quick/pay"), 0);

    // The issue rate limit is per principal: 2/min for alice, and bob has his own.
    for _ in 0..2 {
        let (t, _) = issue(&http, &gw, "/limited/token", "alice").await;
        issued.push(t);
    }
    let r = http
        .send_as(Method::POST, &gw.url("/limited/token"), "alice", &[], "")
        .await;
    problem(&r, StatusCode::TOO_MANY_REQUESTS, "token-rate-limited");
    let wait: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=30).contains(&wait), "{wait}");
    let (t, _) = issue(&http, &gw, "/limited/token", "bob").await;
    issued.push(t);

    // The unguarded variant: a route without token mode runs a double submit that carries
    // no key twice.
    for _ in 0..2 {
        let r = http
            .send_as(Method::POST, &gw.url("/keyed/pay"), "alice", &[], "{}")
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    assert_eq!(up.seen.count("/keyed/pay"), 2);

    // No token in full in the logs, the metrics or the admin API; records hold the digest.
    let records = admin_get(&http, &gw, "/admin/records?namespace=checkout").await;
    assert_eq!(records.status, StatusCode::OK);
    let records = String::from_utf8_lossy(&records.body).into_owned();
    assert!(records.contains("\"tok-"), "{records}");
    let metrics = admin_get(&http, &gw, "/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    for (outcome, at_least) in [("issued", 4), ("consumed", 4), ("unknown", 2), ("used", 1)] {
        let line = format!("idem_tokens_total{{route=\"checkout\",outcome=\"{outcome}\"}}");
        let n: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} missing:\n{metrics}"));
        assert!(n >= at_least, "{line} = {n}");
    }
    // The access log names the token outcome.
    assert!(
        gw.logged("detail=\"expired\"").await || gw.logged("detail=expired").await,
        "{}",
        gw.logs()
    );
    let logs = gw.logs();
    let unique: HashSet<&String> = issued.iter().collect();
    assert_eq!(unique.len(), issued.len(), "two issues gave one token");
    for t in &issued {
        assert!(!logs.contains(t.as_str()), "a token is in the logs");
        assert!(!records.contains(t.as_str()), "a token is in the admin API");
        assert!(!metrics.contains(t.as_str()), "a token is in the metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_routes_on_memory() {
    suite("memory:", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_routes_on_redis() {
    if !service_up(REDIS, "Redis").await {
        return;
    }
    let prefix = format!("idem-gw-tokens-{}:", uuid::Uuid::now_v7().simple());
    suite(
        "redis://127.0.0.1:6379",
        &format!("store_prefix = \"{prefix}\""),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_routes_on_postgres() {
    if let Some((url, table, _drop)) = sql_table(Sql::Postgres, "gw_tokens").await {
        suite(url, &format!("store_table = \"{table}\"")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_routes_on_mariadb() {
    if let Some((url, table, _drop)) = sql_table(Sql::Mariadb, "gw_tokens").await {
        suite(url, &format!("store_table = \"{table}\"")).await;
    }
}

/// Runs `idem check-config` on `toml`; returns (success, stderr).
fn check_config(toml: &str) -> (bool, String) {
    let out = common::check_config(toml);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn check_config_refuses_bad_token_config() {
    let route = |store: &str, token: &str, more: &str| {
        format!(
            r#"
upstream = "http://127.0.0.1:9"
store = "{store}"
[defaults]
principal = {{ from = "none" }}
[[routes]]
name = "checkout"
path = "/checkout/*"
{more}
token = {token}
"#
        )
    };
    let ok = route("memory:", r#"{ issue = "/checkout/token" }"#, "");
    let (success, out) = check_config(&ok);
    assert!(success, "{out}");
    assert!(out.contains("POST /checkout/token issues one"), "{out}");
    let with_status = format!("{ok}\n[status]\npath = \"/idem/status\"\n");
    let (success, out) = check_config(&with_status);
    assert!(success, "{out}");
    assert!(
        out.contains("GET /idem/status?route=checkout with the token in `idempotency-token`"),
        "{out}"
    );
    for (toml, says) in [
        (
            route("sqlite:./x.db", r#"{ issue = "/checkout/token" }"#, ""),
            "route `checkout`: token mode needs a store that keeps tokens",
        ),
        (
            route("memory:", "{ ttl = \"1m\" }", ""),
            "`token.issue` is required",
        ),
        (
            route("memory:", r#"{ issue = "checkout/token" }"#, ""),
            "must start with /",
        ),
        (
            route("memory:", r#"{ issue = "/t", rate = "20/fortnight" }"#, ""),
            "`token.rate`",
        ),
        (
            route("memory:", r#"{ issue = "/t", ttl = "0s" }"#, ""),
            "`token.ttl` must be between",
        ),
        (
            route(
                "memory:",
                r#"{ issue = "/t", header = "authorization" }"#,
                "",
            ),
            "`token.header`",
        ),
        (
            route("memory:", r#"{ issue = "/t" }"#, "key_header = \"x-key\""),
            "takes its key from the token header",
        ),
        (
            route("memory:", r#"{ issue = "/t" }"#, "idempotency = false"),
            "`token` needs idempotency",
        ),
        (
            route("memory:", r#"{ issue = "/t", colour = "red" }"#, ""),
            "colour",
        ),
    ] {
        let (success, out) = check_config(&toml);
        assert!(!success, "accepted:\n{toml}");
        assert!(out.contains(says), "expected `{says}` in:\n{out}");
    }
    // Two routes cannot share an issue path, and `defaults` cannot hold a token.
    let twice = format!(
        "{}\n[[routes]]\nname = \"other\"\npath = \"/other\"\ntoken = {{ issue = \"/checkout/token\" }}\n",
        ok
    );
    let (success, out) = check_config(&twice);
    assert!(
        !success && out.contains("already route `checkout`'s issue path"),
        "{out}"
    );
    let defaults = ok.replace("[defaults]\n", "[defaults]\ntoken = { issue = \"/t\" }\n");
    let (success, out) = check_config(&defaults);
    assert!(!success && out.contains("`defaults.token`"), "{out}");
}

// Further cases, in files of their own (the crate root resolves paths from `tests/`).
#[path = "tokens/faults.rs"]
mod faults;
#[path = "tokens/processes.rs"]
mod processes;
