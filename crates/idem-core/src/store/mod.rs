//! The store contract: a small set of atomic, single-round-trip operations every backend
//! implements, and a boxed form so a binary can pick its store at run time. The in-process
//! stores live here too: [`memory`] (the memory store) and [`cache`] (the local cache tier
//! in front of any store).
//!
//! A "no" is an outcome value; `Err` means the infrastructure failed (timeout, I/O, codec).
//!
//! # Cancel safety
//! Every operation is a single atomic step in the backend: if its future is dropped, the step
//! has either happened or not. A dropped `claim` may leave a processing record behind; it is
//! reclaimed when its lease runs out, like any crashed holder's.

mod boxed;
pub mod cache;
pub mod coalesce;
mod forward;
pub mod memory;

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

pub use boxed::{BoxStore, DynStore};
pub use cache::{CacheStats, CachedStore};
pub use forward::{Around, StoreFuture, StoreOp};
pub use memory::MemoryStore;

use crate::audit::{AuditEvent, AuditQuery};
use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{
    CodecError, Lease, OwnerId, Record, ReleaseKind, StateKind, StoredResponse, TakeoverPolicy,
    Timestamp,
};

/// A request to claim a key.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The key.
    pub key: ScopedKey,
    /// Fingerprint of this request.
    pub fingerprint: Fingerprint,
    /// Who is claiming.
    pub owner: OwnerId,
    /// How long the lease lasts unless renewed.
    pub lease: Duration,
    /// How long the record lives (results are replayed for this long).
    pub ttl: Duration,
    /// What to do with an expired lease.
    pub takeover: TakeoverPolicy,
    /// Request or trace id, kept on the record for operators.
    pub request_id: Option<String>,
}

/// A claim as its holder names it to renew, complete or release it: the key, and the owner
/// and fence of the lease it was granted. The store acts only while the record is still held
/// by exactly this owner and fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold<'a> {
    /// The key.
    pub key: &'a ScopedKey,
    /// The holder.
    pub owner: OwnerId,
    /// The fence the claim was granted.
    pub fence: u64,
}

impl<'a> Hold<'a> {
    /// The hold of `owner` on `key` under `fence`.
    #[must_use]
    pub fn new(key: &'a ScopedKey, owner: OwnerId, fence: u64) -> Self {
        Self { key, owner, fence }
    }

    /// The hold a claim granted as `lease` on `key`.
    #[must_use]
    pub fn of(key: &'a ScopedKey, lease: &Lease) -> Self {
        Self::new(key, lease.owner, lease.fence)
    }
}

/// A completion: the hold it settles, the response it stores, and how long the completed
/// record then lives (results are replayed for this long).
#[derive(Clone, Copy, Debug)]
pub struct Completion<'a> {
    /// The claim it settles.
    pub hold: Hold<'a>,
    /// The final response.
    pub response: &'a StoredResponse,
    /// How long the completed record lives.
    pub ttl: Duration,
}

impl<'a> Completion<'a> {
    /// The completion of `hold` with `response`, kept for `ttl`.
    #[must_use]
    pub fn new(hold: Hold<'a>, response: &'a StoredResponse, ttl: Duration) -> Self {
        Self {
            hold,
            response,
            ttl,
        }
    }
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller now holds the key and must run the handler.
    Claimed {
        /// The lease it holds.
        lease: Lease,
        /// True when an expired lease was taken over.
        takeover: bool,
    },
    /// Another holder's lease is live.
    Busy {
        /// Until that lease runs out, at most.
        retry_after: Duration,
    },
    /// The key completed; replay this.
    Done {
        /// The stored response.
        response: StoredResponse,
    },
    /// The outcome of an earlier attempt is unknown: the record was unknown, or this claim
    /// found an expired lease under [`TakeoverPolicy::Hold`] and marked it so.
    Unknown {
        /// The record's fence: a settlement of this record names it
        /// ([`Store::resolve`]'s `fence`), so it never applies to a later attempt.
        fence: u64,
        /// How long ago (store clock) the attempt claimed the key ([`Record::created_at`]):
        /// under the handler timeout the attempt may still be running.
        age: Duration,
    },
    /// The key exists with a different fingerprint. Nothing changed.
    Mismatch {
        /// The fingerprint on the record.
        stored: Fingerprint,
    },
}

/// Result of a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewOutcome {
    /// The lease now runs until this instant (store clock).
    Renewed {
        /// New deadline.
        deadline: Timestamp,
    },
    /// The caller no longer holds the key.
    Lost,
}

/// Result of completing or releasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleOutcome {
    /// Done.
    Settled,
    /// The caller is not the current owner and fence; nothing was written.
    Fenced,
}

/// How an operator settles an unknown (or stuck) record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The effect happened: keep this response for replay for `ttl`.
    Complete {
        /// The response to replay.
        response: StoredResponse,
        /// How long to keep it.
        ttl: Duration,
    },
    /// The effect did not happen: remove the record so a retry runs.
    Release,
}

/// Result of a resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResolveOutcome {
    /// The record was resolved.
    Resolved,
    /// The record's fence is not the one the resolve named: another attempt claimed the key
    /// since. Nothing changed.
    Fenced {
        /// The record's fence now.
        fence: u64,
    },
    /// There is no such record.
    NotFound,
    /// The record is completed, or processing under a live lease: not resolvable.
    NotResolvable {
        /// Its state.
        state: StateKind,
    },
}

/// Which records `list` returns. Results are ordered oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this principal.
    pub principal: Option<String>,
    /// Only this state.
    pub state: Option<StateKind>,
    /// Only records created at least this long ago (store clock).
    pub older_than: Option<Duration>,
    /// At most this many records (0 means the default, 100).
    pub limit: usize,
}

impl ListFilter {
    /// The effective limit.
    pub fn effective_limit(&self) -> usize {
        match self.limit {
            0 => 100,
            n => n.min(10_000),
        }
    }
}

/// Infrastructure failure in a store. Carriers answer 503 (or `UNAVAILABLE`) and run nothing.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The operation did not finish within its timeout.
    #[error("store operation timed out after {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Box<dyn StdError + Send + Sync>),
    /// The store holds as many records as it may, and none of them has expired: a new key
    /// is refused rather than a live record dropped.
    #[error("store is full: {capacity} records held, none expired")]
    Full {
        /// The configured capacity.
        capacity: usize,
    },
    /// The store's records take as many bytes as it may, and none of them has expired: a
    /// new key is refused rather than a live record dropped.
    #[error("store is full: its records take {max_bytes} bytes, none expired")]
    FullBytes {
        /// The configured bound, in bytes.
        max_bytes: usize,
    },
    /// Fewer replicas than required acknowledged a write, so the claim may not survive a
    /// failover. The handler must not run.
    #[error("claim uncertain: {acked} of {wanted} replicas acknowledged")]
    Uncertain {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        wanted: u32,
    },
    /// A stored value could not be decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

impl StoreError {
    /// Wraps any backend error as [`StoreError::Unavailable`].
    pub fn unavailable(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::Unavailable(e.into())
    }
}

/// Runs `op` for at most `limit`; running out is [`StoreError::Timeout`]. What a store applies
/// to each call it makes to its server.
///
/// # Errors
/// `op`'s error, or [`StoreError::Timeout`].
pub async fn bounded<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, op).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}

/// The store contract. See the module docs and `docs/design.md` ("The store contract").
///
/// Every method is one atomic step judged on the store's clock.
pub trait Store: Send + Sync + 'static {
    /// Claims a key: absent, expired or released records become processing with a fence
    /// strictly greater than any earlier fence of the key; an expired lease is taken over or
    /// marked unknown per `req.takeover`; a different fingerprint is a mismatch.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed; the claim may or may not have happened, and a
    /// claim that did happen is reclaimed once its lease runs out.
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Extends the lease of the current holder (owner and fence must match).
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn renew(
        &self,
        hold: &Hold<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<RenewOutcome, StoreError>> + Send;

    /// Stores the final response; the record becomes completed for the completion's `ttl`.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn complete(
        &self,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send;

    /// Gives the claim up: the record goes away ([`ReleaseKind::Retryable`]) or becomes
    /// unknown ([`ReleaseKind::Unknown`]).
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send;

    /// Reads a live record.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn get(
        &self,
        key: &ScopedKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Lists live records, oldest first.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// Settles an unknown record, or a processing one whose lease has expired. With `fence`,
    /// only if the record still has that fence (else [`ResolveOutcome::Fenced`]): whoever
    /// decided from what it read of one attempt must not settle a later one.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
        fence: Option<u64>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send;

    /// Deletes a record whatever its state. The key's fence still never goes backwards.
    /// Returns whether a live record existed.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn delete(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads the audit trail: the state changes this store recorded that match `query`,
    /// newest first (see [`crate::audit`]).
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    fn audit(
        &self,
        query: &AuditQuery,
    ) -> impl Future<Output = Result<Vec<AuditEvent>, StoreError>> + Send;
}

impl<S: Store> Store for Arc<S> {
    crate::forward_store!(|s| &**s; all);
}
