//! The layer on a plain hyper stack (no axum): a real TCP server and client.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use idem_core::{Engine, MemoryStore, Policy};
use idem_http::{IdempotencyConfig, IdempotencyLayer, RequestBody};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};

#[tokio::test]
async fn hyper_server_replays_and_refuses_bad_keys() -> anyhow::Result<()> {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = tower::service_fn(move |req: Request<RequestBody>| {
        let counter = Arc::clone(&counter);
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let body = req
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let text = format!("run {n}: {} bytes", body.len());
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(text)))
                    .expect("response"),
            )
        }
    });
    let engine = Engine::new(MemoryStore::new(1000), Policy::default());
    let svc = IdempotencyLayer::new(&engine, IdempotencyConfig::new("hyper.test")?).layer(handler);

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let hyper_svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    svc.clone().oneshot(req.map(RequestBody::new))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_svc)
                    .await;
            });
        }
    });

    let (mut client, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(TcpStream::connect(addr).await?))
            .await?;
    tokio::spawn(conn);
    let mut send = async |key: &str,
                          body: &'static str|
           -> anyhow::Result<(StatusCode, http::HeaderMap, Bytes)> {
        let req = Request::post("/charge")
            .header("host", "test")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body)))?;
        let res = client.send_request(req).await?;
        let (parts, body) = res.into_parts();
        Ok((
            parts.status,
            parts.headers,
            body.collect().await?.to_bytes(),
        ))
    };

    let (status, _, first) = send("h1", "{\"a\":1}").await?;
    assert_eq!(
        (status, &first[..]),
        (StatusCode::CREATED, &b"run 1: 7 bytes"[..])
    );
    let (status, headers, again) = send("h1", "{ \"a\": 1 }").await?;
    assert_eq!((status, &again[..]), (StatusCode::CREATED, &first[..]));
    assert_eq!(headers["idempotent-replayed"], "true");
    let (status, _, _) = send("h1", "{\"a\":2}").await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, _) = send("a, b", "{}").await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.abort();
    Ok(())
}
