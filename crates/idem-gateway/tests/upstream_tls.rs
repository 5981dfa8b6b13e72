//! `https://` upstreams: a private CA made in the test, a TLS upstream that asks for a client
//! certificate, the gateway in between. A protected route runs once and replays over TLS; an
//! upstream the gateway cannot verify is a clear 502 that leaves the key free for a retry.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pki::{Pki, issue};
use common::{Gateway, Http, TempDir, bin, key};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idem_testkit::counting_server::CountingServer;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS upstream: counts executions, answers 201 with a body naming the execution. With
/// `client_ca`, it refuses clients without a certificate from that CA.
async fn tls_upstream(pki: &Pki, client_ca: Option<&Path>) -> CountingServer {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server_cert)
        .expect("read cert")
        .collect::<Result<_, _>>()
        .expect("pem");
    let key = PrivateKeyDer::from_pem_file(&pki.server_key).expect("key");
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).expect("ca") {
                roots.add(c.expect("pem")).expect("root");
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(certs, key).expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    CountingServer::start(move |tcp, count| {
        let acceptor = acceptor.clone();
        async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let count = Arc::clone(&count);
                    async move {
                        // The status webhook: every charge it is asked about happened.
                        if req.method() == http::Method::GET {
                            let text = r#"{"outcome":"complete","status":201,"headers":{"content-type":"application/json"},"body":"{\"reconciled\":true}"}"#;
                            return Ok(Response::new(Full::new(Bytes::from(text))));
                        }
                        // `stall`: acts, then answers later than the gateway waits.
                        let stall = req.headers().contains_key("stall");
                        let body = req.into_body().collect().await?.to_bytes();
                        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                        let text = format!(
                            r#"{{"execution":{n},"body":{}}}"#,
                            serde_json::Value::String(String::from_utf8_lossy(&body).into())
                        );
                        if stall {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        let mut res = Response::new(Full::new(Bytes::from(text)));
                        *res.status_mut() = StatusCode::CREATED;
                        res.headers_mut()
                            .insert("content-type", "application/json".parse().expect("ct"));
                        Ok::<_, hyper::Error>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
        }
    })
    .await
}

fn config(upstream: SocketAddr, ca_file: &Path, client: Option<&Pki>) -> String {
    let client = client.map_or(String::new(), |p| {
        format!(
            r#", client_cert_file = "{}", client_key_file = "{}""#,
            p.client_cert.display(),
            p.client_key.display()
        )
    });
    format!(
        r#"
store = "memory:"
[defaults]
principal = {{ from = "none" }}
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
upstream = {{ url = "https://{upstream}", ca_file = "{}"{client} }}
"#,
        ca_file.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_with_a_client_certificate_runs_once_and_replays() {
    let dir = TempDir::new("up-tls");
    let pki = issue(&dir.0, "a");
    let up = tls_upstream(&pki, Some(&pki.ca_file)).await;
    let cfg = config(up.addr, &pki.ca_file, Some(&pki));

    // check-config shows how the upstream is reached.
    let out = common::check_config(&cfg);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("CA file {}", pki.ca_file.display())),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("client certificate {}", pki.client_cert.display())),
        "{shown}"
    );

    let gw = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let k = key();
    let first = http
        .post(&gw.url("/charge"), Some(&k), r#"{"amount":100}"#)
        .await;
    first.assert_status(StatusCode::CREATED);
    assert_eq!(first.json()["execution"], 1);
    let again = http
        .post(&gw.url("/charge"), Some(&k), r#"{"amount":100}"#)
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "the replay is the first answer");
    assert_eq!(up.executions.load(Ordering::SeqCst), 1, "ran once");

    // Another key runs again, over the same verified connection pool.
    let other = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(up.executions.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_upstream_is_a_clear_502_and_the_key_stays_free() {
    let dir = TempDir::new("up-tls-bad");
    let real = issue(&dir.0, "real");
    let other = issue(&dir.0, "other");
    let up = tls_upstream(&real, None).await;
    // The gateway trusts another CA than the one that signed the upstream's certificate.
    let gw = Gateway::start(&config(up.addr, &other.ca_file, None), &[]);
    let http = Http::new();
    let k = key();
    let refused = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(refused.problem_type(), "upstream-tls");
    assert_eq!(refused.json()["status"], 502);
    assert_eq!(
        up.executions.load(Ordering::SeqCst),
        0,
        "nothing reached it"
    );
    assert!(gw.logged("TLS handshake failed").await, "{}", gw.logs());

    // Nothing was sent, so the key was released: once the right CA is configured, the
    // client's retry with the same key runs (rather than being held as unknown).
    std::fs::write(gw.config_path(), config(up.addr, &real.ca_file, None)).expect("rewrite");
    gw.hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
        if probe.status == StatusCode::CREATED {
            break;
        }
        assert!(Instant::now() < deadline, "the reload did not take effect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = up.executions.load(Ordering::SeqCst);
    let retried = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    retried.assert_status(StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(up.executions.load(Ordering::SeqCst), before + 1);
}

/// Reconciliation asks a status webhook on an `https` upstream with the route's upstream
/// client: the same CA file and client certificate that the proxied requests use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_reaches_an_https_webhook_with_the_upstreams_tls_settings() {
    let dir = TempDir::new("up-tls-reconcile");
    let pki = issue(&dir.0, "r");
    let up = tls_upstream(&pki, Some(&pki.ca_file)).await;
    // The usual TLS route, on a store `idem reconcile` shares, holding what times out.
    let cfg = config(up.addr, &pki.ca_file, Some(&pki))
        .replace(
            r#"store = "memory:""#,
            &format!(r#"store = "sqlite:{}""#, dir.0.join("idem.db").display()),
        )
        .replace(
            "path = \"/charge\"\n",
            "path = \"/charge\"\ntimeout = \"500ms\"\nupstream_failure = \"hold\"\nstatus_url = \"/charges?idempotency_key={key}\"\n",
        );
    assert!(cfg.contains("status_url"), "{cfg}");
    let gw = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let k = key();
    let lost = http
        .send(
            http::Method::POST,
            &gw.url("/charge"),
            &[("idempotency-key", k.as_str()), ("stall", "1")],
            "{}",
        )
        .await;
    lost.assert_status(StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(up.executions.load(Ordering::SeqCst), 1, "it acted");

    let out = std::process::Command::new(bin())
        .arg("reconcile")
        .arg("--config")
        .arg(gw.config_path())
        .arg("--json")
        .output()
        .expect("run idem reconcile");
    let text = String::from_utf8_lossy(&out.stdout);
    let item: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|i| i["key"] == k.as_str())
        .unwrap_or_else(|| {
            panic!(
                "no item for the key: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(item["action"], "complete", "{item}");
    assert_eq!(item["applied"], true, "{item}");

    let retry = http.post(&gw.url("/charge"), Some(&k), "{}").await;
    retry.assert_status(StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.json()["reconciled"], true);
    assert_eq!(up.executions.load(Ordering::SeqCst), 1, "never run twice");
}
