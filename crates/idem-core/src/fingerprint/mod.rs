//! Versioned request fingerprints and canonical JSON.
//!
//! A fingerprint is a blake3 digest of what a request asks for, tagged with a version so a
//! change in what is hashed is explicit. The same key with a different fingerprint is a client
//! error (mismatch), never a replay. Fingerprints compare exactly, version included: bump the
//! version only together with a new namespace, or accept mismatches for records written before.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

mod json;
mod number;
mod stream;
#[cfg(test)]
mod tests;

use json::canonical_via_value;
pub use json::{
    JsonFields, canonical_json, canonical_json_filtered, canonical_json_tree, validate_json,
};
pub(crate) use number::write_exact;

/// A versioned request digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    version: u16,
    digest: [u8; 32],
}

/// Length of [`Fingerprint::to_bytes`].
pub const FINGERPRINT_LEN: usize = 34;

/// Why a fingerprint or a JSON body could not be processed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The body was not valid JSON.
    #[error("body is not valid JSON: {0}")]
    Json(String),
    /// A JSON object names the same member twice: parsers disagree on which one counts (the
    /// first, the last, an error), so the body could mean two things to two readers.
    #[error("body is ambiguous JSON: the member {0:?} appears twice in one object")]
    DuplicateMember(String),
    /// A stored or transmitted fingerprint did not parse.
    #[error("malformed fingerprint")]
    Malformed,
}

impl Fingerprint {
    /// Starts a fingerprint of the given version.
    pub fn builder(version: u16) -> FingerprintBuilder {
        let mut buf = SPARE_BUFFER.take();
        buf.clear();
        buf.reserve(256);
        buf.extend_from_slice(b"idem.fingerprint");
        buf.extend_from_slice(&version.to_le_bytes());
        FingerprintBuilder {
            version,
            buf,
            hasher: None,
        }
    }

    /// Fingerprint of raw bytes under version `version`.
    pub fn of_bytes(version: u16, bytes: &[u8]) -> Self {
        Self::builder(version).part("bytes", bytes).finish()
    }

    /// Fingerprint of method, route and raw body bytes.
    pub fn http_raw(version: u16, method: &str, route: &str, body: &[u8]) -> Self {
        Self::builder(version)
            .part("method", method.as_bytes())
            .part("route", route.as_bytes())
            .part("body", body)
            .finish()
    }

    /// Fingerprint of method, route and the canonical form of a JSON body, so key order and
    /// whitespace do not change it.
    ///
    /// # Errors
    /// [`FingerprintError::Json`] if the body is not JSON, [`FingerprintError::DuplicateMember`]
    /// if it could mean two things.
    pub fn http_json(
        version: u16,
        method: &str,
        route: &str,
        body: &[u8],
        fields: &JsonFields,
    ) -> Result<Self, FingerprintError> {
        let mut builder = Self::builder(version)
            .part("method", method.as_bytes())
            .part("route", route.as_bytes());
        if !fields.is_all() {
            let canonical = canonical_via_value(body, fields)?;
            return Ok(builder.part("json", &canonical).finish());
        }
        // The canonical text goes straight into the hashed buffer: no copy, no tree.
        builder.write_header("json");
        let len_at = builder.buf.len();
        builder.buf.extend_from_slice(&[0; 8]);
        stream::canonicalize(body, &mut builder.buf)?;
        let len = (builder.buf.len() - len_at - 8) as u64;
        builder.buf[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
        Ok(builder.finish())
    }

    /// The version this fingerprint was made under.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The 32-byte digest.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// A compact binary form: version (2 bytes, little endian) then the digest.
    pub fn to_bytes(&self) -> [u8; FINGERPRINT_LEN] {
        let mut out = [0u8; FINGERPRINT_LEN];
        out[..2].copy_from_slice(&self.version.to_le_bytes());
        out[2..].copy_from_slice(&self.digest);
        out
    }

    /// Reads the form written by [`Fingerprint::to_bytes`].
    ///
    /// # Errors
    /// [`FingerprintError::Malformed`] on a wrong length.
    pub fn from_bytes(raw: &[u8]) -> Result<Self, FingerprintError> {
        if raw.len() != FINGERPRINT_LEN {
            return Err(FingerprintError::Malformed);
        }
        let version = u16::from_le_bytes([raw[0], raw[1]]);
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&raw[2..]);
        Ok(Self { version, digest })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}:{}", self.version, hex::encode(self.digest))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = FingerprintError;
    fn from_str(s: &str) -> Result<Self, FingerprintError> {
        let rest = s.strip_prefix('v').ok_or(FingerprintError::Malformed)?;
        let (version, digest_hex) = rest.split_once(':').ok_or(FingerprintError::Malformed)?;
        let version = version.parse().map_err(|_| FingerprintError::Malformed)?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(digest_hex, &mut digest).map_err(|_| FingerprintError::Malformed)?;
        Ok(Self { version, digest })
    }
}

/// Accumulates named parts into a fingerprint. Parts are length-prefixed, so moving bytes
/// from one part to the next changes the digest.
///
/// Small parts are gathered in a buffer and hashed in one call at the end (blake3's per-call
/// overhead dominates for the short parts of a typical request); a part larger than the
/// buffer goes through an incremental hasher. The digest is the same either way.
#[derive(Debug, Clone)]
pub struct FingerprintBuilder {
    version: u16,
    buf: Vec<u8>,
    hasher: Option<Box<blake3::Hasher>>,
}

/// Parts are buffered while the buffer stays under this size.
const BUFFERED: usize = 4096;

thread_local! {
    /// The buffer of this thread's last finished builder, reused by its next one: a
    /// fingerprint per request then costs no allocation.
    static SPARE_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

impl FingerprintBuilder {
    /// Adds one named part.
    #[must_use]
    pub fn part(mut self, name: &str, value: &[u8]) -> Self {
        self.write_header(name);
        self.buf
            .extend_from_slice(&(value.len() as u64).to_le_bytes());
        if self.buf.len() + value.len() <= BUFFERED {
            self.buf.extend_from_slice(value);
        } else {
            let hasher = self.hasher.get_or_insert_with(Default::default);
            hasher.update(&self.buf);
            hasher.update(value);
            self.buf.clear();
        }
        self
    }

    /// The length-prefixed name that starts a part.
    fn write_header(&mut self, name: &str) {
        self.buf
            .extend_from_slice(&(name.len() as u64).to_le_bytes());
        self.buf.extend_from_slice(name.as_bytes());
    }

    /// The finished fingerprint.
    pub fn finish(self) -> Fingerprint {
        let digest = match self.hasher {
            None => blake3::hash(&self.buf),
            Some(mut hasher) => {
                hasher.update(&self.buf);
                hasher.finalize()
            }
        };
        if self.buf.capacity() <= 2 * BUFFERED {
            SPARE_BUFFER.set(self.buf);
        }
        Fingerprint {
            version: self.version,
            digest: *digest.as_bytes(),
        }
    }
}
