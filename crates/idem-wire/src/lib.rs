//! idem's wire contract: what every carrier (the HTTP and gRPC layers, the gateway, the
//! consumers) and the client agree on, with nothing of a server in it.
//!
//! - [`Reason`]: every answer idem makes itself, each with its HTTP status, problem `type`,
//!   gRPC code and `ErrorInfo.reason`. A carrier attaches the typed reason to its answer;
//!   nothing reads an answer's body to learn what idem meant.
//! - [`GrpcCode`]: gRPC's codes by number, for the HTTP-only side.
//! - [`header`]: the header and metadata names, `Retry-After` and `grpc-timeout`.
//! - [`message`]: the headers and dead-letter reasons of the message carriers.
//! - [`grpc`] (feature `grpc`): a reason as a `tonic::Status` with `ErrorInfo`/`RetryInfo`,
//!   the reading side of that, and the status service's proto.
//!
//! ```
//! use idem_wire::{Reason, header};
//!
//! let r = Reason::OutcomeUnknown;
//! assert_eq!((r.http_status().as_u16(), r.slug()), (409, "outcome-unknown"));
//! assert_eq!(header::IDEMPOTENCY_KEY, "idempotency-key");
//! ```

mod code;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod header;
pub mod message;
pub mod path;
mod reason;

pub use code::GrpcCode;
pub use reason::{PROBLEM_BASE, Reason};

/// `ErrorInfo.domain` of every gRPC status idem answers itself.
pub const ERROR_DOMAIN: &str = "idem.dev";
