//! HTTP/2 through the gateway: h2c and HTTP/1.1 on the same data port, h2 by ALPN on the TLS
//! listener, HTTP/2 to an `h2c://` upstream (a protected route runs once and replays; an
//! unprotected one passes trailers), and an HTTP/1.1 protocol upgrade carried byte for byte
//! through an unprotected route.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::configs::plain_and_protected;
use common::wire::{self, Got};
use common::{Gateway, Http, TempDir, Upstream, key};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_testkit::counting_server::CountingServer;

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// An upstream serving HTTP/2 with prior knowledge (h2c) or HTTP/1.1, per `h2`. `…/grpc`
/// answers like a gRPC server (data, then `grpc-status` trailers), anything else a 201
/// naming the execution and the HTTP version it arrived in.
async fn upstream(h2: bool) -> CountingServer {
    CountingServer::start(move |tcp, count| async move {
        let svc = hyper::service::service_fn(move |req| {
            let count = Arc::clone(&count);
            async move { Ok::<_, hyper::Error>(handle(req, &count).await) }
        });
        if h2 {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        } else {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        }
    })
    .await
}

async fn handle(req: Request<hyper::body::Incoming>, count: &AtomicU64) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let version = format!("{:?}", req.version());
    let body = req.into_body().collect().await.map(|c| c.to_bytes());
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    if path.ends_with("/grpc") {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().expect("value"));
        trailers.insert("grpc-message", "ok".parse().expect("value"));
        let frames = vec![
            Ok(http_body::Frame::data(Bytes::from_static(
                b"\0\0\0\0\x02hi",
            ))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        let mut res = Response::new(StreamBody::new(futures::stream::iter(frames)).boxed());
        res.headers_mut()
            .insert("content-type", "application/grpc".parse().expect("value"));
        return res;
    }
    let text = format!(
        r#"{{"n":{n},"version":"{version}","len":{}}}"#,
        body.map_or(0, |b| b.len())
    );
    let mut res = Response::new(Full::new(Bytes::from(text)).boxed());
    *res.status_mut() = StatusCode::CREATED;
    res.headers_mut()
        .insert("content-type", "application/json".parse().expect("value"));
    res
}

/// Asserts `got` is a `201` in HTTP/2 and returns its JSON body (the upstream's account of
/// the request).
fn created_over_h2(got: &Got) -> serde_json::Value {
    assert_eq!(got.version, Version::HTTP_2);
    assert_eq!(got.status, StatusCode::CREATED);
    serde_json::from_slice(&got.body).expect("json")
}

/// An HTTP/2 `POST` of `{}` to `path` over `send`, with `headers`.
async fn h2_send(
    send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{authority}{path}"))
        .version(Version::HTTP_2);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    Got::read(send.send_request(req).await.expect("response")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_through_the_gateway_to_an_h2c_upstream() {
    let up = upstream(true).await;
    let gw = Gateway::start(&plain_and_protected(&format!("h2c://{}", up.addr), ""), &[]);
    let authority = gw.addr.to_string();
    let mut send = wire::h2c(gw.addr).await;

    // Protected over HTTP/2 on both sides: runs once, the retry is the replay.
    let k = key();
    let headers = [
        ("idempotency-key", k.as_str()),
        ("content-type", "application/json"),
    ];
    let first = h2_send(&mut send, &authority, "/p/charge", &headers).await;
    let json = created_over_h2(&first);
    assert_eq!(
        json["version"], "HTTP/2.0",
        "the upstream was reached over HTTP/2"
    );
    assert_eq!(json["n"], 1);
    let again = h2_send(&mut send, &authority, "/p/charge", &headers).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "{:?}", again.headers);
    assert_eq!(again.body, first.body);
    assert_eq!(up.executions.load(Ordering::SeqCst), 1);

    // Unprotected: a gRPC-shaped answer passes through with its trailers.
    let grpc = h2_send(
        &mut send,
        &authority,
        "/plain/grpc",
        &[("content-type", "application/grpc"), ("te", "trailers")],
    )
    .await;
    assert_eq!(grpc.status, StatusCode::OK);
    assert_eq!(&grpc.body[..], b"\0\0\0\0\x02hi");
    assert!(grpc.trailers.is_some(), "trailers");
    assert_eq!(grpc.trailer("grpc-status"), Some(&b"0"[..]));
    assert_eq!(grpc.trailer("grpc-message"), Some(&b"ok"[..]));

    // HTTP/1.1 on the same port, to the same HTTP/2 upstream.
    let one = Http::new()
        .post(&gw.url("/p/charge"), Some(&key()), "{}")
        .await;
    assert_eq!(one.status, StatusCode::CREATED);
    assert_eq!(one.json()["version"], "HTTP/2.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http11_upgrade_is_carried_through_an_unprotected_route() {
    // The shared upstream answers `…/ws` upgrades with a protocol that echoes every byte.
    let up = Upstream::start().await;
    let gw = Gateway::start(&plain_and_protected(&up.url(), ""), &[]);
    let (mut tcp, head) = tokio::time::timeout(
        Duration::from_secs(10),
        wire::open_tunnel(gw.addr, "/plain/ws"),
    )
    .await
    .expect("101 in time")
    .expect("switched");
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    // Both directions, several times, over the one connection.
    for msg in [&b"hello"[..], b"\x00\x01binary\xff", b"last"] {
        wire::echoes(&mut tcp, msg, Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_by_alpn_on_the_tls_listener() {
    let up = upstream(false).await;
    let dir = TempDir::new("h2-tls");
    let pki = common::pki::issue(&dir.0, "gw");
    let tls = format!(
        r#"tls = {{ cert_file = "{}", key_file = "{}" }}"#,
        pki.server_cert.display(),
        pki.server_key.display()
    );
    let gw = Gateway::start(
        &plain_and_protected(&format!("http://{}", up.addr), &tls),
        &[],
    );
    let tls = wire::tls_connect(gw.addr, &pki.ca, &[b"h2"])
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut send = wire::h2_over(tls).await;
    let k = key();
    let headers = [("idempotency-key", k.as_str())];
    let authority = format!("127.0.0.1:{}", gw.addr.port());
    let first = h2_send(&mut send, &authority, "/p/charge", &headers).await;
    let json = created_over_h2(&first);
    assert_eq!(
        json["version"], "HTTP/1.1",
        "HTTP/1.1 to an upstream not configured for HTTP/2"
    );
    let again = h2_send(&mut send, &authority, "/p/charge", &headers).await;
    assert_eq!(again.body, first.body);
    assert_eq!(up.executions.load(Ordering::SeqCst), 1);
}
