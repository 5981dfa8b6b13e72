//! Reading bodies into memory under a cap, and moving header fields in and out of a
//! [`StoredResponse`](idem_core::StoredResponse): the pieces every carrier built on HTTP
//! (this crate's layer, the gRPC layer) shares.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Body;
use http_body_util::BodyExt;

use crate::body::BoxError;

/// Why a request body could not be buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyFailure {
    /// It is larger than the limit.
    TooLarge,
    /// It failed while being read.
    Unreadable,
}

/// Buffers a request body of at most `limit` bytes; its trailers are ignored. A body that
/// arrives as one chunk (the usual case) is kept as that chunk, without a copy.
///
/// # Errors
/// [`BodyFailure`] says why.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, BodyFailure>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut chunks = Chunks::default();
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|_| BodyFailure::Unreadable)?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers take no part in the request
        };
        if chunks.len() + data.remaining() > limit {
            return Err(BodyFailure::TooLarge);
        }
        chunks.push(data.copy_to_bytes(data.remaining()));
    }
    Ok(chunks.into_bytes())
}

/// A response body read into memory, or as much of it as the cap allowed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Collected<B> {
    /// The whole body and its trailers (empty when it sent none).
    Whole {
        /// The body's bytes.
        body: Bytes,
        /// Its trailers.
        trailers: HeaderMap,
    },
    /// More than the cap: the bytes read so far, and the rest of the body, unread.
    TooLarge {
        /// The bytes read.
        prefix: Bytes,
        /// The body, positioned after `prefix`.
        rest: B,
    },
    /// The body failed while being read.
    Failed(BoxError),
}

/// Reads a response body and its trailers, stopping as soon as its data passes `cap` bytes.
pub async fn collect_body<B>(mut body: B, cap: usize) -> Collected<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut chunks = Chunks::default();
    let mut trailers = HeaderMap::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Collected::Failed(e.into()),
        };
        match frame.into_data() {
            Ok(data) => {
                chunks.push(data);
                if chunks.len() > cap {
                    return Collected::TooLarge {
                        prefix: chunks.into_bytes(),
                        rest: body,
                    };
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    // A body may send more than one trailers frame; keep every field.
                    for (name, value) in t.iter() {
                        trailers.append(name.clone(), value.clone());
                    }
                }
            }
        }
    }
    Collected::Whole {
        body: chunks.into_bytes(),
        trailers,
    }
}

/// The fields of `map` that `keep` accepts, in order, as a store keeps them.
pub fn stored_fields(
    map: &HeaderMap,
    mut keep: impl FnMut(&HeaderName) -> bool,
) -> Vec<(String, Bytes)> {
    map.iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                Bytes::copy_from_slice(value.as_bytes()),
            )
        })
        .collect()
}

/// Stored fields back into a header map. A field that is no longer a valid name or value
/// (it could only have been written by hand) is left out.
pub fn header_map(fields: Vec<(String, Bytes)>) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// Bytes taken by stored fields, as [`StoredResponse::size`](idem_core::StoredResponse::size)
/// counts them.
pub fn fields_size(fields: &[(String, Bytes)]) -> usize {
    fields.iter().map(|(n, v)| n.len() + v.len()).sum()
}

/// Body chunks gathered without copying while there is only one.
#[derive(Default)]
struct Chunks {
    first: Option<Bytes>,
    rest: BytesMut,
    len: usize,
}

impl Chunks {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, data: Bytes) {
        self.len += data.len();
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.rest.extend_from_slice(&first);
        }
        self.rest.extend_from_slice(&data);
    }

    fn into_bytes(self) -> Bytes {
        match self.first {
            Some(first) => first,
            None => self.rest.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResponseBody;

    fn trailers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.append(*n, HeaderValue::from_static(v));
        }
        map
    }

    #[tokio::test]
    async fn bodies_are_collected_with_their_trailers_and_cut_at_the_cap() {
        let t = trailers(&[("grpc-status", "0"), ("x-sum", "abc")]);
        let body =
            ResponseBody::<http_body_util::Empty<Bytes>>::full_with_trailers("hello", t.clone());
        match collect_body(body, 5).await {
            Collected::Whole { body, trailers } => {
                assert_eq!((&body[..], trailers), (&b"hello"[..], t.clone()));
            }
            other => panic!("{other:?}"),
        }
        let body = ResponseBody::<http_body_util::Empty<Bytes>>::full_with_trailers("hello", t);
        assert!(matches!(
            collect_body(body, 4).await,
            Collected::TooLarge { prefix, .. } if prefix == "hello"
        ));
    }

    #[test]
    fn fields_round_trip_through_a_header_map() {
        let t = trailers(&[("grpc-status", "5"), ("grpc-message", "gone"), ("x", "1")]);
        let kept = stored_fields(&t, |n| n != "x");
        assert_eq!(fields_size(&kept), 11 + 1 + 12 + 4);
        assert_eq!(
            header_map(kept),
            trailers(&[("grpc-status", "5"), ("grpc-message", "gone")])
        );
        assert!(header_map(vec![("bad name".into(), Bytes::new())]).is_empty());
    }
}
