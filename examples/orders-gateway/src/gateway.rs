//! The idem gateway's data plane, in this process, in front of the orders service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use idem_core::BoxStore;
use idem_gateway::app::{self, App};
use idem_gateway::claims::TrackedStore;
use idem_gateway::config;
use idem_gateway::upstream::Clients;
use tokio::net::TcpListener;

/// The gateway's configuration: one protected route for paying orders, on the PostgreSQL
/// store. The route re-runs a request whose upstream timed out (`upstream_failure =
/// "retry"`), which is safe only because the service refuses a stale fence and a second
/// payment under one key (`fenced_upstream = true` says so, and keeps `check-config` quiet);
/// its status webhook settles keys a dead gateway left unknown.
pub fn config(store_url: &str, table: &str, namespace: &str, upstream: SocketAddr) -> String {
    format!(
        r#"
store = "{store_url}"
store_table = "{table}"
upstream = "http://{upstream}"

[[routes]]
name = "pay"
namespace = "{namespace}"
method = "POST"
path = "/orders/{{id}}/pay"
principal = {{ from = "none" }}
timeout = "1s"
upstream_failure = "retry"
fenced_upstream = true
status_url = "/payments/status?key={{key}}"
"#
    )
}

/// Starts the gateway with `toml` on a spare loopback port; its address.
///
/// # Errors
/// A configuration the gateway refuses, or a store it cannot open.
pub async fn start(toml: &str) -> anyhow::Result<SocketAddr> {
    let settings = config::compile(&config::from_toml(toml)?)?;
    let store = idem_gateway::store::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
        None,
    )
    .await
    .context("opening the store")?;
    let mut clients = Clients::new(Duration::from_secs(2), 16);
    let app = App::new(
        &settings,
        TrackedStore::new(BoxStore::new(store)),
        settings.upstream.as_ref(),
        &mut clients,
    )?;
    let app = Arc::new(app);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        while let Ok((stream, remote)) = listener.accept().await {
            let conn = builder
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    app::service(Arc::clone(&app), remote),
                )
                .into_owned();
            tokio::spawn(conn);
        }
    });
    Ok(addr)
}
