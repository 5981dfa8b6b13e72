//! Responses that end with trailers: the first answer and every replay carry them, and the
//! store keeps them. (Guards a layer that kept the body but dropped the trailers, so a
//! replayed gRPC-over-HTTP answer lost its `grpc-status`.)

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use idem_core::{Engine, Key, MemoryStore, Policy, RecordState, Scope, ScopedKey};
use idem_http::{
    IdempotencyConfig, IdempotencyLayer, RequestBody, ResponseBody, StreamingResponses,
};
use tower::{Layer, Service, ServiceExt};

fn trailers(n: usize) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t.insert("x-checksum", HeaderValue::from(n));
    // Framing fields belong to one connection and are never kept.
    t.insert("connection", HeaderValue::from_static("close"));
    t
}

struct Got {
    status: u16,
    replayed: bool,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

async fn send<S, B>(svc: &S, key: &str) -> Got
where
    S: Service<Request<RequestBody>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let req = Request::post("/pay")
        .header("idempotency-key", key)
        .body(RequestBody::from(Bytes::from_static(b"{}")))
        .expect("request");
    let res = svc.clone().oneshot(req).await.expect("infallible");
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let collected = res.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned();
    Got {
        status,
        replayed,
        body: collected.to_bytes(),
        trailers,
    }
}

async fn stored_trailers(
    engine: &Engine<MemoryStore>,
    ns: &str,
    key: &str,
) -> Vec<(String, Bytes)> {
    let scoped = ScopedKey::new(Scope::new(ns).expect("scope"), Key::new(key).expect("key"));
    let record = idem_testkit::requests::record_of(engine.store(), &scoped).await;
    match record.state {
        RecordState::Completed { response, .. } => response.trailers,
        other => panic!("not completed: {other:?}"),
    }
}

#[tokio::test]
async fn a_body_of_known_length_with_trailers_replays_them() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = tower::service_fn(move |_req: Request<RequestBody>| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let body =
                ResponseBody::<Empty<Bytes>>::full_with_trailers(format!("run {n}"), trailers(n));
            Ok::<_, Infallible>(Response::new(body))
        }
    });
    let engine = Engine::new(MemoryStore::new(100), Policy::default());
    let svc = IdempotencyLayer::new(&engine, IdempotencyConfig::new("t.known").expect("ns"))
        .layer(handler);

    let first = send(&svc, "k1").await;
    let replay = send(&svc, "k1").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(!first.replayed && replay.replayed);
    assert_eq!((first.status, replay.status), (200, 200));
    assert_eq!(first.body, "run 1");
    assert_eq!(replay.body, first.body);
    let t = first.trailers.expect("first answer has trailers");
    assert_eq!(t["x-checksum"], "1");
    let r = replay.trailers.expect("replay has trailers");
    assert_eq!(r["grpc-status"], "0");
    assert_eq!(r["x-checksum"], "1");
    assert!(!r.contains_key("connection"), "framing never replayed");
    assert_eq!(
        stored_trailers(&engine, "t.known", "k1").await,
        vec![
            ("grpc-status".to_owned(), Bytes::from_static(b"0")),
            ("x-checksum".to_owned(), Bytes::from_static(b"1")),
        ]
    );
}

#[tokio::test]
async fn a_streamed_body_with_trailers_is_buffered_and_replayed_with_them() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = tower::service_fn(move |_req: Request<RequestBody>| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from_static(b"part one, "))),
                Ok(Frame::data(Bytes::from(format!("run {n}")))),
                Ok(Frame::trailers(trailers(n))),
            ];
            let body = StreamBody::new(futures::stream::iter(frames));
            Ok::<_, Infallible>(Response::new(body))
        }
    });
    let engine = Engine::new(MemoryStore::new(100), Policy::default());
    let config = IdempotencyConfig::new("t.stream")
        .expect("ns")
        .streaming(StreamingResponses::Buffer);
    let svc = IdempotencyLayer::new(&engine, config).layer(handler);

    let first = send(&svc, "k2").await;
    let replay = send(&svc, "k2").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(replay.replayed);
    assert_eq!(first.body, "part one, run 1");
    assert_eq!(replay.body, first.body);
    assert_eq!(first.trailers.expect("first")["x-checksum"], "1");
    assert_eq!(replay.trailers.expect("replay")["x-checksum"], "1");
    assert_eq!(stored_trailers(&engine, "t.stream", "k2").await.len(), 2);
}
