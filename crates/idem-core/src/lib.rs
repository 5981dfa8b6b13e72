//! idem's core: the types, the state machine, the store contract and the engine.
//!
//! `(scope, key, fingerprint, request)` → at most one execution; the stored final response
//! for every retry; never an execution without a durable claim. `docs/design.md` describes
//! the semantics.
//!
//! This crate does no network I/O. Backends (`idem-redis`, `idem-sql`) implement [`Store`];
//! carriers (`idem-http`, …) drive [`Engine`].

pub mod audit;
pub mod clock;
pub mod decide;
pub mod engine;
pub mod fingerprint;
pub mod key;
pub mod key_source;
pub mod lock;
pub mod outbox;
pub mod outcome;
pub mod record;
pub mod store;
mod sync;
pub mod token;

pub use audit::{AuditEvent, AuditKind, AuditLevel, AuditQuery, AuditRetention};
pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{
    Action, Answer, Engine, EngineError, Policy, PolicyBuilder, PolicyError, Probe, ProbeAnswer,
    ProbeFn, ProbeFuture, Reply, SPAN_FENCE, SPAN_KEY, Settled, Settlement, SharedTx, TxStore,
};
pub use fingerprint::{Fingerprint, FingerprintError, JsonFields, canonical_json};
pub use key::{Key, KeyError, Scope, ScopedKey};
pub use outcome::{Kept, Outcome, Refusal};
pub use record::{
    Lease, OwnerId, Record, RecordState, ReleaseKind, StateKind, StoredResponse, TakeoverPolicy,
    Timestamp,
};
// `idem_core::memory` and `idem_core::cache` are short paths to the in-process stores.
pub use store::{
    BoxStore, CachedStore, ClaimOutcome, ClaimRequest, Completion, Hold, ListFilter, MemoryStore,
    RenewOutcome, Resolution, ResolveOutcome, SettleOutcome, Store, StoreError, StoreOp,
};
pub use store::{cache, memory};
