//! The upstream's share of a request's time: a proxy that records how long each forward took.

use std::time::Instant;

use http::Request;
use idem_http::RequestBody;
use metrics::Histogram;

use crate::body::Upstream;
use crate::proxy::Proxy;

/// A [`Proxy`] that records each forward's duration (to the response head, or to the
/// buffered body on protected routes; failures included) in
/// `idem_upstream_duration_seconds{route}`.
#[derive(Clone)]
pub struct TimedProxy {
    proxy: Proxy,
    latency: Histogram,
}

impl std::fmt::Debug for TimedProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedProxy")
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl TimedProxy {
    /// Times `proxy` under the label `route`.
    pub fn new(proxy: Proxy, route: &str) -> Self {
        Self {
            proxy,
            latency: metrics::histogram!("idem_upstream_duration_seconds", "route" => route.to_owned()),
        }
    }

    /// Forwards one request, as [`Proxy::forward`], and records how long it took.
    pub async fn forward(&self, req: Request<RequestBody>) -> Upstream {
        let started = Instant::now();
        let res = self.proxy.forward(req).await;
        self.latency.record(started.elapsed().as_secs_f64());
        res
    }
}

crate::proxy::forwarding_service!(TimedProxy);
