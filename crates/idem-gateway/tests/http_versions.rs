//! HTTP framing through the gateway, byte by byte: the client's HTTP version whatever the
//! upstream's, chunked upstream answers, trailers, and `Expect: 100-continue`. The upstream
//! here writes its answers by hand, so each case is exactly the framing under test.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::wire::{self, Got, raw};
use common::{Gateway, configs, key};
use http::{Method, Request, StatusCode, Version};
use http_body_util::Full;
use idem_testkit::counting_server::CountingServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upstream that answers by path with hand-written bytes and counts executions:
/// `…/http10` (an HTTP/1.0 answer delimited by close), `…/chunked` (three chunks),
/// `…/trailers` (chunks, then a `x-checksum` trailer), anything else a plain 201.
async fn raw_upstream() -> CountingServer {
    CountingServer::start(|stream, count| async move {
        let _ = answer(stream, &count).await;
    })
    .await
}

/// The JSON body the raw upstream answers its `n`th request with.
fn answer_body(n: u64) -> String {
    format!(r#"{{"n":{n},"parts":["alpha","beta","gamma"]}}"#)
}

/// Reads one request (head and `Content-Length` body) and writes the answer for its path,
/// then closes the connection.
async fn answer(mut stream: TcpStream, count: &AtomicU64) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_owned();
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    let body = answer_body(n);
    let out = if path.ends_with("/http10") {
        format!("HTTP/1.0 201 Created\r\nContent-Type: application/json\r\n\r\n{body}")
    } else if path.ends_with("/chunked") || path.ends_with("/trailers") {
        let trailers = path.ends_with("/trailers");
        let mut out = String::from(
            "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n",
        );
        if trailers {
            out.push_str("Trailer: x-checksum\r\n");
        }
        out.push_str("\r\n");
        let (a, rest) = body.split_at(7);
        let (b, c) = rest.split_at(11);
        for part in [a, b, c] {
            out.push_str(&format!("{:x}\r\n{part}\r\n", part.len()));
        }
        out.push_str("0\r\n");
        if trailers {
            out.push_str(&format!("x-checksum: sum-{n}\r\n"));
        }
        out.push_str("\r\n");
        out
    } else {
        format!(
            "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

/// The hand-written upstream and a gateway in front of it with the `/plain/*` and `/p/*`
/// routes.
async fn start() -> (CountingServer, Gateway) {
    let up = raw_upstream().await;
    let gw = Gateway::start(
        &configs::plain_and_protected(&format!("http://{}", up.addr), ""),
        &[],
    );
    (up, gw)
}

/// One request over a fresh HTTP/1.1 connection that accepts trailers.
async fn exchange(addr: SocketAddr, path: &str, key: Option<&str>) -> Got {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut send = wire::h1_over(tcp).await.expect("handshake");
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "gateway")
        .header("te", "trailers")
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let req = req
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    Got::read(send.send_request(req).await.expect("response")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_upstream_is_answered_in_the_clients_version() {
    let (up, gw) = start().await;
    let k = key();
    let request = format!(
        "POST /p/http10 HTTP/1.1\r\nHost: gateway\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let first = raw(gw.addr, &request).await;
    assert!(first.starts_with("HTTP/1.1 201 "), "{first}");
    let again = raw(gw.addr, &request).await;
    assert!(again.starts_with("HTTP/1.1 201 "), "{again}");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{again}"
    );
    let body = |text: &str| text.split("\r\n\r\n").nth(1).map(str::to_owned);
    assert_eq!(body(&first), body(&again));
    assert_eq!(up.count(), 1);

    // Unprotected too, and with the hyper client reading the status line.
    let plain = exchange(gw.addr, "/plain/http10", None).await;
    assert_eq!(plain.version, Version::HTTP_11);
    assert_eq!(plain.status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_answers_replay_byte_identical() {
    let (up, gw) = start().await;
    let k = key();
    let first = exchange(gw.addr, "/p/chunked", Some(&k)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body,
        Bytes::from(answer_body(1)),
        "the chunks joined, nothing more"
    );
    let again = exchange(gw.addr, "/p/chunked", Some(&k)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "{:?}", again.headers);
    assert_eq!(again.body, first.body, "byte-identical replay");
    assert_eq!(up.count(), 1);
    // Framing is per hop: neither answer repeats the upstream's `Transfer-Encoding` header
    // besides the framing hyper chose for this connection.
    for got in [&first, &again] {
        let te: Vec<_> = got.headers.get_all("transfer-encoding").iter().collect();
        assert!(te.len() <= 1, "{te:?}");
    }

    let streamed = exchange(gw.addr, "/plain/chunked", None).await;
    assert_eq!(streamed.body, Bytes::from(answer_body(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_trailers_reach_the_client() {
    let (_up, gw) = start().await;
    let streamed = exchange(gw.addr, "/plain/trailers", None).await;
    assert_eq!(streamed.status, StatusCode::CREATED);
    assert_eq!(
        streamed.headers.get("trailer").map(|v| v.as_bytes()),
        Some(&b"x-checksum"[..]),
        "the Trailer announcement is forwarded"
    );
    assert!(
        streamed.trailers.is_some(),
        "trailers on the streamed answer"
    );
    assert_eq!(streamed.trailer("x-checksum"), Some(&b"sum-1"[..]));
    assert_eq!(streamed.body, Bytes::from(answer_body(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue() {
    let (up, gw) = start().await;

    // Accepted: the client waits for 100 Continue, then sends the body, and the request runs.
    let k = key();
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let head = format!(
        "POST /p/continue HTTP/1.1\r\nHost: gateway\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.expect("write head");
    let interim = tokio::time::timeout(Duration::from_secs(10), wire::read_head(&mut tcp))
        .await
        .expect("100 Continue before the body")
        .expect("not closed before 100 Continue");
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    tcp.write_all(b"{}").await.expect("write body");
    let rest = wire::read_to_close(&mut tcp).await;
    assert!(rest.starts_with("HTTP/1.1 201 "), "{rest}");
    assert_eq!(up.count(), 1);

    // Refused before the body (no key): the final answer comes without 100 Continue and
    // without the body ever being sent.
    let refused = raw(
        gw.addr,
        "POST /p/continue HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 400 "), "{refused}");
    assert!(!refused.contains("100 Continue"), "{refused}");
    assert!(refused.contains("key-missing"), "{refused}");
    assert_eq!(up.count(), 1, "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_trailers_reach_the_client_and_the_replay() {
    let (up, gw) = start().await;
    let k = key();
    let first = exchange(gw.addr, "/p/trailers", Some(&k)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.trailers.is_some(), "trailers on the first answer");
    assert_eq!(first.trailer("x-checksum"), Some(&b"sum-1"[..]));
    let again = exchange(gw.addr, "/p/trailers", Some(&k)).await;
    assert!(again.replayed(), "{:?}", again.headers);
    assert_eq!(again.body, first.body, "byte-identical replay");
    assert_eq!(again.trailers, first.trailers, "the same trailers");
    assert_eq!(up.count(), 1);
}
