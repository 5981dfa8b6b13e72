//! The gateway process: the store, the listeners, reload on SIGHUP and graceful shutdown.
//!
//! On SIGTERM (or Ctrl-C) the listeners stop accepting, in-flight requests get up to
//! `shutdown_grace` to finish, and claims still held after that are released as an
//! interrupted run's would be (unknown under `hold`, retryable under `reexecute`), so no
//! lease is left to expire.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use idem_core::{BoxStore, CachedStore};
use idem_http::{BoxError, RunGuard};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::admin::Admin;
use crate::app::Peer;
use crate::body::ResBody;
use crate::claims::TrackedStore;
use crate::config::{AdminSettings, Settings};
use crate::health::Scrape;
use crate::metrics::MeteredStore;
use crate::reload::{Live, LoadSettings};
use crate::shared::GatewayStore;
use crate::tokens::GatewayTokens;
use crate::upstream::UpstreamSpec;
use crate::{demo, listener, store};

/// Runs the gateway until SIGTERM or Ctrl-C, then drains. SIGHUP reloads the configuration
/// through `load` (see [`crate::reload`]).
///
/// Prints one line per listener on stdout once it is bound (`idem listening on http://…`,
/// `admin listening on https://…`, `demo upstream on http://…`), so scripts and tests can
/// use port 0.
///
/// # Errors
/// The store cannot be opened, a listener cannot be bound, or a certificate cannot be read.
pub async fn run(
    settings: Settings,
    metrics: Option<PrometheusHandle>,
    load: LoadSettings,
) -> anyhow::Result<()> {
    let (store, cache) = open_store(&settings).await?;
    if let Some(handle) = &metrics {
        spawn_upkeep(handle.clone());
    }
    let demo_upstream = start_demo(&settings).await?;
    let tokens = open_tokens(&settings).await?;
    let live = Arc::new(Live::new(
        settings.clone(),
        store.clone(),
        tokens,
        demo_upstream,
        load,
    )?);
    let (stop_tx, stop) = watch::channel(false);
    let grace = settings.shutdown_grace;

    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let data_addr = listener.local_addr()?;
    let admin_task = match &settings.admin {
        Some(a) => {
            let l = TcpListener::bind(a.listen)
                .await
                .with_context(|| format!("cannot listen on {} (admin)", a.listen))?;
            if l.local_addr()? == data_addr {
                anyhow::bail!("the admin listener must not share the data listener's address");
            }
            let scrape = metrics.map(|handle| {
                let scrape = Scrape::new(handle).read_token(a.metrics_token.clone());
                match cache.clone() {
                    Some(cache) => scrape.cache(move || cache.stats()),
                    None => scrape,
                }
            });
            Some(start_admin(
                l,
                &settings,
                a,
                &store,
                scrape,
                &live,
                stop.clone(),
            )?)
        }
        None => None,
    };
    let tls = live.data_tls();
    println!("idem listening on {}://{data_addr}", tls.scheme());
    tracing::info!(addr = %data_addr, store = %settings.store, routes = settings.routes.len(), instance = %idem_core::audit::this_instance(), "gateway up");

    tokio::spawn(reload_on_sighup(Arc::clone(&live)));
    let reconciler = match settings.reconcile.every {
        Some(every) => {
            let reconciler =
                crate::reconcile::Reconciler::new(&settings, store.clone(), "reconcile:serve")?;
            tracing::info!(every = ?every, namespaces = ?reconciler.namespaces().collect::<Vec<_>>(), "reconciler on");
            Some(tokio::spawn(reconciler.run_every(every)))
        }
        None => None,
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let data = DataPlane {
        live: Arc::clone(&live),
        requests: Arc::new(Semaphore::new(settings.limits.max_concurrent_requests)),
    };
    let stopped_at =
        listener::serve(listener, tls, settings.limits, data, stop, move || grace).await;

    // Connections are closed (or the grace ran out). A run whose client went away goes on
    // in the background: wait for it until the grace ends, then release what is still held.
    drain(&store, stopped_at + grace, settings.store_timeout).await;
    if let Some(t) = admin_task {
        t.abort();
    }
    if let Some(t) = reconciler {
        t.abort();
    }
    tracing::info!("shutdown complete");
    Ok(())
}

/// The store every route shares: the configured backend, metered (below the cache, so store
/// latency is the store's and cache hits count as hits), behind the local cache tier when
/// one is configured, and tracked so the drain at shutdown can release what is still held.
/// The cache is returned too, for its figures on `/metrics`.
async fn open_store(
    settings: &Settings,
) -> anyhow::Result<(GatewayStore, Option<CachedStore<MeteredStore<BoxStore>>>)> {
    let backend = store::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
        None,
    )
    .await
    .with_context(|| format!("cannot open store {}", settings.store))?;
    let backend = MeteredStore::new(backend);
    let (store, cache) = match settings.store_cache {
        Some((entries, max_age)) => {
            let cached = CachedStore::new(backend, entries, max_age);
            (BoxStore::new(cached.clone()), Some(cached))
        }
        None => (BoxStore::new(backend), None),
    };
    Ok((TrackedStore::new(store), cache))
}

/// Folds the histograms' raw samples into buckets every 5 s: without it, memory grows with
/// every request between scrapes.
fn spawn_upkeep(handle: PrometheusHandle) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

/// The demo upstream, when the settings ask for one: started on a loopback port and
/// announced on stdout.
async fn start_demo(settings: &Settings) -> anyhow::Result<Option<UpstreamSpec>> {
    if !settings.demo_upstream {
        return Ok(None);
    }
    let (addr, _) = demo::spawn(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    println!("demo upstream on http://{addr}");
    let uri = format!("http://{addr}")
        .parse()
        .context("demo upstream address")?;
    Ok(Some(UpstreamSpec::plain(uri)))
}

/// The token store next to the records, when a route takes one-time tokens: they are issued
/// into it and consumed from it.
async fn open_tokens(settings: &Settings) -> anyhow::Result<Option<GatewayTokens>> {
    if !settings.routes.iter().any(|r| r.policy.token.is_some()) {
        return Ok(None);
    }
    let tokens = GatewayTokens::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
    )
    .await
    .with_context(|| format!("cannot open the token store of {}", settings.store))?;
    Ok(Some(tokens))
}

/// Serves the admin API on `listener` (bound, and checked to be apart from the data
/// listener) until `stop`, announcing it on stdout.
fn start_admin(
    listener: TcpListener,
    settings: &Settings,
    a: &AdminSettings,
    store: &GatewayStore,
    scrape: Option<Scrape>,
    live: &Arc<Live>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<tokio::time::Instant>> {
    let addr = listener.local_addr()?;
    let admin = Arc::new(
        Admin::new(
            store.clone(),
            a.token.clone(),
            scrape,
            settings.store_timeout,
            Some(Arc::clone(live)),
        )
        .with_audit_level(settings.audit.level),
    );
    let tls = live.admin_tls();
    println!("admin listening on {}://{addr}", tls.scheme());
    tracing::info!(%addr, "admin listener up");
    let make = AdminPlane(admin.router());
    // The admin listener has no request cap of its own beyond the connection limit.
    let (limits, grace) = (settings.limits, settings.shutdown_grace);
    Ok(tokio::spawn(listener::serve(
        listener,
        tls,
        limits,
        make,
        stop,
        move || grace,
    )))
}

/// Reloads the configuration on every SIGHUP, logging what happened.
async fn reload_on_sighup(live: Arc<Live>) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP; reload through the admin API only");
            return;
        };
        while hup.recv().await.is_some() {
            match live.reload().await {
                Ok(summary) => tracing::info!(%summary, "SIGHUP: configuration reloaded"),
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "SIGHUP: reload refused; the running configuration is kept"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = live;
}

/// The data listener's connections: every request through the data plane in force, at most
/// `max_concurrent_requests` at once.
struct DataPlane {
    live: Arc<Live>,
    requests: Arc<Semaphore>,
}

impl listener::MakeService for DataPlane {
    type Body = ResBody;
    type Service = DataService;

    fn make(&self, remote: SocketAddr, tls: bool) -> DataService {
        DataService {
            live: Arc::clone(&self.live),
            requests: Arc::clone(&self.requests),
            peer: Arc::new(Peer::new(remote).over_tls(tls)),
        }
    }
}

/// One connection's service on the data listener.
#[derive(Clone)]
struct DataService {
    live: Arc<Live>,
    requests: Arc<Semaphore>,
    peer: Arc<Peer>,
}

impl hyper::service::Service<Request<Incoming>> for DataService {
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let app = this.live.app();
            let Ok(permit) = Arc::clone(&this.requests).try_acquire_owned() else {
                let res = app.overloaded();
                // A gRPC client reads only gRPC statuses, as every other refusal gives it.
                if idem_wire::header::is_grpc(req.headers()) {
                    return Ok(crate::grpc::refusal(res).await);
                }
                return Ok(res);
            };
            // The permit is released when both this future and the protected run are done:
            // a run whose client went away finishes in the background, and still counts.
            let guard = RunGuard::new(permit);
            req.extensions_mut().insert(guard.clone());
            let res = app.handle_from(req, &this.peer).await;
            drop(guard);
            Ok(res)
        })
    }
}

/// The admin listener's connections: the admin router.
struct AdminPlane(axum::Router);

impl listener::MakeService for AdminPlane {
    type Body = ResBody;
    type Service = AdminService;

    fn make(&self, _remote: SocketAddr, _tls: bool) -> AdminService {
        AdminService(self.0.clone())
    }
}

/// One connection's service on the admin listener.
#[derive(Clone)]
struct AdminService(axum::Router);

impl hyper::service::Service<Request<Incoming>> for AdminService {
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let router = self.0.clone();
        Box::pin(async move {
            let res = match tower::ServiceExt::oneshot(router, req.map(axum::body::Body::new)).await
            {
                Ok(res) => res,
                Err(never) => match never {},
            };
            Ok(res.map(|b| b.map_err(BoxError::from).boxed_unsync()))
        })
    }
}

/// Waits for every claim to settle by `deadline`; releases the rest.
async fn drain(store: &GatewayStore, deadline: tokio::time::Instant, store_timeout: Duration) {
    let left = store.wait_settled(deadline).await;
    if left > 0 {
        let released = store.release_all(store_timeout).await;
        tracing::warn!(
            left,
            released,
            "drain deadline passed: released claims still in flight"
        );
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
