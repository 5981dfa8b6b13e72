//! The cost floor of any idempotency layer, for the bench only: NOT a usable middleware.
//!
//! It does only what every idempotency-key layer must do for a fresh key, and nothing the
//! issue's semantics add on top: read and bound-check the key, buffer the request body,
//! hash method, route and body, claim the key in a shared map, call the handler, buffer its
//! response and record it. There are no leases, fences, expiry, principals, canonical JSON,
//! header allow-list, panic or disconnect handling, timeouts or problem bodies. Whatever the
//! real layer costs above this route is the price of those guarantees (and of any overhead
//! idem could still trim). What this route costs over the plain one is close to what any
//! implementation must pay on the same machine: each step is about as lean as it can be
//! written, but a cleverer floor could still shave a little.
//!
//! [`FloorLayer::canonical_json`] adds one thing the issue asks for by default: the
//! fingerprint covers the canonical form of a JSON body (key order and whitespace ignored),
//! computed by idem-core's one-pass canonicaliser, instead of the raw bytes.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::{Fingerprint, JsonFields};
use tower::{Layer, Service};

const BODY_LIMIT: usize = 1 << 20;
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

enum Slot {
    Running(Fingerprint),
    Done(Fingerprint, StatusCode, Bytes),
}

#[derive(Clone, Default)]
pub(crate) struct FloorLayer {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    canonical_json: bool,
}

impl FloorLayer {
    /// Fingerprints the canonical form of a JSON body rather than its bytes.
    pub(crate) fn canonical_json() -> Self {
        Self {
            canonical_json: true,
            ..Self::default()
        }
    }
}

impl<S> Layer<S> for FloorLayer {
    type Service = Floor<S>;

    fn layer(&self, inner: S) -> Floor<S> {
        Floor {
            inner,
            slots: Arc::clone(&self.slots),
            canonical_json: self.canonical_json,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Floor<S> {
    inner: S,
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    canonical_json: bool,
}

impl<S> Service<Request<Body>> for Floor<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let slots = Arc::clone(&self.slots);
        let canonical_json = self.canonical_json;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let key = parts
                .headers
                .get(&KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|k| !k.is_empty() && k.len() < 256);
            let Some(key) = key.map(str::to_owned) else {
                return Ok(StatusCode::BAD_REQUEST.into_response());
            };
            let Some(bytes) = buffer(body).await else {
                return Ok(StatusCode::PAYLOAD_TOO_LARGE.into_response());
            };
            let (method, route) = (parts.method.as_str(), parts.uri.path());
            let json = canonical_json
                .then(|| Fingerprint::http_json(1, method, route, &bytes, &JsonFields::all()).ok())
                .flatten();
            let fingerprint =
                json.unwrap_or_else(|| Fingerprint::http_raw(1, method, route, &bytes));
            {
                let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
                match slots.entry(key.clone()) {
                    Entry::Vacant(slot) => {
                        slot.insert(Slot::Running(fingerprint));
                    }
                    Entry::Occupied(slot) => {
                        return Ok(match slot.get() {
                            Slot::Done(f, status, body) if *f == fingerprint => {
                                (*status, body.clone()).into_response()
                            }
                            Slot::Running(f) if *f == fingerprint => {
                                StatusCode::CONFLICT.into_response()
                            }
                            _ => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
                        });
                    }
                }
            }
            let res = inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await?;
            let (head, body) = res.into_parts();
            let Some(bytes) = buffer(body).await else {
                slots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                return Ok(StatusCode::INTERNAL_SERVER_ERROR.into_response());
            };
            if let Some(slot) = slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(&key)
            {
                *slot = Slot::Done(fingerprint, head.status, bytes.clone());
            }
            Ok(Response::from_parts(head, Body::from(bytes)))
        })
    }
}

/// Buffers a body of at most [`BODY_LIMIT`] bytes; one that arrives as one chunk (the usual
/// case) is kept as that chunk, without a copy.
async fn buffer(body: Body) -> Option<Bytes> {
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while let Some(frame) = body.as_mut().frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue; // trailers
        };
        if first.is_none() && more.is_empty() {
            first = Some(data);
        } else {
            if let Some(first) = first.take() {
                more.extend_from_slice(&first);
            }
            more.extend_from_slice(&data);
        }
        if first.as_ref().map_or(more.len(), Bytes::len) > BODY_LIMIT {
            return None;
        }
    }
    Some(first.unwrap_or_else(|| more.freeze()))
}
