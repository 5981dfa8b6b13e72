//! RFC 9457 problem details with stable `type` URIs.
//!
//! Every answer the layer makes itself (rather than the handler) is `application/problem+json`
//! with `type = https://idem.dev/problems/<slug>`; see `docs/http.md` for the table.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::body::ResponseBody;

/// Base of every problem `type` URI.
pub const PROBLEM_BASE: &str = "https://idem.dev/problems/";

/// A problem answer: status, slug, human text and the idempotency members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Last segment of the `type` URI (e.g. `in-flight`).
    pub slug: &'static str,
    /// Short, stable summary.
    pub title: &'static str,
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

/// Whole seconds for `Retry-After`, rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

impl Problem {
    /// A problem with no idempotency members.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
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

    /// The full `type` URI.
    pub fn type_uri(&self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug)
    }

    /// The JSON body.
    pub fn to_json(&self) -> Bytes {
        let wire = Wire {
            kind: self.type_uri(),
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
            key: self.key.as_deref(),
            state: self.state,
            retry_after: self.retry_after.map(retry_after_secs),
        };
        serde_json::to_vec(&wire)
            .map(Bytes::from)
            .unwrap_or_default()
    }

    /// The response.
    #[cold] // problems are the exception; keep them out of the request path's code
    pub fn into_response<B>(self) -> Response<ResponseBody<B>> {
        let mut res = Response::new(ResponseBody::full(self.to_json()));
        *res.status_mut() = self.status;
        let headers = res.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(d) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_serialise_with_stable_types() {
        let p = Problem::new(
            StatusCode::CONFLICT,
            "in-flight",
            "Request in flight",
            "busy",
        )
        .state("processing")
        .retry_after(Duration::from_millis(1500));
        let v: serde_json::Value = serde_json::from_slice(&p.to_json()).expect("json");
        assert_eq!(v["type"], "https://idem.dev/problems/in-flight");
        assert_eq!(v["retry_after"], 2);
        assert_eq!(v["state"], "processing");
        assert!(v.get("key").is_none());
        let res = p.into_response::<ResponseBody<()>>();
        assert_eq!(res.headers()[header::RETRY_AFTER], "2");
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
