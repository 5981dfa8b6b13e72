//! Every row of the status mapping table (`idem_grpc::codes`, `docs/grpc.md`), through a
//! real tonic server over loopback: what the caller gets, and whether the handler ran.

mod common;

use common::{
    CHARGE, assert_refused, charge, charge_err, charge_ok, default_config, key, keyed, memory,
    method, reason, serve,
};
use idem_core::{Engine, MemoryStore, Policy, StoreOp, TakeoverPolicy};
use idem_grpc::StoreDeterministic;
use idem_testkit::{Fault, FaultyStore};
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic_types::StatusExt;

#[tokio::test]
async fn bad_keys_and_principals_are_refused_before_anything_runs() {
    let (engine, s, mut client) = common::serve_memory("keys").await;

    let missing = charge_err(&mut client, charge("o", 1), "no key").await;
    assert_refused(&missing, Code::InvalidArgument, "KEY_MISSING");

    let long = charge_err(
        &mut client,
        keyed(charge("o", 1), &"x".repeat(256), None),
        "too long",
    )
    .await;
    assert_refused(&long, Code::InvalidArgument, "KEY_MALFORMED");

    let mut req = tonic::Request::new(charge("o", 1));
    req.metadata_mut()
        .insert("idempotency-key", MetadataValue::from_static(""));
    let empty = charge_err(&mut client, req, "empty").await;
    assert_refused(&empty, Code::InvalidArgument, "KEY_MALFORMED");

    let mut req = tonic::Request::new(charge("o", 1));
    req.metadata_mut()
        .append("idempotency-key", MetadataValue::from_static("a"));
    req.metadata_mut()
        .append("idempotency-key", MetadataValue::from_static("b"));
    let twice = charge_err(&mut client, req, "two keys").await;
    assert_refused(&twice, Code::InvalidArgument, "KEY_MULTIPLE");
    assert_eq!(s.hits.started(), 0);

    let required = method("keys.required").principal(
        idem_http::HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")).required(),
    );
    let s = serve(&engine, common::charge_config(required)).await;
    let mut client = s.client.clone();
    let anon = charge_err(&mut client, common::fresh_call(), "no principal").await;
    assert_refused(&anon, Code::Unauthenticated, "UNAUTHENTICATED");
    // The credential twice: the handler might read the other one.
    let mut req = common::fresh_call();
    req.metadata_mut()
        .append("x-api-key", MetadataValue::from_static("alice"));
    req.metadata_mut()
        .append("x-api-key", MetadataValue::from_static("bob"));
    let twice = charge_err(&mut client, req, "two credentials").await;
    assert_refused(&twice, Code::InvalidArgument, "CREDENTIAL_AMBIGUOUS");
    assert_eq!(s.hits.started(), 0);
}

#[tokio::test]
async fn in_flight_mismatch_and_unknown() {
    let engine = memory();
    let m = method("rows.charge").store_policy(StoreDeterministic::new().ambiguous_as_unknown());
    let s = serve(&engine, common::charge_config(m)).await;

    // In flight: ABORTED with RetryInfo while the first call runs.
    let k = key();
    let gated = common::gated("o-1", 1);
    let mut client = s.client.clone();
    let started = s.hits.on_start.notified();
    let (gk, g) = (k.clone(), gated.clone());
    let first = tokio::spawn(async move { client.charge(keyed(g, &gk, None)).await });
    started.await;
    let mut client = s.client.clone();
    let busy = charge_err(&mut client, keyed(gated.clone(), &k, None), "busy").await;
    assert_refused(&busy, Code::Aborted, "IN_FLIGHT");
    assert!(
        busy.get_details_retry_info()
            .is_some_and(|r| r.retry_delay.is_some())
    );
    s.hits.gate.notify_waiters();
    first.await.expect("join").expect("first answers");

    // Mismatch: the same key with another message.
    let other = charge_err(&mut client, keyed(charge("o-1", 2), &k, None), "reused").await;
    assert_refused(&other, Code::FailedPrecondition, "KEY_REUSED");
    assert_eq!(
        other.get_details_error_info().expect("info").metadata["key"],
        k
    );

    // Outcome unknown: an ambiguous failure under `ambiguous_as_unknown`.
    let k = key();
    let mut ambiguous = charge("o-2", 1);
    ambiguous.fail_code = Code::DeadlineExceeded as i32;
    let first = charge_err(&mut client, keyed(ambiguous.clone(), &k, None), "handler's").await;
    assert_eq!(
        first.code(),
        Code::DeadlineExceeded,
        "the handler's own status"
    );
    let retry = charge_err(&mut client, keyed(ambiguous, &k, None), "unknown").await;
    assert_refused(&retry, Code::FailedPrecondition, "OUTCOME_UNKNOWN");
    assert_eq!(s.hits.started(), 2);
}

#[tokio::test]
async fn a_failing_store_is_unavailable_with_retry_info_and_nothing_runs() {
    let store = FaultyStore::new(MemoryStore::new(100)).with(StoreOp::Claim, Fault::Error);
    let engine = Engine::new(store, Policy::default());
    let s = serve(&engine, default_config("down")).await;
    let mut client = s.client.clone();
    let down = charge_err(&mut client, common::fresh_call(), "store down").await;
    assert_refused(&down, Code::Unavailable, "STORE_UNAVAILABLE");
    assert!(
        down.get_details_retry_info()
            .is_some_and(|r| r.retry_delay.is_some())
    );
    assert_eq!(s.hits.started(), 0);
}

#[tokio::test]
async fn too_large_requests_are_refused_and_too_large_answers_are_not_replayed() {
    let (engine, s, mut client) = common::serve_memory("huge").await;
    // A 5 MiB message against the default 4 MiB cap.
    let mut huge = charge("o", 1);
    huge.reference = "r".repeat(5 << 20);
    let refused = charge_err(&mut client, keyed(huge, &key(), None), "too large").await;
    assert_refused(&refused, Code::ResourceExhausted, "REQUEST_TOO_LARGE");
    assert_eq!(s.hits.started(), 0);

    let small = method("huge.small")
        .max_request(1024)
        .max_stored_response(512);
    let s = serve(&engine, common::charge_config(small)).await;
    let mut client = s.client.clone();
    let mut over = charge("o", 1);
    over.reference = "r".repeat(2000);
    let refused = charge_err(&mut client, keyed(over, &key(), None), "over").await;
    assert_eq!(refused.code(), Code::ResourceExhausted);

    let k = key();
    let mut big = charge("o-big", 1);
    big.reply_bytes = 2000;
    let first = charge_ok(&mut client, keyed(big.clone(), &k, None), "all of it").await;
    assert_eq!(
        first.get_ref().padding.len(),
        2000,
        "this caller gets all of it"
    );
    let again = charge_err(&mut client, keyed(big, &k, None), "not stored").await;
    assert_refused(&again, Code::FailedPrecondition, "RESPONSE_NOT_STORED");
    assert_eq!(s.hits.started(), 1, "never a second run");
}

#[tokio::test]
async fn definite_statuses_are_stored_and_retryable_ones_release_the_claim() {
    let (_engine, s, mut client) = common::serve_memory("codes").await;
    // Each code, and how often two calls with one key run the handler: once for a stored
    // status, twice for a released one.
    let cases = [
        (Code::InvalidArgument, 1),
        (Code::NotFound, 1),
        (Code::AlreadyExists, 1),
        (Code::FailedPrecondition, 1),
        (Code::OutOfRange, 1),
        (Code::Unimplemented, 1),
        (Code::Unavailable, 2),
        (Code::DeadlineExceeded, 2),
        (Code::ResourceExhausted, 2),
        (Code::Aborted, 2),
        (Code::Cancelled, 2),
        (Code::Unauthenticated, 2),
        (Code::PermissionDenied, 2),
        (Code::Internal, 2),
        (Code::Unknown, 2),
        (Code::DataLoss, 2),
    ];
    for (code, want) in cases {
        let before = s.hits.started();
        let k = key();
        let mut msg = charge("o", 1);
        msg.fail_code = code as i32;
        for _ in 0..2 {
            let got = charge_err(&mut client, keyed(msg.clone(), &k, None), "fails").await;
            assert_eq!(got.code(), code);
        }
        let runs = s.hits.started() - before;
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
    let (_engine, s, mut client) =
        common::serve_engine(Engine::new(MemoryStore::new(100), policy), "slow").await;
    let slow = common::sleeping(2000);
    let k = key();
    let late = charge_err(&mut client, keyed(slow.clone(), &k, None), "timeout").await;
    assert_refused(&late, Code::DeadlineExceeded, "HANDLER_TIMEOUT");
    assert_eq!(s.hits.finished(), 0);
    // Released: the retry runs (and times out) again.
    let _ = charge_err(&mut client, keyed(slow, &k, None), "timeout").await;
    assert_eq!(s.hits.started(), 2);

    // A panic is INTERNAL with HANDLER_PANICKED; the claim is released and the server serves on.
    let k = key();
    let mut boom = charge("o", 1);
    boom.fail_code = common::PANIC;
    for _ in 0..2 {
        let got = charge_err(&mut client, keyed(boom.clone(), &k, None), "panic").await;
        assert_refused(&got, Code::Internal, "HANDLER_PANICKED");
    }
    assert_eq!(s.hits.started(), 4);

    // Under the default `hold` a timed-out handler may have acted: its key is left unknown
    // and the retry runs nothing.
    let policy = Policy::builder()
        .handler_timeout(std::time::Duration::from_millis(200))
        .build()
        .expect("policy");
    let (_engine, s, mut client) =
        common::serve_engine(Engine::new(MemoryStore::new(100), policy), "slow-held").await;
    let slow = common::sleeping(2000);
    let k = key();
    let late = charge_err(&mut client, keyed(slow.clone(), &k, None), "timeout").await;
    assert_eq!(reason(&late), "HANDLER_TIMEOUT");
    let again = charge_err(&mut client, keyed(slow, &k, None), "unknown").await;
    assert_refused(&again, Code::FailedPrecondition, "OUTCOME_UNKNOWN");
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
    let (_engine, s, mut client) = common::serve_engine(Engine::new(store, policy), "lost").await;
    let slow = common::sleeping(1000);
    let lost = charge_err(&mut client, keyed(slow, &key(), None), "lease lost").await;
    assert_refused(&lost, Code::Unavailable, "LEASE_LOST");
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
