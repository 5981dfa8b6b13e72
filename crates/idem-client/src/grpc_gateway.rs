//! [`GatewayStatus`]: the gRPC layer's status query for a gRPC service behind the `idem`
//! gateway. It asks the gateway's HTTP status endpoint (`GET <path>/{key}?answer=1`) over
//! the same HTTP/2 channel as the calls, with the call's metadata (its credentials scope the
//! key, as the route did), and reads the answer with the HTTP client's own reader: a
//! completed key's stored answer is the gRPC response itself (message, trailers,
//! `idempotent-replayed: true`), replayed by the gateway as a retry would get it.

use std::time::Duration;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderName, Method, Request, Response};
use http_body_util::BodyExt as _;
use tonic::body::Body;
use tower::{Service, ServiceExt as _};

use crate::decide::KeyState;
use crate::error::ClientError;
use crate::grpc::{BoxError, GrpcAnswer, IDEMPOTENCY_KEY, LookupFuture, StatusLookup};
use crate::http::status::{no_answer, read_state};

/// Metadata of the call that describes its body or its deadline, not the caller: never sent
/// on the status query (a `content-type: application/grpc` would make the gateway answer in
/// gRPC's terms instead of the status endpoint's).
const NOT_FORWARDED: [HeaderName; 7] = [
    CONTENT_TYPE,
    CONTENT_LENGTH,
    TE,
    HeaderName::from_static("grpc-timeout"),
    HeaderName::from_static("grpc-encoding"),
    HeaderName::from_static("grpc-accept-encoding"),
    IDEMPOTENCY_KEY,
];

/// Asks the idem gateway's status endpoint, through `channel` (a channel to the gateway).
#[derive(Debug, Clone)]
pub struct GatewayStatus<T> {
    channel: T,
    path: String,
    route: Option<String>,
}

impl<T> GatewayStatus<T> {
    /// The gateway's status endpoint at `path` (its `status.path`, e.g. `/idem/status`).
    ///
    /// # Errors
    /// [`ClientError::Invalid`] when `path` is not an absolute path without a query.
    pub fn new(channel: T, path: &str) -> Result<Self, ClientError> {
        let ok = path.starts_with('/')
            && !path.contains(['?', '#'])
            && path.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(ClientError::Invalid(format!(
                "`{path}`: the status path must be an absolute path, without a query"
            )));
        }
        Ok(Self {
            channel,
            path: path.trim_end_matches('/').to_owned(),
            route: None,
        })
    }

    /// The gateway route asked about (`?route=`): needed when the gateway protects more
    /// than one route.
    pub fn route(mut self, name: impl Into<String>) -> Self {
        self.route = Some(name.into());
        self
    }

    /// The query's path and query for `key`.
    fn target(&self, key: &str) -> String {
        let mut target = format!("{}/{}?answer=1", self.path, idem_wire::path::segment(key));
        if let Some(r) = &self.route {
            target.push_str("&route=");
            target.push_str(&idem_wire::path::segment(r));
        }
        target
    }
}

impl<T> StatusLookup for GatewayStatus<T>
where
    T: Service<Request<Body>, Response = Response<Body>> + Clone + Send + Sync + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
{
    fn lookup(
        &self,
        _method: String,
        key: String,
        mut metadata: HeaderMap,
        timeout: Duration,
    ) -> LookupFuture {
        for name in NOT_FORWARDED {
            metadata.remove(name);
        }
        let target = self.target(&key);
        let channel = self.channel.clone();
        Box::pin(async move {
            let mut req = Request::new(Body::empty());
            *req.method_mut() = Method::GET;
            *req.uri_mut() = target
                .parse()
                .map_err(|e| ClientError::Invalid(format!("status query `{target}`: {e}")))?;
            *req.headers_mut() = metadata;
            let asked = tokio::time::timeout(timeout, async move {
                let res = channel.oneshot(req).await.map_err(|e| {
                    let e: BoxError = e.into();
                    e.to_string()
                })?;
                let (head, body) = res.into_parts();
                let body = body
                    .collect()
                    .await
                    .map_err(|e| format!("answer cut off: {e}"))?;
                let trailers = body.trailers().cloned();
                Ok::<_, String>((head, body.to_bytes(), trailers))
            })
            .await;
            let (head, body, trailers) = match asked {
                Ok(Ok(answer)) => answer,
                Ok(Err(why)) => return Ok(Some(KeyState::Unavailable(why))),
                Err(_) => return Ok(Some(KeyState::Unavailable("timed out".into()))),
            };
            let answer = GrpcAnswer::new(head, body, trailers);
            if answer.replayed() {
                return Ok(Some(KeyState::Completed(answer)));
            }
            let (head, body) = answer.parts();
            read_state(&key, head.status, &head.headers, body)
                .map(no_answer)
                .map(Some)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_carry_the_key_as_one_segment() {
        let s = GatewayStatus::new((), "/idem/status/")
            .expect("path")
            .route("charge gRPC");
        assert_eq!(
            s.target("order/42 x"),
            "/idem/status/order%2F42%20x?answer=1&route=charge%20gRPC"
        );
        assert!(GatewayStatus::new((), "idem/status").is_err());
        assert!(GatewayStatus::new((), "/idem/status?x=1").is_err());
    }
}
