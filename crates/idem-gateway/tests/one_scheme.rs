//! One principal scheme for every carrier: a credential sent through idem-http's layer and
//! through the gateway lands on the same record of a shared store, and the admin API's
//! `credential=` look-up finds it.
//!
//! Guards against the library and the gateway hashing credentials two ways, which silently
//! split one caller into two scopes (a service moving from one to the other lost its replays).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use common::{ADMIN_TOKEN, Http, Upstream, in_process, key};
use http::{Method, StatusCode};
use idem_core::{BoxStore, Engine, Key, MemoryStore, Policy, Scope, ScopedKey, Store};
use idem_gateway::admin::Admin;
use idem_gateway::app::App;
use idem_gateway::claims::TrackedStore;
use idem_gateway::config;
use idem_gateway::metrics::MeteredStore;
use idem_gateway::upstream::Clients;
use idem_http::{HeaderPrincipal, IdempotencyConfig, IdempotencyLayer};

/// A service protected by the library's layer on `store`: `POST /charge`, counting its runs.
async fn library_service(store: Arc<MemoryStore>) -> (SocketAddr, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let engine = Engine::new(store, Policy::default());
    let layer = IdempotencyLayer::new(
        &engine,
        IdempotencyConfig::new("charge")
            .expect("namespace")
            .principal(HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")).required()),
    );
    let counted = Arc::clone(&runs);
    let app: Router = Router::new().route(
        "/charge",
        post(move || {
            let runs = Arc::clone(&counted);
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                (StatusCode::CREATED, format!("{{\"charge\":{n}}}"))
            }
        })
        .layer(layer),
    );
    (common::serve_router(app).await, runs)
}

/// The gateway's data plane on `store`, in this process, in front of `upstream`.
async fn gateway(store: Arc<MemoryStore>, upstream: &str) -> (SocketAddr, Arc<Admin>) {
    let raw = config::from_toml(&format!(
        r#"
upstream = "{upstream}"
store = "memory:"
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
principal = {{ from = "header", header = "x-api-key" }}
"#
    ))
    .expect("toml");
    let settings = config::compile(&raw).expect("valid");
    let store = TrackedStore::new(BoxStore::new(MeteredStore::new(BoxStore::new(store))));
    let mut clients = Clients::new(Duration::from_secs(1), 8);
    let app = App::new(
        &settings,
        store.clone(),
        settings.upstream.as_ref(),
        &mut clients,
    )
    .expect("app");
    let admin = Arc::new(Admin::new(
        store,
        ADMIN_TOKEN.into(),
        None,
        Duration::from_secs(1),
        None,
    ));
    (in_process::serve(app).await, admin)
}

async fn charge(http: &Http, addr: SocketAddr, key: &str, credential: &str) -> common::Reply {
    http.send(
        Method::POST,
        &format!("http://{addr}/charge"),
        &[
            ("idempotency-key", key),
            ("x-api-key", credential),
            ("content-type", "application/json"),
        ],
        r#"{"amount": 100}"#,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_one_record_through_the_layer_and_the_gateway() {
    let store = Arc::new(MemoryStore::new(1_000));
    let (library, library_runs) = library_service(Arc::clone(&store)).await;
    let upstream = Upstream::start().await;
    let (gw, admin) = gateway(Arc::clone(&store), &upstream.url()).await;
    let http = Http::new();
    let k = key();

    // Through the library: the charge runs.
    let first = charge(&http, library, &k, "sk_live_alice").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(library_runs.load(Ordering::SeqCst), 1);

    // Through the gateway, same credential and key: the record the library wrote answers.
    let again = charge(&http, gw, &k, "sk_live_alice").await;
    again.assert_status(StatusCode::CREATED);
    assert!(again.replayed(), "the gateway found the library's record");
    assert_eq!(again.body, first.body);
    assert_eq!(
        upstream.seen.count("/charge"),
        0,
        "nothing ran behind the gateway"
    );

    // The record sits under the one derived principal.
    let scoped = ScopedKey::new(
        Scope::new("charge")
            .expect("ns")
            .with_credential(b"sk_live_alice"),
        Key::new(k.clone()).expect("key"),
    );
    assert!(store.get(&scoped).await.expect("get").is_some());

    // The admin API's `credential=` look-up derives the same principal.
    let res = tower::ServiceExt::oneshot(
        admin.router(),
        http::Request::builder()
            .uri(format!(
                "/admin/record?namespace=charge&credential=sk_live_alice&key={k}"
            ))
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .body(axum::body::Body::empty())
            .expect("request"),
    )
    .await
    .expect("answer");
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .expect("body");
    let record: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(record["state"], "completed");
    assert_eq!(
        record["principal"],
        idem_core::key::credential_principal(b"sk_live_alice")
    );

    // Another credential with the same key is another caller: it runs behind the gateway.
    let bob = charge(&http, gw, &k, "sk_live_bob").await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed());
    assert_eq!(upstream.seen.count("/charge"), 1);
    assert_eq!(library_runs.load(Ordering::SeqCst), 1);
}
