//! The span each request runs in.

use http::HeaderValue;
use idem_core::Outcome;
use tracing::field::Empty;

/// The target of the request span, for log filters (`RUST_LOG=idem::request=info`).
pub const REQUEST_TARGET: &str = "idem::request";

/// One request's span: `request_id` from the start, `route` once matched, `outcome` and
/// `status` once answered; the engine adds `idem.key` and `idem.fence`.
#[derive(Debug, Clone)]
pub struct RequestSpan(tracing::Span);

impl RequestSpan {
    /// Opens the span of the request with id `request_id`.
    pub fn new(request_id: &HeaderValue) -> Self {
        Self(tracing::info_span!(
            target: REQUEST_TARGET,
            "request",
            otel.kind = "server",
            request_id = request_id.to_str().unwrap_or("-"),
            route = Empty,
            outcome = Empty,
            status = Empty,
            idem.key = Empty,
            idem.fence = Empty,
        ))
    }

    /// The span itself, to run the request in.
    pub fn span(&self) -> &tracing::Span {
        &self.0
    }

    /// Records how the request ended: the route it matched (or `-`), its outcome and status.
    pub fn finish(&self, route: &str, outcome: Outcome, status: u16) {
        if self.0.is_disabled() {
            return;
        }
        self.0.record("route", route);
        self.0.record("outcome", outcome.as_str());
        self.0.record("status", status);
    }
}
