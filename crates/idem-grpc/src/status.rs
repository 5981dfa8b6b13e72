//! The status service, `idem.status.v1.Status/Lookup`: a caller that timed out asks what
//! became of its key before it retries (the seeds' "idempotent query").
//!
//! The request names the protected method and the key; the answer is the key's state
//! (absent, in flight, completed with the stored answer, unknown) in the scope of that
//! method's namespace and of the principal its configuration takes from the caller's
//! metadata, so a caller never learns about another principal's keys. The service exists
//! only where it is added to the server ([`GrpcIdempotencyLayer::status_service`]).
//!
//! [`GrpcIdempotencyLayer::status_service`]: crate::GrpcIdempotencyLayer::status_service

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use idem_core::{Key, RecordState, ScopedKey, Store, StoredResponse};
use tonic::{Code, Request, Response};

use crate::idempotency::Shared;
use crate::proto::{LookupRequest, LookupResponse, Metadata, State, StoredAnswer};
use crate::wire;

/// Answers `Lookup` for the methods of one [`GrpcIdempotencyLayer`](crate::GrpcIdempotencyLayer).
pub struct StatusService<St> {
    shared: Arc<Shared<St>>,
}

impl<St> StatusService<St> {
    pub(crate) fn new(shared: Arc<Shared<St>>) -> Self {
        Self { shared }
    }
}

impl<St> fmt::Debug for StatusService<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusService").finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl<St: Store> crate::proto::status_server::Status for StatusService<St> {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, tonic::Status> {
        let (metadata, extensions, ask) = request.into_parts();
        let Some(method) = self.shared.methods.get(&ask.method) else {
            return Err(tonic::Status::invalid_argument(format!(
                "{:?} is not a method this server protects",
                ask.method
            )));
        };
        let key = Key::new(ask.key).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        // The principal extractors read an HTTP request head: give them the call's.
        let mut head = http::Request::new(());
        *head.headers_mut() = metadata.into_headers();
        *head.extensions_mut() = extensions;
        let (parts, ()) = head.into_parts();
        let principal = method
            .config
            .protection
            .principal
            .principal(&parts)
            .map_err(|r| tonic::Status::new(r.reason().code(), r.detail()))?;
        let scoped = ScopedKey::new(method.config.protection.scope_for(principal), key);
        let engine = &method.engine;
        let limit = engine.policy().store_timeout();
        let record = idem_http::read_record(engine.store().as_ref(), &scoped, limit)
            .await
            .ok_or_else(unavailable)?;
        let mut out = LookupResponse {
            state: State::Absent as i32,
            ..LookupResponse::default()
        };
        if let Some(r) = record {
            out.created_at_ms = r.created_at.as_millis();
            out.expires_at_ms = r.expires_at.as_millis();
            match r.state {
                RecordState::Processing { lease_until, .. } => {
                    out.state = State::InFlight as i32;
                    out.lease_until_ms = lease_until.as_millis();
                }
                RecordState::Completed {
                    response,
                    completed_at,
                } => {
                    out.state = State::Completed as i32;
                    out.completed_at_ms = completed_at.as_millis();
                    out.answer = Some(stored_answer(response));
                }
                RecordState::Unknown { .. } => out.state = State::Unknown as i32,
                _ => out.state = State::Unspecified as i32,
            }
        }
        Ok(Response::new(out))
    }
}

fn unavailable() -> tonic::Status {
    tonic::Status::new(
        Code::Unavailable,
        "the idempotency store failed or timed out",
    )
}

/// The stored answer as the status service returns it: the messages without their frame
/// headers, the status fields decoded.
fn stored_answer(r: StoredResponse) -> StoredAnswer {
    let field = |name: &str| {
        r.trailers
            .iter()
            .chain(&r.headers)
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let message = field("grpc-message")
        .map(|v| {
            percent_encoding::percent_decode(&v)
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let details = field("grpc-status-details-bin")
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(trim_padding(&v))
                .ok()
        })
        .unwrap_or_default();
    let messages = wire::messages(&r.body).unwrap_or_default();
    let compressed = messages.iter().any(|m| m.compressed);
    let pairs = |list: &[(String, bytes::Bytes)]| {
        list.iter()
            .map(|(name, value)| Metadata {
                name: name.clone(),
                value: value.to_vec(),
            })
            .collect()
    };
    StoredAnswer {
        code: i32::from(r.status),
        message,
        details,
        messages: messages.iter().map(|m| m.bytes.to_vec()).collect(),
        omitted: r.body_omitted,
        compressed,
        headers: pairs(&r.headers),
        trailers: pairs(&r.trailers),
    }
}

/// `grpc-status-details-bin` may be sent with or without base64 padding.
fn trim_padding(v: &[u8]) -> &[u8] {
    let end = v.iter().rposition(|&b| b != b'=').map_or(0, |i| i + 1);
    &v[..end]
}
