//! Business keys through the gateway: the key taken from the request (the order in the path,
//! or a body field), so "pay order 42" happens once however it arrives, with no header.

mod common;

use common::{Gateway, Http, Upstream};
use http::StatusCode;

fn config(upstream: &str) -> String {
    common::configs::anonymous(upstream, "memory:", "", "", ROUTES)
}

/// The routes of [`config`]: each takes its key from the request a different way.
const ROUTES: &str = r#"
[[routes]]
name = "pay"
method = "POST"
path = "/orders/{id}/pay"
key = { template = "{path.id}:pay" }

[[routes]]
name = "refund"
method = "POST"
path = "/refunds"
key = [{ from = "header" }, { from = "json", path = "refund.order" }]

[[routes]]
name = "order"
method = "POST"
path = "/orders"
key = { from = "json", path = "order" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_paid_once_however_the_request_arrives() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let body = r#"{"amount": 100}"#;
    let first = http.post(&gw.url("/orders/42/pay"), None, body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Other clients, other spellings of the same path (normalised before the key is read).
    for path in [
        "/orders/42/pay",
        "/orders/42/pay/",
        "//orders/42/./pay",
        "/ORDERS/42/Pay",
    ] {
        let again = http.post(&gw.url(path), None, body).await;
        assert!(again.replayed(), "{path}");
        assert_eq!(again.body, first.body, "{path}");
    }
    assert_eq!(up.seen.count("/orders/42/pay"), 1);
    // Another order is another payment.
    let other = http.post(&gw.url("/orders/43/pay"), None, body).await;
    assert!(!other.replayed());
    assert_eq!(up.seen.count("/orders/43/pay"), 1);
    // The same order for another amount is refused, and nothing runs.
    let changed = http
        .post(&gw.url("/orders/42/pay"), None, r#"{"amount": 200}"#)
        .await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(changed.problem_type(), "key-reused");
    assert_eq!(up.seen.count("/orders/42/pay"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_the_body_and_their_errors() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let body = r#"{"refund": {"order": "o-7"}, "amount": 5}"#;
    let a = http.post(&gw.url("/refunds"), None, body).await;
    let b = http.post(&gw.url("/refunds"), None, body).await;
    assert_eq!((a.status, b.replayed()), (StatusCode::CREATED, true));
    // A client key comes first.
    let own = http
        .post(&gw.url("/refunds"), Some("client-key"), body)
        .await;
    assert!(!own.replayed());
    assert_eq!(up.seen.count("/refunds"), 2);
    for (body, slug) in [
        (r#"{"amount": 5}"#, "key-missing"),
        (r#"{"refund": {"order": ["o-7"]}}"#, "key-malformed"),
        (r#"{"refund": {"order": ""}}"#, "key-malformed"),
    ] {
        let r = http.post(&gw.url("/refunds"), None, body).await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (StatusCode::BAD_REQUEST, slug),
            "{body}"
        );
        assert!(
            String::from_utf8_lossy(&r.body).contains("refund.order"),
            "the field is named: {:?}",
            r.body
        );
    }
    assert_eq!(up.seen.count("/refunds"), 2, "nothing ran for bad keys");
}

// Security issue 28: a key number serde_json reads as f64 was rendered from the f64, so these
// two orders shared a key and the second got 422 key-reused instead of running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_beyond_f64_precision_are_different_orders() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    let http = Http::new();
    let first = r#"{"order": 10000000000000000000001, "amount": 5}"#;
    let second = r#"{"order": 10000000000000000000002, "amount": 7}"#;
    let a = http.post(&gw.url("/orders"), None, first).await;
    let b = http.post(&gw.url("/orders"), None, second).await;
    assert_eq!(a.status, StatusCode::CREATED);
    b.assert_status(StatusCode::CREATED);
    assert!(!b.replayed());
    assert_eq!(up.seen.count("/orders"), 2);
    // The same order again is the same order.
    let again = http.post(&gw.url("/orders"), None, first).await;
    assert!(again.replayed());
    assert_eq!(again.body, a.body);
    assert_eq!(up.seen.count("/orders"), 2);
}
