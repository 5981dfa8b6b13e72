//! Resource limits under abuse, against the real gateway: a request body that stalls (over
//! HTTP/1.1 here, gRPC in `grpc.rs`), clients that abandon their requests, and upgraded
//! tunnels that are many or idle must not take the gateway's request or connection slots from
//! everyone else.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Gateway, Http, Upstream, configs, key, wire};
use http::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A gateway in front of `up` allowing `cap` requests in progress, every route protected,
/// with `extra` appended to its `[limits]` table.
fn capped(up: &Upstream, cap: usize, extra: &str) -> String {
    configs::limited(
        &up.url(),
        &format!("max_concurrent_requests = {cap}\n{extra}"),
        "",
    )
}

/// Opens a connection and sends a protected `POST` head declaring `declared` body bytes,
/// followed by `sent` of them; the rest never comes.
async fn stalled_post(gw: &Gateway, key: &str, declared: usize, sent: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    let head = format!(
        "POST /charge HTTP/1.1\r\nhost: idem\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\ncontent-length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(sent).await.expect("body");
    stream.flush().await.expect("flush");
    stream
}

/// The status line's code of the first answer on `stream`, read within `within`.
async fn status_of(stream: &mut TcpStream, within: Duration) -> Option<u16> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    read.ok()?;
    let line = std::str::from_utf8(&buf).ok()?.lines().next()?;
    line.split(' ').nth(1)?.parse().ok()
}

// Bug guarded: nothing timed out a request body being read, so connections that sent a
// protected head and one byte of a 100-byte body held a request slot each, forever: with the
// cap at 4, eight of them made every other caller get `503 overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_cut_off_and_frees_its_slot() {
    let up = Upstream::start().await;
    // The default body limits: the point is that a production gateway is protected as is.
    let gw = Gateway::start(&capped(&up, 4, ""), &[]);
    let http = Http::new();
    let started = Instant::now();
    let mut stalled = Vec::new();
    for i in 0..8 {
        stalled.push(stalled_post(&gw, &format!("stall-{i}"), 100, b"{").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the stalled bodies hold the slots at first"
    );
    // Four stalled bodies took the four slots; the other four were refused at once. Within a
    // few seconds the four are cut off with 408.
    let mut statuses = Vec::new();
    for stream in &mut stalled {
        statuses.push(status_of(stream, Duration::from_secs(8)).await);
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [Some(408); 4]
            .into_iter()
            .chain([Some(503); 4])
            .collect::<Vec<_>>(),
        "after {:?}",
        started.elapsed()
    );
    let served = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
    assert_eq!(
        served.status,
        StatusCode::CREATED,
        "a caller is served once the stalled bodies are cut off ({:?} after they began)",
        started.elapsed()
    );
    // Nothing was claimed for a body that never arrived: its key runs when sent in full.
    let retry = http.post(&gw.url("/charge"), Some("stall-0"), "{}").await;
    retry.assert_status(StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(
        up.seen.count("/charge"),
        2,
        "only the two complete requests ran"
    );
}

// A body that arrives in full, only slowly, within the configured rate and timeout is
// served; one slower than `min_body_rate` is cut off even though it keeps sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_minimum_rate_is_cut_off() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &capped(&up, 4, "body_timeout = \"3s\"\nmin_body_rate = \"1KiB\""),
        &[],
    );
    // 600 bytes, 100 every 300 ms: far below 1 KiB/s once the grace is over.
    let mut slow = stalled_post(&gw, &key(), 600, b"").await;
    let trickle = async {
        for _ in 0..6 {
            if slow.write_all(&[b' '; 100]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
    };
    let started = Instant::now();
    trickle.await;
    let status = status_of(&mut slow, Duration::from_secs(5)).await;
    assert_eq!(status, Some(408), "after {:?}", started.elapsed());
    assert_eq!(up.seen.total(), 0, "nothing ran for a body cut off");
}

// Bug guarded: a request whose client went away finished in the background without its
// concurrency permit, so with the cap at 4, twenty requests each abandoned after 0.2 s all
// ran at the upstream at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_request_keeps_its_slot_until_its_run_ends() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&capped(&up, 4, ""), &[]);
    let mut refused = 0;
    for i in 0..20 {
        let body = "{}";
        let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
        let req = format!(
            "POST /slow?delay_ms=3000 HTTP/1.1\r\nhost: idem\r\ncontent-type: application/json\r\n\
             idempotency-key: gone-{i}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.expect("send");
        if status_of(&mut stream, Duration::from_millis(200)).await == Some(503) {
            refused += 1;
        }
        // The client gives up and closes the connection.
        drop(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = up.seen.peak();
    assert!(
        peak <= 4,
        "{peak} runs at the upstream at once with the cap at 4"
    );
    assert!(refused >= 16, "only {refused} of 20 refused as overloaded");
}

/// Sends `victim`'s charge, then `flood` cheap requests with fresh keys, then the victim's
/// retry: returns how many of the flood were refused with `503 store-unavailable`, and
/// asserts the retry was a replay and the victim ran once.
async fn flood_then_retry(gw: &Gateway, up: &Upstream, body: &str, flood: usize) -> usize {
    let http = Http::new();
    let first = http
        .post(&gw.url("/charge/victim"), Some("victim"), body)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let mut refused = 0;
    for _ in 0..flood {
        let res = http.post(&gw.url("/flood"), Some(&key()), body).await;
        match res.status {
            StatusCode::CREATED => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(res.problem_type(), "store-unavailable");
                refused += 1;
            }
            other => panic!("flood answered {other}"),
        }
    }
    let retry = http
        .post(&gw.url("/charge/victim"), Some("victim"), body)
        .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        retry.replayed(),
        "the victim's retry ran again: {:?}",
        retry.body
    );
    assert_eq!(up.seen.count("/charge/victim"), 1, "the victim ran twice");
    refused
}

// Bug guarded: at capacity the memory store evicted completed records that had not
// expired, so a flood of cheap requests turned a victim's retry into a second execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_store_refuses_new_keys_and_keeps_live_answers() {
    let up = Upstream::start().await;
    let config = capped(&up, 64, "").replace("memory:", "memory:8");
    let gw = Gateway::start(&config, &[]);
    let refused = flood_then_retry(&gw, &up, "{}", 20).await;
    assert_eq!(refused, 13, "7 of the flood fit beside the victim");
}

// The memory store's byte bound (`store_max_bytes`) refuses new keys the same way once the
// answers it holds fill it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_is_bounded_in_bytes() {
    let up = Upstream::start().await;
    let config = capped(&up, 64, "").replace(
        "store = \"memory:\"",
        "store = \"memory:\"\nstore_max_bytes = \"32KiB\"",
    );
    let gw = Gateway::start(&config, &[]);
    // The upstream echoes the body: every answer holds about 4 KB, so about eight fit (a
    // claim is admitted while the bytes are under the bound, and its answer always kept).
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    let refused = flood_then_retry(&gw, &up, &body, 20).await;
    assert!(
        (10..=15).contains(&refused),
        "{refused} of 20 refused in 32 KiB"
    );
}

/// A gateway in front of `up` whose `/ws` route is unprotected (so it passes upgrades), with
/// `limits` as its `[limits]` table.
fn with_tunnels(up: &Upstream, limits: &str) -> String {
    configs::limited(
        &up.url(),
        limits,
        "[[routes]]\nname = \"ws\"\npath = \"/ws\"\nidempotency = false\n",
    )
}

/// Opens a connection to `addr` and upgrades it through the `/ws` route: the stream once the
/// `101` arrived, or what came instead.
async fn open_tunnel(addr: SocketAddr) -> Result<TcpStream, String> {
    wire::open_tunnel(addr, "/ws")
        .await
        .map(|(stream, _)| stream)
}

/// Sends `msg` through a tunnel and reads it back from the echoing upstream.
async fn echoes(tunnel: &mut TcpStream, msg: &[u8]) {
    wire::echoes(tunnel, msg, Duration::from_secs(5)).await;
}

// Bug guarded: after its `101` a tunnel left the listener's connection count (the HTTP
// connection ended and gave its slot back while the tunnel lived on in a task of its own),
// so a client could hold any number of tunnels past `max_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_keeps_its_connection_slot_until_it_closes() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&with_tunnels(&up, "max_connections = 2"), &[]);
    let mut first = open_tunnel(gw.addr).await.expect("the first tunnel");
    let second = open_tunnel(gw.addr).await.expect("the second tunnel");
    echoes(&mut first, b"one").await;
    // Both slots are held by tunnels: a third connection waits in the backlog, unserved.
    let third = tokio::spawn(open_tunnel(gw.addr));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served while two tunnels held both slots: {:?}",
        third.await
    );
    assert_eq!(up.seen.tunnels(), 2);
    // A tunnel that closes gives its slot back.
    drop(second);
    let mut third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("the third connection is served once a tunnel closed")
        .expect("join")
        .expect("the third tunnel");
    echoes(&mut third, b"three").await;
    echoes(&mut first, b"still open").await;
}

// Bug guarded: nothing timed a tunnel out, so one nobody used kept a connection open at the
// gateway and another at the upstream for as long as its client kept the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_is_closed_at_both_ends() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&with_tunnels(&up, "tunnel_idle_timeout = \"1s\""), &[]);
    let mut tunnel = open_tunnel(gw.addr).await.expect("tunnel");
    // Traffic keeps it open well past the timeout: a message every 400 ms for 2.4 s.
    for i in 0..6u8 {
        echoes(&mut tunnel, &[b'0' + i]).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(up.seen.tunnels(), 1, "the upstream's side is open");
    // Silent, it is closed after about the timeout: the client's side sees the end...
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), tunnel.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the idle tunnel was still open after {:?}: {read:?}",
        started.elapsed()
    );
    // ... and the upstream's connection is closed too.
    let closed = async {
        while up.seen.tunnels() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(2), closed)
        .await
        .expect("the upstream's side of the idle tunnel is closed");
}
