//! What the gateway tells operators about itself besides its answers: the build it is, its
//! logs and request spans (exported over OTLP with the `otlp` feature), and the upstream's
//! share of each request's time.
//!
//! Every request runs in one `request` span (target `idem::request`) with `route`,
//! `outcome`, `request_id`, `idem.key` (the scoped key's digest, recorded by the engine;
//! never the key itself) and `idem.fence` (once claimed). The access log line is an event
//! inside that span.

pub mod build;
pub mod logging;
mod span;
mod upstream;

pub use span::{REQUEST_TARGET, RequestSpan};
pub use upstream::TimedProxy;
