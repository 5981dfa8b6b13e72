//! Writing store wrappers: [`forward_store!`](crate::forward_store) writes the [`Store`]
//! methods a wrapper does not change, and [`Around`] is what a wrapper runs around each
//! operation it forwards (a measurement, a count, an injected fault).
//!
//! The operations are listed once, in a table of their signatures; the wrappers, the
//! `Arc` and boxed forms and the object-safe [`DynStore`](super::DynStore) mirror are all
//! written from it.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use idem_core::store::{Around, StoreFuture, StoreOp};
//! use idem_core::{ClaimOutcome, ClaimRequest, MemoryStore, Store, StoreError};
//!
//! /// Counts every store call, the calls that failed, and the claims that were granted.
//! struct Tally<S> {
//!     inner: S,
//!     calls: AtomicUsize,
//!     errors: AtomicUsize,
//!     granted: AtomicUsize,
//! }
//!
//! impl<S: Store> Around for Tally<S> {
//!     async fn around<F: StoreFuture>(
//!         &self,
//!         _op: StoreOp,
//!         call: impl FnOnce() -> F + Send,
//!     ) -> F::Output {
//!         self.calls.fetch_add(1, Ordering::Relaxed);
//!         let result = call().await;
//!         if result.is_err() {
//!             self.errors.fetch_add(1, Ordering::Relaxed);
//!         }
//!         result
//!     }
//! }
//!
//! impl<S: Store> Store for Tally<S> {
//!     // The one operation this wrapper changes; it still goes through `around`.
//!     async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
//!         let outcome = self.around(StoreOp::Claim, || self.inner.claim(req)).await?;
//!         if matches!(outcome, ClaimOutcome::Claimed { .. }) {
//!             self.granted.fetch_add(1, Ordering::Relaxed);
//!         }
//!         Ok(outcome)
//!     }
//!
//!     idem_core::forward_store!(|t| &t.inner, around = t;
//!         renew, complete, release, get, list, resolve, delete, audit);
//! }
//!
//! # fn main() {
//! let tally = Tally {
//!     inner: MemoryStore::new(100),
//!     calls: AtomicUsize::new(0),
//!     errors: AtomicUsize::new(0),
//!     granted: AtomicUsize::new(0),
//! };
//! let key = idem_core::ScopedKey::new(
//!     idem_core::Scope::new("docs").expect("namespace"),
//!     idem_core::Key::new("k").expect("key"),
//! );
//! let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
//! runtime.block_on(async {
//!     assert_eq!(tally.get(&key).await.expect("get"), None);
//! });
//! assert_eq!(tally.calls.load(Ordering::Relaxed), 1);
//! # }
//! ```

use std::fmt;
use std::future::Future;

use super::StoreError;

/// One of the operations of the [`Store`](super::Store) contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum StoreOp {
    /// [`Store::claim`](super::Store::claim).
    Claim,
    /// [`Store::renew`](super::Store::renew).
    Renew,
    /// [`Store::complete`](super::Store::complete).
    Complete,
    /// [`Store::release`](super::Store::release).
    Release,
    /// [`Store::get`](super::Store::get).
    Get,
    /// [`Store::list`](super::Store::list).
    List,
    /// [`Store::resolve`](super::Store::resolve).
    Resolve,
    /// [`Store::delete`](super::Store::delete).
    Delete,
    /// [`Store::audit`](super::Store::audit).
    Audit,
}

impl StoreOp {
    /// Every operation, in the order the contract declares them.
    pub const ALL: [StoreOp; 9] = [
        StoreOp::Claim,
        StoreOp::Renew,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Get,
        StoreOp::List,
        StoreOp::Resolve,
        StoreOp::Delete,
        StoreOp::Audit,
    ];

    /// The method's name (`"claim"`, …), for metric labels and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Renew => "renew",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Get => "get",
            StoreOp::List => "list",
            StoreOp::Resolve => "resolve",
            StoreOp::Delete => "delete",
            StoreOp::Audit => "audit",
        }
    }

    /// Its position in [`StoreOp::ALL`], for per-operation arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The future of one store operation: `Send`, answering `Result<Self::Ok, StoreError>`.
/// Implemented for every such future; it keeps [`Around::around`]'s signature short.
pub trait StoreFuture: Future<Output = Result<Self::Ok, StoreError>> + Send {
    /// What the operation answers when it succeeds.
    type Ok: Send;
}

impl<T: Send, F: Future<Output = Result<T, StoreError>> + Send> StoreFuture for F {
    type Ok = T;
}

/// What a wrapper runs around each operation it forwards with
/// [`forward_store!`](crate::forward_store)'s `around = …`, and may call from the operations
/// it writes itself.
pub trait Around: Send + Sync {
    /// Runs operation `op`: `call` starts it on the wrapped store; what this returns is what
    /// the wrapper's caller sees.
    ///
    /// `call` is a closure rather than a future because some stores act when called, not
    /// when polled ([`MemoryStore`](crate::MemoryStore) applies its transition at once): a
    /// hook that answers on its own must not call it.
    ///
    /// # Errors
    /// The wrapped store's error, or one the hook makes up.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops the operation's, with the wrapped store's cancel
    /// safety (see [`Store`](super::Store)); a hook should keep no state a drop would leave
    /// half-updated.
    fn around<F: StoreFuture>(
        &self,
        op: StoreOp,
        call: impl FnOnce() -> F + Send,
    ) -> impl Future<Output = F::Output> + Send;
}

/// Writes [`Store`](crate::Store) methods that forward to another store, for a wrapper that
/// writes only the methods it changes.
///
/// `forward_store!(|s| target; ops)` goes inside an `impl Store for …` block. `s` names
/// `self` in `target`, an expression for the store to forward to (`&s.inner`, `&**s`); `ops`
/// lists the methods to write (`renew, get, list`), or is `all`. With
/// `forward_store!(|s| target, around = hook; ops)` each forwarded call runs through
/// [`Around::around`] on `hook` (`s` itself, or a field of it).
///
/// ```
/// use idem_core::{ClaimOutcome, ClaimRequest, Store, StoreError};
///
/// /// A store whose claims are all busy for a second.
/// struct Busy<S>(S);
///
/// impl<S: Store> Store for Busy<S> {
///     async fn claim(&self, _req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
///         let retry_after = std::time::Duration::from_secs(1);
///         Ok(ClaimOutcome::Busy { retry_after })
///     }
///
///     idem_core::forward_store!(|b| &b.0; renew, complete, release, get, list, resolve, delete, audit);
/// }
/// ```
#[macro_export]
macro_rules! forward_store {
    (|$s:ident| $target:expr, around = $hook:expr; $($op:ident),+ $(,)?) => {
        $( $crate::__store_op!(__store_method { around $s, $target, $hook } $op); )+
    };
    (|$s:ident| $target:expr; $($op:ident),+ $(,)?) => {
        $( $crate::__store_op!(__store_method { forward $s, $target } $op); )+
    };
}

/// The table of operations: hands operation `$op` (or each one, for `all`) to the macro
/// `$emit` as `{ context } name dyn_name StoreOp (params) -> outcome`. A parameter is
/// `name: [&] Type` (passed by reference) or `name: [] Type` (by value).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_op {
    ($emit:ident { $($ctx:tt)* } all) => {
        $crate::__store_op!($emit { $($ctx)* } claim);
        $crate::__store_op!($emit { $($ctx)* } renew);
        $crate::__store_op!($emit { $($ctx)* } complete);
        $crate::__store_op!($emit { $($ctx)* } release);
        $crate::__store_op!($emit { $($ctx)* } get);
        $crate::__store_op!($emit { $($ctx)* } list);
        $crate::__store_op!($emit { $($ctx)* } resolve);
        $crate::__store_op!($emit { $($ctx)* } delete);
        $crate::__store_op!($emit { $($ctx)* } audit);
    };
    ($emit:ident { $($ctx:tt)* } claim) => {
        $crate::$emit! { { $($ctx)* } claim claim_dyn Claim
            (req: [&] $crate::store::ClaimRequest) -> $crate::store::ClaimOutcome }
    };
    ($emit:ident { $($ctx:tt)* } renew) => {
        $crate::$emit! { { $($ctx)* } renew renew_dyn Renew
            (hold: [&] $crate::store::Hold<'_>, lease: [] ::core::time::Duration)
            -> $crate::store::RenewOutcome }
    };
    ($emit:ident { $($ctx:tt)* } complete) => {
        $crate::$emit! { { $($ctx)* } complete complete_dyn Complete
            (completion: [&] $crate::store::Completion<'_>) -> $crate::store::SettleOutcome }
    };
    ($emit:ident { $($ctx:tt)* } release) => {
        $crate::$emit! { { $($ctx)* } release release_dyn Release
            (hold: [&] $crate::store::Hold<'_>, kind: [] $crate::record::ReleaseKind)
            -> $crate::store::SettleOutcome }
    };
    ($emit:ident { $($ctx:tt)* } get) => {
        $crate::$emit! { { $($ctx)* } get get_dyn Get
            (key: [&] $crate::key::ScopedKey)
            -> ::core::option::Option<$crate::record::Record> }
    };
    ($emit:ident { $($ctx:tt)* } list) => {
        $crate::$emit! { { $($ctx)* } list list_dyn List
            (filter: [&] $crate::store::ListFilter) -> ::std::vec::Vec<$crate::record::Record> }
    };
    ($emit:ident { $($ctx:tt)* } resolve) => {
        $crate::$emit! { { $($ctx)* } resolve resolve_dyn Resolve
            (
                key: [&] $crate::key::ScopedKey,
                resolution: [&] $crate::store::Resolution,
                fence: [] ::core::option::Option<u64>
            ) -> $crate::store::ResolveOutcome }
    };
    ($emit:ident { $($ctx:tt)* } delete) => {
        $crate::$emit! { { $($ctx)* } delete delete_dyn Delete
            (key: [&] $crate::key::ScopedKey) -> bool }
    };
    ($emit:ident { $($ctx:tt)* } audit) => {
        $crate::$emit! { { $($ctx)* } audit audit_dyn Audit
            (query: [&] $crate::audit::AuditQuery)
            -> ::std::vec::Vec<$crate::audit::AuditEvent> }
    };
}

/// A `Store` method whose body, by mode, calls the same method on `target` (`forward`),
/// does so through `hook`'s `around` (`around`), or calls the `DynStore` method (`dyn`).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_method {
    (
        { $($how:tt)* }
        $op:ident $dyn_op:ident $variant:ident
        ($($arg:ident : [$($amp:tt)?] $ty:ty),*) -> $out:ty
    ) => {
        fn $op(
            &self,
            $($arg: $($amp)? $ty),*
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<$out, $crate::store::StoreError>,
        > + ::core::marker::Send {
            $crate::__store_method!(@body { $($how)* } self $op $dyn_op $variant ($($arg),*))
        }
    };
    (@body { forward $s:ident, $target:expr } $this:tt $op:ident $dyn_op:ident $variant:ident
        ($($arg:ident),*)) => {{
        let $s = $this;
        ($target).$op($($arg),*)
    }};
    (@body { around $s:ident, $target:expr, $hook:expr } $this:tt $op:ident $dyn_op:ident
        $variant:ident ($($arg:ident),*)) => {{
        use $crate::store::Around as _;
        let $s = $this;
        ($hook).around($crate::store::StoreOp::$variant, move || ($target).$op($($arg),*))
    }};
    (@body { dyn $s:ident, $target:expr } $this:tt $op:ident $dyn_op:ident $variant:ident
        ($($arg:ident),*)) => {{
        let $s = $this;
        // An async block: the boxed future's one lifetime is shorter than each borrow, which
        // a plain return could not name.
        async move { ($target).$dyn_op($($arg),*).await }
    }};
}

/// A [`DynStore`](crate::store::DynStore) method: its declaration (`decl`), or the blanket
/// impl's, which boxes the `Store` method (`impl`).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_dyn_method {
    ({ decl } $op:ident $dyn_op:ident $variant:ident ($($params:tt)*) -> $out:ty) => {
        $crate::__store_dyn_method!(@fn self $dyn_op ($($params)*) -> $out; ;);
    };
    (
        { impl }
        $op:ident $dyn_op:ident $variant:ident
        ($($arg:ident : [$($amp:tt)?] $ty:ty),*) -> $out:ty
    ) => {
        // `self` is written here for both the parameter and the body: macro hygiene keeps a
        // `self` from one expansion out of another's method.
        $crate::__store_dyn_method!(@fn self $dyn_op ($($arg: [$($amp)?] $ty),*) -> $out; {
            ::std::boxed::Box::pin(self.$op($($arg),*))
        });
    };
    (
        @fn $this:tt $dyn_op:ident
        ($($arg:ident : [$($amp:tt)?] $ty:ty),*) -> $out:ty; $($tail:tt)*
    ) => {
        fn $dyn_op<'a>(
            &'a $this,
            $($arg: $($amp 'a)? $ty),*
        ) -> ::core::pin::Pin<::std::boxed::Box<
            dyn ::core::future::Future<
                Output = ::core::result::Result<$out, $crate::store::StoreError>,
            > + ::core::marker::Send + 'a,
        >> $($tail)*
    };
}

#[cfg(test)]
mod tests {
    use super::StoreOp;

    #[test]
    fn ops_are_listed_in_index_order_with_their_method_names() {
        let names: Vec<&str> = StoreOp::ALL.iter().map(|op| op.as_str()).collect();
        assert_eq!(
            names,
            [
                "claim", "renew", "complete", "release", "get", "list", "resolve", "delete",
                "audit"
            ]
        );
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(op.to_string(), op.as_str());
        }
    }
}
