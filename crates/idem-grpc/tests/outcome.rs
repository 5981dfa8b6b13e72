//! The layer attaches what became of each call (`idem_core::Outcome`) to its response as an
//! extension, for metrics and logs outside it, as the HTTP layer does; nobody works it out
//! again from the status.

mod common;

use std::sync::Arc;

use common::pb::payments_server::PaymentsServer;
use common::{App, CHARGE, ECHO, Hits, charge, default_config, frame, memory};
use idem_core::{Kept, Outcome, Refusal};
use idem_grpc::GrpcIdempotencyLayer;
use tower::{Layer, ServiceExt};

fn call(path: &str, key: Option<&str>, body: &[u8]) -> http::Request<tonic::body::Body> {
    let mut b = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(tonic::body::Body::new(http_body_util::Full::new(
        bytes::Bytes::copy_from_slice(body),
    )))
    .expect("request")
}

#[tokio::test]
async fn every_response_carries_its_outcome() {
    let engine = memory();
    let layer = GrpcIdempotencyLayer::new(&engine, default_config("outcome"));
    let svc = layer.layer(PaymentsServer::new(App(Arc::new(Hits::default()))));
    let msg = frame(&charge("o", 1));
    let outcome = |res: &http::Response<_>| res.extensions().get::<Outcome>().copied();
    let send = async |path, key, msg: &[u8]| {
        svc.clone()
            .oneshot(call(path, key, msg))
            .await
            .expect("call")
    };

    let first = send(CHARGE, Some("k"), &msg).await;
    assert_eq!(outcome(&first), Some(Outcome::Executed(Kept::Stored)));
    let again = send(CHARGE, Some("k"), &msg).await;
    assert_eq!(outcome(&again), Some(Outcome::Replayed));
    let other = frame(&charge("o", 2));
    let reused = send(CHARGE, Some("k"), &other).await;
    assert_eq!(outcome(&reused), Some(Outcome::Mismatch));
    let none = send(CHARGE, None, &msg).await;
    assert_eq!(outcome(&none), Some(Outcome::Refused(Refusal::KeyMissing)));
    let plain = send(ECHO, Some("k"), &msg).await;
    assert_eq!(outcome(&plain), Some(Outcome::Passthrough));
}
