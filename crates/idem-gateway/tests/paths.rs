//! No spelling of a protected path reaches the upstream around its route: the gateway matches
//! routes on the normalised path and forwards that path, and what no route matches follows
//! `unmatched`.
//!
//! Guards against the bypass where, with one route `POST /charge`, the same request to
//! `/charge/`, `//charge`, `/%63harge`, `/./charge`, `/CHARGE` or `/charge;x` was proxied
//! unprotected, and frameworks routed several of those to the `/charge` handler.

mod common;

use common::{Gateway, Http, Upstream, key};
use http::{Method, StatusCode};

fn config(upstream: &str, unmatched: &str) -> String {
    common::configs::anonymous(
        upstream,
        "memory:",
        &format!(r#"unmatched = "{unmatched}""#),
        "",
        ROUTES,
    )
}

/// The routes of [`config`], whose paths the tests spell in other ways.
const ROUTES: &str = r#"
[[routes]]
name = "charge"
method = "POST"
path = "/charge"

[[routes]]
name = "orders"
method = "POST"
path = "/v1/orders/{id}/pay"
"#;

/// Spellings of `/charge` (and of `/v1/orders/7/pay`) that servers route to the same handler.
const VARIANTS: &[&str] = &[
    "/charge/",
    "//charge",
    "///charge//",
    "/%63harge",
    "/%63%68%61%72%67%65",
    "/./charge",
    "/x/../charge",
    "/%2e/charge",
    "/x/%2E%2E/charge",
    "/../charge",
    "/CHARGE",
    "/Charge/",
    "/v1/orders/7/pay/",
    "/V1//orders/7/./PAY",
    "/v1/%6Frders/7/pay",
];

/// Spellings servers disagree on: refused outright.
const REFUSED: &[&str] = &[
    "/charge;x",
    "/charge;jsessionid=1",
    "/charge%2F",
    "/x%2Fcharge",
    "/x%5Ccharge",
    "/charge%00",
    "/ch%zzarge",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_protected_path_is_protected() {
    let up = Upstream::start().await;
    // Even with unmatched requests proxied, no variant slips through.
    let gw = Gateway::start(&config(&up.url(), "proxy"), &[]);
    let http = Http::new();
    for path in VARIANTS {
        let r = http.post(&gw.url(path), None, "{}").await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (StatusCode::BAD_REQUEST, "key-missing"),
            "{path} without a key must be refused like the route it spells"
        );
    }
    for path in REFUSED {
        let r = http.post(&gw.url(path), None, "{}").await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (StatusCode::BAD_REQUEST, "path-rejected"),
            "{path}"
        );
    }
    assert_eq!(up.seen.total(), 0, "nothing reached the upstream");

    // With a key, a variant is the route's request: the upstream receives the route's path,
    // and a retry under another spelling replays.
    let k = key();
    let first = http.post(&gw.url("/%63harge/"), Some(&k), "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json()["path"], "/charge");
    let again = http.post(&gw.url("//CHARGE"), Some(&k), "{}").await;
    assert!(again.replayed(), "one request, two spellings");
    assert_eq!(up.seen.count("/charge"), 1);
    let order = http
        .post(&gw.url("/V1/orders/AbC/./pay/"), Some(&key()), "{}")
        .await;
    assert_eq!(
        order.json()["path"],
        "/v1/orders/AbC/pay",
        "parameters keep their case"
    );

    // A GET passes through the layer; an unmatched path is proxied as configured.
    let other = http
        .send(Method::POST, &gw.url("/elsewhere"), &[], "{}")
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(up.seen.count("/elsewhere"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_requests_follow_the_setting() {
    let up = Upstream::start().await;
    let http = Http::new();

    let reject = Gateway::start(&config(&up.url(), "reject"), &[]);
    let r = http.post(&reject.url("/elsewhere"), None, "{}").await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (StatusCode::NOT_FOUND, "no-route")
    );
    let r = http.get(&reject.url("/elsewhere")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let protect = Gateway::start(&config(&up.url(), "protect"), &[]);
    let r = http.post(&protect.url("/elsewhere"), None, "{}").await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (StatusCode::BAD_REQUEST, "key-missing")
    );
    let k = key();
    let r = http.post(&protect.url("/elsewhere"), Some(&k), "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = http.post(&protect.url("/elsewhere"), Some(&k), "{}").await;
    assert!(r.replayed());
    let r = http.get(&protect.url("/elsewhere")).await;
    assert_eq!(r.status, StatusCode::CREATED, "safe methods pass through");
    assert_eq!(up.seen.count("/elsewhere"), 2, "one POST, one GET");
}

/// Regression: methods are case-sensitive, so `post /charge` matched no `POST` route and was
/// proxied unprotected under `unmatched = "proxy"`; servers that read methods without regard
/// to case then charged it. A standard method (or a route's) in another case is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_in_another_case_is_refused() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), "proxy"), &[]);
    let http = Http::new();
    for spelled in ["post", "Post", "pOST", "get", "Delete"] {
        let method = Method::from_bytes(spelled.as_bytes()).expect("a method token");
        let r = http
            .send(
                method,
                &gw.url("/charge"),
                &[("idempotency-key", &key())],
                "{}",
            )
            .await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (StatusCode::BAD_REQUEST, "method-not-canonical"),
            "{spelled}"
        );
    }
    assert_eq!(up.seen.total(), 0, "nothing reached the upstream");
    // A method no route or standard names passes as configured (here: proxied).
    let r = http
        .send(
            Method::from_bytes(b"purge").expect("method"),
            &gw.url("/charge"),
            &[],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
}
