//! The gRPC layer on a real tonic server over loopback (memory store): concurrent
//! duplicates, replays with status and trailers, keys from metadata and from the message,
//! principals, deadlines, streaming, and the status service.

mod common;

use std::time::Duration;

use common::pb::ChargeRequest;
use common::{
    CHARGE, WATCH, ask, assert_refused, charge, charge_err, charge_ok, default_config, key, keyed,
    lookup, memory, method, reason, serve,
};
use idem_core::key_source::KeySources;
use idem_core::{Engine, MemoryStore, Policy, TakeoverPolicy};
use idem_grpc::GrpcIdempotencyConfig;
use idem_grpc::proto::State;
use tonic::Code;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_duplicates_run_the_handler_once() {
    let engine = memory();
    let s = serve(&engine, default_config("dup")).await;
    let k = key();
    let msg = common::gated("o-1", 100);
    // The winner is held at the gate, so the 49 others must all answer first.
    let (mut tasks, refused) = common::duplicates_refused(
        &s,
        &msg,
        &k,
        50,
        "a duplicate is refused while the first runs",
    )
    .await;
    for status in refused {
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert_eq!(reason(&status), "IN_FLIGHT");
        let retry = status.get_details_retry_info().expect("RetryInfo");
        let delay = retry.retry_delay.expect("a delay");
        assert!(
            delay > Duration::ZERO && delay <= Duration::from_secs(1),
            "{delay:?}"
        );
    }
    assert_eq!(s.hits.started(), 1);
    s.hits.gate.notify_waiters();
    let first = common::next_answer(&mut tasks)
        .await
        .expect("the first call answers");
    assert_eq!(first.get_ref().execution, 1);
    assert!(first.metadata().get("idempotent-replayed").is_none());

    let mut client = s.client.clone();
    let again = charge_ok(&mut client, keyed(msg, &k, Some("alice")), "replay").await;
    assert_eq!(again.get_ref(), first.get_ref(), "the same message");
    assert_eq!(
        again.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert_eq!(s.hits.started(), 1);
}

#[tokio::test]
async fn replays_carry_the_stored_status_message_details_and_trailers() {
    let engine = memory();
    let config = common::charge_config(
        method("replay.charge").replay_metadata(http::HeaderName::from_static("x-charge-id")),
    );
    let s = serve(&engine, config).await;
    let mut client = s.client.clone();

    // A definite failure is stored: its code, message and details come back on replay.
    let mut failing = charge("o-2", 5);
    failing.fail_code = Code::NotFound as i32;
    let k = key();
    let first = charge_err(&mut client, keyed(failing.clone(), &k, None), "not found").await;
    let again = charge_err(&mut client, keyed(failing, &k, None), "replayed not found").await;
    assert_eq!(s.hits.started(), 1);
    assert_eq!(
        (first.code(), again.code()),
        (Code::NotFound, Code::NotFound)
    );
    assert_eq!(again.message(), "failed on execution 1");
    assert_eq!(again.message(), first.message());
    assert_eq!(again.details(), first.details(), "grpc-status-details-bin");
    let bad = again
        .get_details_bad_request()
        .expect("the handler's details");
    assert_eq!(bad.field_violations[0].description, "execution 1");
    assert_eq!(
        again.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );

    // A success replays its message, its allow-listed metadata and `grpc-status: 0`.
    let k = key();
    let ok = charge_ok(&mut client, keyed(charge("o-3", 7), &k, None), "ok").await;
    let replay = charge_ok(&mut client, keyed(charge("o-3", 7), &k, None), "replay").await;
    assert_eq!(s.hits.started(), 2);
    assert_eq!(replay.get_ref(), ok.get_ref());
    assert_eq!(replay.metadata().get("x-charge-id").expect("kept"), "ch-2");

    // The raw replay ends with the stored trailers.
    let raw = common::raw_call(&s.channel, CHARGE, &k, &common::frame(&charge("o-3", 7))).await;
    assert_eq!(raw.trailers.get("grpc-status").expect("trailer"), "0");
    assert_eq!(
        raw.headers.get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert_eq!(s.hits.started(), 2);
}

#[tokio::test]
async fn the_layer_also_wraps_one_service() {
    let engine = memory();
    let s = common::serve_per_service(&engine, default_config("one")).await;
    let mut client = s.client.clone();
    let k = key();
    let a = charge_ok(&mut client, keyed(charge("o", 1), &k, None), "first").await;
    let b = charge_ok(&mut client, keyed(charge("o", 1), &k, None), "replay").await;
    assert_eq!((a.get_ref().execution, b.get_ref().execution), (1, 1));
    assert!(b.metadata().get("idempotent-replayed").is_some());
    let missing = charge_err(&mut client, charge("o", 1), "no key").await;
    assert_eq!(reason(&missing), "KEY_MISSING");
    assert_eq!(s.hits.started(), 1);
}

#[tokio::test]
async fn two_principals_never_share_a_key() {
    let (_engine, s, mut client) = common::serve_memory("who").await;
    let k = key();
    let a = charge_ok(
        &mut client,
        keyed(charge("o", 1), &k, Some("alice")),
        "alice",
    )
    .await;
    let b = charge_ok(&mut client, keyed(charge("o", 1), &k, Some("bob")), "bob").await;
    assert_eq!((a.get_ref().execution, b.get_ref().execution), (1, 2));
    let a2 = charge_ok(
        &mut client,
        keyed(charge("o", 1), &k, Some("alice")),
        "alice again",
    )
    .await;
    assert_eq!(a2.get_ref().execution, 1);
    assert_eq!(s.hits.started(), 2);
}

#[tokio::test]
async fn the_key_can_come_from_a_field_of_the_message() {
    let engine = memory();
    // The client's metadata key if it sends one, else the order id (field 1.1) and "pay".
    let sources =
        KeySources::parse(&["header:idempotency-key", "{proto.1.1}:pay"]).expect("sources");
    let config = common::charge_config(method("field.charge").key(sources));
    let s = serve(&engine, config).await;
    let mut client = s.client.clone();
    let first = charge_ok(&mut client, charge("order-9", 10), "first").await;
    let again = charge_ok(&mut client, charge("order-9", 10), "again").await;
    assert_eq!(
        (first.get_ref().execution, again.get_ref().execution),
        (1, 1)
    );
    assert!(again.metadata().get("idempotent-replayed").is_some());
    // The same order charged another amount is the same key with another request.
    let other = charge_err(&mut client, charge("order-9", 11), "mismatch").await;
    assert_refused(&other, Code::FailedPrecondition, "KEY_REUSED");
    // No order id and no metadata key: refused, naming where the key was looked for.
    let none = charge_err(&mut client, ChargeRequest::default(), "no key").await;
    assert_refused(&none, Code::InvalidArgument, "KEY_MISSING");
    assert!(none.message().contains("proto.1.1"), "{}", none.message());
    assert_eq!(s.hits.started(), 1);
}

#[tokio::test]
async fn the_callers_deadline_bounds_the_handler_and_the_lease() {
    // Under `reexecute`, where the lease must cover the handler: a cancelled run is released
    // as retryable and the lease is cut to the deadline plus the margin. (Under the default
    // `hold` the lease is short anyway, and a cancelled run is left unknown.)
    let engine = Engine::new(
        MemoryStore::new(10_000),
        Policy::builder()
            .takeover(TakeoverPolicy::Reexecute)
            .build()
            .expect("policy"),
    );
    let s = serve(&engine, default_config("deadline")).await;
    let k = key();
    let mut slow = charge("o-d", 1);
    slow.sleep_ms = 1500;
    let mut req = keyed(slow.clone(), &k, None);
    req.set_timeout(Duration::from_millis(300));
    let mut client = s.client.clone();
    let started = s.hits.on_start.notified();
    let call = tokio::spawn(async move { client.charge(req).await });
    started.await;

    // While it runs, the lease covers the caller's deadline plus the 15 s margin, not the
    // method's 45 s default.
    let mut status = s.status.clone();
    let look = lookup(&mut status, ask(CHARGE, &k)).await;
    assert_eq!(look.state, State::InFlight as i32);
    let lease = look.lease_until_ms - look.created_at_ms;
    assert!((15_000..20_000).contains(&lease), "lease {lease} ms");

    let err = call.await.expect("join").expect_err("past the deadline");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    // The handler is cancelled at the deadline and the claim released, so the key reads
    // absent again (no lease left to run out) while the handler never reached its end.
    let mut absent = false;
    for _ in 0..100 {
        let look = lookup(&mut status, ask(CHARGE, &k)).await;
        if look.state == State::Absent as i32 {
            absent = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(absent, "the claim was released");
    assert_eq!(s.hits.finished(), 0, "the handler was cancelled");
    // A retry runs again.
    let mut client = s.client.clone();
    slow.sleep_ms = 1500;
    let again = charge_ok(&mut client, keyed(slow, &k, None), "retry runs").await;
    assert_eq!(again.get_ref().execution, 2);
}

/// Calls `Watch` for order `o-s` with key `k` and collects every message.
async fn watch_all(
    client: &mut common::pb::payments_client::PaymentsClient<tonic::transport::Channel>,
    k: &str,
) -> Vec<common::pb::ChargeReply> {
    use tokio_stream::StreamExt;
    let stream = client
        .watch(keyed(charge("o-s", 1), k, None))
        .await
        .expect("watch")
        .into_inner();
    stream.collect::<Result<_, _>>().await.expect("messages")
}

#[tokio::test]
async fn streaming_methods_pass_through_unless_configured() {
    let (engine, _s, mut client) = common::serve_memory("stream").await;
    let k = key();
    for n in 1..=2u64 {
        let got = watch_all(&mut client, &k).await;
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].execution, n, "unprotected: every call runs");
    }

    let config = GrpcIdempotencyConfig::new()
        .method(WATCH, method("stream.watch"))
        .expect("path");
    let s = serve(&engine, config).await;
    let mut client = s.client.clone();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let got = watch_all(&mut client, &k).await;
        answers.push(got);
    }
    assert_eq!(
        s.hits.started(),
        1,
        "configured: buffered, stored and replayed"
    );
    assert_eq!(answers[0].len(), 3);
    assert_eq!(answers[0], answers[1]);
}

#[tokio::test]
async fn the_status_service_answers_absent_in_flight_completed_and_unknown() {
    let engine = memory();
    let config = common::charge_config(
        method("status.charge")
            .store_policy(idem_grpc::StoreDeterministic::new().ambiguous_as_unknown()),
    );
    let s = serve(&engine, config).await;
    let mut status = s.status.clone();
    let ask_as = |key: &str, who: &str| {
        let mut req = ask(CHARGE, key);
        req.metadata_mut()
            .insert("x-api-key", who.parse().expect("ascii"));
        req
    };
    let k = key();
    let look = lookup(&mut status, ask_as(&k, "alice")).await;
    assert_eq!(look.state, State::Absent as i32);

    let gated = common::gated("o-q", 3);
    let mut client = s.client.clone();
    let started = s.hits.on_start.notified();
    let (gk, g) = (k.clone(), gated.clone());
    let call = tokio::spawn(async move { client.charge(keyed(g, &gk, Some("alice"))).await });
    started.await;
    let look = lookup(&mut status, ask_as(&k, "alice")).await;
    assert_eq!(look.state, State::InFlight as i32);
    assert!(look.lease_until_ms > 0);
    // Another principal asking about the same key sees nothing.
    let other = lookup(&mut status, ask_as(&k, "mallory")).await;
    assert_eq!(other.state, State::Absent as i32);

    s.hits.gate.notify_waiters();
    let reply = call.await.expect("join").expect("answer").into_inner();
    let look = lookup(&mut status, ask_as(&k, "alice")).await;
    assert_eq!(look.state, State::Completed as i32);
    let answer = look.answer.expect("the stored answer");
    assert_eq!(answer.code, 0);
    assert_eq!(answer.messages.len(), 1);
    let decoded = <common::pb::ChargeReply as prost::Message>::decode(&answer.messages[0][..])
        .expect("the stored message");
    assert_eq!(decoded, reply);

    // An ambiguous failure (under `ambiguous_as_unknown`) leaves the key unknown.
    let k = key();
    let mut ambiguous = charge("o-u", 1);
    ambiguous.fail_code = Code::DeadlineExceeded as i32;
    let mut client = s.client.clone();
    let _ = charge_err(
        &mut client,
        keyed(ambiguous, &k, Some("alice")),
        "handler failed",
    )
    .await;
    let look = lookup(&mut status, ask_as(&k, "alice")).await;
    assert_eq!(look.state, State::Unknown as i32);

    // A method this server does not protect, and a malformed key, are refused.
    let bad = status
        .lookup(ask("/x.Y/Z", &k))
        .await
        .expect_err("unknown method");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let bad = status.lookup(ask(CHARGE, "")).await.expect_err("empty key");
    assert_eq!(bad.code(), Code::InvalidArgument);
}
