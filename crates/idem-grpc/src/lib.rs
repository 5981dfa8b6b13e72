//! idem's gRPC carrier: a tower layer that gives a tonic server's unary methods the
//! idempotency-key semantics of `docs/design.md`, on top of [`idem_core::Engine`], and a
//! status service a caller asks after a timeout. `docs/grpc.md` is the guide.
//!
//! ```
//! use idem_core::{Engine, MemoryStore, Policy};
//! use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, MethodConfig};
//! use idem_http::HeaderPrincipal;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new(100_000), Policy::default());
//! let charge = MethodConfig::new("payments.charge")?
//!     .principal(HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")).required());
//! let config = GrpcIdempotencyConfig::new().method("/payments.v1.Payments/Charge", charge)?;
//! let layer = GrpcIdempotencyLayer::new(&engine, config);
//! // tonic::transport::Server::builder()
//! //     .layer(layer.clone())
//! //     .add_service(PaymentsServer::new(payments))
//! //     .add_service(layer.status_service())
//! //     .serve(addr)
//! # let _ = layer; Ok(()) }
//! ```
//!
//! Calls to methods that are not configured, streaming ones included, pass through
//! unprotected.

pub mod codes;
mod config;
mod idempotency;
mod status;
mod wire;

/// The wire readers' entry points for the fuzz targets (`fuzz/`), behind the `fuzzing`
/// feature: not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use std::borrow::Cow;

    /// A gRPC body split into its messages, each as its compressed flag and bytes; `None` for
    /// a body that is not a whole number of messages.
    pub fn messages(body: &[u8]) -> Option<Vec<(bool, &[u8])>> {
        let split = crate::wire::messages(body).ok()?;
        Some(split.into_iter().map(|m| (m.compressed, m.bytes)).collect())
    }

    /// The protobuf scalar at `path` in `msg`, as a key is read from a request.
    ///
    /// # Errors
    /// Why the field cannot be read, as text.
    pub fn field<'a>(msg: &'a [u8], path: &[u32]) -> Result<Option<Cow<'a, [u8]>>, String> {
        crate::wire::field(msg, path).map_err(|e| format!("{e:?}"))
    }
}

pub use codes::{ERROR_DOMAIN, LayerDetails, Reason, StoreDeterministic};
pub use config::{
    DEFAULT_MAX_REQUEST, DEFAULT_MAX_STORED_RESPONSE, DEFAULT_REPLAY_METADATA,
    GrpcIdempotencyConfig, IDEMPOTENCY_KEY, MethodConfig, MethodConfigError,
};
pub use idempotency::{GrpcIdempotency, GrpcIdempotencyLayer};
pub use status::StatusService;
/// The tonic this crate is built on, for [`Reason::status`]'s `Code` and `Status`.
pub use tonic;

/// The status service's messages and its generated server and client, from idem-wire (the
/// contract a client shares without this server layer).
pub use idem_wire::grpc::proto;
