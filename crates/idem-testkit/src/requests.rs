//! Requests and reads that store tests write the same way in many places.

use std::time::Duration;

use idem_core::store::ClaimRequest;
use idem_core::{Fingerprint, OwnerId, Record, ScopedKey, Store, TakeoverPolicy};

/// A claim of `key` by a fresh owner: fingerprint `of_bytes(1, b"x")`, a 30 s lease, a 60 s
/// TTL, takeover by re-execution, no request id.
pub fn claim_request(key: ScopedKey) -> ClaimRequest {
    ClaimRequest {
        key,
        fingerprint: Fingerprint::of_bytes(1, b"x"),
        owner: OwnerId::random(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

/// The record `store` holds for `key`.
///
/// # Panics
/// When the store fails or holds no record for `key`.
pub async fn record_of<S: Store>(store: &S, key: &ScopedKey) -> Record {
    store.get(key).await.expect("store").expect("record")
}
