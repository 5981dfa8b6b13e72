//! The same gRPC scenarios over every kind of store: memory, Redis (the shared local server,
//! its own key prefix) and PostgreSQL (its own table). Concurrent duplicates run once,
//! answers are stored with their status, details and trailers and replayed from the store,
//! released statuses run again, and the status service reads the stored answer.

mod common;

use std::time::Duration;

use common::{
    CHARGE, assert_refused, charge, charge_err, charge_ok, default_config, key, keyed, serve,
};
use idem_core::{Engine, Key, Policy, RecordState, Scope, ScopedKey, Store};
use idem_grpc::proto::{LookupRequest, State};
use tonic::Code;
use tonic_types::StatusExt;

async fn scenario<St: Store>(engine: Engine<St>, ns: &str) {
    let s = serve(&engine, default_config(ns)).await;

    // Concurrent duplicates: one run, the others in flight, then the replay.
    let k = key();
    let gated = common::gated("o-1", 100);
    let (mut tasks, refused) = common::duplicates_refused(&s, &gated, &k, 20, "in flight").await;
    for status in refused {
        assert_refused(&status, Code::Aborted, "IN_FLIGHT");
    }
    s.hits.gate.notify_waiters();
    let first = common::next_answer(&mut tasks).await.expect("first");
    let mut client = s.client.clone();
    let replay = charge_ok(&mut client, keyed(gated, &k, Some("alice")), "replay").await;
    assert_eq!(replay.get_ref(), first.get_ref());
    assert_eq!(s.hits.started(), 1);

    // The record holds the message and the `grpc-status` trailer.
    let scoped = ScopedKey::new(
        Scope::new(format!("{ns}.charge"))
            .expect("scope")
            .with_credential(b"alice"),
        Key::new(k.clone()).expect("key"),
    );
    let record = idem_testkit::requests::record_of(engine.store(), &scoped).await;
    let RecordState::Completed { response, .. } = record.state else {
        panic!("not completed: {:?}", record.state);
    };
    assert_eq!(response.status, 0);
    assert!(
        response
            .trailers
            .iter()
            .any(|(n, v)| n == "grpc-status" && v == "0"),
        "{response:?}"
    );

    // A definite failure replays with its code, message and details.
    let k = key();
    let mut failing = charge("o-2", 1);
    failing.fail_code = Code::NotFound as i32;
    let a = charge_err(
        &mut client,
        keyed(failing.clone(), &k, Some("alice")),
        "not found",
    )
    .await;
    let b = charge_err(&mut client, keyed(failing, &k, Some("alice")), "replayed").await;
    assert_eq!((a.code(), b.code()), (Code::NotFound, Code::NotFound));
    assert_eq!((a.message(), a.details()), (b.message(), b.details()));
    assert!(b.get_details_bad_request().is_some());
    assert_eq!(
        b.metadata().get("idempotent-replayed").expect("marked"),
        "true"
    );
    assert_eq!(s.hits.started(), 2);

    // A retryable failure releases the claim: the retry runs again.
    let k = key();
    let mut flaky = charge("o-3", 1);
    flaky.fail_code = Code::Unavailable as i32;
    for _ in 0..2 {
        let e = charge_err(
            &mut client,
            keyed(flaky.clone(), &k, Some("alice")),
            "unavailable",
        )
        .await;
        assert_eq!(e.code(), Code::Unavailable);
    }
    assert_eq!(s.hits.started(), 4);

    // The status service reads the stored answer from the store.
    let mut status = s.status.clone();
    let mut ask = tonic::Request::new(LookupRequest {
        method: CHARGE.into(),
        key: scoped.key.as_str().into(),
    });
    ask.metadata_mut()
        .insert("x-api-key", "alice".parse().expect("ascii"));
    let look = status.lookup(ask).await.expect("lookup").into_inner();
    assert_eq!(look.state, State::Completed as i32);
    assert_eq!(look.answer.expect("answer").messages.len(), 1);
}

fn policy() -> Policy {
    Policy::builder()
        .store_timeout(Duration::from_secs(2))
        .build()
        .expect("policy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store() {
    scenario(common::memory(), "mem").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store() {
    let Some(store) = common::redis().await else {
        return;
    };
    scenario(Engine::new(store, policy()), "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store() {
    let Some(pg) = common::postgres().await else {
        return;
    };
    scenario(Engine::new(pg.store.clone(), policy()), "pg").await;
}
