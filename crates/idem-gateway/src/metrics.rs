//! Prometheus metrics, a store wrapper that measures every store call and tracks the claims
//! this process holds (so shutdown can settle them), and the per-request outcome counters.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};
use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, OwnerId, Record, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError, StoredResponse, TakeoverPolicy,
};
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use tokio::sync::Notify;

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

#[derive(Clone, Copy)]
enum Op {
    Claim,
    Renew,
    Complete,
    Release,
    Get,
    List,
    Resolve,
    Delete,
}

const OPS: [&str; 8] = [
    "claim", "renew", "complete", "release", "get", "list", "resolve", "delete",
];

struct OpMetrics {
    latency: Histogram,
    errors: Counter,
}

struct Handles {
    ops: Vec<OpMetrics>,
    takeovers: Counter,
    fenced: Counter,
}

/// A claim this process holds: enough to settle it at shutdown.
#[derive(Clone, Debug)]
struct Held {
    key: ScopedKey,
    takeover: TakeoverPolicy,
}

struct Claims {
    held: Mutex<HashMap<(OwnerId, u64), Held, BuildHasherDefault<ClaimIdHasher>>>,
    empty: Notify,
}

/// Hashes the gateway's own claim ids (random owner ids and fences, never client input),
/// so the default SipHash, built to resist chosen keys, is not needed on every claim and
/// settle: a multiply-rotate mix of the words.
#[derive(Debug, Default, Clone, Copy)]
struct ClaimIdHasher(u64);

impl ClaimIdHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;
}

impl Hasher for ClaimIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(Self::K);
    }

    fn write_u128(&mut self, n: u128) {
        // Truncations on purpose: the two halves.
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

/// Wraps a store: measures latency and errors per operation, counts takeovers and fenced
/// results, and remembers the claims this process holds.
#[derive(Clone)]
pub struct MeteredStore<S> {
    inner: S,
    handles: Arc<Handles>,
    claims: Arc<Claims>,
}

impl<S> std::fmt::Debug for MeteredStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore")
            .field("held", &self.claims.held.lock().len())
            .finish_non_exhaustive()
    }
}

impl<S: Store> MeteredStore<S> {
    /// Wraps `inner`. Metrics go to whichever recorder is installed (none: they are dropped).
    pub fn new(inner: S) -> Self {
        let ops = OPS
            .iter()
            .map(|op| OpMetrics {
                latency: metrics::histogram!("idem_store_op_seconds", "op" => *op),
                errors: metrics::counter!("idem_store_errors_total", "op" => *op),
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
            // Sized for the usual number in flight: a table this small (the default) filled
            // up with tombstones and rehashed on nearly every claim.
            claims: Arc::new(Claims {
                held: Mutex::new(HashMap::with_capacity_and_hasher(
                    256,
                    BuildHasherDefault::default(),
                )),
                empty: Notify::new(),
            }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Claims this process holds and has not settled yet.
    pub fn held(&self) -> usize {
        self.claims.held.lock().len()
    }

    /// Waits until every held claim is settled, or `deadline` passes; returns how many remain.
    pub async fn wait_settled(&self, deadline: tokio::time::Instant) -> usize {
        loop {
            let notified = self.claims.empty.notified();
            tokio::pin!(notified);
            // Registered before the check, so a settle in between is not missed.
            notified.as_mut().enable();
            let held = self.held();
            if held == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.held();
            }
        }
    }

    /// Releases every claim still held, as an interrupted run would be released: unknown
    /// under `hold`, retryable under `reexecute`. Returns how many were settled.
    pub async fn release_all(&self, timeout: Duration) -> usize {
        let held: Vec<((OwnerId, u64), Held)> = self.claims.held.lock().drain().collect();
        let mut settled = 0;
        for ((owner, fence), h) in held {
            let kind = match h.takeover {
                TakeoverPolicy::Hold => ReleaseKind::Unknown,
                _ => ReleaseKind::Retryable,
            };
            match tokio::time::timeout(timeout, self.inner.release(&h.key, owner, fence, kind))
                .await
            {
                Ok(Ok(_)) => {
                    settled += 1;
                    tracing::warn!(key = %h.key, fence, ?kind, "shutdown: released a claim still in flight");
                }
                Ok(Err(e)) => {
                    tracing::error!(key = %h.key, error = %e, "shutdown: release failed; the lease will expire")
                }
                Err(_) => {
                    tracing::error!(key = %h.key, "shutdown: release timed out; the lease will expire")
                }
            }
        }
        self.claims.empty.notify_waiters();
        settled
    }

    async fn measure<T>(
        &self,
        op: Op,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let m = &self.handles.ops[op as usize];
        let started = Instant::now();
        let result = fut.await;
        m.latency.record(started.elapsed().as_secs_f64());
        if result.is_err() {
            m.errors.increment(1);
        }
        result
    }

    fn settled(&self, owner: OwnerId, fence: u64, outcome: &Result<SettleOutcome, StoreError>) {
        match outcome {
            Ok(SettleOutcome::Fenced) => self.handles.fenced.increment(1),
            Ok(_) => {}
            // Still held: the engine may retry, or the lease runs out.
            Err(_) => return,
        }
        let mut held = self.claims.held.lock();
        held.remove(&(owner, fence));
        if held.is_empty() {
            self.claims.empty.notify_waiters();
        }
    }
}

impl<S: Store> Store for MeteredStore<S> {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.measure(Op::Claim, self.inner.claim(req)).await?;
        if let ClaimOutcome::Claimed { lease, takeover } = &outcome {
            if *takeover {
                self.handles.takeovers.increment(1);
            }
            self.claims.held.lock().insert(
                (lease.owner, lease.fence),
                Held {
                    key: req.key.clone(),
                    takeover: req.takeover,
                },
            );
        }
        Ok(outcome)
    }

    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.measure(Op::Renew, self.inner.renew(key, owner, fence, lease))
            .await
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
            .measure(
                Op::Complete,
                self.inner.complete(key, owner, fence, response, ttl),
            )
            .await;
        self.settled(owner, fence, &outcome);
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
            .measure(Op::Release, self.inner.release(key, owner, fence, kind))
            .await;
        self.settled(owner, fence, &outcome);
        outcome
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        self.measure(Op::Get, self.inner.get(key)).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        self.measure(Op::List, self.inner.list(filter)).await
    }

    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        self.measure(Op::Resolve, self.inner.resolve(key, resolution))
            .await
    }

    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        self.measure(Op::Delete, self.inner.delete(key)).await
    }
}

/// What became of one request, for `idem_requests_total{outcome}` and the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Not protected (safe method, unmatched route, idempotency off, or no key where optional).
    Passthrough,
    /// Claimed and sent upstream.
    Executed,
    /// A stored response was replayed.
    Replayed,
    /// Refused: the same key is in flight (409).
    InFlight,
    /// Refused: the earlier outcome is unknown (409).
    Unknown,
    /// Refused: same key, different request (422).
    Mismatch,
    /// Refused: key missing, malformed or doubled (400).
    KeyError,
    /// Refused: principal missing or invalid (401).
    Unauthenticated,
    /// Refused: the store failed (503).
    StoreUnavailable,
    /// The upstream failed (502, 503, 504 made by the gateway).
    UpstreamFailed,
    /// Any other answer made by the gateway itself.
    Refused,
}

impl RequestOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Unknown => "unknown",
            Self::Mismatch => "mismatch",
            Self::KeyError => "key_error",
            Self::Unauthenticated => "unauthenticated",
            Self::StoreUnavailable => "store_unavailable",
            Self::UpstreamFailed => "upstream_failed",
            Self::Refused => "refused",
        }
    }

    /// Counts this outcome (looks the counters up in the recorder on every call; the data
    /// plane uses [`OutcomeCounters`], which looks them up once).
    pub fn record(self) {
        metrics::counter!("idem_requests_total", "outcome" => self.as_str()).increment(1);
        match self {
            Self::Replayed => metrics::counter!("idem_replays_total").increment(1),
            Self::InFlight => metrics::counter!("idem_conflicts_total").increment(1),
            Self::Mismatch => metrics::counter!("idem_mismatches_total").increment(1),
            _ => {}
        }
    }

    const ALL: [Self; 11] = [
        Self::Passthrough,
        Self::Executed,
        Self::Replayed,
        Self::InFlight,
        Self::Unknown,
        Self::Mismatch,
        Self::KeyError,
        Self::Unauthenticated,
        Self::StoreUnavailable,
        Self::UpstreamFailed,
        Self::Refused,
    ];
}

/// The per-outcome request counters, looked up in the recorder once. Registering a labelled
/// counter on every request (key allocation, registry lookup) showed up in the gateway's
/// profile; incrementing a held handle is one atomic add.
#[derive(Clone)]
pub struct OutcomeCounters {
    requests: Vec<Counter>,
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
            requests: RequestOutcome::ALL
                .iter()
                .map(|o| metrics::counter!("idem_requests_total", "outcome" => o.as_str()))
                .collect(),
            replays: metrics::counter!("idem_replays_total"),
            conflicts: metrics::counter!("idem_conflicts_total"),
            mismatches: metrics::counter!("idem_mismatches_total"),
        }
    }

    /// Counts `outcome`, as [`RequestOutcome::record`] does.
    pub fn record(&self, outcome: RequestOutcome) {
        if let Some(c) = self.requests.get(outcome as usize) {
            c.increment(1);
        }
        match outcome {
            RequestOutcome::Replayed => self.replays.increment(1),
            RequestOutcome::InFlight => self.conflicts.increment(1),
            RequestOutcome::Mismatch => self.mismatches.increment(1),
            _ => {}
        }
    }
}

/// Header the gateway sets on its own problem answers, naming the problem (internal only;
/// removed before the response leaves).
pub const PROBLEM_SLUG: http::HeaderName = http::HeaderName::from_static("x-idem-problem");

/// Classifies a protected route's answer from its status and headers. `slug` is the problem
/// type's last segment when the answer is a problem made by the gateway or the layer.
pub fn classify(status: StatusCode, headers: &HeaderMap, slug: Option<&str>) -> RequestOutcome {
    if headers
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    {
        return RequestOutcome::Replayed;
    }
    match slug {
        None => RequestOutcome::Executed,
        Some("in-flight") => RequestOutcome::InFlight,
        Some("outcome-unknown") => RequestOutcome::Unknown,
        Some("key-reused") => RequestOutcome::Mismatch,
        Some(s) if s.starts_with("key-") => RequestOutcome::KeyError,
        Some("unauthenticated") => RequestOutcome::Unauthenticated,
        Some("store-unavailable") | Some("lease-lost") => RequestOutcome::StoreUnavailable,
        Some(s) if s.starts_with("upstream-") => RequestOutcome::UpstreamFailed,
        Some(_) if status.is_success() => RequestOutcome::Executed,
        Some(_) => RequestOutcome::Refused,
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{Fingerprint, Key, MemoryStore, Scope};

    use super::*;

    #[test]
    fn outcome_handles_line_up_with_the_outcomes() {
        for (i, o) in RequestOutcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{}", o.as_str());
        }
        // Every outcome has its own handle (no index falls off the end).
        assert_eq!(
            OutcomeCounters::new().requests.len(),
            RequestOutcome::ALL.len()
        );
    }

    fn req(key: &str, takeover: TakeoverPolicy) -> ClaimRequest {
        ClaimRequest {
            key: ScopedKey::new(Scope::new("ns").expect("ns"), Key::new(key).expect("key")),
            fingerprint: Fingerprint::of_bytes(1, b"x"),
            owner: OwnerId::random(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
            takeover,
            request_id: None,
        }
    }

    #[tokio::test]
    async fn held_claims_are_tracked_and_released_at_shutdown() {
        let store = MeteredStore::new(MemoryStore::new(100));
        let a = req("a", TakeoverPolicy::Hold);
        let b = req("b", TakeoverPolicy::Reexecute);
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&a).await.expect("claim") else {
            panic!("not claimed")
        };
        store.claim(&b).await.expect("claim");
        assert_eq!(store.held(), 2);
        store
            .complete(
                &a.key,
                lease.owner,
                lease.fence,
                &StoredResponse::new(200, "ok"),
                a.ttl,
            )
            .await
            .expect("complete");
        assert_eq!(store.held(), 1);
        assert_eq!(store.release_all(Duration::from_secs(1)).await, 1);
        assert_eq!(store.held(), 0);
        // Released as retryable (reexecute): the key can be claimed again at once.
        assert!(matches!(
            store
                .claim(&req("b", TakeoverPolicy::Reexecute))
                .await
                .expect("claim"),
            ClaimOutcome::Claimed { .. }
        ));
        // A held-policy claim released at shutdown becomes unknown.
        let c = req("c", TakeoverPolicy::Hold);
        store.claim(&c).await.expect("claim");
        store.release_all(Duration::from_secs(1)).await;
        assert_eq!(
            store
                .claim(&req("c", TakeoverPolicy::Hold))
                .await
                .expect("claim"),
            ClaimOutcome::Unknown
        );
        // Waiting ends when the last held claim settles.
        let d = req("d", TakeoverPolicy::Reexecute);
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&d).await.expect("claim") else {
            panic!("not claimed")
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(10);
        assert_eq!(store.wait_settled(deadline).await, 1, "d is still held");
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .wait_settled(tokio::time::Instant::now() + Duration::from_secs(10))
                    .await
            })
        };
        store
            .complete(
                &d.key,
                lease.owner,
                lease.fence,
                &StoredResponse::new(200, "ok"),
                d.ttl,
            )
            .await
            .expect("complete");
        assert_eq!(waiter.await.expect("join"), 0);
    }

    #[test]
    fn outcomes_are_classified() {
        let mut replayed = HeaderMap::new();
        replayed.insert("idempotent-replayed", "true".parse().expect("value"));
        assert_eq!(
            classify(StatusCode::OK, &replayed, None),
            RequestOutcome::Replayed
        );
        assert_eq!(
            classify(StatusCode::OK, &HeaderMap::new(), None),
            RequestOutcome::Executed
        );
        assert_eq!(
            classify(StatusCode::CONFLICT, &HeaderMap::new(), Some("in-flight")),
            RequestOutcome::InFlight
        );
        assert_eq!(
            classify(
                StatusCode::BAD_REQUEST,
                &HeaderMap::new(),
                Some("key-missing")
            ),
            RequestOutcome::KeyError
        );
        assert_eq!(
            classify(
                StatusCode::UNPROCESSABLE_ENTITY,
                &HeaderMap::new(),
                Some("key-reused")
            ),
            RequestOutcome::Mismatch
        );
        assert_eq!(
            classify(
                StatusCode::GATEWAY_TIMEOUT,
                &HeaderMap::new(),
                Some("upstream-timeout")
            ),
            RequestOutcome::UpstreamFailed
        );
    }
}
