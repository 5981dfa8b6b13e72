//! Shared plumbing for the rules: a store, a private namespace and short-hand operations that
//! panic with a clear message on infrastructure errors.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use idem_core::audit::AuditLevel;
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, ListFilter, OwnerId, Record, ReleaseKind,
    RenewOutcome, Resolution, ResolveOutcome, Scope, ScopedKey, SettleOutcome, Store,
    StoredResponse, TakeoverPolicy,
};

use crate::harness::Harness;

/// A namespace no other rule, case or run uses.
pub fn unique_namespace(label: &str) -> String {
    format!("idem-test.{label}.{:032x}", OwnerId::random().0)
}

/// The fingerprint the suite uses for request variant `n`.
pub fn fp(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(1, &[n])
}

/// A response with everything a store must keep byte for byte: repeated and binary headers,
/// a binary body with zero bytes and invalid UTF-8, and trailers (gRPC status fields).
pub fn rich_response() -> StoredResponse {
    let mut body = b"{\"id\":42,\"note\":\"\xff\x00\xfe binary\"}\r\n".to_vec();
    body.extend((0..=255u8).cycle().take(20_000));
    StoredResponse::new(201, body)
        .with_header("content-type", "application/json")
        .with_header("x-dup", "1")
        .with_header("x-dup", "2")
        .with_header("x-bin", Bytes::from_static(&[0, 255, b'\n', b'"', b'\\']))
        .with_header("x-empty", "")
        .with_trailer("grpc-status", "9")
        .with_trailer(
            "grpc-status-details-bin",
            Bytes::from_static(&[8, 9, 0, 255]),
        )
}

/// One rule's view of the store: a store from the harness and a private namespace.
pub(crate) struct Ctx<'h, H: Harness> {
    pub(crate) h: &'h H,
    pub(crate) store: H::Store,
    pub(crate) ns: String,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
}

impl<'h, H: Harness> Ctx<'h, H> {
    pub(crate) async fn new(h: &'h H, label: &str) -> Self {
        Self::at(h, label, AuditLevel::default()).await
    }

    /// A view of a store that records the changes `level` names.
    pub(crate) async fn at(h: &'h H, label: &str, level: AuditLevel) -> Self {
        let lease = h.lease();
        Self {
            h,
            store: h.store_at(level).await,
            ns: unique_namespace(label),
            lease,
            ttl: lease * 50,
        }
    }

    pub(crate) fn key(&self, name: &str) -> ScopedKey {
        ScopedKey::new(
            Scope::new(self.ns.clone()).expect("namespace"),
            Key::new(name).expect("key"),
        )
    }

    pub(crate) fn req(&self, key: &ScopedKey, fingerprint: Fingerprint) -> ClaimRequest {
        ClaimRequest {
            key: key.clone(),
            fingerprint,
            owner: OwnerId::random(),
            lease: self.lease,
            ttl: self.ttl,
            takeover: TakeoverPolicy::Reexecute,
            request_id: None,
        }
    }

    pub(crate) fn hold_req(&self, key: &ScopedKey, fingerprint: Fingerprint) -> ClaimRequest {
        ClaimRequest {
            takeover: TakeoverPolicy::Hold,
            ..self.req(key, fingerprint)
        }
    }

    pub(crate) async fn advance(&self, d: Duration) {
        self.h.advance(d).await;
    }

    /// Waits until a lease claimed or renewed before the call (with `self.lease`) has run out,
    /// with half a lease to spare.
    pub(crate) async fn wait_out_lease(&self) {
        self.advance(self.lease + self.lease / 2).await;
    }

    pub(crate) async fn claim(&self, req: &ClaimRequest) -> ClaimOutcome {
        self.store
            .claim(req)
            .await
            .unwrap_or_else(|e| panic!("claim of {}: store error: {e}", req.key))
    }

    pub(crate) async fn claim_fp(&self, key: &ScopedKey, fingerprint: Fingerprint) -> ClaimOutcome {
        self.claim(&self.req(key, fingerprint)).await
    }

    /// Claims `req` and insists it was a fresh claim (no takeover).
    pub(crate) async fn claimed_with(&self, req: &ClaimRequest) -> Lease {
        match self.claim(req).await {
            ClaimOutcome::Claimed {
                lease,
                takeover: false,
            } => {
                assert_eq!(
                    lease.owner, req.owner,
                    "claim of {}: lease names another owner",
                    req.key
                );
                assert!(
                    lease.fence >= 1,
                    "claim of {}: fence must be at least 1, got {}",
                    req.key,
                    lease.fence
                );
                lease
            }
            other => panic!(
                "claim of {}: expected Claimed {{ takeover: false }}, got {other:?}",
                req.key
            ),
        }
    }

    pub(crate) async fn claimed(&self, key: &ScopedKey) -> Lease {
        self.claimed_with(&self.req(key, fp(1))).await
    }

    /// Claims and insists the claim took an expired lease over.
    pub(crate) async fn taken_over(&self, req: &ClaimRequest) -> Lease {
        match self.claim(req).await {
            ClaimOutcome::Claimed {
                lease,
                takeover: true,
            } => {
                assert_eq!(lease.owner, req.owner);
                lease
            }
            other => panic!(
                "claim of {}: expected Claimed {{ takeover: true }}, got {other:?}",
                req.key
            ),
        }
    }

    pub(crate) async fn busy(&self, key: &ScopedKey) -> Duration {
        match self.claim_fp(key, fp(1)).await {
            ClaimOutcome::Busy { retry_after } => {
                assert!(
                    retry_after > Duration::ZERO,
                    "busy {key}: retry_after must be positive"
                );
                retry_after
            }
            other => panic!("claim of {key}: expected Busy, got {other:?}"),
        }
    }

    /// Claims with `req` and insists the key is unknown at `fence`; answers the attempt's age.
    pub(crate) async fn unknown_with(&self, req: &ClaimRequest, fence: u64) -> Duration {
        match self.claim(req).await {
            ClaimOutcome::Unknown { fence: f, age } => {
                assert_eq!(
                    f, fence,
                    "unknown {}: names fence {f}, the record has {fence}",
                    req.key
                );
                age
            }
            other => panic!("claim of {}: expected Unknown, got {other:?}", req.key),
        }
    }

    /// [`Ctx::unknown_with`] for both takeover policies and another fingerprint (a mismatch):
    /// an unknown record answers the same to every claim.
    pub(crate) async fn unknown(&self, key: &ScopedKey, fence: u64) -> Duration {
        let age = self.unknown_with(&self.hold_req(key, fp(1)), fence).await;
        let again = self.unknown_with(&self.req(key, fp(1)), fence).await;
        assert!(again >= age, "unknown {key}: the attempt's age went back");
        assert!(
            matches!(
                self.claim_fp(key, fp(2)).await,
                ClaimOutcome::Mismatch { .. }
            ),
            "unknown {key}: another fingerprint is a mismatch"
        );
        age
    }

    pub(crate) async fn renew(&self, hold: Hold<'_>, lease: Duration) -> RenewOutcome {
        self.store
            .renew(&hold, lease)
            .await
            .unwrap_or_else(|e| panic!("renew of {}: store error: {e}", hold.key))
    }

    pub(crate) async fn complete_as(
        &self,
        hold: Hold<'_>,
        response: &StoredResponse,
    ) -> SettleOutcome {
        self.complete_ttl(hold, response, self.ttl).await
    }

    pub(crate) async fn complete_ttl(
        &self,
        hold: Hold<'_>,
        response: &StoredResponse,
        ttl: Duration,
    ) -> SettleOutcome {
        self.store
            .complete(&Completion::new(hold, response, ttl))
            .await
            .unwrap_or_else(|e| panic!("complete of {}: store error: {e}", hold.key))
    }

    pub(crate) async fn complete(&self, key: &ScopedKey, lease: &Lease, response: &StoredResponse) {
        let got = self.complete_as(Hold::of(key, lease), response).await;
        assert_eq!(
            got,
            SettleOutcome::Settled,
            "complete of {key} by its holder (fence {})",
            lease.fence
        );
    }

    pub(crate) async fn release_as(&self, hold: Hold<'_>, kind: ReleaseKind) -> SettleOutcome {
        self.store
            .release(&hold, kind)
            .await
            .unwrap_or_else(|e| panic!("release of {}: store error: {e}", hold.key))
    }

    pub(crate) async fn release(&self, key: &ScopedKey, lease: &Lease, kind: ReleaseKind) {
        let got = self.release_as(Hold::of(key, lease), kind).await;
        assert_eq!(
            got,
            SettleOutcome::Settled,
            "release ({kind:?}) of {key} by its holder (fence {})",
            lease.fence
        );
    }

    pub(crate) async fn get(&self, key: &ScopedKey) -> Option<Record> {
        self.store
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("get of {key}: store error: {e}"))
    }

    pub(crate) async fn record(&self, key: &ScopedKey) -> Record {
        self.get(key)
            .await
            .unwrap_or_else(|| panic!("get of {key}: expected a record, found none"))
    }

    pub(crate) async fn resolve(&self, key: &ScopedKey, resolution: &Resolution) -> ResolveOutcome {
        self.resolve_at(key, resolution, None).await
    }

    pub(crate) async fn resolve_at(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
        fence: Option<u64>,
    ) -> ResolveOutcome {
        self.store
            .resolve(key, resolution, fence)
            .await
            .unwrap_or_else(|e| panic!("resolve of {key}: store error: {e}"))
    }

    pub(crate) async fn delete(&self, key: &ScopedKey) -> bool {
        self.store
            .delete(key)
            .await
            .unwrap_or_else(|e| panic!("delete of {key}: store error: {e}"))
    }

    pub(crate) async fn list(&self, filter: &ListFilter) -> Vec<Record> {
        let found = self
            .store
            .list(filter)
            .await
            .unwrap_or_else(|e| panic!("list {filter:?}: store error: {e}"));
        assert!(
            found.windows(2).all(|w| w[0].created_at <= w[1].created_at),
            "list {filter:?}: results must be ordered oldest first"
        );
        found
    }

    /// The keys (by key text) that `list` returns for this filter.
    pub(crate) async fn list_keys(&self, filter: &ListFilter) -> BTreeSet<String> {
        self.list(filter)
            .await
            .into_iter()
            .map(|r| r.key.key.as_str().to_owned())
            .collect()
    }

    pub(crate) fn in_ns(&self) -> ListFilter {
        ListFilter {
            namespace: Some(self.ns.clone()),
            ..ListFilter::default()
        }
    }
}

/// Builds a set of key names, for comparing `list` answers.
pub(crate) fn names(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
