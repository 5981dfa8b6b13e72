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
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        String::from_utf8(canonical_json(s.as_bytes()).expect("json")).expect("utf8")
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        assert_eq!(
            canon(r#"{"b":1,"a":[1, 2,{"d":1,"c":2}]}"#),
            r#"{"a":[1,2,{"c":2,"d":1}],"b":1}"#
        );
        assert_eq!(canon(" {\n\"a\" : 1.0 } "), r#"{"a":1}"#);
        assert_eq!(canon(r#"{"a":1.5}"#), canon(r#"{"a":15e-1}"#));
        assert_ne!(canon(r#"{"a":"1"}"#), canon(r#"{"a":1}"#));
    }

    #[test]
    fn invalid_json_is_an_error() {
        assert!(matches!(
            canonical_json(b"{"),
            Err(FingerprintError::Json(_))
        ));
    }

    #[test]
    fn include_and_exclude() {
        let body = br#"{"amount":10,"meta":{"ts":1,"id":2},"note":"x"}"#;
        let only = JsonFields::all().include(["amount", "meta.id"]);
        let got = canonical_json_filtered(body, &only).expect("json");
        assert_eq!(got, br#"{"amount":10,"meta":{"id":2}}"#);
        let without = JsonFields::all().exclude(["meta.ts", "note"]);
        let got = canonical_json_filtered(body, &without).expect("json");
        assert_eq!(got, br#"{"amount":10,"meta":{"id":2}}"#);
    }

    #[test]
    fn fingerprints_round_trip_and_separate_parts() {
        let a = Fingerprint::http_raw(1, "POST", "/a", b"xy");
        let b = Fingerprint::http_raw(1, "POST", "/ax", b"y");
        assert_ne!(a, b);
        assert_ne!(a, Fingerprint::http_raw(2, "POST", "/a", b"xy"));
        assert_eq!(Fingerprint::from_bytes(&a.to_bytes()), Ok(a));
        assert_eq!(a.to_string().parse::<Fingerprint>(), Ok(a));
        assert!("v1:zz".parse::<Fingerprint>().is_err());
    }

    /// The one-pass path and the tree path agree: both refuse, or both write the same bytes.
    fn same_as_tree(body: &[u8]) {
        let fast = canonical_json(body);
        let tree = canonical_json_tree(body);
        match (&fast, &tree) {
            (Ok(a), Ok(b)) => assert_eq!(
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b),
                "input {:?}",
                String::from_utf8_lossy(body)
            ),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "paths disagree on {:?}: one-pass {fast:?}, tree {tree:?}",
                String::from_utf8_lossy(body)
            ),
        }
    }

    #[test]
    fn one_pass_matches_the_tree_on_edge_cases() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let deep_obj = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
        let cases: Vec<Vec<u8>> = [
            "",
            " ",
            "{",
            "}",
            "[",
            "]",
            "[,]",
            "[1,]",
            "{\"a\":1,}",
            "{,}",
            "{\"a\"}",
            "{\"a\":}",
            "{1:2}",
            "nul",
            "nulls",
            "truex",
            "false",
            "null",
            " true ",
            "\u{feff}{}",
            "0",
            "-0",
            "-0.0",
            "00",
            "01",
            "-",
            "-a",
            "1.",
            ".5",
            "1e",
            "1e+",
            "1E-2",
            "1.5e3",
            "1e400",
            "-1e400",
            "1e-400",
            "123456789012345678",
            "1234567890123456789",
            "-123456789012345678",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "123456789012345678901234567890",
            "4.0",
            "4.5",
            "0.1",
            "1e2",
            "9007199254740993",
            "9007199254740993.0",
            "2.5e-8",
            r#""a""#,
            r#""\u0061""#,
            r#""\/""#,
            r#""\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\udc00x""#,
            r#""\x""#,
            r#""\"#,
            "\"a\u{1}\"",
            "\"tab\there\"",
            "\"\u{7f}\"",
            r#""\u0000""#,
            r#""é""#,
            r#""\u00e9""#,
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"\u0061":2}"#,
            r#"{"b":{"d":[3,{"z":0,"y":1}],"c":null},"a":[true,false]}"#,
            r#"{"a":1,"b":2,"a":3,"c":{"x":1,"x":{"q":2}}}"#,
            r#"{"é":1,"e":2,"f":3}"#,
            "[1, 2 ,3\n,\t4\r]",
            "{ \"k\" : [ ] , \"j\" : { } }",
            "[1 2]",
            "[\"a\" \"b\"]",
            "{\"a\":1 \"b\":2}",
            "[1]x",
            "[1] [2]",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([
            deep(126).into_bytes(),
            deep(127).into_bytes(),
            deep(128).into_bytes(),
            deep_obj(127).into_bytes(),
            deep_obj(128).into_bytes(),
            b"\"\xff\"".to_vec(),
            b"{\"\xc3\":1}".to_vec(),
            b"[\"ok\",\xe2\x82]".to_vec(),
        ])
        .collect();
        for case in &cases {
            same_as_tree(case);
        }
        assert_eq!(canon(r#"{"a":1,"\u0061":2}"#), r#"{"a":2}"#);
        assert_eq!(canon(r#"{"b":1,"a":2,"b":3}"#), r#"{"a":2,"b":3}"#);
        assert!(canonical_json(deep(127).as_bytes()).is_ok());
        assert!(canonical_json(deep(128).as_bytes()).is_err());
    }

    #[test]
    fn the_builder_hashes_what_it_always_hashed() {
        // The digest is blake3 over: tag, version, then each part as (len, name, len, value).
        let big = vec![7u8; 10_000];
        for value in [&b"small"[..], &big[..]] {
            let mut h = blake3::Hasher::new();
            h.update(b"idem.fingerprint");
            h.update(&3u16.to_le_bytes());
            for piece in [&b"first"[..], b"x", b"second", value] {
                h.update(&(piece.len() as u64).to_le_bytes());
                h.update(piece);
            }
            let fp = Fingerprint::builder(3)
                .part("first", b"x")
                .part("second", value)
                .finish();
            assert_eq!(fp.digest(), h.finalize().as_bytes());
        }
        // The one-pass JSON part is the same part the tree path would add.
        let body = br#"{"z": [1, 2.50], "a": "x"}"#;
        let tree = canonical_json_tree(body).expect("json");
        let expected = Fingerprint::builder(1)
            .part("method", b"POST")
            .part("route", b"/r")
            .part("json", &tree)
            .finish();
        let got = Fingerprint::http_json(1, "POST", "/r", body, &JsonFields::all()).expect("json");
        assert_eq!(got, expected);
    }

    mod differential {
        use proptest::prelude::*;
        use serde_json::Value;

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(Value::from),
                "\\PC{0,8}".prop_map(Value::String),
                "[a-c\"\\\\\u{1}\u{e9}]{0,4}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    prop::collection::vec(("[a-d]{0,2}", inner), 0..5)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// Writes `v` with random whitespace, member order, duplicated members and
        /// number spellings (`1.0`, `10e-1`) that mean the same.
        fn spell(v: &Value, noise: &mut impl Iterator<Item = u8>, out: &mut String) {
            let ws = |out: &mut String, n: &mut dyn Iterator<Item = u8>| match n.next().unwrap_or(0)
                % 6
            {
                0 => out.push(' '),
                1 => out.push_str("\n\t"),
                _ => {}
            };
            match v {
                Value::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        ws(out, noise);
                        spell(item, noise, out);
                        ws(out, noise);
                    }
                    out.push(']');
                }
                Value::Object(map) => {
                    let mut members: Vec<_> = map.iter().collect();
                    if noise.next().unwrap_or(0).is_multiple_of(2) {
                        members.reverse();
                    }
                    out.push('{');
                    let mut first = true;
                    for (name, item) in members {
                        // Sometimes an earlier duplicate that the later one overrides.
                        let dup = noise.next().unwrap_or(0).is_multiple_of(5);
                        for value in [dup.then_some(&Value::Null), Some(item)]
                            .into_iter()
                            .flatten()
                        {
                            if !first {
                                out.push(',');
                            }
                            first = false;
                            ws(out, noise);
                            out.push_str(&serde_json::to_string(name).unwrap_or_default());
                            ws(out, noise);
                            out.push(':');
                            spell(value, noise, out);
                        }
                    }
                    out.push('}');
                }
                Value::Number(n) if n.as_i64().is_some_and(|i| i.abs() < 1000) => {
                    let i = n.as_i64().unwrap_or(0);
                    match noise.next().unwrap_or(0) % 3 {
                        0 => out.push_str(&format!("{i}.0")),
                        1 => out.push_str(&format!("{}e-1", i * 10)),
                        _ => out.push_str(&i.to_string()),
                    }
                }
                other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn respelled_documents_agree(v in json(), noise in prop::collection::vec(any::<u8>(), 64)) {
                let mut text = String::new();
                spell(&v, &mut noise.iter().copied().cycle(), &mut text);
                super::same_as_tree(text.as_bytes());
                // Every spelling of the same document has the same canonical form.
                let plain = serde_json::to_vec(&v).unwrap_or_default();
                prop_assert_eq!(
                    super::canonical_json(text.as_bytes()).ok(),
                    super::canonical_json(&plain).ok()
                );
            }

            #[test]
            fn damaged_documents_agree(
                v in json(),
                cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            ) {
                let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
                for (at, byte) in cuts {
                    if bytes.is_empty() { break; }
                    let i = at.index(bytes.len());
                    match byte % 3 {
                        0 => bytes[i] = byte,
                        1 => { bytes.truncate(i); }
                        _ => bytes.insert(i, b"{}[],:\"\\-.eE0 "[usize::from(byte) % 14]),
                    }
                }
                super::same_as_tree(&bytes);
            }
        }
    }
}
