//! The ids an operation carries on every attempt: its key (as a header value), its request id
//! and its trace context.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The request id header.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The W3C trace context header.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The request id and trace id of one operation.
#[derive(Debug, Clone)]
pub(crate) struct Ids {
    request_id: HeaderValue,
    /// The caller's `traceparent`, propagated as is; else one trace id for the operation.
    trace: Trace,
}

#[derive(Debug, Clone)]
enum Trace {
    Given(HeaderValue),
    Made(u128),
}

impl Ids {
    /// The caller's `X-Request-ID` and `traceparent` when it set them, else new ones.
    pub(crate) fn for_operation(headers: &HeaderMap) -> Self {
        let request_id = headers.get(X_REQUEST_ID).cloned().unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::now_v7().to_string())
                .unwrap_or(HeaderValue::from_static("invalid"))
        });
        let trace = match headers.get(TRACEPARENT) {
            Some(v) => Trace::Given(v.clone()),
            None => Trace::Made(uuid::Uuid::new_v4().as_u128()),
        };
        Self { request_id, trace }
    }

    /// The operation's request id (the HTTP client reports it on its reply).
    #[cfg(feature = "http")]
    pub(crate) fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or("")
    }

    /// Sets the request id and a `traceparent` on one attempt's headers: the caller's, or the
    /// operation's trace id with a new span id per attempt.
    pub(crate) fn stamp(&self, headers: &mut HeaderMap) {
        headers.insert(X_REQUEST_ID, self.request_id.clone());
        let value = match &self.trace {
            Trace::Given(v) => v.clone(),
            Trace::Made(trace) => {
                let span = fastrand::u64(1..);
                HeaderValue::from_str(&format!("00-{trace:032x}-{span:016x}-01"))
                    .unwrap_or(HeaderValue::from_static("invalid"))
            }
        };
        headers.insert(TRACEPARENT, value);
    }
}

/// The key as a header value: a bare token when it is one, else an RFC 8941 sf-string (so a
/// key holding `,`, `"`, `\` or edge spaces reaches the server unchanged). `None` for a
/// key that is not printable ASCII.
pub(crate) fn key_header_value(key: &str) -> Option<HeaderValue> {
    if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return None;
    }
    let bare = !key.bytes().any(|b| matches!(b, b',' | b'"' | b'\\'))
        && !key.starts_with(' ')
        && !key.ends_with(' ');
    if bare {
        return HeaderValue::from_str(key).ok();
    }
    let mut quoted = String::with_capacity(key.len() + 2);
    quoted.push('"');
    for c in key.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    HeaderValue::from_str(&quoted).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_bare_or_quoted() {
        assert_eq!(key_header_value("order-42").expect("v"), "order-42");
        assert_eq!(key_header_value("a,b").expect("v"), "\"a,b\"");
        assert_eq!(
            key_header_value("say \"hi\"").expect("v"),
            "\"say \\\"hi\\\"\""
        );
        assert!(key_header_value("é").is_none());
    }

    #[test]
    fn one_request_id_and_trace_per_operation() {
        let ids = Ids::for_operation(&HeaderMap::new());
        let (mut a, mut b) = (HeaderMap::new(), HeaderMap::new());
        ids.stamp(&mut a);
        ids.stamp(&mut b);
        assert_eq!(a.get(X_REQUEST_ID), b.get(X_REQUEST_ID));
        let (ta, tb) = (
            a[TRACEPARENT].to_str().expect("a"),
            b[TRACEPARENT].to_str().expect("b"),
        );
        assert_eq!(ta.len(), 55);
        assert_eq!(ta[..35], tb[..35], "same trace id");
        assert_ne!(ta[36..52], tb[36..52], "a new span per attempt");

        let mut given = HeaderMap::new();
        given.insert(X_REQUEST_ID, HeaderValue::from_static("req-1"));
        given.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let ids = Ids::for_operation(&given);
        let mut c = HeaderMap::new();
        ids.stamp(&mut c);
        assert_eq!(c[X_REQUEST_ID], "req-1");
        assert_eq!(c[TRACEPARENT], given[TRACEPARENT]);
    }
}
