//! The HTTP client: [`HttpClient`] sends a [`Call`] under a [`RetryPolicy`], with one key for
//! the whole operation, and returns a [`Reply`] or a [`ClientError`].
//!
//! Built on `reqwest` with rustls and the ring provider. Each attempt carries the key, the
//! operation's `X-Request-ID` (the caller's, or a UUID v7 made once) and a W3C
//! `traceparent` (the caller's, or one trace id per operation with a new span id per
//! attempt). After an ambiguous failure the client asks the configured [`StatusEndpoint`]
//! before it decides (see [`decide`](crate::decide)).

pub(crate) mod status;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use reqwest::Url;

pub use status::StatusEndpoint;

use idem_wire::Reason;
use idem_wire::header::retry_after;

use crate::decide::{Attempt, Later};
use crate::error::ClientError;
use crate::ids::{Ids, key_header_value};
use crate::policy::RetryPolicy;
use crate::retry;

/// The idempotency key header.
pub const IDEMPOTENCY_KEY: HeaderName = idem_wire::header::IDEMPOTENCY_KEY;
/// The request id header.
pub const X_REQUEST_ID: HeaderName = crate::ids::X_REQUEST_ID;
/// The W3C trace context header.
pub const TRACEPARENT: HeaderName = crate::ids::TRACEPARENT;
/// Set on a replayed answer.
pub const IDEMPOTENT_REPLAYED: HeaderName = idem_wire::header::IDEMPOTENT_REPLAYED;

/// One logical operation: a request sent once or several times, always with the same key.
#[derive(Debug, Clone)]
pub struct Call {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Bytes,
    key: Option<String>,
    route: Option<String>,
}

impl Call {
    /// A call of `method` on `url`.
    ///
    /// # Errors
    /// [`ClientError::Invalid`] when `url` is not an absolute http(s) URL.
    pub fn new(method: Method, url: &str) -> Result<Self, ClientError> {
        let url = Url::parse(url).map_err(|e| ClientError::Invalid(format!("`{url}`: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ClientError::Invalid(format!(
                "`{url}`: only http and https URLs"
            )));
        }
        Ok(Self {
            method,
            url,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            key: None,
            route: None,
        })
    }

    /// A `POST` to `url`.
    ///
    /// # Errors
    /// As [`Call::new`].
    pub fn post(url: &str) -> Result<Self, ClientError> {
        Self::new(Method::POST, url)
    }

    /// Adds a header (sent on every attempt, and on status queries unless it describes the
    /// body: the credential that scopes the key goes along).
    ///
    /// # Errors
    /// [`ClientError::Invalid`] for a name or value HTTP does not allow.
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, ClientError> {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ClientError::Invalid(format!("`{name}` is not a header name")))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| ClientError::Invalid(format!("the value of `{name}` is not valid")))?;
        self.headers.append(n, v);
        Ok(self)
    }

    /// The body, sent whole on every attempt.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// A JSON body (`content-type: application/json` unless one is set).
    pub fn json(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self.headers
            .entry(CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        self
    }

    /// The idempotency key of this operation; unset, a UUID v7 is made.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The gateway route whose key this is, for the status query (`?route=`).
    pub fn route(mut self, name: impl Into<String>) -> Self {
        self.route = Some(name.into());
        self
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }
}

/// The answer to an operation.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// The operation's key.
    pub key: String,
    /// The operation's request id.
    pub request_id: String,
    /// Requests sent.
    pub attempts: u32,
    /// Whether it is the stored answer fetched from the status endpoint after this
    /// client's own attempt lost its answer.
    pub from_status: bool,
}

impl Reply {
    /// Whether the server replayed a stored answer (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }
}

/// One HTTP answer, before the loop decides what it means.
#[derive(Debug)]
pub(crate) struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}", self.status)
    }
}

/// The retrying HTTP client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpClient {
    http: reqwest::Client,
    policy: Arc<RetryPolicy>,
    status: Option<Arc<StatusEndpoint>>,
    key_header: HeaderName,
}

impl HttpClient {
    /// A client with its own connection pool (rustls, system roots).
    ///
    /// # Errors
    /// [`ClientError::Invalid`] when the TLS configuration cannot be built.
    pub fn new(policy: RetryPolicy) -> Result<Self, ClientError> {
        // A redirect is returned as the answer: following one would send the operation
        // somewhere its key was never checked.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Invalid(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self::with_reqwest(http, policy))
    }

    /// A client over a `reqwest::Client` the caller configured (pool, proxies, TLS roots).
    /// Its own timeouts should not be shorter than the policy's attempt timeout, and it
    /// should not follow redirects (`HttpClient::new` does not).
    pub fn with_reqwest(http: reqwest::Client, policy: RetryPolicy) -> Self {
        Self {
            http,
            policy: Arc::new(policy),
            status: None,
            key_header: IDEMPOTENCY_KEY,
        }
    }

    /// Asks `endpoint` after every ambiguous failure. Without one, an ambiguous failure
    /// ends the operation with [`ClientError::Ambiguous`].
    pub fn status_endpoint(mut self, endpoint: StatusEndpoint) -> Self {
        self.status = Some(Arc::new(endpoint));
        self
    }

    /// Sends the key in `name` instead of `Idempotency-Key`.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Runs one operation: sends `call`, retries what is safe with the same key, asks the
    /// status endpoint after an ambiguous failure, and returns the first final answer.
    ///
    /// Final answers of any status are returned as a [`Reply`] (400, 422, 500 included);
    /// only 409 `in-flight`, 429, 503 and failures before anything was sent are retried.
    ///
    /// # Errors
    /// A [`ClientError`] naming the key: the outcome is unknown, cannot be told, or the
    /// policy's attempts or deadline ran out.
    pub async fn send(&self, mut call: Call) -> Result<Reply, ClientError> {
        // A key given as a header is the operation's key, not a second one.
        if let Some(given) = call.headers.remove(&self.key_header)
            && call.key.is_none()
        {
            let text = given.to_str().map_err(|_| {
                ClientError::Invalid(format!("the `{}` header is not text", self.key_header))
            })?;
            call.key = Some(text.trim().to_owned());
        }
        let key = match call.key.clone() {
            Some(k) => {
                idem_core::Key::new(k.clone())
                    .map_err(|e| ClientError::Invalid(format!("key `{k}`: {e}")))?;
                k
            }
            None => uuid::Uuid::now_v7().to_string(),
        };
        let key_value = key_header_value(&key)
            .ok_or_else(|| ClientError::Invalid(format!("key `{key}` cannot be sent")))?;
        let ids = Ids::for_operation(&call.headers);
        let call = Arc::new(call);
        // The closures own what they use (clones and `Arc`s), so the operation's future is
        // `Send`.
        let (this, for_send, for_send_ids) = (self.clone(), Arc::clone(&call), ids.clone());
        let send = move |n: u32, timeout: Duration| {
            let (this, call, key, ids) = (
                this.clone(),
                Arc::clone(&for_send),
                key_value.clone(),
                for_send_ids.clone(),
            );
            async move { this.attempt(&call, &key, &ids, n, timeout).await }
        };
        let (this, for_status, for_status_ids, status_key) =
            (self.clone(), Arc::clone(&call), ids.clone(), key.clone());
        let status = move |timeout: Duration| {
            let (this, call, key, ids) = (
                this.clone(),
                Arc::clone(&for_status),
                status_key.clone(),
                for_status_ids.clone(),
            );
            async move {
                match &this.status {
                    None => Ok(None),
                    Some(endpoint) => endpoint
                        .query(&this.http, &call, &key, &ids, timeout)
                        .await
                        .map(Some),
                }
            }
        };
        let done = retry::run(&self.policy, &key, send, status).await?;
        let answer = done.answer;
        Ok(Reply {
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            key,
            request_id: ids.request_id().to_owned(),
            attempts: done.attempts,
            from_status: done.from_status,
        })
    }

    async fn attempt(
        &self,
        call: &Call,
        key: &HeaderValue,
        ids: &Ids,
        n: u32,
        timeout: Duration,
    ) -> Attempt<Answer> {
        let mut headers = call.headers.clone();
        headers.insert(self.key_header.clone(), key.clone());
        ids.stamp(&mut headers);
        tracing::debug!(target: "idem_client", attempt = n, method = %call.method, url = %call.url, "sending");
        let sent = self
            .http
            .request(call.method.clone(), call.url.clone())
            .headers(headers)
            .body(call.body.clone())
            .timeout(timeout)
            .send()
            .await;
        let res = match sent {
            Ok(res) => res,
            Err(e) => return transport_failure(&e),
        };
        let status = res.status();
        let headers = res.headers().clone();
        let body = match res.bytes().await {
            Ok(b) => b,
            // The server answered but the body broke off: it may have acted.
            Err(e) => return Attempt::Ambiguous(format!("answer cut off: {e}")),
        };
        classify(Answer {
            status,
            headers,
            body,
        })
    }
}

/// A failure before any answer: safe to retry only when nothing can have been sent.
fn transport_failure<T>(e: &reqwest::Error) -> Attempt<T> {
    if e.is_builder() {
        return Attempt::NotSent(format!("request not built: {e}"));
    }
    if e.is_connect() {
        return Attempt::NotSent(format!("connect failed: {e}"));
    }
    if e.is_timeout() {
        return Attempt::Ambiguous(format!("timed out: {e}"));
    }
    Attempt::Ambiguous(format!("connection failed after sending: {}", chain(e)))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// What an answer means for the loop (the table in [`crate::decide`]).
fn classify(answer: Answer) -> Attempt<Answer> {
    let replayed = answer
        .headers
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    if replayed {
        return Attempt::Final(answer);
    }
    let retry_after = answer
        .headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    match answer.status.as_u16() {
        409 => match problem_reason(&answer.headers, &answer.body) {
            Some(Reason::InFlight) => Attempt::Retryable {
                answer,
                why: Later::InFlight,
                retry_after,
            },
            Some(Reason::OutcomeUnknown) => Attempt::OutcomeUnknown(answer),
            _ => Attempt::Final(answer),
        },
        429 => Attempt::Retryable {
            answer,
            why: Later::Throttled,
            retry_after,
        },
        503 => Attempt::Retryable {
            answer,
            why: Later::Unavailable,
            retry_after,
        },
        502 | 504 => Attempt::Ambiguous(format!("HTTP {}", answer.status)),
        _ => Attempt::Final(answer),
    }
}

/// The idem reason a problem+json answer names by its `type`: the one thing an HTTP client
/// can read of what idem meant.
fn problem_reason(headers: &HeaderMap, body: &[u8]) -> Option<Reason> {
    let ct = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    if !ct.trim_start().starts_with("application/problem+json") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("type")?.as_str().and_then(Reason::from_type_uri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::kind;

    /// Callers spawn operations: the future must be `Send`.
    #[allow(dead_code)]
    fn send_is_send(client: &HttpClient, call: Call) -> impl Send + '_ {
        client.send(call)
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        Answer {
            status: StatusCode::from_u16(status).expect("status"),
            headers: map,
            body: Bytes::from(body.to_owned()),
        }
    }

    const PROBLEM: (&str, &str) = ("content-type", "application/problem+json");

    #[test]
    fn answers_are_classified_by_the_table() {
        for (status, headers, body, expect) in [
            (201, vec![], "", "final"),
            (400, vec![], "", "final"),
            (401, vec![], "", "final"),
            (403, vec![], "", "final"),
            (422, vec![PROBLEM], "{}", "final"),
            (500, vec![], "", "final"),
            (429, vec![], "", "throttled"),
            (503, vec![("retry-after", "1")], "", "unavailable"),
            (502, vec![], "", "ambiguous"),
            (504, vec![], "", "ambiguous"),
            (
                409,
                vec![PROBLEM],
                r#"{"type":"https://idem.dev/problems/in-flight"}"#,
                "in_flight",
            ),
            (
                409,
                vec![PROBLEM],
                r#"{"type":"https://idem.dev/problems/outcome-unknown"}"#,
                "unknown",
            ),
            // The service's own conflict is its answer.
            (
                409,
                vec![("content-type", "application/json")],
                "{}",
                "final",
            ),
            // A replayed answer is final whatever its status.
            (503, vec![("idempotent-replayed", "true")], "", "final"),
            (
                409,
                vec![PROBLEM, ("idempotent-replayed", "true")],
                r#"{"type":"https://idem.dev/problems/in-flight"}"#,
                "final",
            ),
        ] {
            let a = classify(answer(status, &headers, body));
            assert_eq!(kind(&a), expect, "{status} {headers:?} {body}");
        }
        let a = classify(answer(503, &[("retry-after", "2")], ""));
        assert!(matches!(
            a,
            Attempt::Retryable { retry_after: Some(d), .. } if d == Duration::from_secs(2)
        ));
    }
}
