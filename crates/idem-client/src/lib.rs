//! idem's retrying client: one idempotency key per logical operation, reused on every
//! attempt; retries only what is safe to retry, with exponential backoff, full jitter, a
//! maximum number of attempts and an overall deadline; and after an ambiguous failure (a
//! timeout, a reset after sending, a 502 or 504) it asks the server's status endpoint what
//! became of the key before deciding, instead of retrying blind.
//!
//! The decision is one carrier-neutral table ([`decide`]) driven by one loop, so every
//! carrier retries the same way under the same [`RetryPolicy`]. The HTTP client is
//! [`HttpClient`] (feature `http`, on by default).
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_client::{Call, HttpClient, RetryPolicy, StatusEndpoint};
//!
//! # async fn charge() -> Result<(), idem_client::ClientError> {
//! let client = HttpClient::new(RetryPolicy::default().deadline(Duration::from_secs(20)))?
//!     .status_endpoint(StatusEndpoint::new("http://127.0.0.1:8080/idem/status")?.route("charge"));
//! let reply = client
//!     .send(
//!         Call::post("http://127.0.0.1:8080/charge")?
//!             .header("x-api-key", "alice-key")?
//!             .json(r#"{"amount": 100}"#),
//!     )
//!     .await?;
//! println!("{} after {} attempts, key {}", reply.status, reply.attempts, reply.key);
//! # Ok(()) }
//! ```
//!
//! See `docs/client.md` for the decision table and the failure scenarios it is tested against.

pub mod decide;
mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(all(feature = "grpc", feature = "http"))]
mod grpc_gateway;
#[cfg(feature = "grpc")]
mod grpc_status;
#[cfg(feature = "http")]
mod http;
#[cfg(any(feature = "http", feature = "grpc"))]
mod ids;
mod policy;
mod retry;

pub use error::ClientError;
#[cfg(all(feature = "grpc", feature = "http"))]
pub use grpc_gateway::GatewayStatus;
#[cfg(feature = "grpc")]
pub use grpc_status::IdemStatus;
#[cfg(feature = "http")]
pub use http::{
    Call, HttpClient, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, Reply, StatusEndpoint, TRACEPARENT,
    X_REQUEST_ID,
};
pub use policy::{Jitter, RetryPolicy};
/// The `reqwest` this client is built on, for [`HttpClient::with_reqwest`].
#[cfg(feature = "http")]
pub use reqwest;
pub use retry::Done;
