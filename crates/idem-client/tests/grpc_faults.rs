//! The gRPC client layer through an HTTP/2 fault proxy (`idem_testkit::h2_fault`) to a real
//! tonic server with idem-grpc's layer, on the memory, Redis and PostgreSQL stores. The proxy
//! works per call, so it can lose one call's answer after the server acted, which a
//! byte-level proxy cannot do on an HTTP/2 connection.
//!
//! Every scenario ends with exactly one execution (counted when the handler starts) and the
//! client holding the first answer: the answer lost after the server acted (stream reset, or
//! the whole connection dropped) is fetched from the status service; a call reset before it
//! reached the server is sent again; a call held past the client's wait arrives after the
//! retry and is answered from the record; an answer, or a handler, slower than the attempt
//! timeout is found by the status query; every answer lost still ends with the first one.
//!
//! The unsafe clients live at the end of this file and fail the same scenarios: one that
//! makes a new key per attempt runs twice; one that keeps its key but never asks the status
//! service ends without the answer of a call that ran.
#![cfg(feature = "grpc")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{StoreKind, channel_to, key, replayed, request, retrying, start};
use idem_grpc::proto::LookupResponse;
use idem_grpc::proto::status_client::StatusClient;
use idem_testkit::h2_fault::{H2Fault, H2FaultProxy, Matcher};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(5);

/// Faults hit calls of the protected method only.
fn protected() -> Matcher {
    Arc::new(|p: &http::request::Parts| p.uri.path() == common::METHOD)
}

async fn proxy(s: &common::Servers, plan: impl IntoIterator<Item = H2Fault>) -> H2FaultProxy {
    H2FaultProxy::start_matching(s.business_addr, protected(), plan)
        .await
        .expect("proxy")
}

/// The answer is the first execution's, and there was exactly one.
fn assert_first_answer(reply: &tonic::Response<LookupResponse>, s: &common::Servers) {
    assert_eq!(reply.get_ref().created_at_ms, 1, "the first answer");
    assert_eq!(s.runs(), 1, "exactly one execution");
}

/// One call by the client under test, waiting `wait` per attempt, through a proxy with
/// `plan` to servers whose handler takes `handler`; the servers, the proxy and the answer,
/// checked to be the first execution's and the only one. `None` where the store is not
/// running.
async fn one_call(
    kind: StoreKind,
    handler: Duration,
    plan: impl IntoIterator<Item = H2Fault>,
    wait: Duration,
) -> Option<(
    common::Servers,
    H2FaultProxy,
    tonic::Response<LookupResponse>,
)> {
    let s = start(kind, handler).await?;
    let p = proxy(&s, plan).await;
    let reply = retrying(&s, channel_to(p.addr()), wait)
        .lookup(request(None))
        .await
        .expect("an answer");
    assert_first_answer(&reply, &s);
    Some((s, p, reply))
}

/// The answer is the stored one, fetched from the status service, and the call was not
/// sent again.
fn assert_from_status_sent_once(reply: &tonic::Response<LookupResponse>, p: &H2FaultProxy) {
    assert!(
        replayed(reply),
        "the stored answer, from the status service"
    );
    assert_eq!(p.forwarded(), 1, "nothing sent again");
}

async fn an_answer_lost_after_the_server_acted_is_fetched_from_the_status_service(kind: StoreKind) {
    let Some((_s, p, reply)) =
        one_call(kind, Duration::ZERO, [H2Fault::ResetAfterAnswer], WAIT).await
    else {
        return;
    };
    assert_from_status_sent_once(&reply, &p);
    assert_eq!(p.applied().await, [H2Fault::ResetAfterAnswer]);
}

async fn a_connection_dropped_after_the_server_acted_loses_nothing(kind: StoreKind) {
    let Some((_s, p, reply)) =
        one_call(kind, Duration::ZERO, [H2Fault::DropAfterAnswer], WAIT).await
    else {
        return;
    };
    assert_from_status_sent_once(&reply, &p);
}

async fn a_call_reset_before_sending_is_sent_again(kind: StoreKind) {
    let Some((_s, p, reply)) =
        one_call(kind, Duration::ZERO, [H2Fault::ResetBeforeSending], WAIT).await
    else {
        return;
    };
    assert!(!replayed(&reply), "the answer of the one run, sent again");
    assert_eq!(
        p.applied().await,
        [H2Fault::ResetBeforeSending, H2Fault::Pass]
    );
}

/// The first call is held past the client's wait and reaches the server after the retry ran:
/// it is answered from the record, never run.
async fn a_call_arriving_after_its_retry_is_not_run_again(kind: StoreKind) {
    let held = H2Fault::Delay(Duration::from_millis(1500));
    let Some((s, p, _)) = one_call(kind, Duration::ZERO, [held], Duration::from_millis(400)).await
    else {
        return;
    };
    assert!(
        p.settled(Duration::from_secs(10)).await,
        "the late call was answered"
    );
    assert_eq!(p.forwarded(), 2, "the late call reached the server");
    assert_eq!(s.runs(), 1, "and did not run again");
}

/// The server acted at once; its answer is slower than the client waits.
async fn an_answer_slower_than_the_attempt_timeout_is_fetched_from_the_status_service(
    kind: StoreKind,
) {
    let slow = H2Fault::DelayAnswer(Duration::from_millis(1500));
    let Some((_s, p, reply)) =
        one_call(kind, Duration::ZERO, [slow], Duration::from_millis(300)).await
    else {
        return;
    };
    assert_from_status_sent_once(&reply, &p);
}

/// The handler itself is slower than the attempt timeout: the server is told the operation's
/// deadline, so the run is left to finish; the status query finds it in flight, then
/// completed.
async fn a_handler_slower_than_the_attempt_timeout_runs_once(kind: StoreKind) {
    let Some((_s, p, reply)) = one_call(
        kind,
        Duration::from_millis(1200),
        [],
        Duration::from_millis(300),
    )
    .await
    else {
        return;
    };
    assert_from_status_sent_once(&reply, &p);
}

async fn every_answer_lost_still_ends_with_the_first_one(kind: StoreKind) {
    let Some((_s, _p, reply)) =
        one_call(kind, Duration::ZERO, [H2Fault::ResetAfterAnswer; 5], WAIT).await
    else {
        return;
    };
    assert!(replayed(&reply));
}

on_every_store!(
    an_answer_lost_after_the_server_acted_is_fetched_from_the_status_service,
    a_connection_dropped_after_the_server_acted_loses_nothing,
    a_call_reset_before_sending_is_sent_again,
    a_call_arriving_after_its_retry_is_not_run_again,
    an_answer_slower_than_the_attempt_timeout_is_fetched_from_the_status_service,
    a_handler_slower_than_the_attempt_timeout_runs_once,
    every_answer_lost_still_ends_with_the_first_one,
);

// The unsafe clients, each shown to fail a scenario above.

/// How an unsafe client retries.
#[derive(Clone, Copy)]
enum Unsafe {
    /// A new key for every attempt.
    FreshKey,
    /// One key, retried blindly: it never asks the status service.
    SameKeyNoStatus,
    /// One key, no status query, and its per-attempt wait sent as the call's deadline.
    SameKeyAttemptDeadline,
}

/// Up to `attempts` calls through `channel`, each waited for `wait`; the first answer that
/// arrives, if any.
async fn unsafe_client(
    how: Unsafe,
    channel: Channel,
    attempts: usize,
    wait: Duration,
) -> Option<LookupResponse> {
    let mut client = StatusClient::new(channel);
    let one_key = key();
    for _ in 0..attempts {
        let mut req = match how {
            Unsafe::FreshKey => request(Some(&key())),
            Unsafe::SameKeyNoStatus | Unsafe::SameKeyAttemptDeadline => request(Some(&one_key)),
        };
        req.set_timeout(match how {
            Unsafe::SameKeyAttemptDeadline => wait,
            Unsafe::FreshKey | Unsafe::SameKeyNoStatus => Duration::from_secs(15),
        });
        if let Ok(Ok(reply)) = tokio::time::timeout(wait, client.lookup(req)).await {
            return Some(reply.into_inner());
        }
        // Long enough for a cancelled run's claim to be released before the next attempt.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Servers on the memory store behind a proxy with `plan`.
async fn on_memory_behind(
    plan: impl IntoIterator<Item = H2Fault>,
) -> (common::Servers, H2FaultProxy) {
    let s = start(StoreKind::Memory, Duration::ZERO)
        .await
        .expect("memory");
    let p = proxy(&s, plan).await;
    (s, p)
}

/// A new key per attempt: an answer lost after the server acted becomes a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_fresh_key_runs_twice_when_the_answer_is_lost() {
    let (s, p) = on_memory_behind([H2Fault::ResetAfterAnswer]).await;
    let reply = unsafe_client(Unsafe::FreshKey, channel_to(p.addr()), 3, WAIT)
        .await
        .expect("the second attempt got through");
    assert_eq!(reply.created_at_ms, 2, "the answer of a second run");
    assert_eq!(s.runs(), 2, "the fresh-key client ran twice");
}

/// A new key per attempt: a call held past the client's wait arrives after the retry and
/// runs as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_fresh_key_runs_twice_when_the_call_arrives_late() {
    let (s, p) = on_memory_behind([H2Fault::Delay(Duration::from_millis(1500))]).await;
    let reply = unsafe_client(
        Unsafe::FreshKey,
        channel_to(p.addr()),
        3,
        Duration::from_millis(400),
    )
    .await;
    assert!(reply.is_some(), "the retry got through");
    assert!(p.settled(Duration::from_secs(10)).await);
    assert_eq!(s.runs(), 2, "the late call ran too");
}

/// A new key per attempt: an answer slower than the client waits becomes a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_fresh_key_runs_twice_when_the_answer_is_slow() {
    let (s, p) = on_memory_behind([H2Fault::DelayAnswer(Duration::from_millis(1500))]).await;
    let reply = unsafe_client(
        Unsafe::FreshKey,
        channel_to(p.addr()),
        3,
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(
        reply.map(|r| r.created_at_ms),
        Some(2),
        "a second run answered"
    );
    assert_eq!(s.runs(), 2, "the fresh-key client ran twice");
}

/// One key, no status query: when every answer is lost it gives up, though the call ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_same_key_without_status_query_loses_the_answer() {
    let (s, p) = on_memory_behind([H2Fault::ResetAfterAnswer; 5]).await;
    let reply = unsafe_client(Unsafe::SameKeyNoStatus, channel_to(p.addr()), 5, WAIT).await;
    assert!(reply.is_none(), "no answer reached the client");
    assert_eq!(s.runs(), 1, "yet the call ran");
    assert_eq!(p.forwarded(), 5, "and every retry was sent (and replayed)");
}

/// One key, no status query, its attempt wait sent as the deadline: a handler slower than
/// that is cancelled by the server, and the client never gets an answer. (On a server that
/// re-runs an interrupted handler, `takeover = reexecute`, every attempt would start it
/// again; under the default `hold` the cancelled run leaves the key unknown, so it ran once
/// and then refuses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_attempt_deadline_cancels_a_slow_handler_and_never_answers() {
    let s = start(StoreKind::Memory, Duration::from_millis(1200))
        .await
        .expect("memory");
    let reply = unsafe_client(
        Unsafe::SameKeyAttemptDeadline,
        s.business.clone(),
        5,
        Duration::from_millis(300),
    )
    .await;
    assert!(reply.is_none(), "no attempt lived long enough to answer");
    assert_eq!(s.runs(), 1, "cancelled once, then held unknown");
}
