//! Listeners, the accept loops and graceful shutdown.
//!
//! On SIGTERM (or Ctrl-C) the data listener stops accepting, in-flight requests get up to
//! `shutdown_grace` to finish, and claims still held after that are released as an
//! interrupted run's would be (unknown under `hold`, retryable under `reexecute`), so no
//! lease is left to expire.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::admin::Admin;
use crate::app::GatewayStore;
use crate::app::{self, App};
use crate::claims::TrackedStore;
use crate::config::Settings;
use crate::metrics::MeteredStore;
use crate::{demo, proxy, store};

/// Runs the gateway until SIGTERM or Ctrl-C, then drains.
///
/// Prints one line per listener on stdout once it is bound (`idem listening on http://…`,
/// `admin listening on http://…`, `demo upstream on http://…`), so scripts and tests can
/// use port 0.
///
/// # Errors
/// The store cannot be opened or a listener cannot be bound.
pub async fn run(settings: Settings, metrics: Option<PrometheusHandle>) -> anyhow::Result<()> {
    let backend = store::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
        settings.store_cache,
    )
    .await
    .with_context(|| format!("cannot open store {}", settings.store))?;
    let store = TrackedStore::new(MeteredStore::new(backend));
    if let Some(handle) = &metrics {
        // Histograms keep raw samples until upkeep folds them into buckets: without it,
        // memory grows with every request between scrapes.
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
    }

    let mut upstream = settings.upstream.clone();
    if settings.demo_upstream {
        let (addr, _) = demo::spawn(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        println!("demo upstream on http://{addr}");
        upstream = Some(
            format!("http://{addr}")
                .parse()
                .context("demo upstream address")?,
        );
    }
    let client = proxy::client(
        settings.upstream_connect_timeout,
        settings.upstream_pool_max_idle,
    );
    let app = Arc::new(App::new(
        &settings,
        store.clone(),
        upstream.as_ref(),
        &client,
    )?);

    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let data_addr = listener.local_addr()?;
    let admin_task = match &settings.admin {
        Some(a) => {
            let l = TcpListener::bind(a.listen)
                .await
                .with_context(|| format!("cannot listen on {} (admin)", a.listen))?;
            let addr = l.local_addr()?;
            if addr == data_addr {
                anyhow::bail!("the admin listener must not share the data listener's address");
            }
            let admin = Arc::new(Admin::new(
                store.clone(),
                a.token.clone(),
                metrics,
                settings.store_timeout,
            ));
            println!("admin listening on http://{addr}");
            tracing::info!(%addr, "admin listener up");
            Some(tokio::spawn(serve_admin(l, admin)))
        }
        None => None,
    };
    println!("idem listening on http://{data_addr}");
    tracing::info!(addr = %data_addr, store = %settings.store, routes = settings.routes.len(), "gateway up");

    let graceful = serve_data(listener, app, shutdown_signal()).await;

    tracing::info!(grace = ?settings.shutdown_grace, "shutting down: no new connections; draining in-flight requests");
    let deadline = tokio::time::Instant::now() + settings.shutdown_grace;
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with requests still in flight");
    }
    drain(&store, deadline, settings.store_timeout).await;
    if let Some(t) = admin_task {
        t.abort();
    }
    tracing::info!("shutdown complete");
    Ok(())
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

/// Accepts until `shutdown` resolves; returns the watcher of the open connections.
async fn serve_data(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let conn = builder.serve_connection(TokioIo::new(stream), app::service(Arc::clone(&app), remote)).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful
}

async fn serve_admin(listener: TcpListener, admin: Arc<Admin>) {
    if let Err(e) = axum::serve(listener, admin.router()).await {
        tracing::error!(error = %e, "admin listener stopped");
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
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
