//! Business keys: the idempotency key taken from the request itself ("pay order 42" happens
//! once however the request arrives), through the layer on an axum app.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idem_core::key_source::KeySources;
use idem_core::{Engine, MemoryStore, Policy};
use idem_http::{IdempotencyConfig, IdempotencyLayer, PathParams, SourceKey};
use tower::ServiceExt;

/// `POST /orders/{id}/pay` behind the layer, keyed by `sources`; counts its runs. The route's
/// `id` reaches the layer as a `PathParams` extension, as the gateway sets it.
fn app(sources: &[&str]) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::new(MemoryStore::new(1_000), Policy::default());
    let config = IdempotencyConfig::new("orders.pay")
        .expect("namespace")
        .key(SourceKey::new(KeySources::parse(sources).expect("sources")));
    let counted = Arc::clone(&runs);
    let handler = post(move || {
        let runs = Arc::clone(&counted);
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::CREATED, format!("{{\"payment\":{n}}}"))
        }
    })
    .layer(IdempotencyLayer::new(&engine, config))
    .layer(axum::middleware::map_request(
        |mut req: Request<Body>| async move {
            let id = req
                .uri()
                .path()
                .split('/')
                .nth(2)
                .unwrap_or_default()
                .to_owned();
            req.extensions_mut()
                .insert(PathParams(vec![("id".into(), id)]));
            req
        },
    ));
    (Router::new().route("/orders/{id}/pay", handler), runs)
}

/// `pay` on order 42 without extra headers.
async fn pay_order_42(app: &Router, body: &str) -> (StatusCode, String, bool) {
    pay(app, "/orders/42/pay", &[], body).await
}

async fn pay(
    app: &Router,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String, bool) {
    let mut req = Request::post(path).header("content-type", "application/json");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("answer");
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        String::from_utf8_lossy(&bytes).into_owned(),
        replayed,
    )
}

#[tokio::test]
async fn the_same_order_paid_twice_without_a_header_runs_once() {
    let (app, runs) = app(&["header:idempotency-key", "{json.order.id}:pay"]);
    let body = r#"{"order": {"id": 42}, "amount": 100}"#;
    let first = pay_order_42(&app, body).await;
    assert_eq!((first.0, first.2), (StatusCode::CREATED, false));
    // Another client, another spelling of the same body: the same order, a replay.
    let again = pay_order_42(&app, r#"{ "amount": 100, "order": {"id": 42} }"#).await;
    assert_eq!(
        (again.0, again.1.as_str(), again.2),
        (StatusCode::CREATED, first.1.as_str(), true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A client that sends its own key is keyed by it, even for the same order.
    let own = pay(
        &app,
        "/orders/42/pay",
        &[("idempotency-key", "client-1")],
        body,
    )
    .await;
    assert_eq!((own.0, own.2), (StatusCode::CREATED, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The fingerprint still covers the rest of the request: "pay order 42 for 100", then "pay
/// order 42 for 200", is a mismatch, not a replay, and nothing runs.
#[tokio::test]
async fn a_changed_amount_for_the_same_order_is_refused() {
    let (app, runs) = app(&["{json.order.id}:pay"]);
    let first = pay_order_42(&app, r#"{"order": {"id": 42}, "amount": 100}"#).await;
    assert_eq!(first.0, StatusCode::CREATED);
    let other = pay_order_42(&app, r#"{"order": {"id": 42}, "amount": 200}"#).await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(other.1.contains("key-reused"), "{}", other.1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn keys_from_the_path_pay_each_order_once() {
    let (app, runs) = app(&["{path.id}:pay"]);
    let a = pay_order_42(&app, "{}").await;
    let b = pay_order_42(&app, "{}").await;
    let c = pay(&app, "/orders/43/pay", &[], "{}").await;
    assert_eq!((a.2, b.2, c.2), (false, true, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bad_and_missing_fields_answer_400_and_nothing_runs() {
    let (app, runs) = app(&["{json.order.id}:pay"]);
    for (body, slug, field) in [
        (r#"{"amount": 1}"#, "key-missing", "order.id"),
        ("not json", "key-missing", "order.id"),
        (
            r#"{"order": {"id": {"x": 1}}}"#,
            "key-malformed",
            "order.id",
        ),
        (r#"{"order": {"id": null}}"#, "key-malformed", "order.id"),
        (r#"{"order": {"id": ""}}"#, "key-malformed", "order.id"),
    ] {
        let (status, text, _) = pay_order_42(&app, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert!(text.contains(slug), "{body}: {text}");
        assert!(text.contains(field), "the field is named: {text}");
    }
    let long = format!(r#"{{"order": {{"id": "{}"}}}}"#, "x".repeat(300));
    let (status, text, _) = pay_order_42(&app, &long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("255"), "{text}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Regression: the key field was read from a tree where the last duplicate won, so
/// `{"order":{"id":1,"id":2}}` paid order 2 while an upstream keeping the first member paid 1.
#[tokio::test]
async fn a_body_with_duplicate_members_is_refused() {
    let (app, runs) = app(&["{json.order.id}:pay"]);
    let (status, text, _) = pay_order_42(&app, r#"{"order":{"id":1,"id":2}}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("body-ambiguous"), "{text}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
