//! Clients below [`Http`](super::Http), for the tests that look at the bytes and the
//! protocol: raw HTTP/1.1 on a socket, one-off HTTP/1.1 and HTTP/2 connections that keep the
//! version and the trailers of an answer, protocol upgrades, and TLS that trusts a test CA.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// What an exchange returned: the version of the status line, the head, the body and the
/// trailers.
#[derive(Debug)]
pub struct Got {
    pub version: Version,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Got {
    /// Reads `res` whole, trailers included.
    pub async fn read<B>(res: Response<B>) -> Self
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = res.into_parts();
        let collected = body.collect().await.expect("body");
        Self {
            version: parts.version,
            status: parts.status,
            headers: parts.headers,
            trailers: collected.trailers().cloned(),
            body: collected.to_bytes(),
        }
    }

    /// Whether the gateway marked the answer as a replay (`idempotent-replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .map(|v| v.as_bytes())
            == Some(&b"true"[..])
    }

    /// The value of trailer `name`, if the answer had trailers and that one among them.
    pub fn trailer(&self, name: &str) -> Option<&[u8]> {
        self.trailers.as_ref()?.get(name).map(|v| v.as_bytes())
    }
}

/// A sender for HTTP/2 with prior knowledge (h2c) on a fresh connection to `addr`.
pub async fn h2c(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    h2_over(tcp).await
}

/// A sender for HTTP/2 over `io` (plain TCP, or TLS that negotiated `h2`); the connection is
/// driven by a task of its own.
pub async fn h2_over<IO>(io: IO) -> hyper::client::conn::http2::SendRequest<Full<Bytes>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    send
}

/// A sender for HTTP/1.1 over `io`; the connection is driven by a task of its own.
pub async fn h1_over<IO>(
    io: IO,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

/// Writes `head` (a whole raw request) on a fresh connection to `addr` and returns everything
/// read until the server closes it (within 10 s).
pub async fn raw(addr: SocketAddr, head: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(head.as_bytes()).await.expect("write");
    read_to_close(&mut tcp).await
}

/// Everything read from `stream` until the server closes it (within 10 s).
pub async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("the gateway answered and closed")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads `stream` a byte at a time up to the blank line that ends a response head (so not a
/// byte of what follows is consumed): the head, or how the stream ended before it.
pub async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<String, String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            other => {
                return Err(format!(
                    "closed after {:?}: {other:?}",
                    String::from_utf8_lossy(&head)
                ));
            }
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Opens a connection to `addr` and asks to upgrade `path` to the test upstream's echo
/// protocol: the stream and the (lowercased) head once a `101` arrived, or what came
/// instead.
pub async fn open_tunnel(addr: SocketAddr, path: &str) -> Result<(TcpStream, String), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: idem\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let head = read_head(&mut stream).await?.to_ascii_lowercase();
    if head.starts_with("http/1.1 101 ") {
        Ok((stream, head))
    } else {
        Err(head)
    }
}

/// Sends `msg` through a tunnel and asserts the echoing upstream sends it back within
/// `within`.
pub async fn echoes(tunnel: &mut TcpStream, msg: &[u8], within: Duration) {
    tunnel.write_all(msg).await.expect("write to the tunnel");
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(within, tunnel.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("read from the tunnel");
    assert_eq!(got, msg);
}

/// A TLS connection to `addr` (named `127.0.0.1`) that trusts only `ca` and offers `alpn`.
pub async fn tls_connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> Result<TlsStream<TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| e.to_string())?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}
