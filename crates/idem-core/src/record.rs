//! The record a store keeps per scoped key, and the values inside it.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;

/// A point on the store's clock, in milliseconds since the Unix epoch.
///
/// Lease expiry is always judged on the store's clock, never on a client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// This instant moved later by `d` (saturating).
    #[must_use]
    pub fn plus(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_ms(d)))
    }

    /// How long from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in whole milliseconds, rounded up so a non-zero duration never becomes zero.
pub fn duration_ms(d: Duration) -> u64 {
    let ms = d.as_millis();
    let rounded = if d.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(rounded).unwrap_or(u64::MAX)
}

/// Identifies one claim attempt's holder. Unique per claim (see [`OwnerId::random`]), so a regressed fence
/// counter can never hand the same (owner, fence) pair to two holders.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u128);

impl OwnerId {
    /// A fresh, unique owner id: this process's random 64-bit nonce, then a per-process
    /// counter. Two processes share a nonce with probability 2^-64; within a process ids never
    /// repeat, and no random draw is needed per claim.
    pub fn random() -> Self {
        static NONCE: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nonce = *NONCE.get_or_init(|| (uuid::Uuid::new_v4().as_u128() >> 64) as u64);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self((u128::from(nonce) << 64) | u128::from(n))
    }

    /// The id as 16 big-endian bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", uuid::Uuid::from_u128(self.0))
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

/// A held claim: who holds it, its fence, and until when (store clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The holder.
    pub owner: OwnerId,
    /// Strictly greater than every earlier fence of this key.
    pub fence: u64,
    /// When the lease runs out unless renewed.
    pub deadline: Timestamp,
}

/// What happens to a processing record that is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseKind {
    /// The handler failed before any effect: the record goes away and a retry may run.
    Retryable,
    /// The outcome is ambiguous: the record becomes [`RecordState::Unknown`] until resolved.
    Unknown,
}

/// What a claim does with a processing record whose lease has expired.
///
/// An expired lease means the holder stopped renewing (crashed, paused, cut off from the
/// store), not that its effect did not happen: the default, [`TakeoverPolicy::Hold`], never
/// runs such a key again blind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TakeoverPolicy {
    /// Claim it again with a higher fence and run the handler again. Only for handlers whose
    /// effects roll back with the claim (same-transaction mode) or that the downstream system
    /// refuses by fence: otherwise a crash after the effect runs it twice.
    Reexecute,
    /// Mark it unknown. While the attempt may still be running, retries are told it is in
    /// flight; then a status probe (if the engine has one) settles it from what the
    /// downstream system did, the holder may still complete it, and otherwise retries get
    /// "outcome unknown" until it is resolved.
    #[default]
    Hold,
}

/// A final response kept for replay: status, headers, body and trailers.
///
/// Carriers give `status` their own meaning (HTTP status, gRPC code, or 0 for plain
/// functions). Trailers are the fields sent after the body (HTTP trailers; for gRPC,
/// `grpc-status`, `grpc-message` and `grpc-status-details-bin`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// Status code.
    pub status: u16,
    /// Headers in order; names are lower case.
    pub headers: Vec<(String, Bytes)>,
    /// Body bytes.
    pub body: Bytes,
    /// Trailers in order; names are lower case.
    pub trailers: Vec<(String, Bytes)>,
    /// True when the body was larger than the store cap and was not kept. A replay must
    /// answer a documented error instead of re-running.
    pub body_omitted: bool,
}

impl StoredResponse {
    /// The same response in exact-size buffers of its own.
    ///
    /// A body is often a slice of a much larger buffer (an HTTP client's read buffer): kept
    /// as it is in memory, every record would pin that whole buffer. Stores that keep
    /// responses in process memory keep this copy instead.
    #[must_use]
    pub fn compacted(&self) -> Self {
        Self {
            status: self.status,
            headers: self
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), Bytes::copy_from_slice(value)))
                .collect(),
            body: Bytes::copy_from_slice(&self.body),
            trailers: self
                .trailers
                .iter()
                .map(|(name, value)| (name.clone(), Bytes::copy_from_slice(value)))
                .collect(),
            body_omitted: self.body_omitted,
        }
    }

    /// A response with a status and body and no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            trailers: Vec::new(),
            body_omitted: false,
        }
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds a trailer.
    #[must_use]
    pub fn with_trailer(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.trailers.push((name.into(), value.into()));
        self
    }

    /// Bytes taken by headers, body and trailers: what a store cap is checked against.
    pub fn size(&self) -> usize {
        let fields =
            |list: &[(String, Bytes)]| list.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
        self.body.len() + fields(&self.headers) + fields(&self.trailers)
    }

    /// Compact binary encoding shared by every store.
    ///
    /// Version 2: version byte, status, omitted flag, headers, body, trailers. Version 1
    /// (the same without trailers) is still read, so records written before trailers were
    /// kept replay unchanged.
    pub fn encode(&self) -> Vec<u8> {
        let fields = self.headers.len() + self.trailers.len();
        let mut out = Vec::with_capacity(20 + self.size() + fields * 8);
        out.push(CODEC_VERSION);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.push(u8::from(self.body_omitted));
        put_fields(&mut out, &self.headers);
        put_bytes(&mut out, &self.body);
        put_fields(&mut out, &self.trailers);
        out
    }

    /// Reads the encoding written by [`StoredResponse::encode`].
    ///
    /// # Errors
    /// [`CodecError`] on truncated or foreign input.
    pub fn decode(raw: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader { raw, at: 0 };
        let version = r.take(1)?[0];
        if version != CODEC_VERSION && version != CODEC_VERSION_NO_TRAILERS {
            return Err(CodecError("unknown response encoding version"));
        }
        let status = u16::from_be_bytes(r.array()?);
        let body_omitted = r.take(1)?[0] != 0;
        let headers = r.fields()?;
        let body = Bytes::copy_from_slice(r.bytes()?);
        let trailers = if version == CODEC_VERSION {
            r.fields()?
        } else {
            Vec::new()
        };
        if r.at != raw.len() {
            return Err(CodecError("trailing bytes after response"));
        }
        Ok(Self {
            status,
            headers,
            body,
            trailers,
            body_omitted,
        })
    }
}

const CODEC_VERSION: u8 = 2;
const CODEC_VERSION_NO_TRAILERS: u8 = 1;

fn put_fields(out: &mut Vec<u8>, fields: &[(String, Bytes)]) {
    out.extend_from_slice(&(fields.len() as u32).to_be_bytes());
    for (name, value) in fields {
        put_bytes(out, name.as_bytes());
        put_bytes(out, value);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.raw.len())
            .ok_or(CodecError("truncated response"))?;
        let out = &self.raw[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        self.take(len)
    }

    fn fields(&mut self) -> Result<Vec<(String, Bytes)>, CodecError> {
        let count = u32::from_be_bytes(self.array()?) as usize;
        let mut fields = Vec::with_capacity(count.min(256));
        for _ in 0..count {
            let name = String::from_utf8(self.bytes()?.to_vec())
                .map_err(|_| CodecError("field name is not UTF-8"))?;
            let value = Bytes::copy_from_slice(self.bytes()?);
            fields.push((name, value));
        }
        Ok(fields)
    }
}

/// A stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("codec: {0}")]
pub struct CodecError(pub &'static str);

/// The state of a record that exists. Absent records are `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// A holder is running the handler.
    Processing {
        /// The holder.
        owner: OwnerId,
        /// When its lease runs out (store clock).
        lease_until: Timestamp,
    },
    /// The handler finished and its response is kept until the record expires.
    Completed {
        /// The final response.
        response: StoredResponse,
        /// When it completed.
        completed_at: Timestamp,
    },
    /// The outcome is ambiguous; waits for its holder (which may still complete it), a status
    /// probe, a reconciler or an operator.
    Unknown {
        /// When it became unknown.
        since: Timestamp,
        /// The holder whose attempt became unknown, if the store still knows it. That holder,
        /// with the record's fence, may still complete or release it: a holder paused past its
        /// lease that comes back finishes its own work.
        owner: Option<OwnerId>,
    },
}

/// The state names, for filters and status answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StateKind {
    /// See [`RecordState::Processing`].
    Processing,
    /// See [`RecordState::Completed`].
    Completed,
    /// See [`RecordState::Unknown`].
    Unknown,
}

impl StateKind {
    /// Lower-case name as used in APIs and problem bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Unknown => "unknown",
        }
    }
}

impl RecordState {
    /// The state's name.
    pub fn kind(&self) -> StateKind {
        match self {
            Self::Processing { .. } => StateKind::Processing,
            Self::Completed { .. } => StateKind::Completed,
            Self::Unknown { .. } => StateKind::Unknown,
        }
    }
}

/// One record per scoped key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Which key.
    pub key: ScopedKey,
    /// Fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// Fence of the latest claim.
    pub fence: u64,
    /// Request id (trace id) of the latest claim, for operators.
    pub request_id: Option<String>,
    /// When the current attempt claimed the key: the first claim, or the latest takeover.
    /// The attempt's age (store clock) tells whether it may still be running.
    pub created_at: Timestamp,
    /// When the record goes away (store clock).
    pub expires_at: Timestamp,
    /// Its state.
    pub state: RecordState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_codec_round_trips_and_rejects_garbage() {
        let r = StoredResponse::new(201, "body").with_header("content-type", "application/json");
        let enc = r.encode();
        assert_eq!(StoredResponse::decode(&enc), Ok(r));
        assert!(StoredResponse::decode(&enc[..enc.len() - 1]).is_err());
        assert!(StoredResponse::decode(b"").is_err());
        assert!(StoredResponse::decode(&[1, 0, 200, 0, 255, 255, 255, 255]).is_err());
    }

    #[test]
    fn trailers_round_trip_and_version_one_records_still_decode() {
        let r = StoredResponse::new(200, "msg")
            .with_header("content-type", "application/grpc")
            .with_trailer("grpc-status", "5")
            .with_trailer("grpc-message", "not found");
        assert_eq!(StoredResponse::decode(&r.encode()), Ok(r.clone()));
        assert_eq!(r.size(), 3 + 28 + 11 + 1 + 12 + 9);

        // A version-1 encoding: status 201, no headers, body "ok", no trailer section.
        let v1 = [1, 0, 201, 0, 0, 0, 0, 0, 0, 0, 0, 2, b'o', b'k'];
        assert_eq!(
            StoredResponse::decode(&v1),
            Ok(StoredResponse::new(201, "ok"))
        );
        // The same bytes labelled version 2 lack the trailer count.
        let mut v2 = v1;
        v2[0] = 2;
        assert!(StoredResponse::decode(&v2).is_err());
    }

    #[test]
    fn durations_round_up_to_milliseconds() {
        assert_eq!(duration_ms(Duration::from_micros(1)), 1);
        assert_eq!(duration_ms(Duration::from_millis(5)), 5);
        assert_eq!(Timestamp(10).plus(Duration::from_millis(5)), Timestamp(15));
        assert_eq!(Timestamp(10).since(Timestamp(20)), Duration::ZERO);
    }
}
