//! Reading bodies into memory under a cap, and moving header fields in and out of a
//! [`StoredResponse`](idem_core::StoredResponse): the pieces every carrier built on HTTP
//! (this crate's layer, the gRPC layer) shares.

use std::time::Duration;

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
    /// It did not arrive in time: slower than its [`BodyPace`] allows.
    TimedOut,
}

/// Default of [`BodyPace::timeout`]: 30 s for a whole request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`BodyPace::min_rate`]: 16 KiB/s on average once [`BODY_RATE_GRACE`] is over.
pub const DEFAULT_MIN_BODY_RATE: u64 = 16 * 1024;
/// How long a body may take before the minimum rate applies: a client's first bytes may
/// come late (slow start, a request built while it is sent) without being cut off.
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(2);

/// How fast a request body must arrive while it is buffered: in full within `timeout`, and
/// after [`BODY_RATE_GRACE`] at an average of at least `min_rate` bytes per second since
/// reading began. A client that stalls mid-body (or trickles it) would otherwise hold the
/// request, and the server's slot for it, for as long as it keeps the connection open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPace {
    /// Longest the whole body may take.
    pub timeout: Duration,
    /// Least average rate, in bytes per second; `0` checks no rate.
    pub min_rate: u64,
}

impl Default for BodyPace {
    /// [`DEFAULT_BODY_TIMEOUT`] and [`DEFAULT_MIN_BODY_RATE`].
    fn default() -> Self {
        Self {
            timeout: DEFAULT_BODY_TIMEOUT,
            min_rate: DEFAULT_MIN_BODY_RATE,
        }
    }
}

impl BodyPace {
    /// No bound at all: a body may take as long as its sender likes. For callers whose
    /// server already bounds request bodies.
    pub const UNBOUNDED: Self = Self {
        timeout: Duration::MAX,
        min_rate: 0,
    };

    /// The longest a body may take, counted from when reading began, once `received` bytes
    /// of it arrived: every byte buys `1 / min_rate` s past the grace, up to `timeout`.
    pub fn allowed(&self, received: usize) -> Duration {
        if self.min_rate == 0 {
            return self.timeout;
        }
        let nanos = (received as u128).saturating_mul(1_000_000_000) / u128::from(self.min_rate);
        let earned = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        BODY_RATE_GRACE.saturating_add(earned).min(self.timeout)
    }
}

/// Buffers a request body of at most `limit` bytes, arriving at `pace`; its trailers are
/// ignored. A body that arrives as one chunk (the usual case) is kept as that chunk, without
/// a copy.
///
/// # Errors
/// [`BodyFailure`] says why.
pub async fn read_body<B>(body: B, limit: usize, pace: BodyPace) -> Result<Bytes, BodyFailure>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut chunks = Chunks::default();
    let started = tokio::time::Instant::now();
    loop {
        let mut pinned = body.as_mut();
        let next = pinned.frame();
        let frame = if pace == BodyPace::UNBOUNDED {
            next.await
        } else {
            // The deadline moves out as bytes arrive, so it is taken again for every frame.
            let deadline = started
                .checked_add(pace.allowed(chunks.len()))
                .unwrap_or_else(far_future);
            match tokio::time::timeout_at(deadline, next).await {
                Ok(frame) => frame,
                Err(_) => return Err(BodyFailure::TimedOut),
            }
        };
        let Some(frame) = frame else { break };
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

/// An instant no body will wait for (about 30 years away), for a deadline past what an
/// `Instant` can hold.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365 * 30)
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

    /// A body that sends `sent` bytes in chunks of `chunk` bytes every `every`, then stalls
    /// (or ends, when `stall` is false).
    fn trickle(
        sent: usize,
        chunk: usize,
        every: Duration,
        stall: bool,
    ) -> impl Body<Data = Bytes, Error = BoxError> {
        use futures::StreamExt as _;
        let chunks = futures::stream::iter(0..sent.div_ceil(chunk)).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(vec![b' '; chunk])))
        });
        let tail = futures::stream::poll_fn(move |_| {
            if stall {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(None)
            }
        });
        http_body_util::StreamBody::new(chunks.chain(tail))
    }

    // Bug guarded: nothing timed out a body being read, so a client that sent one byte of a
    // declared 100 held the request (and the server's slot for it) for as long as it liked.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out_after_the_grace() {
        let started = tokio::time::Instant::now();
        let got = read_body(
            trickle(1, 1, Duration::ZERO, true),
            100,
            BodyPace::default(),
        )
        .await;
        assert_eq!(got, Err(BodyFailure::TimedOut));
        let waited = started.elapsed();
        assert!(waited >= BODY_RATE_GRACE && waited < BODY_RATE_GRACE + Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_held_to_its_rate_and_its_timeout() {
        let pace = BodyPace {
            timeout: Duration::from_secs(10),
            min_rate: 1000,
        };
        // 100 bytes a second is a tenth of the rate: cut off soon after the grace.
        let slow = read_body(
            trickle(5000, 100, Duration::from_secs(1), true),
            10_000,
            pace,
        )
        .await;
        assert_eq!(slow, Err(BodyFailure::TimedOut));
        // 2000 bytes a second keeps up with it; 8000 bytes arrive whole in 4 s.
        let fast = trickle(8000, 2000, Duration::from_secs(1), false);
        let fast = read_body(fast, 10_000, pace)
            .await
            .expect("a body at the rate");
        assert_eq!(fast.len(), 8000);
        // At the rate forever, the timeout still ends it.
        let started = tokio::time::Instant::now();
        let endless = read_body(
            trickle(1 << 20, 2000, Duration::from_secs(1), true),
            1 << 20,
            pace,
        );
        assert_eq!(endless.await, Err(BodyFailure::TimedOut));
        assert_eq!(started.elapsed(), pace.timeout);
        // Unbounded, a stalled body is simply waited for.
        let stalled = read_body(
            trickle(1, 1, Duration::ZERO, true),
            100,
            BodyPace::UNBOUNDED,
        );
        let waited = tokio::time::timeout(Duration::from_secs(3600), stalled).await;
        assert!(waited.is_err(), "an unbounded read gave up");
    }

    #[test]
    fn a_pace_earns_time_per_byte() {
        let pace = BodyPace {
            timeout: Duration::from_secs(30),
            min_rate: 1024,
        };
        assert_eq!(pace.allowed(0), BODY_RATE_GRACE);
        assert_eq!(pace.allowed(2048), BODY_RATE_GRACE + Duration::from_secs(2));
        assert_eq!(pace.allowed(usize::MAX), pace.timeout);
        let no_rate = BodyPace {
            min_rate: 0,
            ..pace
        };
        assert_eq!(no_rate.allowed(0), pace.timeout);
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
