//! The HTTP acceptance list through the real `idem` binary, on the memory store.

mod common;

use std::time::Duration;

use common::{Gateway, Http, Upstream, key, spare_port};
use http::{Method, StatusCode};

/// The acceptance routes on the memory store, with an admin listener.
fn config(upstream: &str) -> String {
    common::configs::with_admin(upstream, "memory:", "", r#"namespace = "test""#, ROUTES)
}

/// The routes of [`config`]: one per behaviour the acceptance list checks.
const ROUTES: &str = r#"
[[routes]]
name = "held"
path = "/held/*"
timeout = "1s"
upstream_failure = "hold"

[[routes]]
name = "retried"
path = "/retried/*"
timeout = "1s"
upstream_failure = "retry"

[[routes]]
name = "tenant"
path = "/tenant/*"
principal = { from = "header", header = "x-api-key" }

[[routes]]
name = "plain"
path = "/plain/*"
idempotency = false

[[routes]]
name = "default"
path = "/*"
"#;

async fn setup() -> (Upstream, Gateway, Http) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url()), &[]);
    (up, gw, Http::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_run_once() {
    let (up, gw, http) = setup().await;
    let k = key();
    let url = gw.url("/charge?delay_ms=300");
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (http, url, k) = (http.clone(), url.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            http.post(&url, Some(&k), r#"{"amount":1}"#).await
        }));
    }
    let mut created = Vec::new();
    for t in tasks {
        let r = t.await.expect("join");
        match r.status {
            StatusCode::CREATED => created.push(r.body),
            StatusCode::CONFLICT => assert_eq!(r.problem_type(), "in-flight"),
            other => panic!("unexpected {other}: {:?}", r.body),
        }
    }
    assert_eq!(
        up.seen.count("/charge"),
        1,
        "exactly one upstream execution"
    );
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|b| *b == created[0]),
        "every 201 is the same response"
    );
    // After it finished, the key replays.
    let r = http.post(&url, Some(&k), r#"{"amount":1}"#).await;
    assert!(r.replayed());
    assert_eq!(r.body, created[0]);
    assert_eq!(up.seen.count("/charge"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_mismatches_and_key_errors() {
    let (up, gw, http) = setup().await;
    let k = key();
    let first = http
        .post(&gw.url("/orders"), Some(&k), r#"{"a":1,"b":2}"#)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        first.header("set-cookie").is_some(),
        "the first answer is the upstream's own"
    );
    // Same request with members reordered: the canonical JSON fingerprint matches.
    let again = http
        .post(&gw.url("/orders"), Some(&k), r#"{ "b": 2, "a": 1 }"#)
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.header("idempotency-key"), Some(k.as_str()));
    assert_eq!(again.body, first.body);
    assert_eq!(
        again.header("set-cookie"),
        None,
        "Set-Cookie is not in the replay allow-list"
    );
    // Same key, another body: 422 and nothing runs.
    let other = http
        .post(&gw.url("/orders"), Some(&k), r#"{"a":1,"b":3}"#)
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), "key-reused");
    assert_eq!(up.seen.count("/orders"), 1);

    // Key errors: 400 and nothing runs.
    let missing = http.post(&gw.url("/nokey"), None, "{}").await;
    assert_eq!(
        (missing.status, missing.problem_type().as_str()),
        (StatusCode::BAD_REQUEST, "key-missing")
    );
    let long = "x".repeat(300);
    let too_long = http.post(&gw.url("/nokey"), Some(&long), "{}").await;
    assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
    let two = http
        .send(
            Method::POST,
            &gw.url("/nokey"),
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
            "{}",
        )
        .await;
    assert_eq!(
        (two.status, two.problem_type().as_str()),
        (StatusCode::BAD_REQUEST, "key-multiple")
    );
    assert_eq!(up.seen.count("/nokey"), 0);

    // Safe methods pass through, key or not.
    for _ in 0..2 {
        let r = http
            .send(
                Method::GET,
                &gw.url("/orders"),
                &[("idempotency-key", &k)],
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert!(!r.replayed());
    }
    assert_eq!(up.seen.count("/orders"), 3);
    // A route with idempotency off is a plain proxy.
    for _ in 0..2 {
        let r = http.post(&gw.url("/plain/x"), Some(&k), "{}").await;
        assert!(!r.replayed());
    }
    assert_eq!(up.seen.count("/plain/x"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_decide_what_is_stored() {
    let (up, gw, http) = setup().await;
    // 500: released, a retry runs again.
    let (k500, k422, k429, k201) = (key(), key(), key(), key());
    for _ in 0..2 {
        let r = http.post(&gw.url("/status/500"), Some(&k500), "{}").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!r.replayed());
    }
    assert_eq!(up.seen.count("/status/500"), 2);
    // 422 from the upstream: deterministic, stored and replayed.
    let a = http.post(&gw.url("/status/422"), Some(&k422), "{}").await;
    let b = http.post(&gw.url("/status/422"), Some(&k422), "{}").await;
    assert_eq!(
        (a.status, b.status),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::UNPROCESSABLE_ENTITY
        )
    );
    assert!(b.replayed());
    assert_eq!(up.seen.count("/status/422"), 1);
    // 429: rejected before running, not stored.
    for _ in 0..2 {
        let r = http.post(&gw.url("/status/429"), Some(&k429), "{}").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(!r.replayed());
    }
    assert_eq!(up.seen.count("/status/429"), 2);
    // 201: stored.
    http.post(&gw.url("/status/201"), Some(&k201), "{}").await;
    assert!(
        http.post(&gw.url("/status/201"), Some(&k201), "{}")
            .await
            .replayed()
    );
    assert_eq!(up.seen.count("/status/201"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principals_are_isolated() {
    let (up, gw, http) = setup().await;
    let k = key();
    let send = |who: &'static str| {
        let (http, url, k) = (http.clone(), gw.url("/tenant/pay"), k.clone());
        async move {
            http.send(
                Method::POST,
                &url,
                &[
                    ("idempotency-key", &k),
                    ("x-api-key", who),
                    ("content-type", "application/json"),
                ],
                "{}",
            )
            .await
        }
    };
    let alice = send("alice-key").await;
    let bob = send("bob-key").await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!bob.replayed(), "bob's key is not alice's");
    assert_eq!(up.seen.count("/tenant/pay"), 2);
    let alice_again = send("alice-key").await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    let bob_again = send("bob-key").await;
    assert!(bob_again.replayed());
    assert_eq!(bob_again.body, bob.body);
    assert_ne!(alice.body, bob.body);
    assert_eq!(up.seen.count("/tenant/pay"), 2, "each ran once");
    // No credential on a route that scopes by one: 401, nothing runs.
    let anon = http.post(&gw.url("/tenant/pay"), Some(&k), "{}").await;
    assert_eq!(anon.status, StatusCode::UNAUTHORIZED);
    assert_eq!(up.seen.count("/tenant/pay"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_error_releases_the_claim() {
    let port = spare_port();
    let up_url = format!("http://127.0.0.1:{port}");
    let gw = Gateway::start(&config(&up_url), &[]);
    let http = Http::new();
    let k = key();
    let r = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_type(), "upstream-unavailable");
    // Nothing was sent, so the claim was released: once the upstream is up, the retry runs.
    let up = Upstream::start_on(format!("127.0.0.1:{port}").parse().expect("addr")).await;
    let r = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed());
    assert_eq!(up.seen.count("/charge"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_failures_follow_the_route_policy() {
    let (up, gw, http) = setup().await;

    // hold: a timeout after sending makes the outcome unknown; the retry does not run.
    let k = key();
    let r = http
        .post(&gw.url("/held/pay?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "upstream-timeout")
    );
    let retry = http
        .post(&gw.url("/held/pay?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(
        (retry.status, retry.problem_type().as_str()),
        (StatusCode::CONFLICT, "outcome-unknown")
    );
    assert_eq!(up.seen.count("/held/pay"), 1);
    // hold: a reset after sending, likewise.
    let kr = key();
    let r = http.post(&gw.url("/held/reset"), Some(&kr), "{}").await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (StatusCode::BAD_GATEWAY, "upstream-failed")
    );
    let retry = http.post(&gw.url("/held/reset"), Some(&kr), "{}").await;
    assert_eq!(retry.problem_type(), "outcome-unknown");
    assert_eq!(up.seen.count("/held/reset"), 1);

    // The operator finds both unknown records and resolves one as completed.
    let list = http
        .admin(
            Method::GET,
            &gw.admin_url("/admin/records?state=unknown"),
            "",
        )
        .await;
    assert_eq!(list.status, StatusCode::OK);
    let keys: Vec<String> = list.json()["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(keys.contains(&k) && keys.contains(&kr), "{keys:?}");
    let resolve = http
        .admin(
            Method::POST,
            &gw.admin_url(&format!("/admin/record/resolve?namespace=test&key={k}")),
            r#"{"outcome":"complete","status":201,"headers":{"content-type":"application/json"},"body":"{\"charged\":true}"}"#,
        )
        .await;
    resolve.assert_status(StatusCode::OK);
    let replay = http
        .post(&gw.url("/held/pay?delay_ms=3000"), Some(&k), "{}")
        .await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.json()["charged"], true);
    // ... and the other as released: the retry runs again.
    let release = http
        .admin(
            Method::POST,
            &gw.admin_url(&format!("/admin/record/resolve?namespace=test&key={kr}")),
            r#"{"outcome":"release"}"#,
        )
        .await;
    assert_eq!(release.status, StatusCode::OK);
    http.post(&gw.url("/held/reset"), Some(&kr), "{}").await;
    assert_eq!(up.seen.count("/held/reset"), 2);

    // retry: the same failures release the claim, and the retry runs again.
    let k2 = key();
    for _ in 0..2 {
        let r = http
            .post(&gw.url("/retried/pay?delay_ms=3000"), Some(&k2), "{}")
            .await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(up.seen.count("/retried/pay"), 2);
    let k3 = key();
    for _ in 0..2 {
        let r = http.post(&gw.url("/retried/reset"), Some(&k3), "{}").await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(up.seen.count("/retried/reset"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_propagated_or_made() {
    let (up, gw, http) = setup().await;
    let r = http
        .send(
            Method::POST,
            &gw.url("/rid"),
            &[
                ("idempotency-key", &key()),
                ("x-request-id", "trace-abc-123"),
            ],
            "{}",
        )
        .await;
    assert_eq!(r.header("x-request-id"), Some("trace-abc-123"));
    let r2 = http.post(&gw.url("/rid"), Some(&key()), "{}").await;
    let made = r2.header("x-request-id").expect("generated id").to_owned();
    let parsed = uuid::Uuid::parse_str(&made).expect("a UUID");
    assert_eq!(parsed.get_version_num(), 7);
    assert_eq!(
        *up.seen.request_ids.lock(),
        vec!["trace-abc-123".to_owned(), made.clone()]
    );
    assert!(gw.logged(&made).await, "the request id is logged");
    // The upstream is told who asked.
    {
        let headers = up.seen.headers.lock();
        assert!(headers[0].get("x-forwarded-for").is_some());
        assert_eq!(
            headers[0].get("x-forwarded-proto").map(|v| v.as_bytes()),
            Some(&b"http"[..])
        );
    }
    // A client cannot claim a scheme it did not use.
    http.send(
        Method::POST,
        &gw.url("/rid"),
        &[("idempotency-key", &key()), ("x-forwarded-proto", "https")],
        "{}",
    )
    .await;
    let headers = up.seen.headers.lock();
    assert_eq!(
        headers
            .last()
            .and_then(|h| h.get("x-forwarded-proto"))
            .map(|v| v.as_bytes()),
        Some(&b"http"[..])
    );
}

/// Regression: the hop-by-hop strip ran after the gateway set its own headers, so a client's
/// `Connection: X-Forwarded-For, X-Request-Id` removed them and an upstream trusting
/// `X-Forwarded-For` saw the gateway's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_connection_header_cannot_strip_the_gateways_headers() {
    let (up, gw, http) = setup().await;
    let named = "X-Forwarded-For, X-Request-Id, X-Forwarded-Proto, X-Forwarded-Host, \
                 Idempotency-Key, Idempotency-Fence, X-Hop";
    for path in ["/conn", "/plain/conn"] {
        http.send(
            Method::POST,
            &gw.url(path),
            &[
                ("idempotency-key", &key()),
                ("connection", named),
                ("x-hop", "for the gateway only"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
            "{}",
        )
        .await;
        let headers = up.seen.headers.lock();
        let last = headers.last().expect("the upstream was reached");
        for own in [
            "x-forwarded-for",
            "x-request-id",
            "x-forwarded-proto",
            "x-forwarded-host",
        ] {
            assert!(
                last.get(own).is_some(),
                "{path}: {own} was stripped: {last:?}"
            );
        }
        if path == "/conn" {
            for own in ["idempotency-key", "idempotency-fence"] {
                assert!(
                    last.get(own).is_some(),
                    "{path}: {own} was stripped: {last:?}"
                );
            }
        }
        // The client's own copy was for the gateway alone; the list starts at the client.
        assert_eq!(
            last.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"127.0.0.1"[..]),
            "{path}"
        );
        // What the client named as hop-by-hop for itself is still not forwarded.
        assert!(last.get("x-hop").is_none(), "{path}: {last:?}");
        assert!(last.get("connection").is_none(), "{path}: {last:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_its_token_and_its_own_listener() {
    let (up, gw, http) = setup().await;
    for path in [
        "/metrics",
        "/admin/records",
        "/admin/record?namespace=test&key=a",
    ] {
        let none = http.get(&gw.admin_url(path)).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{path}");
        let wrong = http
            .send(
                Method::GET,
                &gw.admin_url(path),
                &[("authorization", "Bearer nope")],
                "",
            )
            .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    assert_eq!(
        http.get(&gw.admin_url("/healthz")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.get(&gw.admin_url("/readyz")).await.status,
        StatusCode::OK
    );

    // On the data listener the admin paths are just upstream paths.
    let r = http.admin(Method::GET, &gw.url("/admin/records"), "").await;
    assert_eq!(
        r.json()["path"],
        "/admin/records",
        "answered by the upstream, not the admin API"
    );
    assert_eq!(up.seen.count("/admin/records"), 1);
    let m = http.admin(Method::GET, &gw.url("/metrics"), "").await;
    assert!(!String::from_utf8_lossy(&m.body).contains("idem_"));

    // A few outcomes, then the metrics show them.
    let k = key();
    http.post(&gw.url("/m"), Some(&k), "{}").await;
    http.post(&gw.url("/m"), Some(&k), "{}").await;
    http.post(&gw.url("/m"), Some(&k), r#"{"x":1}"#).await;
    let metrics = http.admin(Method::GET, &gw.admin_url("/metrics"), "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for needle in [
        "idem_requests_total{route=\"default\",outcome=\"executed\"} 1",
        "idem_requests_total{route=\"default\",outcome=\"replayed\"} 1",
        "idem_requests_total{route=\"default\",outcome=\"mismatch\"} 1",
        "idem_store_op_seconds_bucket{op=\"claim\"",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
    // Get and delete one record.
    let get = http
        .admin(
            Method::GET,
            &gw.admin_url(&format!("/admin/record?namespace=test&key={k}")),
            "",
        )
        .await;
    assert_eq!(get.json()["state"], "completed");
    assert_eq!(get.json()["response"]["status"], 201);
    let del = http
        .admin(
            Method::DELETE,
            &gw.admin_url(&format!("/admin/record?namespace=test&key={k}")),
            "",
        )
        .await;
    assert_eq!(del.status, StatusCode::OK);
    let r = http.post(&gw.url("/m"), Some(&k), r#"{"x":1}"#).await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "after delete the key is free again"
    );
    assert_eq!(up.seen.count("/m"), 2);
}

/// The gateway counts what its layer decided, never what an answer's body says: an upstream
/// whose own 409 carries idem's in-flight problem type is an execution, not a conflict.
/// (Guards against classifying outcomes by re-parsing problem bodies.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answer_in_idems_problem_format_counts_as_an_execution() {
    let (up, gw, http) = setup().await;
    let r = http
        .post(&gw.url("/x/idem-problem"), Some(&key()), "{}")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        r.problem_type(),
        "in-flight",
        "the upstream's body passes through"
    );
    assert_eq!(up.seen.count("/x/idem-problem"), 1);
    let metrics = http.admin(Method::GET, &gw.admin_url("/metrics"), "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    let count = |outcome: &str| {
        let prefix = format!("idem_requests_total{{route=\"default\",outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("executed"), 1, "{text}");
    assert_eq!(count("in_flight"), 0, "{text}");
}

/// A compressed answer replays byte for byte, with the headers that say how to read it.
/// (Guards against a replay allow-list without `content-encoding`: the replay carried the gzip
/// bytes without the header, and clients printed binary garbage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_answers_replay_byte_for_byte() {
    let (up, gw, http) = setup().await;
    for (path, encoding, body) in [
        ("/c/gzip", "gzip", common::GZIP_BODY),
        ("/c/br", "br", common::BROTLI_BODY),
    ] {
        let k = key();
        let first = http.post(&gw.url(path), Some(&k), "{}").await;
        let again = http.post(&gw.url(path), Some(&k), "{}").await;
        assert!(again.replayed(), "{path}");
        for r in [&first, &again] {
            assert_eq!(r.status, StatusCode::CREATED, "{path}");
            assert_eq!(
                &r.body[..],
                body,
                "{path}: the bytes as the upstream sent them"
            );
            assert_eq!(r.header("content-encoding"), Some(encoding), "{path}");
            assert_eq!(r.header("vary"), Some("accept-encoding"), "{path}");
            assert_eq!(r.header("content-type"), Some("application/json"), "{path}");
        }
        assert_eq!(up.seen.count(path), 1, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests() {
    let (up, mut gw, http) = setup().await;
    let k = key();
    let pending = up.in_flight(&http, gw.url("/slow?delay_ms=1000"), &k).await;
    gw.term();
    let r = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("answered")
        .expect("join")
        .expect("the in-flight request got an answer");
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "the in-flight request finished"
    );
    assert!(
        gw.wait_exit(Duration::from_secs(10)).await,
        "clean exit after draining"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_principals_are_verified_and_isolated() {
    const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";
    let up = Upstream::start().await;
    let cfg = format!(
        r#"
upstream = "{}"
store = "memory:"
[[routes]]
name = "jwt"
path = "/*"
principal = {{ from = "jwt", hs256_secret = "{SECRET}", issuer = "test-issuer" }}
"#,
        up.url()
    );
    let gw = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 600;
    let token = |sub: &str, secret: &str, iss: &str| {
        let claims = serde_json::json!({"sub": sub, "exp": exp, "iss": iss});
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).expect("key");
        format!(
            "Bearer {}",
            jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).expect("encode")
        )
    };
    let k = key();
    let send = |auth: String| {
        let (http, url, k) = (http.clone(), gw.url("/pay"), k.clone());
        async move {
            http.send(
                Method::POST,
                &url,
                &[("idempotency-key", &k), ("authorization", &auth)],
                "{}",
            )
            .await
        }
    };
    let alice = send(token("alice", SECRET, "test-issuer")).await;
    let bob = send(token("bob", SECRET, "test-issuer")).await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!bob.replayed());
    assert!(send(token("alice", SECRET, "test-issuer")).await.replayed());
    // Forged, wrong issuer, or no token: 401 and nothing runs.
    for bad in [
        token(
            "alice",
            "another-secret-of-at-least-32-bytes!!",
            "test-issuer",
        ),
        token("alice", SECRET, "evil"),
        String::new(),
    ] {
        let r = send(bad).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(up.seen.count("/pay"), 2);
}
