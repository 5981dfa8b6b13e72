//! The span each request runs in.

use http::{HeaderMap, HeaderValue};
use idem_core::Outcome;
use tracing::field::Empty;

/// The target of the request span, for log filters (`RUST_LOG=idem::request=info`).
pub const REQUEST_TARGET: &str = "idem::request";

/// One request's span: `request_id` from the start, `route` once matched, `outcome` and
/// `status` once answered; the engine adds `idem.key` and `idem.fence`.
#[derive(Debug, Clone)]
pub struct RequestSpan(tracing::Span);

impl RequestSpan {
    /// Opens the span of the request with id `request_id`. With OTLP export, a valid W3C
    /// `traceparent` among `headers` makes the caller's span its parent, so the gateway's
    /// span joins the caller's trace.
    pub fn new(request_id: &HeaderValue, headers: &HeaderMap) -> Self {
        let span = tracing::info_span!(
            target: REQUEST_TARGET,
            "request",
            otel.kind = "server",
            request_id = request_id.to_str().unwrap_or("-"),
            route = Empty,
            outcome = Empty,
            status = Empty,
            idem.key = Empty,
            idem.fence = Empty,
        );
        #[cfg(feature = "otlp")]
        trace_context::adopt_parent(&span, headers);
        #[cfg(not(feature = "otlp"))]
        let _ = headers;
        Self(span)
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

#[cfg(feature = "otlp")]
mod trace_context {
    use http::HeaderMap;
    use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
    use opentelemetry::trace::TraceContextExt as _;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    /// Request headers as the propagator reads them; a value that is not text is absent.
    struct Headers<'a>(&'a HeaderMap);

    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }

    /// Makes the span in the caller's `traceparent` the parent of `span`. A missing or
    /// malformed header leaves `span` a root, as without one.
    pub(super) fn adopt_parent(span: &tracing::Span, headers: &HeaderMap) {
        if span.is_disabled() || !headers.contains_key("traceparent") {
            return;
        }
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        if cx.span().span_context().is_valid() {
            // Fails only without the OpenTelemetry layer, when nothing is exported anyway.
            let _ = span.set_parent(cx);
        }
    }
}
