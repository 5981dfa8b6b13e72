//! Canonical JSON: one spelling per JSON value (sorted members, no insignificant whitespace,
//! one number form), optionally narrowed to selected fields, so two spellings of one request
//! fingerprint alike.

use serde_json::Value;

use super::FingerprintError;

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

    pub(super) fn is_all(&self) -> bool {
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
    super::stream::canonicalize(body, &mut out)?;
    Ok(out)
}

/// [`canonical_json`] through a serde_json tree: the reference the one-pass path is tested
/// against (and the path for field selections). Not part of the API.
#[doc(hidden)]
pub fn canonical_json_tree(body: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    canonical_via_value(body, &JsonFields::all())
}

pub(super) fn canonical_via_value(
    body: &[u8],
    fields: &JsonFields,
) -> Result<Vec<u8>, FingerprintError> {
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
pub(super) fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
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

pub(super) fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is already minimal and deterministic.
    let _ = serde_json::to_writer(&mut *out, s);
}
