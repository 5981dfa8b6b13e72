//! Prometheus metrics: the recorder, a store wrapper that measures every store call, and the
//! per-request counters fed by each answer's [`Outcome`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::{Around, StoreFuture, StoreOp};
use idem_core::{ClaimOutcome, ClaimRequest, Outcome, Refusal, Store, StoreError};
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the global Prometheus recorder and returns the handle that renders it.
///
/// # Errors
/// A recorder was already installed.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let buckets = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;
    metrics::describe_counter!(
        "idem_requests_total",
        "Requests through the gateway, by route and outcome"
    );
    metrics::describe_counter!(
        "idem_refusals_total",
        "Requests refused before anything ran, by reason (a breakdown of outcome=\"refused\")"
    );
    metrics::describe_histogram!(
        "idem_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time from a request's arrival to its response head, by route and outcome"
    );
    metrics::describe_histogram!(
        "idem_upstream_duration_seconds",
        metrics::Unit::Seconds,
        "Time the upstream took to answer (failures included), by route"
    );
    metrics::describe_counter!(
        "idem_takeovers_total",
        "Expired leases taken over by a new claim"
    );
    metrics::describe_counter!(
        "idem_status_webhook_total",
        "Status webhook calls made when a request found its key unknown, by route and answer (done, not_done, unknown)"
    );
    metrics::describe_counter!(
        "idem_store_errors_total",
        "Store operations that failed, by operation"
    );
    metrics::describe_histogram!(
        "idem_store_op_seconds",
        metrics::Unit::Seconds,
        "Store round-trip latency, by operation (answers from the local cache are not store operations)"
    );
    metrics::describe_counter!(
        "idem_upstream_failures_total",
        "Upstream failures, by kind (connect, timeout, reset)"
    );
    metrics::describe_gauge!(
        "idem_claims_held",
        "Claims this process holds right now (handlers running or settling)"
    );
    metrics::describe_counter!(
        "idem_cache_hits_total",
        "Claims answered from the local cache of completed responses"
    );
    metrics::describe_counter!(
        "idem_cache_misses_total",
        "Claims the local cache passed on to the store"
    );
    metrics::describe_gauge!(
        "idem_build_info",
        "Always 1; the labels name the version and the compiled-in store backends"
    );
    crate::observe::build::record_build_info();
    Ok(handle)
}

struct OpMetrics {
    latency: Histogram,
    errors: Counter,
}

struct Handles {
    ops: Vec<OpMetrics>,
    takeovers: Counter,
}

/// Wraps a store: measures latency and errors per operation, and counts takeovers.
#[derive(Clone)]
pub struct MeteredStore<S> {
    inner: S,
    handles: Arc<Handles>,
}

impl<S> std::fmt::Debug for MeteredStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore").finish_non_exhaustive()
    }
}

impl<S: Store> MeteredStore<S> {
    /// Wraps `inner`. Metrics go to whichever recorder is installed (none: they are dropped).
    pub fn new(inner: S) -> Self {
        let ops = StoreOp::ALL
            .iter()
            .map(|op| OpMetrics {
                latency: metrics::histogram!("idem_store_op_seconds", "op" => op.as_str()),
                errors: metrics::counter!("idem_store_errors_total", "op" => op.as_str()),
            })
            .collect();
        let handles = Handles {
            ops,
            takeovers: metrics::counter!("idem_takeovers_total"),
        };
        Self {
            inner,
            handles: Arc::new(handles),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Store> Around for MeteredStore<S> {
    async fn around<F: StoreFuture>(
        &self,
        op: StoreOp,
        call: impl FnOnce() -> F + Send,
    ) -> F::Output {
        let started = Instant::now();
        let result = call().await;
        if let Some(m) = self.handles.ops.get(op.index()) {
            m.latency.record(started.elapsed().as_secs_f64());
            if result.is_err() {
                m.errors.increment(1);
            }
        }
        result
    }
}

impl<S: Store> Store for MeteredStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self
            .around(StoreOp::Claim, || self.inner.claim(req))
            .await?;
        if let ClaimOutcome::Claimed { takeover: true, .. } = &outcome {
            self.handles.takeovers.increment(1);
        }
        Ok(outcome)
    }

    idem_core::forward_store!(|m| &m.inner, around = m; complete, release, renew, get, list, resolve, delete, audit);
}

/// The label values of `idem_requests_total{outcome}`, in [`outcome_index`] order.
const OUTCOMES: [&str; 10] = [
    "executed",
    "replayed",
    "in_flight",
    "unknown",
    "mismatch",
    "refused",
    "store_unavailable",
    "fenced",
    "passthrough",
    "queried",
];

/// The label values of `idem_refusals_total{reason}`, in [`refusal_index`] order.
const REFUSALS: [&str; 14] = [
    "key_missing",
    "key_malformed",
    "key_multiple",
    "unauthenticated",
    "credential_ambiguous",
    "body_too_large",
    "body_unreadable",
    "body_ambiguous",
    "body_timeout",
    "response_not_stored",
    "no_route",
    "bad_target",
    "overloaded",
    "token",
];

fn outcome_index(o: Outcome) -> Option<usize> {
    OUTCOMES.iter().position(|l| *l == o.as_str())
}

fn refusal_index(r: Refusal) -> Option<usize> {
    REFUSALS.iter().position(|l| *l == r.as_str())
}

/// The label `route` takes for requests no route matched (and for requests refused before
/// routing).
pub const NO_ROUTE: &str = "-";

/// The per-route, per-outcome request counters and latency histograms, looked up in the
/// recorder once: incrementing a held handle is one atomic add, where registering a labelled
/// metric per request would look it up in the registry every time.
#[derive(Clone)]
pub struct RequestMetrics {
    /// `[route][outcome]`; the last route is [`NO_ROUTE`].
    requests: Vec<Vec<Counter>>,
    latency: Vec<Vec<Histogram>>,
    refusals: Vec<Counter>,
}

impl std::fmt::Debug for RequestMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestMetrics")
            .field("routes", &self.requests.len())
            .finish_non_exhaustive()
    }
}

impl RequestMetrics {
    /// Handles for `routes` (by name, in match order) plus [`NO_ROUTE`], from whichever
    /// recorder is installed now (none: they are dropped).
    pub fn new<'a>(routes: impl IntoIterator<Item = &'a str>) -> Self {
        let names: Vec<String> = routes
            .into_iter()
            .chain([NO_ROUTE])
            .map(str::to_owned)
            .collect();
        let requests = names
            .iter()
            .map(|route| {
                OUTCOMES
                    .iter()
                    .map(|o| metrics::counter!("idem_requests_total", "route" => route.clone(), "outcome" => *o))
                    .collect()
            })
            .collect();
        let latency = names
            .iter()
            .map(|route| {
                OUTCOMES
                    .iter()
                    .map(|o| metrics::histogram!("idem_request_duration_seconds", "route" => route.clone(), "outcome" => *o))
                    .collect()
            })
            .collect();
        Self {
            requests,
            latency,
            refusals: REFUSALS
                .iter()
                .map(|r| metrics::counter!("idem_refusals_total", "reason" => *r))
                .collect(),
        }
    }

    /// The index [`record`](Self::record) takes for requests no route matched.
    pub fn no_route(&self) -> usize {
        self.requests.len().saturating_sub(1)
    }

    /// Counts one request of route `route` (its index in match order, or
    /// [`no_route`](Self::no_route)) that ended as `outcome` after `elapsed`.
    pub fn record(&self, route: usize, outcome: Outcome, elapsed: Duration) {
        let route = route.min(self.no_route());
        if let Some(i) = outcome_index(outcome) {
            if let Some(c) = self.requests.get(route).and_then(|r| r.get(i)) {
                c.increment(1);
            }
            if let Some(h) = self.latency.get(route).and_then(|r| r.get(i)) {
                h.record(elapsed.as_secs_f64());
            }
        }
        if let Outcome::Refused(why) = outcome
            && let Some(c) = refusal_index(why).and_then(|i| self.refusals.get(i))
        {
            c.increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{Kept, ReleaseKind};

    use super::*;

    #[test]
    fn every_outcome_and_refusal_has_its_counter() {
        let released = Outcome::Executed(Kept::Released(ReleaseKind::Unknown));
        for o in Outcome::EACH_KIND.into_iter().chain([released]) {
            assert!(outcome_index(o).is_some(), "{o}");
        }
        for r in [
            Refusal::KeyMissing,
            Refusal::KeyMalformed,
            Refusal::KeyMultiple,
            Refusal::Unauthenticated,
            Refusal::CredentialAmbiguous,
            Refusal::BodyTooLarge,
            Refusal::BodyUnreadable,
            Refusal::BodyAmbiguous,
            Refusal::BodyTimeout,
            Refusal::ResponseNotStored,
            Refusal::NoRoute,
            Refusal::BadTarget,
            Refusal::Overloaded,
            Refusal::Token,
        ] {
            assert!(refusal_index(r).is_some(), "{r:?}");
        }
    }
}
