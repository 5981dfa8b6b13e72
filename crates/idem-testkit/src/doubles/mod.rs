//! Test doubles that wrap any store: [`FaultyStore`] injects failures per operation,
//! [`CountingStore`] counts calls per operation, [`SlowStore`] delays them. They nest, and
//! clones share their switches and counts, so a test keeps one handle while the engine owns
//! another:
//!
//! ```
//! use idem_core::{
//!     Engine, EngineError, Key, MemoryStore, Policy, Scope, ScopedKey, Settlement, StoreError,
//!     StoreOp, StoredResponse,
//! };
//! use idem_testkit::{CountingStore, Fault, FaultyStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let faults = FaultyStore::new(MemoryStore::new(1_000));
//! let store = CountingStore::new(faults.clone());
//! let engine = Engine::new(store.clone(), Policy::default());
//! let key = ScopedKey::new(Scope::new("docs").expect("ns"), Key::new("k").expect("key"));
//!
//! // The store is down for claims: the engine fails closed and the handler never runs.
//! faults.set(StoreOp::Claim, Fault::Error);
//! let answer = engine
//!     .run(&key, &idem_testkit::fp(1), |_| async {
//!         Settlement::complete("ran", StoredResponse::new(200, "ran"))
//!     })
//!     .await;
//! assert!(matches!(answer, Err(EngineError::Store(StoreError::Unavailable(_)))));
//! assert_eq!(store.calls()[StoreOp::Claim], 1);
//! assert_eq!(store.calls().granted(), 0);
//! # }
//! ```

mod counting;
mod faulty;
mod slow;

pub use counting::{Calls, CountingStore};
pub use faulty::{Fault, FaultyStore};
pub use slow::SlowStore;
