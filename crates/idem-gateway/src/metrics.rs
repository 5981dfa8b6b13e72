//! Prometheus metrics: the recorder, a store wrapper that measures every store call, and the
//! per-request counters fed by each answer's [`Outcome`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::{Around, StoreFuture, StoreOp};
use idem_core::{
    ClaimOutcome, ClaimRequest, Outcome, OwnerId, Refusal, ReleaseKind, ScopedKey, SettleOutcome,
    Store, StoreError, StoredResponse,
};
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
        "Requests through the gateway, by outcome"
    );
    metrics::describe_counter!("idem_replays_total", "Stored responses replayed");
    metrics::describe_counter!(
        "idem_conflicts_total",
        "Requests refused because the same key was in flight (409)"
    );
    metrics::describe_counter!(
        "idem_mismatches_total",
        "Keys reused with a different request (422)"
    );
    metrics::describe_counter!(
        "idem_takeovers_total",
        "Expired leases taken over by a new claim"
    );
    metrics::describe_counter!(
        "idem_fenced_total",
        "Results discarded because a newer holder owned the key"
    );
    metrics::describe_counter!(
        "idem_store_errors_total",
        "Store operations that failed, by operation"
    );
    metrics::describe_histogram!(
        "idem_store_op_seconds",
        metrics::Unit::Seconds,
        "Store operation latency, by operation"
    );
    metrics::describe_counter!(
        "idem_upstream_failures_total",
        "Upstream failures, by kind (connect, timeout, reset)"
    );
    Ok(handle)
}

struct OpMetrics {
    latency: Histogram,
    errors: Counter,
}

struct Handles {
    ops: Vec<OpMetrics>,
    takeovers: Counter,
    fenced: Counter,
}

/// Wraps a store: measures latency and errors per operation, and counts takeovers and
/// fenced results.
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
            fenced: metrics::counter!("idem_fenced_total"),
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

    fn settled(&self, outcome: &Result<SettleOutcome, StoreError>) {
        if matches!(outcome, Ok(SettleOutcome::Fenced)) {
            self.handles.fenced.increment(1);
        }
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

    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let outcome = self
            .around(StoreOp::Complete, || {
                self.inner.complete(key, owner, fence, response, ttl)
            })
            .await;
        self.settled(&outcome);
        outcome
    }

    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let outcome = self
            .around(StoreOp::Release, || {
                self.inner.release(key, owner, fence, kind)
            })
            .await;
        self.settled(&outcome);
        outcome
    }

    idem_core::forward_store!(|m| &m.inner, around = m; renew, get, list, resolve, delete, audit);
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
const REFUSALS: [&str; 10] = [
    "key_missing",
    "key_malformed",
    "key_multiple",
    "unauthenticated",
    "body_too_large",
    "body_unreadable",
    "response_not_stored",
    "no_route",
    "bad_target",
    "overloaded",
];

fn outcome_index(o: Outcome) -> Option<usize> {
    OUTCOMES.iter().position(|l| *l == o.as_str())
}

fn refusal_index(r: Refusal) -> Option<usize> {
    REFUSALS.iter().position(|l| *l == r.as_str())
}

/// The per-outcome request counters, looked up in the recorder once: incrementing a held
/// handle is one atomic add, where registering a labelled counter per request would look
/// it up in the registry every time.
#[derive(Clone)]
pub struct OutcomeCounters {
    requests: Vec<Counter>,
    refusals: Vec<Counter>,
    replays: Counter,
    conflicts: Counter,
    mismatches: Counter,
}

impl std::fmt::Debug for OutcomeCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutcomeCounters").finish_non_exhaustive()
    }
}

impl Default for OutcomeCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl OutcomeCounters {
    /// Handles from whichever recorder is installed now (none: they are dropped).
    pub fn new() -> Self {
        Self {
            requests: OUTCOMES
                .iter()
                .map(|o| metrics::counter!("idem_requests_total", "outcome" => *o))
                .collect(),
            refusals: REFUSALS
                .iter()
                .map(|r| metrics::counter!("idem_refusals_total", "reason" => *r))
                .collect(),
            replays: metrics::counter!("idem_replays_total"),
            conflicts: metrics::counter!("idem_conflicts_total"),
            mismatches: metrics::counter!("idem_mismatches_total"),
        }
    }

    /// Counts one request's outcome.
    pub fn record(&self, outcome: Outcome) {
        if let Some(c) = outcome_index(outcome).and_then(|i| self.requests.get(i)) {
            c.increment(1);
        }
        match outcome {
            Outcome::Replayed => self.replays.increment(1),
            Outcome::InFlight => self.conflicts.increment(1),
            Outcome::Mismatch => self.mismatches.increment(1),
            Outcome::Refused(why) => {
                if let Some(c) = refusal_index(why).and_then(|i| self.refusals.get(i)) {
                    c.increment(1);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{Kept, ReleaseKind};

    use super::*;

    #[test]
    fn every_outcome_and_refusal_has_its_counter() {
        for o in [
            Outcome::Executed(Kept::Stored),
            Outcome::Executed(Kept::Released(ReleaseKind::Unknown)),
            Outcome::Replayed,
            Outcome::InFlight,
            Outcome::Unknown,
            Outcome::Mismatch,
            Outcome::Refused(Refusal::KeyMissing),
            Outcome::StoreUnavailable,
            Outcome::Fenced,
            Outcome::Passthrough,
            Outcome::Queried,
        ] {
            assert!(outcome_index(o).is_some(), "{o}");
        }
        for r in [
            Refusal::KeyMissing,
            Refusal::KeyMalformed,
            Refusal::KeyMultiple,
            Refusal::Unauthenticated,
            Refusal::BodyTooLarge,
            Refusal::BodyUnreadable,
            Refusal::ResponseNotStored,
            Refusal::NoRoute,
            Refusal::BadTarget,
            Refusal::Overloaded,
        ] {
            assert!(refusal_index(r).is_some(), "{r:?}");
        }
    }
}
