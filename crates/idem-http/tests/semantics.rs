//! The HTTP behaviour of `docs/design.md` through an axum app: replays, conflicts, mismatches, keys, principals,
//! store policy, panics, caps, streaming, status endpoint.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Hits, app, post_req, send, send_post};
use idem_core::{Engine, MemoryStore, Policy};

fn engine() -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(10_000), Policy::default())
}

/// A memory-store engine, the handler's counters, and the default app on both.
fn served() -> (Engine<MemoryStore>, Arc<Hits>, axum::Router) {
    let engine = engine();
    let hits = Arc::new(Hits::default());
    let router = app(&engine, Arc::clone(&hits));
    (engine, hits, router)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_identical_requests_run_the_handler_once() {
    let (_engine, hits, router) = served();
    let body = r#"{"amount":100}"#;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let router = router.clone();
        tasks.spawn(async move { send_post(&router, "/gated", Some("k-200"), body).await });
    }
    // The winner's handler is held at the gate, so the 199 others must all answer first.
    for _ in 0..199 {
        let got = tasks.join_next().await.expect("task").expect("join");
        assert_eq!(got.status, StatusCode::CONFLICT, "{got:?}");
        assert_eq!(got.problem_type(), "https://idem.dev/problems/in-flight");
        // Capped: the default 45 s lease would otherwise tell every duplicate to wait ~45 s.
        assert_eq!(got.headers["retry-after"], "1");
        assert_eq!(got.json()["retry_after"], 1);
        assert_eq!(got.json()["state"], "processing");
    }
    assert_eq!(hits.started(), 1);
    hits.gate.notify_waiters();
    let winner = tasks.join_next().await.expect("task").expect("join");
    assert_eq!(winner.status, StatusCode::CREATED);
    assert_eq!(hits.started(), 1);

    let retry = send_post(&router, "/gated", Some("k-200"), body).await;
    assert_eq!(retry.status, winner.status);
    assert_eq!(retry.body, winner.body, "byte-identical body");
    assert!(retry.replayed());
    assert_eq!(retry.headers["idempotency-key"], "k-200");
    assert_eq!(retry.headers["content-type"], "application/json");
    assert_eq!(hits.started(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_in_flight_wait_duplicates_get_the_stored_response() {
    let (_engine, hits, router) = served();
    let started = hits.on_start.notified();
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            send_post(&router, "/gated-wait", Some("w"), "{}").await
        }));
    }
    started.await;
    hits.gate.notify_waiters();
    let mut bodies = Vec::new();
    for t in tasks {
        let got = t.await.expect("task");
        // Each is the stored response (or the original); a 409 only if the wait ran out.
        assert!(
            got.status == StatusCode::CREATED || got.status == StatusCode::CONFLICT,
            "{got:?}"
        );
        if got.status == StatusCode::CREATED {
            bodies.push(got.body);
        }
    }
    assert_eq!(hits.started(), 1);
    assert!(bodies.len() > 1);
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every success is the identical stored body"
    );
}

#[tokio::test]
async fn different_body_is_422_and_reordered_json_replays() {
    let (_engine, hits, router) = served();
    let first = send_post(
        &router,
        "/respond",
        Some("m"),
        r#"{"amount":100,"currency":"EUR"}"#,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = send_post(
        &router,
        "/respond",
        Some("m"),
        "{ \"currency\" : \"EUR\",\n  \"amount\": 100.0 }",
    )
    .await;
    assert!(reordered.replayed(), "{reordered:?}");
    assert_eq!(reordered.body, first.body);
    let other = send_post(
        &router,
        "/respond",
        Some("m"),
        r#"{"amount":101,"currency":"EUR"}"#,
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), "https://idem.dev/problems/key-reused");
    assert_eq!(other.json()["key"], "m");
    assert_eq!(
        hits.started(),
        1,
        "neither the replay nor the mismatch ran the handler"
    );
}

/// Regression: numbers were compared as f64 (two amounts beyond 2^53 replayed each other) and
/// of duplicate members the last won, while an upstream that keeps the first one charges it.
#[tokio::test]
async fn json_that_means_two_things_is_not_the_same_request() {
    let (_engine, hits, router) = served();
    let first = send_post(
        &router,
        "/respond",
        Some("big"),
        r#"{"amount":10000000000000000000001}"#,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send_post(
        &router,
        "/respond",
        Some("big"),
        r#"{"amount":10000000000000000000002}"#,
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    let same = send_post(
        &router,
        "/respond",
        Some("big"),
        r#"{"amount":1000000000000000000000.1e1}"#,
    )
    .await;
    assert!(
        same.replayed(),
        "one exact value, another spelling: {same:?}"
    );

    let twice = send_post(
        &router,
        "/respond",
        Some("dup"),
        r#"{"amount":1,"amount":9}"#,
    )
    .await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{twice:?}");
    assert_eq!(
        twice.problem_type(),
        "https://idem.dev/problems/body-ambiguous"
    );
    assert!(
        twice.json()["detail"]
            .as_str()
            .is_some_and(|d| d.contains("amount"))
    );
    assert_eq!(hits.started(), 1, "only the first request ran");
}

#[tokio::test]
async fn missing_and_malformed_keys_are_400() {
    let (_engine, hits, router) = served();
    let missing = send_post(&router, "/respond", None, "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "https://idem.dev/problems/key-missing"
    );

    let long = "k".repeat(256);
    let quoted_long = format!("\"{long}\"");
    let malformed: &[&[u8]] = &[
        b"",
        b"\"\"",
        long.as_bytes(),
        quoted_long.as_bytes(),
        // The only control byte `http` lets into a header value is HTAB (it refuses the
        // rest, and DEL, before they reach any layer); the parser tests cover the others.
        b"a\tb",
        b"caf\xc3\xa9",
        br#""a\nb""#,
        br#""abc"#,
        br#""abc"tail"#,
    ];
    for raw in malformed {
        let req = Request::builder()
            .method("POST")
            .uri("/respond")
            .header(
                "idempotency-key",
                http::HeaderValue::from_bytes(raw).expect("header value"),
            )
            .body(Body::from("{}"))
            .expect("request");
        let got = send(&router, req).await;
        assert_eq!(
            got.status,
            StatusCode::BAD_REQUEST,
            "{:?}",
            String::from_utf8_lossy(raw)
        );
        assert_eq!(
            got.problem_type(),
            "https://idem.dev/problems/key-malformed",
            "{:?}",
            String::from_utf8_lossy(raw)
        );
    }

    let two = Request::builder()
        .method("POST")
        .uri("/respond")
        .header("idempotency-key", "a")
        .header("idempotency-key", "a")
        .body(Body::from("{}"))
        .expect("request");
    let got = send(&router, two).await;
    assert_eq!(
        (got.status, got.problem_type().as_str()),
        (
            StatusCode::BAD_REQUEST,
            "https://idem.dev/problems/key-multiple"
        )
    );
    for list in ["a, b", r#""a", "b""#] {
        let got = send_post(&router, "/respond", Some(list), "{}").await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{list}");
        assert_eq!(got.problem_type(), "https://idem.dev/problems/key-multiple");
    }
    assert_eq!(
        hits.started(),
        0,
        "no malformed request reached the handler"
    );

    let bare = send_post(&router, "/respond", Some("same-key"), "{}").await;
    assert_eq!(bare.status, StatusCode::CREATED);
    let quoted = send_post(&router, "/respond", Some("\"same-key\""), "{}").await;
    assert!(
        quoted.replayed(),
        "quoted sf-string and bare token are the same key"
    );
    assert_eq!(quoted.body, bare.body);
    assert_eq!(hits.started(), 1);
}

#[tokio::test]
async fn optional_key_passes_through_and_get_is_never_protected() {
    let (_engine, hits, router) = served();
    for _ in 0..2 {
        let got = send_post(&router, "/respond-optional", None, "{}").await;
        assert_eq!(got.status, StatusCode::CREATED);
        assert!(!got.replayed());
    }
    assert_eq!(hits.started(), 2);
    let get = send(
        &router,
        Request::get("/plain").body(Body::empty()).expect("request"),
    )
    .await;
    assert_eq!(get.body, "plain");
}

#[tokio::test]
async fn principals_never_see_each_others_responses() {
    let (_engine, hits, router) = served();
    let alice = send(
        &router,
        post_req("/respond", Some("shared"), Some("Bearer alice"), "{}"),
    )
    .await;
    let bob = send(
        &router,
        post_req("/respond", Some("shared"), Some("Bearer bob"), "{}"),
    )
    .await;
    assert_eq!(hits.started(), 2, "two principals, two executions");
    assert!(!bob.replayed());
    for (who, first) in [("Bearer alice", &alice), ("Bearer bob", &bob)] {
        let again = send(
            &router,
            post_req("/respond", Some("shared"), Some(who), "{}"),
        )
        .await;
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.json()["principal"], who);
    }
    assert_eq!(hits.started(), 2);
    // The status endpoint answers per principal.
    let status = |who: &str| {
        Request::get("/idempotency/shared")
            .header("authorization", who)
            .body(Body::empty())
            .expect("request")
    };
    let mine = send(&router, status("Bearer alice")).await;
    assert_eq!(
        (mine.status, mine.json()["state"].as_str()),
        (StatusCode::OK, Some("completed"))
    );
    assert_eq!(mine.json()["status"], 201);
    let stranger = send(&router, status("Bearer mallory")).await;
    assert_eq!(
        (stranger.status, stranger.json()["state"].as_str()),
        (StatusCode::NOT_FOUND, Some("absent"))
    );
}

#[tokio::test]
async fn store_policy_releases_500_and_429_and_keeps_422() {
    let (_engine, hits, router) = served();
    for (key, status, stored) in [
        ("s500", 500, false),
        ("s429", 429, false),
        ("s422", 422, true),
        ("s401", 401, false),
    ] {
        let body = format!(r#"{{"status":{status}}}"#);
        let before = hits.started();
        let first = send_post(&router, "/respond", Some(key), &body).await;
        let second = send_post(&router, "/respond", Some(key), &body).await;
        assert_eq!(first.status.as_u16(), status);
        assert_eq!(second.status.as_u16(), status);
        if stored {
            assert_eq!(hits.started() - before, 1, "{status} is stored");
            assert!(second.replayed());
            assert_eq!(second.body, first.body);
        } else {
            assert_eq!(
                hits.started() - before,
                2,
                "{status} is released and the retry runs again"
            );
            assert!(!second.replayed());
            assert_ne!(second.body, first.body);
        }
    }
}

#[tokio::test]
async fn replays_only_allow_listed_headers() {
    let (_engine, _hits, router) = served();
    let first = send_post(&router, "/respond", Some("h"), "{}").await;
    assert!(
        first.headers.contains_key("set-cookie"),
        "the first caller gets its cookie"
    );
    let again = send_post(&router, "/respond", Some("h"), "{}").await;
    assert!(again.replayed());
    assert_eq!(again.headers["content-type"], "application/json");
    for never in ["set-cookie", "www-authenticate", "x-custom"] {
        assert!(
            !again.headers.contains_key(never),
            "{never} must not be replayed"
        );
    }
    assert_eq!(
        again.headers["content-length"],
        again.body.len().to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_gets_500_releases_the_claim_and_the_service_keeps_serving() {
    let (_engine, hits, router) = served();
    let boom = send_post(&router, "/panic", Some("p"), "{}").await;
    assert_eq!(boom.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        boom.problem_type(),
        "https://idem.dev/problems/handler-panicked"
    );
    // Released, not stuck in processing: the retry runs the handler again.
    let retry = send_post(&router, "/panic", Some("p"), "{}").await;
    assert_eq!(
        (retry.status, &retry.body[..]),
        (StatusCode::OK, &b"recovered"[..])
    );
    assert_eq!(hits.started(), 2);
    let other = send_post(&router, "/respond", Some("after-panic"), "{}").await;
    assert_eq!(other.status, StatusCode::CREATED);
}

#[tokio::test]
async fn oversized_request_is_413_and_nothing_runs() {
    let (_engine, hits, router) = served();
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100));
    let got = send_post(&router, "/small-body", Some("b"), &big).await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        got.problem_type(),
        "https://idem.dev/problems/body-too-large"
    );
    // Without a content-length the cap is enforced while reading.
    let stream = Body::from_stream(futures::stream::iter(vec![Ok::<_, std::io::Error>(
        bytes::Bytes::from(big.clone()),
    )]));
    let req = Request::post("/small-body")
        .header("idempotency-key", "b2")
        .body(stream)
        .expect("request");
    let got = send(&router, req).await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(hits.started(), 0);
    let ok = send_post(&router, "/small-body", Some("b3"), "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

#[tokio::test]
async fn oversized_response_reaches_the_client_and_replays_as_a_problem() {
    let (_engine, hits, router) = served();
    let first = send_post(&router, "/big", Some("big"), "").await;
    assert_eq!((first.status, first.body.len()), (StatusCode::OK, 4096));
    let again = send_post(&router, "/big", Some("big"), "").await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(
        again.problem_type(),
        "https://idem.dev/problems/response-not-stored"
    );
    assert_eq!(again.json()["state"], "completed");
    assert_eq!(hits.started(), 1, "never re-run");
}

#[tokio::test]
async fn streaming_responses_pass_through_and_release() {
    let (_engine, hits, router) = served();
    let first = send_post(&router, "/sse", Some("sse"), "").await;
    assert_eq!(&first.body[..], b"data: 1\n\ndata: end\n\n");
    let second = send_post(&router, "/sse", Some("sse"), "").await;
    assert!(!second.replayed());
    assert_eq!(&second.body[..], b"data: 2\n\ndata: end\n\n");
    assert_eq!(
        hits.started(),
        2,
        "streams are not protected by default, and never half-stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_cancel_the_handler() {
    let (_engine, hits, router) = served();
    let started = hits.on_start.notified();
    let client = {
        let router = router.clone();
        tokio::spawn(async move { send_post(&router, "/gated-wait", Some("gone"), "{}").await })
    };
    started.await;
    // The client goes away mid-handler.
    client.abort();
    assert!(client.await.expect_err("aborted").is_cancelled());
    let finished = hits.on_finish.notified();
    hits.gate.notify_waiters();
    tokio::time::timeout(Duration::from_secs(5), finished)
        .await
        .expect("the handler was cancelled together with the client");
    // The outcome was recorded: the retry (waiting for it if needed) replays it.
    let retry = send_post(&router, "/gated-wait", Some("gone"), "{}").await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.json()["execution"], 1);
    assert_eq!(hits.started(), 1);
    // Regression guard (checked by building `ResponseFuture` with `detach_on_drop: false`):
    // without the hand-off to a spawned task on drop, the abort cancels the handler, which
    // never finishes, and this test fails at the timeout above.
}

#[tokio::test]
async fn status_endpoint_reports_processing_and_absent() {
    let (_engine, _hits, router) = served();
    let absent = send(
        &router,
        Request::get("/idempotency/nope")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(absent.status, StatusCode::NOT_FOUND);
    assert_eq!(absent.json()["state"], "absent");
    let bad = send(
        &router,
        Request::get("/idempotency/a%01b")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    send_post(&router, "/respond", Some("with space"), "{}").await;
    let done = send(
        &router,
        Request::get("/idempotency/with%20space")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(done.json()["state"], "completed");
    assert!(
        done.json()["created_at"].as_u64().is_some()
            && done.json()["expires_at"].as_u64().is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_its_timeout_gets_504_and_is_released() {
    let engine = engine();
    let hits = Arc::new(Hits::default());
    let policy = Policy::builder()
        .handler_timeout(Duration::from_millis(100))
        .lease(Duration::from_secs(16))
        .build()
        .expect("policy");
    let router = common::app_with(&engine, Arc::clone(&hits), move |c| {
        c.policy(policy.clone())
    });
    // The gate is never opened: the handler hangs until the engine's timeout cancels it
    // (the paused clock jumps straight to it).
    let got = send_post(&router, "/gated", Some("slow"), "{}").await;
    assert_eq!(got.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        got.problem_type(),
        "https://idem.dev/problems/handler-timeout"
    );
    let status = send(
        &router,
        Request::get("/idempotency/slow")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(
        status.json()["state"],
        "absent",
        "released under the default re-execute takeover"
    );
    assert_eq!(hits.started(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_endpoint_reports_a_key_in_flight() {
    let (_engine, hits, router) = served();
    let started = hits.on_start.notified();
    let first = {
        let router = router.clone();
        tokio::spawn(async move { send_post(&router, "/gated", Some("busy"), "{}").await })
    };
    started.await;
    let query = || {
        Request::get("/idempotency-gated/busy")
            .body(Body::empty())
            .expect("request")
    };
    let during = send(&router, query()).await;
    assert_eq!(during.status, StatusCode::OK, "{during:?}");
    assert_eq!(during.json()["state"], "processing");
    assert!(during.json()["lease_until"].as_u64() > during.json()["created_at"].as_u64());
    hits.gate.notify_waiters();
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);
    let after = send(&router, query()).await;
    assert_eq!(
        (
            after.json()["state"].as_str(),
            after.json()["status"].as_u64()
        ),
        (Some("completed"), Some(201))
    );
}
