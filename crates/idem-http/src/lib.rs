//! idem's HTTP carrier: a tower layer that gives any `http` service (axum, hyper) the
//! idempotency-key semantics of `docs/design.md` ("HTTP behaviour"), on top of [`idem_core::Engine`], plus a
//! status endpoint.
//!
//! ```
//! use axum::{Router, routing::post};
//! use idem_core::{Engine, MemoryStore, Policy};
//! use idem_http::{HeaderPrincipal, IdempotencyConfig, IdempotencyLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new(100_000), Policy::default());
//! let config = IdempotencyConfig::new("payments.charge")?
//!     .principal(HeaderPrincipal::new(http::header::AUTHORIZATION));
//! let app: Router = Router::new()
//!     .route("/charge", post(|| async { "charged" }).layer(IdempotencyLayer::new(&engine, config)));
//! # let _ = app; Ok(()) }
//! ```
//!
//! See [`Idempotency`] for the request flow and the problem table, [`policy`] for the
//! pluggable behaviour, and [`IdempotencyConfig`] for per-route settings.

mod body;
pub mod buffer;
mod config;
mod guard;
mod idempotency;
pub mod key;
pub mod policy;
mod problem;
mod source;
mod status;

pub use body::{BoxError, RequestBody, ResponseBody};
pub use config::{
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_STORED_RESPONSE, DEFAULT_REPLAY_HEADERS,
    IdempotencyConfig, NEVER_REPLAYED, Protection, RouteConfigError, StreamingResponses,
};
pub use guard::RunGuard;
#[doc(hidden)]
pub use idempotency::take_ready;
pub use idempotency::{
    Idempotency, IdempotencyLayer, InTransaction, IncomingBody, ResponseFuture, Separate,
    ServiceBody, TxIdempotency, TxIdempotencyLayer, Wrapped,
};
pub use key::{KeyRejection, parse_key};
pub use policy::{
    AmbiguousBody, AnswerHead, CanonicalJson, ExtensionPrincipal, ExtractKey, ExtractPrincipal,
    FingerprintRequest, FoundKey, HeaderKey, HeaderPrincipal, IDEMPOTENCY_FENCE, IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED, NoPrincipal, Principal, PrincipalRejection, RawBody, StoreDecision,
    StorePolicy, StoreUnless5xx, X_IDEMPOTENCY_KEY, X_REQUEST_ID,
};
pub use problem::{PROBLEM_BASE, Problem, Reason, retry_after_secs};
pub use source::{PathParams, SourceKey};
pub use status::{IdempotencyStatus, read_record};
