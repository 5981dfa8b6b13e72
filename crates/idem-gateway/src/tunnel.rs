//! HTTP/1.1 protocol upgrades (WebSocket and the like) through unprotected routes: after the
//! upstream's `101`, the client's connection and the upstream's are joined byte for byte,
//! under the limits of the connection the upgrade came from. A tunnel keeps that
//! connection's slot under `limits.max_connections` until it ends, and is closed once nothing
//! moved either way for `limits.tunnel_idle_timeout` or the listener stops.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::header;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::activity::{Activity, Tracked};
use crate::config::Limits;

/// What a tunnel made from a connection holds and obeys. The listener puts one in every
/// request that asks for an upgrade; a request served without one (by a server other than
/// the listener) gets a tunnel that holds no slot and closes after the default idle time.
#[derive(Clone, Debug)]
pub(crate) struct Terms {
    /// The connection's slot under `limits.max_connections`, so tunnels count against it.
    slot: Option<Arc<OwnedSemaphorePermit>>,
    /// Longest the tunnel may go with no byte moved either way.
    idle: Duration,
    /// The listener's stop flag. The gateway cannot finish a tunnel's protocol gracefully,
    /// so a stopping listener closes its tunnels rather than wait for them until the grace
    /// runs out.
    stop: Option<watch::Receiver<bool>>,
}

impl Default for Terms {
    fn default() -> Self {
        Self {
            slot: None,
            idle: Limits::default().tunnel_idle_timeout,
            stop: None,
        }
    }
}

impl Terms {
    /// The terms of a connection holding `slot`, under `idle`, until `stop`.
    pub(crate) fn new(
        slot: Arc<OwnedSemaphorePermit>,
        idle: Duration,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            slot: Some(slot),
            idle,
            stop: Some(stop),
        }
    }
}

/// A request's upgrade: the client connection's upgrade handle, the protocol asked for, and
/// the terms its tunnel runs under.
#[derive(Debug)]
pub(crate) struct Upgrade {
    client: OnUpgrade,
    /// The protocol asked for (`Upgrade: <protocol>`).
    pub(crate) protocol: HeaderValue,
    terms: Terms,
}

/// The request's upgrade, if it asks for one the way HTTP/1.1 does (`Connection: upgrade` and
/// `Upgrade: <protocol>`).
pub(crate) fn take(parts: &mut http::request::Parts) -> Option<Upgrade> {
    if parts.version != http::Version::HTTP_11 {
        return None;
    }
    let protocol = parts.headers.get(header::UPGRADE)?.clone();
    let asked = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !asked {
        return None;
    }
    let client = parts.extensions.remove::<OnUpgrade>()?;
    let terms = parts.extensions.remove::<Terms>().unwrap_or_default();
    Some(Upgrade {
        client,
        protocol,
        terms,
    })
}

impl Upgrade {
    /// Joins the upgraded client connection to the upgraded `upstream` connection until
    /// either side closes, nothing moves either way for the idle time, or the listener
    /// stops; then both connections are closed and the slot is given back.
    pub(crate) async fn tunnel(self, upstream: OnUpgrade) {
        let Terms { slot, idle, stop } = self.terms;
        let client = self.client;
        let activity = Arc::new(Activity::new());
        let joined = async {
            let (client, upstream) = match tokio::try_join!(client, upstream) {
                Ok(both) => both,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed");
                    return;
                }
            };
            // Every byte either way passes the client's side: tracking it alone sees both.
            let mut client = Tracked::new(TokioIo::new(client), Arc::clone(&activity));
            let mut upstream = TokioIo::new(upstream);
            match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
                Err(e) => tracing::debug!(error = %e, "upgraded connection ended with an error"),
            }
        };
        let stopped = async move {
            match stop {
                Some(mut stop) => {
                    let _ = stop.wait_for(|s| *s).await;
                }
                None => std::future::pending().await,
            }
        };
        // Dropping `joined` drops both upgraded connections, which closes them.
        tokio::select! {
            () = joined => {}
            () = activity.idle_for(idle) => tracing::debug!(?idle, "closing an idle tunnel"),
            () = stopped => tracing::debug!("closing a tunnel: the listener stops"),
        }
        drop(slot);
    }
}
