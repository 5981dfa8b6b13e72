//! The data listener as clients meet it: TLS with a certificate reloaded in place, slow
//! clients that cannot starve the others, and configuration reloads under load that drop no
//! request.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pki::{Pki, issue};
use common::{Gateway, Http, TempDir, Upstream, key, wire};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends one POST over TLS, trusting only `ca`; returns the status, the body and the
/// certificate the server presented.
async fn tls_post(
    addr: std::net::SocketAddr,
    ca: &CertificateDer<'static>,
    key: &str,
) -> Result<(StatusCode, Bytes, CertificateDer<'static>), String> {
    let tls = wire::tls_connect(addr, ca, &[]).await?;
    let presented = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or("no certificate")?
        .into_owned();
    let mut send = wire::h1_over(tls).await?;
    let req = Request::builder()
        .method(Method::POST)
        .uri("/charge")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .map_err(|e| e.to_string())?;
    let res = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body, presented))
}

fn tls_config(upstream: &str, pki: &Pki) -> String {
    format!(
        r#"
upstream = "{upstream}"
store = "memory:"
tls = {{ cert_file = "{}", key_file = "{}" }}
[defaults]
principal = {{ from = "none" }}
"#,
        pki.server_cert.display(),
        pki.server_key.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_serves_and_reloads_its_certificate() {
    let up = Upstream::start().await;
    let dir = TempDir::new("tls");
    let first = issue(&dir.0, "first");
    let gw = Gateway::start(&tls_config(&up.url(), &first), &[]);

    let k = key();
    let (status, body, cert) = tls_post(gw.addr, &first.ca, &k).await.expect("TLS request");
    assert_eq!(status, StatusCode::CREATED);
    let (_, again, _) = tls_post(gw.addr, &first.ca, &k).await.expect("TLS replay");
    assert_eq!(again, body, "the replay over TLS is the first answer");
    assert_eq!(up.seen.count("/charge"), 1);
    assert_eq!(
        up.seen.headers.lock()[0]
            .get("x-forwarded-proto")
            .map(|v| v.as_bytes().to_vec()),
        Some(b"https".to_vec()),
        "the upstream is told the client came over TLS"
    );
    let first_cert = cert;

    // Plain HTTP to the TLS port gets no answer.
    let plain = Http::new()
        .try_send(Method::POST, &gw.url("/charge"), &[], "{}")
        .await;
    assert!(plain.is_err(), "plain HTTP must not be served: {plain:?}");

    // A renewed certificate (from another CA) is picked up on SIGHUP by new connections.
    let second = issue(&dir.0, "second");
    std::fs::copy(&second.server_cert, &first.server_cert).expect("replace cert");
    std::fs::copy(&second.server_key, &first.server_key).expect("replace key");
    gw.hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((status, _, presented)) = tls_post(gw.addr, &second.ca, &key()).await {
            assert_eq!(status, StatusCode::CREATED);
            assert_ne!(presented, first_cert, "a new certificate");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        tls_post(gw.addr, &first.ca, &key()).await.is_err(),
        "the old CA no longer verifies the server"
    );
}

/// Slow clients (slowloris: headers a byte at a time) take connection slots only until the
/// header read timeout; an ordinary request still gets through. Without the timeout (shown
/// with `header_read_timeout = "1h"`), the slow clients hold every slot and the ordinary
/// request waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_starve_the_others() {
    let up = Upstream::start().await;
    let config = common::configs::limited(
        &up.url(),
        "max_connections = 16\nheader_read_timeout = \"1s\"",
        "",
    );
    let gw = Gateway::start(&config, &[]);
    let addr = gw.addr;
    let closed = Arc::new(AtomicU64::new(0));
    let mut slow = Vec::new();
    for _ in 0..24 {
        let closed = Arc::clone(&closed);
        slow.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                return;
            };
            let head = b"POST /charge HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            let _ = s.write_all(head).await;
            // One byte every 300 ms, never finishing the headers.
            for _ in 0..40 {
                if s.write_all(b"a").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let mut buf = [0u8; 512];
            if matches!(
                tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await,
                Ok(Ok(_) | Err(_))
            ) {
                closed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        Http::new().post(&gw.url("/charge"), Some(&key()), "{}"),
    )
    .await
    .expect("an ordinary request is answered while slow clients hold connections");
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(started.elapsed() < Duration::from_secs(5));
    for t in slow {
        let _ = t.await;
    }
    assert!(
        closed.load(Ordering::Relaxed) >= 16,
        "the gateway closed the slow connections ({} of 24)",
        closed.load(Ordering::Relaxed)
    );
}

fn reload_config(upstream: &str, extra_route: bool) -> String {
    let mut config = common::configs::with_admin(
        upstream,
        "memory:",
        r#"unmatched = "reject""#,
        "",
        "[[routes]]\nname = \"charge\"\nmethod = \"POST\"\npath = \"/charge\"\n",
    );
    if extra_route {
        config.push_str("[[routes]]\nname = \"refund\"\nmethod = \"POST\"\npath = \"/refund\"\n");
    }
    config
}

/// Routes reload under load with no failed request: the new route answers, the old ones never
/// stop, and a bad configuration is refused with its reason while the running one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_drops_no_request() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&reload_config(&up.url(), false), &[]);
    let http = Http::new();
    let refund = http.post(&gw.url("/refund"), Some(&key()), "{}").await;
    assert_eq!(refund.status, StatusCode::NOT_FOUND, "no such route yet");

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..8 {
        let (http, url, stop, sent, failed) = (
            http.clone(),
            gw.url("/charge?delay_ms=20"),
            Arc::clone(&stop),
            Arc::clone(&sent),
            Arc::clone(&failed),
        );
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let k = key();
                let r = http
                    .try_send(
                        Method::POST,
                        &url,
                        &[
                            ("idempotency-key", &k),
                            ("content-type", "application/json"),
                        ],
                        "{}",
                    )
                    .await;
                sent.fetch_add(1, Ordering::Relaxed);
                if !matches!(r, Ok(ref r) if r.status == StatusCode::CREATED) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        std::fs::write(gw.config_path(), reload_config(&up.url(), round % 2 == 1))
            .expect("rewrite config");
        if round % 3 == 0 {
            gw.hup();
        } else {
            let r = http
                .admin(Method::POST, &gw.admin_url("/admin/reload"), "")
                .await;
            r.assert_status(StatusCode::OK);
        }
    }
    // A broken configuration is refused; the running one keeps serving.
    std::fs::write(gw.config_path(), "this is = not [toml").expect("rewrite config");
    let refused = http
        .admin(Method::POST, &gw.admin_url("/admin/reload"), "")
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        String::from_utf8_lossy(&refused.body).contains("invalid configuration"),
        "{:?}",
        refused.body
    );
    // So is a change that needs a restart.
    std::fs::write(
        gw.config_path(),
        reload_config(&up.url(), true).replace("store = \"memory:\"", "store = \"memory:10\""),
    )
    .expect("rewrite config");
    let refused = http
        .admin(Method::POST, &gw.admin_url("/admin/reload"), "")
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(String::from_utf8_lossy(&refused.body).contains("restart"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.expect("load task");
    }
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(sent > 50, "the load ran ({sent} requests)");
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed during reloads"
    );
    // The last good configuration (with the refund route) is the one in force.
    let refund = http.post(&gw.url("/refund"), Some(&key()), "{}").await;
    assert_eq!(refund.status, StatusCode::CREATED);
    assert!(gw.logged("reload refused").await);
}

/// Past `max_concurrent_requests`, a request is refused at once with 503 and `Retry-After`,
/// and nothing is forwarded for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_cap_are_refused_not_queued() {
    let up = Upstream::start().await;
    let config = common::configs::limited(&up.url(), "max_concurrent_requests = 2", "");
    let gw = Gateway::start(&config, &[]);
    let http = Http::new();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let (http, url) = (http.clone(), gw.url("/slow?delay_ms=1500"));
            tokio::spawn(async move { http.post(&url, Some(&key()), "{}").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = http.post(&gw.url("/fast"), Some(&key()), "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem_type(), "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(up.seen.count("/fast"), 0);
    for t in slow {
        assert_eq!(t.await.expect("join").status, StatusCode::CREATED);
    }
    let after = http.post(&gw.url("/fast"), Some(&key()), "{}").await;
    assert_eq!(
        after.status,
        StatusCode::CREATED,
        "a free slot serves again"
    );
}
