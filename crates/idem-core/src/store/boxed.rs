//! The type-erased store, for binaries that choose a backend at run time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome,
    SettleOutcome, Store, StoreError,
};
use crate::key::ScopedKey;
use crate::record::{OwnerId, Record, ReleaseKind, StoredResponse};

/// Object-safe mirror of [`Store`]; implemented for every `Store`.
#[allow(missing_docs)]
pub trait DynStore: Send + Sync + 'static {
    fn claim_dyn<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>>;
    fn renew_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, StoreError>>;
    fn complete_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &'a StoredResponse,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<SettleOutcome, StoreError>>;
    fn release_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> BoxFuture<'a, Result<SettleOutcome, StoreError>>;
    fn get_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    fn list_dyn<'a>(
        &'a self,
        filter: &'a ListFilter,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>>;
    fn resolve_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        resolution: &'a Resolution,
    ) -> BoxFuture<'a, Result<ResolveOutcome, StoreError>>;
    fn delete_dyn<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<bool, StoreError>>;
}

impl<S: Store> DynStore for S {
    fn claim_dyn<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(self.claim(req))
    }
    fn renew_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, StoreError>> {
        Box::pin(self.renew(key, owner, fence, lease))
    }
    fn complete_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &'a StoredResponse,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<SettleOutcome, StoreError>> {
        Box::pin(self.complete(key, owner, fence, response, ttl))
    }
    fn release_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> BoxFuture<'a, Result<SettleOutcome, StoreError>> {
        Box::pin(self.release(key, owner, fence, kind))
    }
    fn get_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(self.get(key))
    }
    fn list_dyn<'a>(
        &'a self,
        filter: &'a ListFilter,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(self.list(filter))
    }
    fn resolve_dyn<'a>(
        &'a self,
        key: &'a ScopedKey,
        resolution: &'a Resolution,
    ) -> BoxFuture<'a, Result<ResolveOutcome, StoreError>> {
        Box::pin(self.resolve(key, resolution))
    }
    fn delete_dyn<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.delete(key))
    }
}

/// A store chosen at run time: a cheap-to-clone handle to any [`Store`].
#[derive(Clone)]
pub struct BoxStore(Arc<dyn DynStore>);

impl BoxStore {
    /// Erases a store's type.
    pub fn new<S: Store>(store: S) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxStore")
    }
}

impl Store for BoxStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.0.claim_dyn(req).await
    }
    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.0.renew_dyn(key, owner, fence, lease).await
    }
    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        self.0.complete_dyn(key, owner, fence, response, ttl).await
    }
    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        self.0.release_dyn(key, owner, fence, kind).await
    }
    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        self.0.get_dyn(key).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        self.0.list_dyn(filter).await
    }
    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        self.0.resolve_dyn(key, resolution).await
    }
    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        self.0.delete_dyn(key).await
    }
}
