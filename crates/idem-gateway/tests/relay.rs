//! `idem relay` end to end from RabbitMQ: the real binary consumes a queue of its own
//! (expiring unused) and POSTs each message to an orders service that counts what it
//! executed, with a Redis store under a prefix of its own.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;
mod relay_kit;

use common::{ADMIN_TOKEN, Gateway, Http};
use http::Method;
use idem_testkit::brokers::{
    AMQP_URL, amqp, declare_queue, eventually, publish_with_id, queue_ready,
};
use lapin::Connection;
use relay_kit::{Orders, Relay, WAIT, config, unique, without_webhook};

/// A queue of its own and `idem relay` consuming it, posting to `upstream` under the route's
/// `failure` policy.
async fn relay_on(conn: &Connection, what: &str, upstream: &str, failure: &str) -> (String, Relay) {
    let q = unique(what);
    declare_queue(conn, &q).await;
    let source = format!("broker = \"{AMQP_URL}\"\nqueue = \"{q}\"");
    let relay = Relay::start(&config(&q, upstream, "/orders", failure, &source));
    (q, relay)
}

async fn publish(conn: &Connection, q: &str, key: &str, times: usize) {
    publish_with_id(conn, q, key, &format!(r#"{{"order":"{key}"}}"#), times).await;
}

/// Waits (at most [`WAIT`]) until the relay has logged exactly one replay and `q` holds no
/// ready message: a redelivery settled from the store and acknowledged.
async fn one_replay_and_drained(relay: &Relay, conn: &Connection, q: &str) {
    relay
        .until("one replay, the queue drained", || async {
            relay.logged("replayed") == 1 && queue_ready(conn, q).await == 0
        })
        .await;
}

/// Five copies of one message and one other: the service executes each order once; the
/// duplicates are acknowledged from the stored result, one access-log line per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_posts_each_message_once() {
    let conn = amqp().await;
    let (upstream, orders) = Orders::start().await;
    let (q, relay) = relay_on(&conn, "once", &upstream, "hold").await;
    publish(&conn, &q, "order-1", 5).await;
    publish(&conn, &q, "order-2", 1).await;
    relay
        .until(
            "every copy executed or replayed, the queue drained",
            || async { relay.logged("replayed") >= 4 && queue_ready(&conn, &q).await == 0 },
        )
        .await;
    assert_eq!(orders.executed("order-1"), 1);
    assert_eq!(orders.executed("order-2"), 1);
    // One access-log line per message: two executions, four replays.
    assert_eq!(relay.logged("replayed"), 4, "{}", relay.log());
    assert_eq!(relay.logged("executed"), 2);
}

/// An orders service that executes and then answers past the relay's timeout. Under
/// `upstream_failure = "retry"` the redelivery executes again (what `hold` prevents). Under
/// `hold` with the route's status webhook the message is redelivered and its key settled
/// from the webhook: acknowledged as a replay, nothing dead-lettered, no operator. Under
/// `hold` without a webhook the key is left unknown and the message dead-lettered; a
/// redelivery is dead-lettered too without calling the service; once `idem reconcile` (with
/// the webhook) has completed the record, a redelivery is acknowledged from the store. One
/// execution throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_upstream_times_out_after_acting() {
    let conn = amqp().await;
    let (upstream, orders) = Orders::start().await;

    let (q, relay) = relay_on(&conn, "timeout_retry", &upstream, "retry").await;
    publish(&conn, &q, "slow-a", 1).await;
    relay
        .until("retry: the redelivery executes again", || async {
            orders.executed("slow-a") >= 2
        })
        .await;
    drop(relay);

    // Settled from the webhook on the redelivery.
    let (q, relay) = relay_on(&conn, "timeout_hold", &upstream, "hold").await;
    let dead = format!("{q}.dead");
    publish(&conn, &q, "slow-b", 1).await;
    one_replay_and_drained(&relay, &conn, &q).await;
    assert_eq!(orders.executed("slow-b"), 1, "hold: executed once");
    assert_eq!(
        orders.calls("slow-b"),
        1,
        "settled without calling it again"
    );
    assert_eq!(queue_ready(&conn, &dead).await, 0, "nothing dead-lettered");
    drop(relay);

    // Without a webhook: dead-lettered, then settled by an operator's reconcile.
    let q = unique("timeout_bare");
    declare_queue(&conn, &q).await;
    let source = format!("broker = \"{AMQP_URL}\"\nqueue = \"{q}\"");
    let with_webhook = config(&q, &upstream, "/orders", "hold", &source);
    let relay = Relay::start(&without_webhook(&with_webhook));
    let dead = format!("{q}.dead");
    publish(&conn, &q, "slow-c", 1).await;
    assert!(eventually(WAIT, || async { queue_ready(&conn, &dead).await == 1 }).await);
    publish(&conn, &q, "slow-c", 1).await;
    assert!(eventually(WAIT, || async { queue_ready(&conn, &dead).await == 2 }).await);
    assert_eq!(
        orders.calls("slow-c"),
        1,
        "hold: the redelivery did not call the service"
    );
    let (code, out) = relay.reconcile_with(&with_webhook);
    assert_eq!(code, 0, "{out}");
    publish(&conn, &q, "slow-c", 1).await;
    one_replay_and_drained(&relay, &conn, &q).await;
    assert_eq!(orders.executed("slow-c"), 1, "hold: executed once");
    assert_eq!(orders.calls("slow-c"), 1);
    assert_eq!(queue_ready(&conn, &dead).await, 2);
}

/// A 4xx other than 408/409/429 dead-letters at once; a 503 is redelivered and succeeds once
/// on the next attempt; a service that keeps answering 503 is called `max_attempts` times,
/// then the message is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_client_errors_dead_letter_and_server_errors_retry() {
    let conn = amqp().await;
    let (upstream, orders) = Orders::start().await;
    let (q, relay) = relay_on(&conn, "status", &upstream, "hold").await;
    let dead = format!("{q}.dead");
    publish(&conn, &q, "reject-1", 1).await;
    publish(&conn, &q, "flaky-1", 1).await;
    publish(&conn, &q, "down-1", 1).await;
    relay
        .until("two dead letters, flaky-1 executed", || async {
            queue_ready(&conn, &dead).await == 2 && orders.executed("flaky-1") == 1
        })
        .await;
    assert_eq!(orders.calls("reject-1"), 1, "not retried");
    assert_eq!(orders.calls("flaky-1"), 2, "503, then 201");
    assert_eq!(orders.calls("down-1"), 3, "max_attempts = 3");
    assert_eq!(orders.total(), 1);
    drop(relay);
}

/// Regression: a relay's keys lived under `credential_principal("relay:<name>")`, the
/// principal a `from = "header"` route derives for a caller who sends that very header value,
/// so such a caller read the relay's answers through the status endpoint and, claiming a
/// message's key first, had the relay replay the caller's answer instead of executing the
/// message. The relay's principal is now an internal one no credential hashes to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_callers_cannot_reach_relay_keys() {
    let conn = amqp().await;
    let (upstream, orders) = Orders::start().await;
    let q = unique("scope");
    declare_queue(&conn, &q).await;
    let source = format!("broker = \"{AMQP_URL}\"\nqueue = \"{q}\"");
    let cfg = config(&q, &upstream, "/orders", "hold", &source).replace(
        r#"principal = { from = "none" }"#,
        r#"principal = { from = "header", header = "x-api-key" }"#,
    ) + "\n[status]\npath = \"/idem/status\"\n";
    let gateway = Gateway::start(&cfg, &[]);
    let http = Http::new();
    // The header value that hashed to the relay's principal.
    let pretender = "relay:orders";

    // Claimed (and completed) first over HTTP, with the body the relay will post.
    let body = r#"{"order":"claimed-1"}"#;
    let first = http
        .send_as(
            Method::POST,
            &gateway.url("/orders"),
            pretender,
            &[
                ("idempotency-key", "claimed-1"),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(orders.executed("claimed-1"), 1);

    let relay = Relay::start(&cfg);
    publish(&conn, &q, "claimed-1", 1).await;
    publish(&conn, &q, "relayed-1", 1).await;
    relay
        .until("relayed-1 executed, the queue drained", || async {
            orders.executed("relayed-1") == 1 && queue_ready(&conn, &q).await == 0
        })
        .await;
    assert_eq!(
        orders.executed("claimed-1"),
        2,
        "the relay's message ran in its own scope, not replayed from the caller's\n{}",
        relay.log()
    );

    // The relay's completed key reads as absent to the pretender.
    for query in ["route=orders", "route=orders&answer=1"] {
        let status = http
            .send_as(
                Method::GET,
                &gateway.url(&format!("/idem/status/relayed-1?{query}")),
                pretender,
                &[],
                "",
            )
            .await;
        assert_eq!(status.status, 404, "{query}: {:?}", status.body);
    }
}

// Regression: `--metrics-listen` served `/metrics` to anyone, where the gateway's own
// `/metrics` takes the admin token or the read-only metrics token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_metrics_take_the_gateway_tokens() {
    const SCRAPE: &str = "scrape-token-0123456789";
    let conn = amqp().await;
    let q = unique("metrics");
    declare_queue(&conn, &q).await;
    let source = format!("broker = \"{AMQP_URL}\"\nqueue = \"{q}\"");
    let bare = config(&q, "http://127.0.0.1:9", "/orders", "hold", &source);
    let args = ["--metrics-listen", "127.0.0.1:0"];

    let (code, out) = Relay::refused(&bare, &args);
    assert_eq!(code, Some(2), "refused at start, not running: {out}");
    assert!(
        out.contains("--metrics-listen") && out.contains("admin.token"),
        "{out}"
    );

    let cfg = format!(
        "{bare}\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{ADMIN_TOKEN}\"\nmetrics_token = \"{SCRAPE}\"\n"
    );
    let (relay, addr) = Relay::start_with(&cfg, &args);
    let url = format!("http://{}/metrics", addr.expect("a metrics listener"));
    let http = Http::new();
    for (auth, want) in [
        (None, 401),
        (Some("wrong-token-0123456789"), 401),
        (Some(ADMIN_TOKEN), 200),
        (Some(SCRAPE), 200),
    ] {
        let bearer = auth.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .as_deref()
            .map(|b| vec![("authorization", b)])
            .unwrap_or_default();
        let r = http.send(Method::GET, &url, &headers, "").await;
        assert_eq!(
            r.status.as_u16(),
            want,
            "{auth:?}: {:?}\n{}",
            r.body,
            relay.log()
        );
        if want == 200 {
            let text = String::from_utf8_lossy(&r.body);
            assert!(text.contains("idem_requests_total"), "{text}");
        } else {
            assert!(r.header("www-authenticate").is_some(), "{auth:?}");
        }
    }
}

/// `check-config` shows each relay; an incomplete one is refused, naming the field.
#[test]
fn check_config_shows_relays() {
    let source = format!("broker = \"{AMQP_URL}\"\nqueue = \"orders_q\"");
    let good = config("orders_q", "http://127.0.0.1:9", "/orders", "hold", &source);
    let out = common::check_config(&good);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("orders: RabbitMQ queue `orders_q` -> POST http://127.0.0.1:9/orders"),
        "{text}"
    );
    assert!(
        text.contains("key: the message id; route `orders`"),
        "{text}"
    );

    let out = common::check_config(&good.replace("queue = \"orders_q\"\n", ""));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`queue` is required"));
}
