//! Every row of the status mapping table (`idem_grpc::codes`, `docs/grpc.md`), through a
//! real tonic server over loopback: what the caller gets, and whether the handler ran.

mod common;

use common::{CHARGE, charge, default_config, key, keyed, memory, method, reason, serve};
use idem_core::{Engine, MemoryStore, Policy, StoreOp, TakeoverPolicy};
use idem_grpc::{GrpcIdempotencyConfig, StoreDeterministic};
use idem_testkit::{Fault, FaultyStore};
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic_types::StatusExt;

fn config(m: idem_grpc::MethodConfig) -> GrpcIdempotencyConfig {
    GrpcIdempotencyConfig::new()
        .method(CHARGE, m)
        .expect("path")
}

#[tokio::test]
async fn bad_keys_and_principals_are_refused_before_anything_runs() {
    let engine = memory();
    let s = serve(&engine, default_config("keys")).await;
    let mut client = s.client.clone();

    let missing = client.charge(charge("o", 1)).await.expect_err("no key");
    assert_eq!(
        (missing.code(), reason(&missing)),
        (Code::InvalidArgument, "KEY_MISSING".into())
    );

    let long = client
        .charge(keyed(charge("o", 1), &"x".repeat(256), None))
        .await
        .expect_err("too long");
    assert_eq!(
        (long.code(), reason(&long)),
        (Code::InvalidArgument, "KEY_MALFORMED".into())
    );

    let mut req = tonic::Request::new(charge("o", 1));
    req.metadata_mut()
        .insert("idempotency-key", MetadataValue::from_static(""));
    let empty = client.charge(req).await.expect_err("empty");
    assert_eq!(
        (empty.code(), reason(&empty)),
        (Code::InvalidArgument, "KEY_MALFORMED".into())
    );

    let mut req = tonic::Request::new(charge("o", 1));
    req.metadata_mut()
        .append("idempotency-key", MetadataValue::from_static("a"));
    req.metadata_mut()
        .append("idempotency-key", MetadataValue::from_static("b"));
    let twice = client.charge(req).await.expect_err("two keys");
    assert_eq!(
        (twice.code(), reason(&twice)),
        (Code::InvalidArgument, "KEY_MULTIPLE".into())
    );
    assert_eq!(s.hits.started(), 0);

    let required = method("keys.required").principal(
        idem_http::HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")).required(),
    );
    let s = serve(&engine, config(required)).await;
    let mut client = s.client.clone();
    let anon = client
        .charge(keyed(charge("o", 1), &key(), None))
        .await
        .expect_err("no principal");
    assert_eq!(
        (anon.code(), reason(&anon)),
        (Code::Unauthenticated, "UNAUTHENTICATED".into())
    );
    // The credential twice: the handler might read the other one.
    let mut req = keyed(charge("o", 1), &key(), None);
    req.metadata_mut()
        .append("x-api-key", MetadataValue::from_static("alice"));
    req.metadata_mut()
        .append("x-api-key", MetadataValue::from_static("bob"));
    let twice = client.charge(req).await.expect_err("two credentials");
    assert_eq!(
        (twice.code(), reason(&twice)),
        (Code::InvalidArgument, "CREDENTIAL_AMBIGUOUS".into())
    );
    assert_eq!(s.hits.started(), 0);
}

#[tokio::test]
async fn in_flight_mismatch_and_unknown() {
    let engine = memory();
    let m = method("rows.charge").store_policy(StoreDeterministic::new().ambiguous_as_unknown());
    let s = serve(&engine, config(m)).await;

    // In flight: ABORTED with RetryInfo while the first call runs.
    let k = key();
    let mut gated = charge("o-1", 1);
    gated.gated = true;
    let mut client = s.client.clone();
    let started = s.hits.on_start.notified();
    let (gk, g) = (k.clone(), gated.clone());
    let first = tokio::spawn(async move { client.charge(keyed(g, &gk, None)).await });
    started.await;
    let mut client = s.client.clone();
    let busy = client
        .charge(keyed(gated.clone(), &k, None))
        .await
        .expect_err("busy");
    assert_eq!(
        (busy.code(), reason(&busy)),
        (Code::Aborted, "IN_FLIGHT".into())
    );
    assert!(
        busy.get_details_retry_info()
            .is_some_and(|r| r.retry_delay.is_some())
    );
    s.hits.gate.notify_waiters();
    first.await.expect("join").expect("first answers");

    // Mismatch: the same key with another message.
    let other = client
        .charge(keyed(charge("o-1", 2), &k, None))
        .await
        .expect_err("reused");
    assert_eq!(
        (other.code(), reason(&other)),
        (Code::FailedPrecondition, "KEY_REUSED".into())
    );
    assert_eq!(
        other.get_details_error_info().expect("info").metadata["key"],
        k
    );

    // Outcome unknown: an ambiguous failure under `ambiguous_as_unknown`.
    let k = key();
    let mut ambiguous = charge("o-2", 1);
    ambiguous.fail_code = Code::DeadlineExceeded as i32;
    let first = client
        .charge(keyed(ambiguous.clone(), &k, None))
        .await
        .expect_err("handler's");
    assert_eq!(
        first.code(),
        Code::DeadlineExceeded,
        "the handler's own status"
    );
    let retry = client
        .charge(keyed(ambiguous, &k, None))
        .await
        .expect_err("unknown");
    assert_eq!(
        (retry.code(), reason(&retry)),
        (Code::FailedPrecondition, "OUTCOME_UNKNOWN".into())
    );
    assert_eq!(s.hits.started(), 2);
}

#[tokio::test]
async fn a_failing_store_is_unavailable_with_retry_info_and_nothing_runs() {
    let store = FaultyStore::new(MemoryStore::new(100)).with(StoreOp::Claim, Fault::Error);
    let engine = Engine::new(store, Policy::default());
    let s = serve(&engine, default_config("down")).await;
    let mut client = s.client.clone();
    let down = client
        .charge(keyed(charge("o", 1), &key(), None))
        .await
        .expect_err("store down");
    assert_eq!(
        (down.code(), reason(&down)),
        (Code::Unavailable, "STORE_UNAVAILABLE".into())
    );
    assert!(
        down.get_details_retry_info()
            .is_some_and(|r| r.retry_delay.is_some())
    );
    assert_eq!(s.hits.started(), 0);
}

#[tokio::test]
async fn too_large_requests_are_refused_and_too_large_answers_are_not_replayed() {
    let engine = memory();
    let s = serve(&engine, default_config("huge")).await;
    let mut client = s.client.clone();
    // A 5 MiB message against the default 4 MiB cap.
    let mut huge = charge("o", 1);
    huge.reference = "r".repeat(5 << 20);
    let refused = client
        .charge(keyed(huge, &key(), None))
        .await
        .expect_err("too large");
    assert_eq!(
        (refused.code(), reason(&refused)),
        (Code::ResourceExhausted, "REQUEST_TOO_LARGE".into())
    );
    assert_eq!(s.hits.started(), 0);

    let small = method("huge.small")
        .max_request(1024)
        .max_stored_response(512);
    let s = serve(&engine, config(small)).await;
    let mut client = s.client.clone();
    let mut over = charge("o", 1);
    over.reference = "r".repeat(2000);
    let refused = client
        .charge(keyed(over, &key(), None))
        .await
        .expect_err("over");
    assert_eq!(refused.code(), Code::ResourceExhausted);

    let k = key();
    let mut big = charge("o-big", 1);
    big.reply_bytes = 2000;
    let first = client
        .charge(keyed(big.clone(), &k, None))
        .await
        .expect("all of it");
    assert_eq!(
        first.get_ref().padding.len(),
        2000,
        "this caller gets all of it"
    );
    let again = client
        .charge(keyed(big, &k, None))
        .await
        .expect_err("not stored");
    assert_eq!(
        (again.code(), reason(&again)),
        (Code::FailedPrecondition, "RESPONSE_NOT_STORED".into())
    );
    assert_eq!(s.hits.started(), 1, "never a second run");
}

#[tokio::test]
async fn definite_statuses_are_stored_and_retryable_ones_release_the_claim() {
    let engine = memory();
    let s = serve(&engine, default_config("codes")).await;
    let mut client = s.client.clone();
    let stored = [
        Code::InvalidArgument,
        Code::NotFound,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::OutOfRange,
        Code::Unimplemented,
    ];
    let released = [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Aborted,
        Code::Cancelled,
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::Internal,
        Code::Unknown,
        Code::DataLoss,
    ];
    for code in stored.into_iter().chain(released) {
        let before = s.hits.started();
        let k = key();
        let mut msg = charge("o", 1);
        msg.fail_code = code as i32;
        for _ in 0..2 {
            let got = client
                .charge(keyed(msg.clone(), &k, None))
                .await
                .expect_err("fails");
            assert_eq!(got.code(), code);
        }
        let runs = s.hits.started() - before;
        let want = if stored.contains(&code) { 1 } else { 2 };
        assert_eq!(
            runs, want,
            "{code:?}: stored ones run once, released ones again"
        );
    }
}

#[tokio::test]
async fn a_timed_out_or_panicking_handler_is_released() {
    // The handler's own timeout (not the caller's) is DEADLINE_EXCEEDED with HANDLER_TIMEOUT.
    // Under `reexecute` the timed-out claim is released as retryable.
    let policy = Policy::builder()
        .takeover(TakeoverPolicy::Reexecute)
        .handler_timeout(std::time::Duration::from_millis(200))
        .lease(std::time::Duration::from_secs(16))
        .build()
        .expect("policy");
    let engine = Engine::new(MemoryStore::new(100), policy);
    let s = serve(&engine, default_config("slow")).await;
    let mut client = s.client.clone();
    let mut slow = charge("o", 1);
    slow.sleep_ms = 2000;
    let k = key();
    let late = client
        .charge(keyed(slow.clone(), &k, None))
        .await
        .expect_err("timeout");
    assert_eq!(
        (late.code(), reason(&late)),
        (Code::DeadlineExceeded, "HANDLER_TIMEOUT".into())
    );
    assert_eq!(s.hits.finished(), 0);
    // Released: the retry runs (and times out) again.
    let _ = client
        .charge(keyed(slow, &k, None))
        .await
        .expect_err("timeout");
    assert_eq!(s.hits.started(), 2);

    // A panic is INTERNAL with HANDLER_PANICKED; the claim is released and the server serves on.
    let k = key();
    let mut boom = charge("o", 1);
    boom.fail_code = common::PANIC;
    for _ in 0..2 {
        let got = client
            .charge(keyed(boom.clone(), &k, None))
            .await
            .expect_err("panic");
        assert_eq!(
            (got.code(), reason(&got)),
            (Code::Internal, "HANDLER_PANICKED".into())
        );
    }
    assert_eq!(s.hits.started(), 4);

    // Under the default `hold` a timed-out handler may have acted: its key is left unknown
    // and the retry runs nothing.
    let policy = Policy::builder()
        .handler_timeout(std::time::Duration::from_millis(200))
        .build()
        .expect("policy");
    let engine = Engine::new(MemoryStore::new(100), policy);
    let s = serve(&engine, default_config("slow-held")).await;
    let mut client = s.client.clone();
    let mut slow = charge("o", 1);
    slow.sleep_ms = 2000;
    let k = key();
    let late = client
        .charge(keyed(slow.clone(), &k, None))
        .await
        .expect_err("timeout");
    assert_eq!(reason(&late), "HANDLER_TIMEOUT");
    let again = client
        .charge(keyed(slow, &k, None))
        .await
        .expect_err("unknown");
    assert_eq!(
        (again.code(), reason(&again)),
        (Code::FailedPrecondition, "OUTCOME_UNKNOWN".into())
    );
    assert_eq!(s.hits.started(), 1);
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_and_is_unavailable() {
    // Under `reexecute` a lost lease means a retry may run it again: the handler is stopped.
    // (Under the default `hold` it goes on; see idem-core's engine tests.)
    let store = FaultyStore::new(MemoryStore::new(100)).with(StoreOp::Renew, Fault::RenewLost);
    let policy = Policy::builder()
        .takeover(TakeoverPolicy::Reexecute)
        .renew_every(std::time::Duration::from_millis(50))
        .build()
        .expect("policy");
    let engine = Engine::new(store, policy);
    let s = serve(&engine, default_config("lost")).await;
    let mut client = s.client.clone();
    let mut slow = charge("o", 1);
    slow.sleep_ms = 1000;
    let lost = client
        .charge(keyed(slow, &key(), None))
        .await
        .expect_err("lease lost");
    assert_eq!(
        (lost.code(), reason(&lost)),
        (Code::Unavailable, "LEASE_LOST".into())
    );
    assert!(lost.get_details_retry_info().is_some());
    assert_eq!(s.hits.finished(), 0, "the handler was cancelled");
}

#[tokio::test]
async fn a_protected_call_must_be_exactly_one_message() {
    let engine = memory();
    let s = serve(&engine, default_config("frames")).await;
    let one = common::frame(&charge("o", 1));
    for (what, body) in [
        ("two messages", [one.clone(), one.clone()].concat()),
        ("a truncated message", one[..one.len() - 1].to_vec()),
        ("no message", Vec::new()),
    ] {
        let raw = common::raw_call(&s.channel, CHARGE, &key(), &body).await;
        // Refused trailers-only: the status is in the response head.
        let code = raw
            .headers
            .get("grpc-status")
            .expect("trailers-only status");
        assert_eq!(code, "3", "{what}: INVALID_ARGUMENT");
    }
    assert_eq!(s.hits.started(), 0);
}
