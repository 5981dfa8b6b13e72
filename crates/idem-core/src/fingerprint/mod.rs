//! Versioned request fingerprints and canonical JSON.
//!
//! A fingerprint is a blake3 digest of what a request asks for, tagged with a version so a
//! change in what is hashed is explicit. The same key with a different fingerprint is a client
//! error (mismatch), never a replay. Fingerprints compare exactly, version included: bump the
//! version only together with a new namespace, or accept mismatches for records written before.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;
use thiserror::Error;

use crate::key::hex;

mod stream;

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
    /// [`FingerprintError::Json`] if the body is not JSON.
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
        write!(f, "v{}:{}", self.version, hex(&self.digest))
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
        if digest_hex.len() != 64 || !digest_hex.is_ascii() {
            return Err(FingerprintError::Malformed);
        }
        let mut digest = [0u8; 32];
        for (i, byte) in digest.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digest_hex[i * 2..i * 2 + 2], 16)
                .map_err(|_| FingerprintError::Malformed)?;
        }
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

/// Which JSON fields take part in a fingerprint. Paths are dot-separated object member names
/// (`metadata.client_time`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonFields {
    include: Vec<Vec<String>>,
    exclude: Vec<Vec<String>>,
}

impl JsonFields {
    /// Every field counts.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only these paths count (an empty list means all).
    #[must_use]
    pub fn include<I: IntoIterator<Item = S>, S: AsRef<str>>(mut self, paths: I) -> Self {
        self.include = paths.into_iter().map(|p| split_path(p.as_ref())).collect();
        self
    }

    /// These paths never count, for example a client timestamp.
    #[must_use]
    pub fn exclude<I: IntoIterator<Item = S>, S: AsRef<str>>(mut self, paths: I) -> Self {
        self.exclude = paths.into_iter().map(|p| split_path(p.as_ref())).collect();
        self
    }

    fn is_all(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

fn split_path(path: &str) -> Vec<String> {
    path.split('.').map(str::to_owned).collect()
}

/// The canonical form of a JSON document: object members sorted by name, no whitespace,
/// integral numbers written as integers and other numbers in their shortest round-trip form
/// (so `1.0` and `1` agree, as in RFC 8785).
///
/// # Errors
/// [`FingerprintError::Json`] if `body` is not JSON.
pub fn canonical_json(body: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    canonical_json_filtered(body, &JsonFields::all())
}

/// [`canonical_json`] after applying an include/exclude field selection.
///
/// # Errors
/// [`FingerprintError::Json`] if `body` is not JSON.
pub fn canonical_json_filtered(
    body: &[u8],
    fields: &JsonFields,
) -> Result<Vec<u8>, FingerprintError> {
    if !fields.is_all() {
        return canonical_via_value(body, fields);
    }
    let mut out = Vec::with_capacity(body.len());
    stream::canonicalize(body, &mut out)?;
    Ok(out)
}

/// [`canonical_json`] through a serde_json tree: the reference the one-pass path is tested
/// against (and the path for field selections). Not part of the API.
#[doc(hidden)]
pub fn canonical_json_tree(body: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    canonical_via_value(body, &JsonFields::all())
}

fn canonical_via_value(body: &[u8], fields: &JsonFields) -> Result<Vec<u8>, FingerprintError> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|e| FingerprintError::Json(e.to_string()))?;
    if !fields.is_all() {
        if !fields.include.is_empty() {
            value = keep_paths(&value, &fields.include);
        }
        for path in &fields.exclude {
            remove_path(&mut value, path);
        }
    }
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out);
    Ok(out)
}

fn keep_paths(value: &Value, paths: &[Vec<String>]) -> Value {
    let mut kept = serde_json::Map::new();
    if let Value::Object(map) = value {
        for path in paths {
            let Some((head, rest)) = path.split_first() else {
                continue;
            };
            let Some(child) = map.get(head) else { continue };
            let picked = if rest.is_empty() {
                child.clone()
            } else {
                keep_paths(child, &[rest.to_vec()])
            };
            match (kept.get_mut(head), picked) {
                (Some(Value::Object(existing)), Value::Object(more)) => existing.extend(more),
                (_, picked) => {
                    kept.insert(head.clone(), picked);
                }
            }
        }
    }
    Value::Object(kept)
}

fn remove_path(value: &mut Value, path: &[String]) {
    let Value::Object(map) = value else { return };
    match path {
        [] => {}
        [last] => {
            map.remove(last);
        }
        [head, rest @ ..] => {
            if let Some(child) = map.get_mut(head) {
                remove_path(child, rest);
            }
        }
    }
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
    }
}

// Writing into a `Vec<u8>` cannot fail, so the `io::Result`s below are dropped; going through
// `io::Write` avoids one temporary allocation per number and per string (a hot path: every
// protected request is fingerprinted).
fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    use std::io::Write;
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        // Integral floats within the exact range print as integers, so 1.0 == 1.
        if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
            let _ = write!(out, "{}", f as i64);
        } else {
            let _ = write!(out, "{f:e}");
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is already minimal and deterministic.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests;
