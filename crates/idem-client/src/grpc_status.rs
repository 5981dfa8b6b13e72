//! [`IdemStatus`]: the gRPC layer's status query over idem-grpc's status service
//! (`idem.status.v1.Status/Lookup`), answered in the caller's scope (the call's metadata
//! carries its credentials). A completed key comes back as the stored answer, rebuilt as
//! the response the generated client decodes: the leading metadata, the messages framed as
//! on the wire, the trailers, and `idempotent-replayed: true`.

use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use idem_wire::grpc::proto::status_client::StatusClient;
use idem_wire::grpc::proto::{LookupRequest, Metadata, State, StoredAnswer};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::decide::KeyState;
use crate::error::ClientError;
use crate::grpc::{BoxError, GrpcAnswer, LookupFuture, StatusLookup};

/// Asks idem-grpc's status service, over the same channel as the calls.
#[derive(Debug, Clone)]
pub struct IdemStatus<T> {
    client: StatusClient<T>,
}

impl<T> IdemStatus<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    /// The status service reached through `channel`.
    pub fn new(channel: T) -> Self {
        Self {
            client: StatusClient::new(channel),
        }
    }
}

impl<T> StatusLookup for IdemStatus<T>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    fn lookup(
        &self,
        path: String,
        key: String,
        metadata: HeaderMap,
        timeout: Duration,
    ) -> LookupFuture {
        let mut client = self.client.clone();
        Box::pin(async move {
            let mut req = tonic::Request::new(LookupRequest {
                method: path,
                key: key.clone(),
            });
            *req.metadata_mut() = MetadataMap::from_headers(metadata);
            req.set_timeout(timeout);
            let res = match client.lookup(req).await {
                Ok(res) => res.into_inner(),
                Err(s) => return failed(&key, &s),
            };
            let state = match res.state() {
                State::Absent => KeyState::Absent,
                State::InFlight => KeyState::InFlight { retry_after: None },
                State::Unknown => KeyState::Unknown,
                State::Completed => match res.answer {
                    Some(answer) if !answer.omitted => KeyState::Completed(rebuild(answer)),
                    Some(_) => return Err(ClientError::ResponseNotStored { key }),
                    None => {
                        return Err(ClientError::StatusQuery {
                            key,
                            detail: "completed without its answer".into(),
                        });
                    }
                },
                State::Unspecified => {
                    return Err(ClientError::StatusQuery {
                        key,
                        detail: "state unspecified".into(),
                    });
                }
            };
            Ok(Some(state))
        })
    }
}

/// A failed query: asked again when the service may answer later, an error otherwise (a
/// method it does not protect, a refused credential).
fn failed(key: &str, s: &Status) -> Result<Option<KeyState<GrpcAnswer>>, ClientError> {
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted => {
            Ok(Some(KeyState::Unavailable(format!(
                "status service: {:?} {}",
                s.code(),
                s.message()
            ))))
        }
        _ => Err(ClientError::StatusQuery {
            key: key.to_owned(),
            detail: format!("{:?}: {}", s.code(), s.message()),
        }),
    }
}

/// The stored answer as the response a replay would have been.
fn rebuild(answer: StoredAnswer) -> GrpcAnswer {
    let mut head = Response::new(()).into_parts().0;
    head.headers = pairs(&answer.headers);
    head.headers
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    head.headers
        .entry(http::header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/grpc"));
    let mut body = BytesMut::new();
    for m in &answer.messages {
        body.put_u8(u8::from(answer.compressed));
        body.put_u32(u32::try_from(m.len()).unwrap_or(u32::MAX));
        body.put_slice(m);
    }
    let mut trailers = pairs(&answer.trailers);
    let trailers_only = head.headers.contains_key("grpc-status");
    if !trailers_only && !trailers.contains_key("grpc-status") {
        let status = Status::with_details(
            Code::from_i32(answer.code),
            answer.message.clone(),
            Bytes::from(answer.details.clone()),
        );
        let _ = status.add_header(&mut trailers);
    }
    let trailers = (!trailers.is_empty()).then_some(trailers);
    GrpcAnswer::new(head, body.freeze(), trailers)
}

fn pairs(list: &[Metadata]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for m in list {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(m.name.as_bytes()),
            HeaderValue::from_bytes(&m.value),
        ) {
            map.append(name, value);
        }
    }
    map
}
