//! RFC 9457 problem details with stable `type` URIs.
//!
//! Every answer the layer makes itself (rather than the handler) is `application/problem+json`
//! with `type = https://idem.dev/problems/<slug>`, one [`Reason`] of idem-wire's table; see
//! `docs/http.md`. The answer also carries the [`Problem`] as a response extension, so
//! whatever sits outside the layer (the gateway answering a gRPC call, metrics) reads the
//! typed reason there and never parses a body to learn what idem meant.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
pub use idem_wire::header::retry_after_secs;
pub use idem_wire::{PROBLEM_BASE, Reason};
use serde::Serialize;

use crate::body::ResponseBody;

/// A problem answer: its reason, human text and the idempotency members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// What idem means by it: the HTTP status, `type` slug, title and gRPC code.
    pub reason: Reason,
    /// Human explanation for this occurrence.
    pub detail: String,
    /// The key, when one was parsed.
    pub key: Option<String>,
    /// The key's state (`processing`, `completed`, `unknown`), where relevant.
    pub state: Option<&'static str>,
    /// When to retry, also sent as `Retry-After`.
    pub retry_after: Option<Duration>,
}

#[derive(Serialize)]
struct Wire<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem with no idempotency members.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
            key: None,
            state: None,
            retry_after: None,
        }
    }

    /// Adds the key.
    #[must_use]
    pub fn key(mut self, key: Option<&idem_core::Key>) -> Self {
        self.key = key.map(|k| k.as_str().to_owned());
        self
    }

    /// Adds the state.
    #[must_use]
    pub fn state(mut self, state: &'static str) -> Self {
        self.state = Some(state);
        self
    }

    /// Adds a retry hint (member and header).
    #[must_use]
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// The HTTP status: the reason's.
    pub fn status(&self) -> StatusCode {
        self.reason.http_status()
    }

    /// The full `type` URI.
    pub fn type_uri(&self) -> String {
        self.reason.type_uri()
    }

    /// The JSON body.
    pub fn to_json(&self) -> Bytes {
        let wire = Wire {
            kind: self.type_uri(),
            title: self.reason.title(),
            status: self.status().as_u16(),
            detail: &self.detail,
            key: self.key.as_deref(),
            state: self.state,
            retry_after: self.retry_after.map(retry_after_secs),
        };
        serde_json::to_vec(&wire)
            .map(Bytes::from)
            .unwrap_or_default()
    }

    /// The response, with this problem as its extension.
    #[cold] // problems are the exception; keep them out of the request path's code
    pub fn into_response<B>(self) -> Response<ResponseBody<B>> {
        let mut res = Response::new(ResponseBody::full(self.to_json()));
        *res.status_mut() = self.status();
        let headers = res.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(d) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
        }
        res.extensions_mut().insert(self);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_serialise_with_stable_types() {
        let p = Problem::new(Reason::InFlight, "busy")
            .state("processing")
            .retry_after(Duration::from_millis(1500));
        let v: serde_json::Value = serde_json::from_slice(&p.to_json()).expect("json");
        assert_eq!(v["type"], "https://idem.dev/problems/in-flight");
        assert_eq!(v["retry_after"], 2);
        assert_eq!(v["state"], "processing");
        assert!(v.get("key").is_none());
        let res = p.clone().into_response::<ResponseBody<()>>();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            res.extensions().get::<Problem>(),
            Some(&p),
            "the typed note"
        );
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
