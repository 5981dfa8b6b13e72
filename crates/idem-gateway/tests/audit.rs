//! The audit trail through the real `idem` binary: what an operator sees at
//! `GET /admin/audit` after a payment's outcome became unknown and was settled, at
//! `[audit] level = "all"` and at the default level, and what a first request leaves.

mod common;

use common::{ADMIN_TOKEN, Gateway, Http, TempDir, Upstream, key};
use http::{Method, StatusCode};
use serde_json::Value;

/// The gateway's configuration: the charge route that holds an upstream failure, on SQLite
/// at `db`; `audit` is the `[audit]` table's body.
fn config(upstream: &str, db: &str, audit: &str) -> String {
    common::configs::with_admin(
        upstream,
        &format!("sqlite:{db}"),
        "",
        r#"namespace = "payments""#,
        &format!(
            r#"
[audit]
{audit}

[[routes]]
name = "charge"
path = "/charges"
timeout = "1s"
upstream_failure = "hold"
"#
        ),
    )
}

async fn admin(http: &Http, gw: &Gateway, method: Method, path: &str, body: &str) -> common::Reply {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    http.send(
        method,
        &gw.admin_url(path),
        &[("authorization", &auth), ("x-idem-actor", "ann")],
        body,
    )
    .await
}

/// Settles the record of `key` in `payments` through the admin API with `body`.
async fn resolve(http: &Http, gw: &Gateway, key: &str, body: &str) -> common::Reply {
    let path = format!("/admin/record/resolve?namespace=payments&key={key}");
    admin(http, gw, Method::POST, &path, body).await
}

/// The audit trail of `key` in `payments`, from the admin API.
async fn trail_of(http: &Http, gw: &Gateway, key: &str) -> common::Reply {
    let path = format!("/admin/audit?namespace=payments&key={key}");
    admin(http, gw, Method::GET, &path, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_of_a_key_through_claim_timeout_unknown_resolve() {
    let dir = TempDir::new("audit");
    let db = dir.0.join("idem.db");
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &config(&up.url(), &db.display().to_string(), r#"level = "all""#),
        &[],
    );
    let http = Http::new();
    let k = key();

    // The upstream takes longer than the route's timeout: the outcome is unknown.
    let slow = gw.url("/charges?delay_ms=3000");
    let charge = || http.post(&slow, Some(&k), r#"{"amount":100}"#);
    let r = charge().await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    let retry = charge().await;
    assert_eq!(retry.problem_type(), "outcome-unknown");

    // The operator settles it: the charge went through.
    let resolved = resolve(
        &http,
        &gw,
        &k,
        r#"{"outcome":"complete","status":201,"body":"{\"charged\":true}"}"#,
    )
    .await;
    resolved.assert_status(StatusCode::OK);

    let trail = trail_of(&http, &gw, &k).await;
    trail.assert_status(StatusCode::OK);
    let events = trail.json()["events"].as_array().cloned().expect("events");
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(names, ["resolved", "unknown", "claimed"], "{events:#?}");
    assert_eq!(trail.json()["level"], "all");
    let (resolve, unknown, claim) = (&events[0], &events[1], &events[2]);
    for e in &events {
        assert_eq!(e["namespace"], "payments");
        assert_eq!(e["scope"], "");
        assert_eq!(e["key"], k.as_str());
        assert_eq!(e["fence"], claim["fence"]);
        assert!(e["at_ms"].as_u64().is_some_and(|t| t > 0));
    }
    assert!(
        claim["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert!(claim["instance"].as_str().is_some_and(|i| i.len() == 16));
    assert_eq!(claim["actor"], Value::Null);
    assert_eq!(unknown["outcome"], "ambiguous");
    assert_eq!(unknown["instance"], claim["instance"]);
    assert_eq!(resolve["outcome"], "complete");
    assert_eq!(resolve["status"], 201);
    assert_eq!(resolve["actor"], "admin:ann");
    assert!(claim["at_ms"].as_u64() <= resolve["at_ms"].as_u64());

    // Filters: by event and time; a bad filter is a clear 400.
    let unknowns = admin(
        &http,
        &gw,
        Method::GET,
        "/admin/audit?namespace=payments&state=unknown",
        "",
    )
    .await;
    let only: Vec<Value> = unknowns.json()["events"]
        .as_array()
        .cloned()
        .expect("events");
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["key"], k.as_str());
    let later = format!(
        "/admin/audit?namespace=payments&since={}",
        resolve["at_ms"].as_u64().expect("at") + 1
    );
    let none = admin(&http, &gw, Method::GET, &later, "").await;
    assert_eq!(none.json()["events"], serde_json::json!([]));
    let bad = admin(&http, &gw, Method::GET, "/admin/audit?state=maybe", "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let unauthorized = http.get(&gw.admin_url("/admin/audit")).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    assert_eq!(up.seen.count("/charges"), 1);
}

/// At the default level the trail of a settled payment is its unknown and its resolve, and
/// a first request leaves no event: the answer says the level, and carries the key's record,
/// which tells when it was claimed and completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_level_leaves_a_first_request_to_its_record() {
    let dir = TempDir::new("audit-default");
    let db = dir.0.join("idem.db");
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), &db.display().to_string(), ""), &[]);
    let http = Http::new();

    let first = key();
    let r = http
        .post(&gw.url("/charges"), Some(&first), r#"{"amount":1}"#)
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let trail = admin(
        &http,
        &gw,
        Method::GET,
        &format!("/admin/audit?namespace=payments&key={first}"),
        "",
    )
    .await;
    trail.assert_status(StatusCode::OK);
    let answer = trail.json();
    assert_eq!(answer["events"], serde_json::json!([]), "{answer:#}");
    assert_eq!(answer["level"], "operator");
    let record = &answer["record"];
    assert_eq!(record["state"], "completed", "{answer:#}");
    assert_eq!(record["status"], 201);
    assert!(record["created_at_ms"].as_u64() <= record["completed_at_ms"].as_u64());
    assert!(record["fence"].as_u64().is_some_and(|f| f > 0));
    assert!(
        record.get("response").is_none(),
        "no body in an audit answer"
    );

    let k = key();
    let r = http
        .post(&gw.url("/charges?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    let resolved = resolve(&http, &gw, &k, r#"{"outcome":"release"}"#).await;
    resolved.assert_status(StatusCode::OK);
    let trail = trail_of(&http, &gw, &k).await;
    let answer = trail.json();
    let names: Vec<&str> = answer["events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert_eq!(names, ["resolved", "unknown"], "{answer:#}");
    assert_eq!(answer["events"][0]["actor"], "admin:ann");
    assert_eq!(answer["events"][1]["outcome"], "ambiguous");
    assert_eq!(answer["record"], Value::Null, "released: no record");
    // A query over the namespace names no key, so it carries no record.
    let all = admin(
        &http,
        &gw,
        Method::GET,
        "/admin/audit?namespace=payments",
        "",
    )
    .await;
    assert!(all.json().get("record").is_none());
    assert_eq!(all.json()["events"].as_array().map(Vec::len), Some(2));
    // Checked configuration says what the trail records.
    let out = common::check_config(&config(&up.url(), &db.display().to_string(), ""));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(level operator)"), "{text}");
}
