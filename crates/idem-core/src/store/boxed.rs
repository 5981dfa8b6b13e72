//! The type-erased store, for binaries that choose a backend at run time.

use std::fmt;
use std::sync::Arc;

use super::Store;

/// Object-safe mirror of [`Store`]; implemented for every `Store`. Its methods carry a
/// `_dyn` suffix so they never clash with `Store`'s where both traits are in scope.
#[allow(missing_docs)]
pub trait DynStore: Send + Sync + 'static {
    crate::__store_op!(__store_dyn_method { decl } all);
}

impl<S: Store> DynStore for S {
    crate::__store_op!(__store_dyn_method { impl } all);
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
    crate::__store_op!(__store_method { dyn b, &*b.0 } all);
}
