//! A small TCP fault proxy to put between a client and a server: each new connection whose
//! first request matches takes the next [`Fault`] of a plan (the rest pass untouched), so a
//! test can make "the server answered but the client never heard it" or "the request never
//! arrived" happen exactly once, at the attempt it chooses.
//!
//! It works on bytes, not on a protocol: for HTTP/1 it reads the request head (and the body
//! its `Content-Length` announces) before it decides, so a fault hits a whole request; an
//! HTTP/2 connection (gRPC) is one request stream to it, and a fault hits the connection.
//! To fault one HTTP/2 call (lose its answer after the server acted), use
//! [`h2_fault`](crate::h2_fault).
//!
//! ```no_run
//! use idem_testkit::fault_proxy::{Fault, FaultProxy};
//!
//! # async fn demo(gateway: std::net::SocketAddr) -> std::io::Result<()> {
//! let proxy = FaultProxy::start(gateway, [Fault::DropAfterAnswer]).await?;
//! // The first POST's answer is lost on its way back; later ones pass.
//! let url = format!("http://{}/charge", proxy.addr());
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub use crate::fault_plan::{Proxy, ProxyKind, Shared};

/// What happens to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Forwarded both ways untouched.
    Pass,
    /// The request is forwarded; as soon as the server starts answering, the client's
    /// connection is reset and the answer dropped: it ran, and the client cannot know.
    DropAfterAnswer,
    /// The request is read whole, then the client's connection is reset: nothing reaches the
    /// server, and the client cannot know that either.
    ResetBeforeSending,
    /// The request is held this long before it is forwarded (then passed both ways), whether
    /// or not the client is still waiting: a request that arrives after its client gave up.
    Delay(Duration),
}

/// Decides which connections take a fault from the plan, from the first bytes the client
/// sent (an HTTP/1 request head, or the start of an HTTP/2 connection).
pub type Matcher = fn(&[u8]) -> bool;

/// Every connection.
pub fn any(_: &[u8]) -> bool {
    true
}

/// HTTP/1 requests whose method is `POST`.
pub fn posts(head: &[u8]) -> bool {
    head.starts_with(b"POST ")
}

/// The byte-level kind of [`Proxy`]: one fault per connection.
#[derive(Debug)]
pub enum Tcp {}

impl ProxyKind for Tcp {
    type Fault = Fault;
    type Matcher = Matcher;
    type State = ();
    const NAME: &'static str = "FaultProxy";
}

/// The running byte-level proxy; stops when dropped. Its [`Proxy::settled`] waits until
/// every delayed request has been forwarded and the server has started answering it.
pub type FaultProxy = Proxy<Tcp>;

impl Proxy<Tcp> {
    /// A proxy on a spare loopback port in front of `target`, applying `plan` to every
    /// connection in turn.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(
        target: SocketAddr,
        plan: impl IntoIterator<Item = Fault>,
    ) -> io::Result<Self> {
        Self::start_matching(target, any, plan).await
    }

    /// As [`start`](Self::start), but only connections `matcher` accepts take a fault
    /// (the others pass).
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start_matching(
        target: SocketAddr,
        matcher: Matcher,
        plan: impl IntoIterator<Item = Fault>,
    ) -> io::Result<Self> {
        Self::start_with(target, matcher, (), plan, accept).await
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared<Tcp>>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _ = handle(client, &shared).await;
        });
    }
}

async fn handle(mut client: TcpStream, shared: &Shared<Tcp>) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut first = read_request(&mut client).await?;
    if first.is_empty() {
        return Ok(());
    }
    let fault = if (shared.matcher)(&first) {
        shared.plan.next(Fault::Pass).await
    } else {
        Fault::Pass
    };
    match fault {
        Fault::ResetBeforeSending => {
            reset(client);
            Ok(())
        }
        Fault::Delay(d) => {
            // Counted until the held request has been forwarded and the server has started
            // answering it (see `settled`).
            shared.plan.begin();
            let forwarded = async {
                tokio::time::sleep(d).await;
                let mut server = TcpStream::connect(shared.target).await?;
                server.write_all(&first).await?;
                let mut answer = [0u8; 1];
                let n = server.read(&mut answer).await?;
                Ok::<_, io::Error>((server, answer, n))
            }
            .await;
            shared.plan.end();
            let (mut server, answer, n) = forwarded?;
            // The client has most likely given up; whatever is left goes to it if it has not.
            let _ = client.write_all(&answer[..n]).await;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            Ok(())
        }
        Fault::Pass => {
            let mut server = TcpStream::connect(shared.target).await?;
            server.write_all(&first).await?;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            Ok(())
        }
        Fault::DropAfterAnswer => {
            let mut server = TcpStream::connect(shared.target).await?;
            server.write_all(&first).await?;
            first.clear();
            let (mut from_client, _) = client.split();
            let (mut from_server, mut to_server) = server.split();
            let mut byte = [0u8; 1];
            // Keep feeding the server whatever else the client sends until it answers.
            let answered = async {
                match from_server.read(&mut byte).await? {
                    0 => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                    _ => Ok(()),
                }
            };
            let feed = tokio::io::copy(&mut from_client, &mut to_server);
            tokio::select! {
                r = answered => r?,
                _ = feed => {}
            }
            drop(server);
            reset(client);
            Ok(())
        }
    }
}

/// Reads what the client sends first: an HTTP/1 request head and the body its
/// `Content-Length` announces, or whatever arrives first on another protocol.
async fn read_request(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if !looks_like_http1(&buf) {
            return Ok(buf);
        }
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let want = end + 4 + content_length(&buf[..end]);
            while buf.len() < want {
                let n = client.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(buf);
        }
        if buf.len() > 64 * 1024 {
            return Ok(buf);
        }
    }
}

fn looks_like_http1(buf: &[u8]) -> bool {
    !buf.starts_with(b"PRI * HTTP/2.0")
        && buf
            .iter()
            .take(8)
            .take_while(|b| **b != b' ')
            .all(u8::is_ascii_uppercase)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Closes with a TCP reset rather than an orderly shutdown.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn request_heads_are_recognised() {
        assert!(posts(b"POST /charge HTTP/1.1\r\n"));
        assert!(!posts(b"GET /idem/status/k HTTP/1.1\r\n"));
        assert!(looks_like_http1(b"POST /x HTTP/1.1"));
        assert!(!looks_like_http1(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert_eq!(
            content_length(b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 12"),
            12
        );
        assert_eq!(content_length(b"GET / HTTP/1.1\r\nHost: x"), 0);
    }

    #[tokio::test]
    async fn faults_hit_the_connections_in_turn() {
        let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = server.local_addr().expect("addr");
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = server.accept().await else {
                    return;
                };
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let _ = read_request(&mut s).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                });
            }
        });
        let proxy = FaultProxy::start(target, [Fault::ResetBeforeSending, Fault::DropAfterAnswer])
            .await
            .expect("proxy");
        let exchange = || async {
            let mut c = TcpStream::connect(proxy.addr()).await.expect("connect");
            c.write_all(b"POST / HTTP/1.1\r\ncontent-length: 1\r\n\r\nx")
                .await
                .expect("write");
            let mut out = Vec::new();
            match c.read_to_end(&mut out).await {
                Ok(_) => Ok(out),
                Err(e) => Err(e.kind()),
            }
        };
        let reset = exchange().await;
        assert!(reset.as_ref().map_or(true, Vec::is_empty), "{reset:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing reached the server");
        let dropped = exchange().await;
        assert!(dropped.as_ref().map_or(true, Vec::is_empty), "{dropped:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the server answered");
        let passed = exchange().await.expect("passed");
        assert!(passed.ends_with(b"ok"));
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert_eq!(
            proxy.applied().await,
            [
                Fault::ResetBeforeSending,
                Fault::DropAfterAnswer,
                Fault::Pass
            ]
        );
    }
}
