//! Accepting connections: optional TLS (with certificates that can be swapped while the
//! listener runs), a cap on open connections (an upgraded tunnel keeps its connection's
//! slot), a header read timeout, an idle timeout, and a graceful stop that lets every open
//! connection finish its requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use idem_http::BoxError;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::activity::{Activity, InFlight, Tracked};
use crate::config::Limits;
use crate::tls::{TlsFiles, server_config_opt};
use crate::tunnel::Terms;

/// A listener's TLS acceptor, swappable while it accepts (certificate reload). Empty means
/// plain TCP.
#[derive(Default)]
pub struct Tls(ArcSwapOption<TlsAcceptor>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tls").field(&self.scheme()).finish()
    }
}

impl Tls {
    /// An acceptor for `files`, or plain TCP for `None`.
    ///
    /// # Errors
    /// See [`server_config`](crate::tls::server_config).
    pub fn new(files: Option<&TlsFiles>) -> anyhow::Result<Self> {
        let tls = Self::default();
        tls.load(files)?;
        Ok(tls)
    }

    /// Reads `files` again and uses them for new connections; open ones keep theirs.
    ///
    /// # Errors
    /// See [`server_config`](crate::tls::server_config); the acceptor in use is kept.
    pub fn load(&self, files: Option<&TlsFiles>) -> anyhow::Result<()> {
        self.set(server_config_opt(files)?);
        Ok(())
    }

    /// Uses `config` for new connections (`None`: plain TCP); open ones keep theirs.
    pub fn set(&self, config: Option<rustls::ServerConfig>) {
        self.0
            .store(config.map(|c| Arc::new(TlsAcceptor::from(Arc::new(c)))));
    }

    /// The URL scheme clients use.
    pub fn scheme(&self) -> &'static str {
        if self.0.load().is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// What a connection's service is made from: the peer's address.
pub(crate) trait MakeService: Send + Sync + 'static {
    /// The body of the answers.
    type Body: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static;
    /// The service for one connection.
    type Service: hyper::service::Service<
            Request<Incoming>,
            Response = Response<Self::Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static;

    /// The service for a connection from `remote`; `tls` says whether it came over TLS.
    fn make(&self, remote: SocketAddr, tls: bool) -> Self::Service;
}

/// Accepts on `listener` until `stop` turns true, then asks every open connection to finish
/// its requests and close. Resolves when the last one closed, or `grace` after `stop`, with
/// the instant the stop was seen.
pub(crate) async fn serve<M: MakeService>(
    listener: TcpListener,
    tls: Arc<Tls>,
    limits: Limits,
    make: M,
    mut stop: watch::Receiver<bool>,
    grace: impl Fn() -> Duration,
) -> Instant {
    let make = Arc::new(make);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    loop {
        // At the cap, stop accepting: the kernel's backlog holds the rest.
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = stopped(&mut stop) => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            remote,
            builder: Arc::clone(&builder),
            make: Arc::clone(&make),
            limits,
            stop: stop.clone(),
            slot: Arc::new(permit),
        };
        let acceptor = tls.0.load_full();
        tokio::spawn(conn.run(stream, acceptor));
    }
    drop(listener);
    let stopped_at = Instant::now();
    // Every permit back means every connection (and every tunnel) closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace(), slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with connections still open");
    }
    stopped_at
}

struct Connection<M> {
    remote: SocketAddr,
    builder: Arc<auto::Builder<TokioExecutor>>,
    make: Arc<M>,
    limits: Limits,
    stop: watch::Receiver<bool>,
    /// The connection's place under `max_connections`, given back when the connection and
    /// any tunnel upgraded from it are closed.
    slot: Arc<OwnedSemaphorePermit>,
}

impl<M: MakeService> Connection<M> {
    async fn run(self, stream: TcpStream, acceptor: Option<Arc<TlsAcceptor>>) {
        let activity = Arc::new(Activity::new());
        match acceptor {
            None => {
                let io = Tracked::new(stream, Arc::clone(&activity));
                self.serve(io, activity, false).await;
            }
            Some(acceptor) => {
                // A handshake is bounded like a request head: a client that stalls in it
                // holds a connection slot.
                let handshake =
                    tokio::time::timeout(self.limits.header_read_timeout, acceptor.accept(stream));
                let io = match handshake.await {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        tracing::debug!(remote = %self.remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(remote = %self.remote, "TLS handshake timed out");
                        return;
                    }
                };
                let io = Tracked::new(io, Arc::clone(&activity));
                self.serve(io, activity, true).await;
            }
        }
    }

    async fn serve<I>(self, io: Tracked<I>, activity: Arc<Activity>, tls: bool)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = Counted {
            inner: self.make.make(self.remote, tls),
            activity: Arc::clone(&activity),
            tunnel: Terms::new(
                self.slot,
                self.limits.tunnel_idle_timeout,
                self.stop.clone(),
            ),
        };
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        tokio::pin!(conn);
        let mut stop = self.stop;
        let idle = self.limits.idle_timeout;
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = stopped(&mut stop) => {}
            () = activity.idle_for(idle) => {
                tracing::debug!(remote = %self.remote, ?idle, "closing an idle connection");
            }
        }
        // Finish what is in progress, then close.
        conn.as_mut().graceful_shutdown();
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}

/// Resolves once the stop flag is raised (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Counts a connection's requests in progress, so an idle timeout never cuts one short, and
/// hands a request that asks for an upgrade the terms its tunnel runs under.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
    tunnel: Terms,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        >,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        // Only a request that may upgrade carries them: hyper adds its upgrade handle then.
        if req
            .extensions()
            .get::<hyper::upgrade::OnUpgrade>()
            .is_some()
        {
            req.extensions_mut().insert(self.tunnel.clone());
        }
        let guard = InFlight::new(Arc::clone(&self.activity));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            drop(guard);
            res
        })
    }
}
