//! The gRPC client layer against a real tonic server with idem-grpc's layer, on loopback, on
//! the memory, Redis and PostgreSQL stores.
//!
//! Duplicates at once run once (the second is told `ABORTED` with retry info and waits); a
//! connection reset before sending is asked about, found absent and sent again; a completed
//! key asked about comes back as the stored answer; without a status service the caller is
//! told the outcome cannot be known; a client that makes a new key per attempt runs twice.
//! The faults between client and server (lost answers, delays) are in `grpc_faults.rs`.
#![cfg(feature = "grpc")]

mod common;

use std::time::Duration;

use common::{StoreKind, channel_to, key, replayed, request, retrying, start};
use idem_client::grpc::GrpcRetryLayer;
use idem_grpc::proto::status_client::StatusClient;
use idem_testkit::fault_proxy::{Fault, FaultProxy};

const WAIT: Duration = Duration::from_secs(5);

async fn duplicates_at_once_run_once_and_share_the_answer(kind: StoreKind) {
    let Some(s) = start(kind, Duration::from_millis(600)).await else {
        return;
    };
    let key = key();
    let (mut a, mut b) = (
        retrying(&s, s.business.clone(), WAIT),
        retrying(&s, s.business.clone(), WAIT),
    );
    let (ra, rb) = tokio::join!(a.lookup(request(Some(&key))), b.lookup(request(Some(&key))));
    let (ra, rb) = (ra.expect("an answer"), rb.expect("an answer"));
    assert_eq!(ra.get_ref().created_at_ms, 1);
    assert_eq!(rb.get_ref().created_at_ms, 1, "the same first answer");
    assert!(replayed(&ra) != replayed(&rb), "one ran, one was replayed");
    assert_eq!(s.runs(), 1, "exactly one execution");
}

async fn a_reset_before_sending_is_asked_about_then_sent_again(kind: StoreKind) {
    let Some(s) = start(kind, Duration::ZERO).await else {
        return;
    };
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let reply = retrying(&s, channel_to(proxy.addr()), WAIT)
        .lookup(request(None))
        .await
        .expect("an answer");
    assert_eq!(reply.get_ref().created_at_ms, 1);
    assert!(!replayed(&reply), "the answer of the one run");
    assert_eq!(s.runs(), 1, "exactly one execution");
    assert_eq!(
        proxy.applied().await,
        [Fault::ResetBeforeSending, Fault::Pass]
    );
}

/// A key that already completed, asked about after a reset: the stored answer comes back
/// from the status service, rebuilt as the response the generated client decodes.
async fn a_completed_key_is_answered_from_the_status_service(kind: StoreKind) {
    let Some(s) = start(kind, Duration::ZERO).await else {
        return;
    };
    let key = key();
    let mut direct = StatusClient::new(s.business.clone());
    let first = direct.lookup(request(Some(&key))).await.expect("first");
    assert_eq!(first.get_ref().created_at_ms, 1);
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let reply = retrying(&s, channel_to(proxy.addr()), WAIT)
        .lookup(request(Some(&key)))
        .await
        .expect("the stored answer");
    assert_eq!(reply.get_ref().created_at_ms, 1, "the first answer");
    assert!(replayed(&reply));
    assert_eq!(proxy.applied().await, [Fault::ResetBeforeSending]);
    assert_eq!(s.runs(), 1, "exactly one execution");
}

async fn without_a_status_service_the_caller_is_told_it_cannot_be_known(kind: StoreKind) {
    let Some(s) = start(kind, Duration::ZERO).await else {
        return;
    };
    let proxy = FaultProxy::start(s.business_addr, [Fault::ResetBeforeSending])
        .await
        .expect("proxy");
    let channel = tower::ServiceBuilder::new()
        .layer(GrpcRetryLayer::new(common::retry_policy(WAIT)))
        .service(channel_to(proxy.addr()));
    let err = StatusClient::new(channel)
        .lookup(request(None))
        .await
        .expect_err("ambiguous");
    let source = std::error::Error::source(&err).expect("the client error");
    assert!(
        matches!(
            source.downcast_ref::<idem_client::ClientError>(),
            Some(idem_client::ClientError::Ambiguous { .. })
        ),
        "{err}"
    );
    assert_eq!(s.runs(), 0, "not sent again");
}

on_every_store!(
    duplicates_at_once_run_once_and_share_the_answer,
    a_reset_before_sending_is_asked_about_then_sent_again,
    a_completed_key_is_answered_from_the_status_service,
    without_a_status_service_the_caller_is_told_it_cannot_be_known,
);

/// The unsafe variant: a client that makes a new key for every attempt starts the call
/// again each time it gives up waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_key_per_attempt_runs_twice() {
    let s = start(StoreKind::Memory, Duration::from_millis(900))
        .await
        .expect("memory");
    let mut raw = StatusClient::new(s.business.clone());
    for _ in 0..2 {
        let mut req = request(Some(&key()));
        req.set_timeout(Duration::from_millis(300));
        let _ = raw.lookup(req).await;
    }
    assert_eq!(s.runs(), 2, "the fresh-key client ran twice");
}
