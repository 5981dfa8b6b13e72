//! The gateway's data plane served in the test's own process, for tests that build an
//! [`App`] by hand (a store swapped for one that fails on demand, or shared with a library
//! service).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_gateway::app::{self, App};
use tokio::net::TcpListener;

/// Serves `app` on a spare loopback port for as long as the test's runtime lives; its
/// address.
pub async fn serve(app: App) -> SocketAddr {
    let app = Arc::new(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        loop {
            let Ok((stream, remote)) = listener.accept().await else {
                continue;
            };
            let conn = builder
                .serve_connection(TokioIo::new(stream), app::service(Arc::clone(&app), remote))
                .into_owned();
            tokio::spawn(conn);
        }
    });
    addr
}
