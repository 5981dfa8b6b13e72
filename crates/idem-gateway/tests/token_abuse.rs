//! Token issuing under abuse, against the real gateway: callers who invent a new credential
//! per request (a route whose principal is a header, or none) must not issue without limit,
//! and a token store full of live tokens refuses new issues while every live token works.

mod common;

use common::{Gateway, Http, Upstream};
use http::{Method, StatusCode};

/// A gateway with one token route whose principal is the `x-api-key` header, on `store`,
/// with `token_extra` added to the route's token table.
fn config(up: &Upstream, store: &str, token_extra: &str) -> String {
    common::configs::keyed(
        &up.url(),
        store,
        "",
        "",
        &format!(
            r#"[[routes]]
name = "checkout"
method = "POST"
path = "/checkout/*"
token = {{ issue = "/checkout/token", ttl = "15m"{token_extra} }}
"#
        ),
    )
}

/// Asks for a token as `principal`; the status, and the token if one was issued.
async fn issue(http: &Http, gw: &Gateway, principal: &str) -> (StatusCode, Option<String>) {
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/token"), principal, &[], "")
        .await;
    let token = (r.status == StatusCode::CREATED)
        .then(|| r.json()["token"].as_str().map(str::to_owned))
        .flatten();
    (r.status, token)
}

/// Issues as `count` fresh credentials, one each; how many got a token, and the statuses
/// of those that did not.
async fn flood(http: &Http, gw: &Gateway, tag: &str, count: usize) -> (usize, Vec<StatusCode>) {
    let mut issued = 0;
    let mut refused = Vec::new();
    for i in 0..count {
        match issue(http, gw, &format!("invented-{tag}-{i}")).await {
            (StatusCode::CREATED, Some(_)) => issued += 1,
            (status, _) => refused.push(status),
        }
    }
    (issued, refused)
}

// Bug guarded: the issue rate was kept per principal only, so with a header principal every
// invented credential had a bucket of its own and issued without limit. The route's global
// rate now bounds them all together, by default too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_credentials_share_the_routes_global_issue_rate() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, "memory:", ""), &[]);
    let http = Http::new();
    let (issued, refused) = flood(&http, &gw, "default", 400).await;
    assert!(
        issued < 400 && refused.iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{issued} of 400 invented credentials got a token; refused: {refused:?}"
    );
    // Configured, the global rate is exact.
    let gw = Gateway::start(&config(&up, "memory:", ", global_rate = \"10/min\""), &[]);
    let (issued, refused) = flood(&http, &gw, "configured", 30).await;
    assert_eq!(issued, 10, "refused: {refused:?}");
    let r = http
        .send_as(
            Method::POST,
            &gw.url("/checkout/token"),
            "one-more",
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.problem_type(), "token-rate-limited");
    assert!(r.header("retry-after").is_some());
}

// A token store full of live tokens refuses new issues with 503, and every live token is
// still redeemed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_token_store_refuses_issues_and_honours_live_tokens() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, "memory:20", ", global_rate = \"1000/s\""), &[]);
    let http = Http::new();
    let mut held = Vec::new();
    for i in 0..20 {
        let principal = format!("holder-{i}");
        let (status, token) = issue(&http, &gw, &principal).await;
        assert_eq!(status, StatusCode::CREATED);
        held.push((principal, token.expect("token")));
    }
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/token"), "late", &[], "")
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_type(), "token-store-full");
    assert!(r.header("retry-after").is_some());
    for (principal, token) in &held {
        let res = http
            .send_as(
                Method::POST,
                &gw.url("/checkout/pay"),
                principal,
                &[("idempotency-token", token.as_str())],
                "{}",
            )
            .await;
        res.assert_status(StatusCode::CREATED);
    }
    assert_eq!(up.seen.count("/checkout/pay"), 20);
}
