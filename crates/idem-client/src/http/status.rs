//! The status query: `GET <endpoint>/{key}?answer=1[&route=…]`, as the idem gateway serves
//! it, with the call's own credentials so the key is looked up in the caller's scope.

use std::time::Duration;

use http::header::{
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING,
};
use http::{HeaderMap, StatusCode};
use reqwest::Url;

use idem_wire::Reason;
use idem_wire::header::retry_after;

use super::{Answer, Call, IDEMPOTENT_REPLAYED, problem_reason};
use crate::decide::KeyState;
use crate::error::ClientError;
use crate::ids::Ids;

/// Where the client asks what became of a key: the gateway's `status.path` as a URL, e.g.
/// `http://127.0.0.1:8080/idem/status`.
#[derive(Debug, Clone)]
pub struct StatusEndpoint {
    base: Url,
    route: Option<String>,
}

impl StatusEndpoint {
    /// The endpoint at `url`.
    ///
    /// # Errors
    /// [`ClientError::Invalid`] when `url` is not an absolute http(s) URL that can take a
    /// path segment.
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let base = Url::parse(url).map_err(|e| ClientError::Invalid(format!("`{url}`: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(ClientError::Invalid(format!(
                "`{url}`: the status endpoint must be an http(s) URL"
            )));
        }
        Ok(Self { base, route: None })
    }

    /// The route asked about when a call names none (`?route=`).
    pub fn route(mut self, name: impl Into<String>) -> Self {
        self.route = Some(name.into());
        self
    }

    /// The query URL for `key`.
    fn url(&self, key: &str, route: Option<&str>) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            // Percent-encodes the key as one segment (`/` included).
            segments.pop_if_empty().push(key);
        }
        url.set_query(None);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("answer", "1");
            if let Some(r) = route.or(self.route.as_deref()) {
                q.append_pair("route", r);
            }
        }
        url
    }

    /// Asks once. Failures of the query itself are [`KeyState::Unavailable`] (asked again);
    /// answers that are not a status for this key are errors.
    pub(crate) async fn query(
        &self,
        http: &reqwest::Client,
        call: &Call,
        key: &str,
        ids: &Ids,
        timeout: Duration,
    ) -> Result<KeyState<Answer>, ClientError> {
        let mut headers: HeaderMap = call.headers.clone();
        for h in [
            CONTENT_TYPE,
            CONTENT_LENGTH,
            CONTENT_ENCODING,
            TRANSFER_ENCODING,
        ] {
            headers.remove(h);
        }
        ids.stamp(&mut headers);
        let sent = http
            .get(self.url(key, call.route.as_deref()))
            .headers(headers)
            .timeout(timeout)
            .send()
            .await;
        let res = match sent {
            Ok(res) => res,
            Err(e) => return Ok(KeyState::Unavailable(super::chain(&e))),
        };
        let status = res.status();
        let headers = res.headers().clone();
        let body = match res.bytes().await {
            Ok(b) => b,
            Err(e) => return Ok(KeyState::Unavailable(format!("answer cut off: {e}"))),
        };
        let answer = Answer {
            status,
            headers,
            body,
        };
        read(key, answer)
    }
}

/// What a status answer says.
fn read(key: &str, answer: Answer) -> Result<KeyState<Answer>, ClientError> {
    if answer
        .headers
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    {
        return Ok(KeyState::Completed(answer));
    }
    read_state(key, answer.status, &answer.headers, &answer.body).map(no_answer)
}

/// A state without a stored answer, as any carrier's [`KeyState`].
pub(crate) fn no_answer<T>(state: KeyState<std::convert::Infallible>) -> KeyState<T> {
    match state {
        KeyState::Absent => KeyState::Absent,
        KeyState::InFlight { retry_after } => KeyState::InFlight { retry_after },
        KeyState::Unknown => KeyState::Unknown,
        KeyState::Unavailable(why) => KeyState::Unavailable(why),
        KeyState::Completed(never) => match never {},
    }
}

/// What a status answer that is not a stored answer (no `Idempotent-Replayed: true`) says
/// about `key`: the gateway's JSON state, a failure of the query (asked again), or an error
/// when it is not a status of this key at all. Shared by the HTTP and gRPC clients.
pub(crate) fn read_state(
    key: &str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<KeyState<std::convert::Infallible>, ClientError> {
    let refused = |detail: String| ClientError::StatusQuery {
        key: key.to_owned(),
        detail,
    };
    match status.as_u16() {
        429 | 502 | 503 | 504 => {
            return Ok(KeyState::Unavailable(format!("HTTP {status}")));
        }
        409 if problem_reason(headers, body) == Some(Reason::ResponseNotStored) => {
            return Err(ClientError::ResponseNotStored {
                key: key.to_owned(),
            });
        }
        _ => {}
    }
    let json: Option<serde_json::Value> =
        (matches!(status, StatusCode::OK | StatusCode::NOT_FOUND))
            .then(|| serde_json::from_slice(body).ok())
            .flatten();
    let Some(json) = json.filter(|j| j.get("key").and_then(|k| k.as_str()) == Some(key)) else {
        let text = String::from_utf8_lossy(body);
        let text: String = text.chars().take(200).collect();
        return Err(refused(format!("HTTP {status}: {text}")));
    };
    match json.get("state").and_then(|s| s.as_str()) {
        Some("absent") => Ok(KeyState::Absent),
        Some("processing") => Ok(KeyState::InFlight {
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(retry_after),
        }),
        Some("unknown") => Ok(KeyState::Unknown),
        Some(other) => Err(refused(format!(
            "state `{other}` without the stored answer"
        ))),
        None => Err(refused("no `state` in the answer".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderValue, StatusCode};

    use super::*;

    fn answer(status: u16, body: &str, replayed: bool) -> Answer {
        let mut headers = HeaderMap::new();
        if replayed {
            headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        Answer {
            status: StatusCode::from_u16(status).expect("status"),
            headers,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn urls_carry_the_key_as_one_segment() {
        let e = StatusEndpoint::new("http://gw:8080/idem/status/")
            .expect("url")
            .route("charge");
        assert_eq!(
            e.url("order/42 x", None).as_str(),
            "http://gw:8080/idem/status/order%2F42%20x?answer=1&route=charge"
        );
        assert_eq!(
            e.url("k", Some("refund")).as_str(),
            "http://gw:8080/idem/status/k?answer=1&route=refund"
        );
        assert!(StatusEndpoint::new("mailto:x@y").is_err());
    }

    #[test]
    fn status_answers_are_read_strictly() {
        let k = "k-1";
        assert!(matches!(
            read(k, answer(404, r#"{"key":"k-1","state":"absent"}"#, false)),
            Ok(KeyState::Absent)
        ));
        assert!(matches!(
            read(
                k,
                answer(200, r#"{"key":"k-1","state":"processing"}"#, false)
            ),
            Ok(KeyState::InFlight { .. })
        ));
        assert!(matches!(
            read(k, answer(200, r#"{"key":"k-1","state":"unknown"}"#, false)),
            Ok(KeyState::Unknown)
        ));
        assert!(matches!(
            read(k, answer(201, "charged", true)),
            Ok(KeyState::Completed(_))
        ));
        assert!(matches!(
            read(k, answer(503, "", false)),
            Ok(KeyState::Unavailable(_))
        ));
        // Not a status of this key: a plain 404 page, another key, a refusal.
        assert!(read(k, answer(404, "not found", false)).is_err());
        assert!(read(k, answer(404, r#"{"key":"k-2","state":"absent"}"#, false)).is_err());
        assert!(read(k, answer(401, r#"{"key":"k-1"}"#, false)).is_err());
        assert!(
            read(
                k,
                answer(200, r#"{"key":"k-1","state":"completed"}"#, false)
            )
            .is_err()
        );
    }
}
