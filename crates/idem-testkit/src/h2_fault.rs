//! An HTTP/2 fault proxy (h2c on both sides) to put between a gRPC client and its server:
//! each request whose head matches takes the next [`H2Fault`] of a plan (the rest pass
//! untouched), so a test can lose **one call's answer** after the server acted, reset one
//! call before it reaches the server, or hold one call or its answer, on a connection that
//! keeps carrying other calls.
//!
//! The byte-level [`fault_proxy`](crate::fault_proxy) cannot do this for HTTP/2: every call
//! of a connection shares one byte stream, and the server speaks first. This proxy terminates
//! HTTP/2 (a hyper server), reads each request whole, and forwards it on a connection of its
//! own to the server (a hyper client). Every request it forwards is run to its end at the
//! server and its whole answer (trailers included) read, whatever the client does meanwhile:
//! a call the client gave up on still reaches the server, as it would through a slow network.
//!
//! ```no_run
//! use idem_testkit::h2_fault::{H2Fault, H2FaultProxy};
//!
//! # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
//! // The first call's answer is lost after the server acted; later calls pass.
//! let proxy = H2FaultProxy::start(server, [H2Fault::ResetAfterAnswer]).await?;
//! let url = format!("http://{}", proxy.addr());
//! # let _ = url; Ok(()) }
//! ```

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::fault_plan::{Proxy, ProxyKind, Shared};

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum H2Fault {
    /// Forwarded, and its answer passed back.
    Pass,
    /// Forwarded; once the server's whole answer has arrived (it acted), the client's stream
    /// is reset (`RST_STREAM`) instead of answered: the answer is lost, the connection lives.
    ResetAfterAnswer,
    /// Forwarded; once the server's whole answer has arrived, the client's whole connection
    /// is closed instead of answered (every other call on it fails too).
    DropAfterAnswer,
    /// Read whole, then the client's stream is reset: nothing reaches the server.
    ResetBeforeSending,
    /// Held this long before it is forwarded, whether or not the client still waits: a call
    /// that arrives after its client gave up.
    Delay(Duration),
    /// Forwarded at once; the server's answer is held this long before it is passed back: a
    /// server that acted in time, slower than its client waits.
    DelayAnswer(Duration),
}

/// Decides which requests take a fault from the plan, from the request head.
pub type Matcher = Arc<dyn Fn(&http::request::Parts) -> bool + Send + Sync>;

/// A whole message body: its data in one frame, then its trailers.
type Whole =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

fn whole(data: Bytes, trailers: Option<HeaderMap>) -> Whole {
    let mut frames = Vec::with_capacity(2);
    if !data.is_empty() {
        frames.push(Ok(Frame::data(data)));
    }
    if let Some(t) = trailers {
        frames.push(Ok(Frame::trailers(t)));
    }
    StreamBody::new(futures::stream::iter(frames))
}

/// The proxy's refusal to answer a stream: hyper resets a stream whose service fails.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fault proxy: {}", self.0)
    }
}

impl std::error::Error for Refused {}

/// The HTTP/2 kind of [`Proxy`]: one fault per request; counts the requests it forwards.
#[derive(Debug)]
pub enum H2 {}

impl ProxyKind for H2 {
    type Fault = H2Fault;
    type Matcher = Matcher;
    /// How many requests (matching or not) have been sent on to the server.
    type State = AtomicUsize;
    const NAME: &'static str = "H2FaultProxy";
}

/// The running HTTP/2 proxy; stops accepting when dropped. Its clients connect with h2c
/// (prior knowledge); its [`Proxy::settled`] waits until the server has answered every
/// request the proxy forwarded or holds (the delayed ones included).
pub type H2FaultProxy = Proxy<H2>;

impl Proxy<H2> {
    /// A proxy on a spare loopback port in front of the h2c server at `target`, applying
    /// `plan` to every request in turn.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(
        target: SocketAddr,
        plan: impl IntoIterator<Item = H2Fault>,
    ) -> io::Result<Self> {
        Self::start_matching(target, Arc::new(|_: &http::request::Parts| true), plan).await
    }

    /// As [`start`](Self::start), but only requests `matcher` accepts take a fault (the
    /// others pass and are not recorded).
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start_matching(
        target: SocketAddr,
        matcher: Matcher,
        plan: impl IntoIterator<Item = H2Fault>,
    ) -> io::Result<Self> {
        Self::start_with(target, matcher, AtomicUsize::new(0), plan, accept).await
    }

    /// How many requests (matching or not) have been sent on to the server.
    pub fn forwarded(&self) -> usize {
        self.shared.state.load(Ordering::SeqCst)
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared<H2>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            // Signalled by a `DropAfterAnswer` request: the connection is dropped mid-call.
            let kill = Arc::new(Notify::new());
            let service = {
                let kill = Arc::clone(&kill);
                hyper::service::service_fn(move |req| {
                    handle(req, Arc::clone(&shared), Arc::clone(&kill))
                })
            };
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = kill.notified() => {}
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared<H2>>,
    kill: Arc<Notify>,
) -> Result<Response<Whole>, Refused> {
    let (parts, body) = req.into_parts();
    let fault = if (shared.matcher)(&parts) {
        shared.plan.next(H2Fault::Pass).await
    } else {
        H2Fault::Pass
    };
    let body = body
        .collect()
        .await
        .map_err(|e| Refused(format!("request unreadable: {e}")))?;
    let trailers = body.trailers().cloned();
    let data = body.to_bytes();
    if fault == H2Fault::ResetBeforeSending {
        return Err(Refused("reset before sending".into()));
    }
    let hold = match fault {
        H2Fault::Delay(d) => d,
        _ => Duration::ZERO,
    };
    // Forwarded on a task of its own, so the server gets the whole call and answers it even
    // when the client has reset its stream meanwhile.
    shared.plan.begin();
    let forwarding = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            shared.state.fetch_add(1, Ordering::SeqCst);
            let answer = forward(shared.target, parts, data, trailers).await;
            shared.plan.end();
            answer
        })
    };
    let (head, data, trailers) = forwarding
        .await
        .map_err(|e| Refused(format!("forwarding task: {e}")))?
        .map_err(|e| Refused(format!("server unreachable: {e}")))?;
    match fault {
        H2Fault::ResetAfterAnswer => Err(Refused("answer lost".into())),
        H2Fault::DropAfterAnswer => {
            kill.notify_one();
            // The connection (and this call with it) is dropped by the accept task.
            std::future::pending().await
        }
        H2Fault::DelayAnswer(d) => {
            tokio::time::sleep(d).await;
            Ok(Response::from_parts(head, whole(data, trailers)))
        }
        _ => Ok(Response::from_parts(head, whole(data, trailers))),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends one request to `target` on a connection of its own and reads the whole answer.
async fn forward(
    target: SocketAddr,
    mut parts: http::request::Parts,
    data: Bytes,
    trailers: Option<HeaderMap>,
) -> Result<(http::response::Parts, Bytes, Option<HeaderMap>), BoxError> {
    let stream = TcpStream::connect(target).await?;
    let _ = stream.set_nodelay(true);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let authority = parts
        .uri
        .authority()
        .map_or_else(|| target.to_string(), ToString::to_string);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    parts.uri = Uri::try_from(format!("http://{authority}{path}"))?;
    let res = send
        .send_request(Request::from_parts(parts, whole(data, trailers)))
        .await?;
    let (head, body) = res.into_parts();
    let body = body.collect().await?;
    let trailers = body.trailers().cloned();
    Ok((head, body.to_bytes(), trailers))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An h2c server answering every request `ok` with a `grpc-status: 0` trailer, counting
    /// the requests it saw.
    async fn server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                let counter = Arc::clone(&counter);
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counter = Arc::clone(&counter);
                    async move {
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::SeqCst);
                        let mut t = HeaderMap::new();
                        t.insert("grpc-status", http::HeaderValue::from_static("0"));
                        Ok::<_, Infallible>(Response::new(whole(
                            Bytes::from_static(b"ok"),
                            Some(t),
                        )))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), service),
                );
            }
        });
        (addr, seen)
    }

    /// A client connection to `addr`; each call returns the body and trailers, or the error.
    struct Client(hyper::client::conn::http2::SendRequest<Whole>);

    impl Client {
        async fn connect(addr: SocketAddr) -> Self {
            let s = TcpStream::connect(addr).await.expect("connect");
            let (send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
                    .await
                    .expect("handshake");
            tokio::spawn(conn);
            Self(send)
        }

        async fn call(&mut self, path: &str) -> Result<(Bytes, Option<HeaderMap>), String> {
            let req = Request::post(format!("http://localhost{path}"))
                .body(whole(Bytes::from_static(b"req"), None))
                .expect("request");
            let res = self.0.send_request(req).await.map_err(|e| e.to_string())?;
            let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
            let trailers = body.trailers().cloned();
            Ok((body.to_bytes(), trailers))
        }
    }

    #[tokio::test]
    async fn faults_hit_the_matching_requests_in_turn() {
        let (target, seen) = server().await;
        let proxy = H2FaultProxy::start_matching(
            target,
            Arc::new(|p: &http::request::Parts| p.uri.path() == "/faulty"),
            [H2Fault::ResetBeforeSending, H2Fault::ResetAfterAnswer],
        )
        .await
        .expect("proxy");
        let mut c = Client::connect(proxy.addr()).await;

        c.call("/faulty").await.expect_err("reset before sending");
        assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing reached the server");
        c.call("/faulty").await.expect_err("answer lost");
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the server answered");
        // The connection lives on; other paths pass untouched and unrecorded.
        let (body, trailers) = c.call("/other").await.expect("passed");
        assert_eq!(body, "ok");
        assert_eq!(trailers.expect("trailers")["grpc-status"], "0");
        c.call("/faulty").await.expect("past the plan");
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(proxy.forwarded(), 3);
        assert_eq!(
            proxy.applied().await,
            [
                H2Fault::ResetBeforeSending,
                H2Fault::ResetAfterAnswer,
                H2Fault::Pass
            ]
        );
    }

    #[tokio::test]
    async fn a_dropped_connection_loses_the_answer_after_the_server_acted() {
        let (target, seen) = server().await;
        let proxy = H2FaultProxy::start(target, [H2Fault::DropAfterAnswer])
            .await
            .expect("proxy");
        let mut c = Client::connect(proxy.addr()).await;
        c.call("/x").await.expect_err("connection dropped");
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the server answered");
        c.call("/x").await.expect_err("the connection is gone");
        let mut fresh = Client::connect(proxy.addr()).await;
        fresh.call("/x").await.expect("a new connection passes");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn held_requests_reach_the_server_after_their_client_gave_up() {
        let (target, seen) = server().await;
        let proxy = H2FaultProxy::start(
            target,
            [
                H2Fault::Delay(Duration::from_millis(300)),
                H2Fault::DelayAnswer(Duration::from_millis(300)),
            ],
        )
        .await
        .expect("proxy");
        let mut c = Client::connect(proxy.addr()).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(50), c.call("/late")).await;
        assert!(gave_up.is_err(), "held past the client's wait");
        assert_eq!(seen.load(Ordering::SeqCst), 0, "not forwarded yet");
        assert!(proxy.settled(Duration::from_secs(5)).await);
        assert_eq!(seen.load(Ordering::SeqCst), 1, "forwarded all the same");

        let gave_up = tokio::time::timeout(Duration::from_millis(50), c.call("/slow")).await;
        assert!(gave_up.is_err(), "the answer is held");
        assert!(proxy.settled(Duration::from_secs(5)).await);
        assert_eq!(seen.load(Ordering::SeqCst), 2, "the server acted at once");
    }
}
