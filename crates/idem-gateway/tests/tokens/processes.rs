//! Token routes across reloads and across gateway processes.

use http::{Method, StatusCode};

use super::common::{Gateway, Http, Reply, Upstream};
use super::{REDIS, assert_answered_or_in_flight, config, issue, problem, service_up, submit};

/// Token routes reload like any route: a reload can turn token mode on (the token store is
/// opened then), and tokens issued before a reload are still usable after it, even on the
/// in-process memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_mode_reloads_and_tokens_outlive_reloads() {
    let up = Upstream::start().await;
    let keyed = config(&up.url(), "memory:", "")
        .replace(
            "token = { issue = \"/checkout/token\", ttl = \"15m\", rate = \"1000/min\" }",
            "",
        )
        .replace("token = { header = \"x-form-token\", issue = \"/quick/token\", ttl = \"300ms\", rate = \"1000/min\" }", "")
        .replace("token = { issue = \"/limited/token\", rate = \"2/min\" }", "");
    assert!(!keyed.contains("token = {"), "{keyed}");
    let gw = Gateway::start(&keyed, &[]);
    let http = Http::new();
    let reload = |gw: &Gateway| {
        let http = http.clone();
        let url = gw.admin_url("/admin/reload");
        async move {
            let r = http.admin(Method::POST, &url, "").await;
            r.assert_status(StatusCode::OK);
        }
    };
    // Without token mode the issue path is just a path of the route: a keyless POST is
    // refused for its missing key, and nothing issues tokens.
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/token"), "alice", &[], "")
        .await;
    problem(&r, StatusCode::BAD_REQUEST, "key-missing");

    std::fs::write(gw.config_path(), config(&up.url(), "memory:", "")).expect("write");
    reload(&gw).await;
    let (t, _) = issue(&http, &gw, "/checkout/token", "alice").await;
    let r = http
        .send_as(Method::POST, &gw.url("/checkout/pay"), "alice", &[], "{}")
        .await;
    problem(&r, StatusCode::PRECONDITION_REQUIRED, "token-missing");

    // Another reload (a changed rate) keeps the token store: the token issued before works.
    let slower = config(&up.url(), "memory:", "").replace("1000/min", "500/min");
    std::fs::write(gw.config_path(), slower).expect("write");
    reload(&gw).await;
    let r = submit(&http, &gw, "/checkout/pay", "alice", &t).await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(up.seen.count("/checkout/pay"), 1);
}

/// Two gateways on one Redis store behave as one: a token issued by one is consumed once
/// across both, whichever receives the submits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_tokens_on_redis() {
    if !service_up(REDIS, "Redis").await {
        return;
    }
    let up = Upstream::start().await;
    let prefix = format!("idem-gw-tokens-{}:", uuid::Uuid::now_v7().simple());
    let toml = config(
        &up.url(),
        "redis://127.0.0.1:6379",
        &format!("store_prefix = \"{prefix}\""),
    );
    let (a, b) = (Gateway::start(&toml, &[]), Gateway::start(&toml, &[]));
    let http = Http::new();
    let (t, _) = issue(&http, &a, "/checkout/token", "alice").await;
    let url = "/checkout/shared?delay_ms=300";
    let replies: Vec<Reply> = futures::future::join_all((0..20).map(|i| {
        let gw = if i % 2 == 0 { &a } else { &b };
        submit(&http, gw, url, "alice", &t)
    }))
    .await;
    assert_eq!(up.seen.count("/checkout/shared"), 1);
    assert_answered_or_in_flight(&replies);
    // Once done, either gateway replays it.
    let r = submit(&http, &b, url, "alice", &t).await;
    assert!(r.replayed());
}
