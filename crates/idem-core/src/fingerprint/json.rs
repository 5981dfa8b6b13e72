//! Canonical JSON: one spelling per JSON value (sorted members, no insignificant whitespace,
//! one number form), optionally narrowed to selected fields, so two spellings of one request
//! fingerprint alike.

use serde_json::value::RawValue;

use super::FingerprintError;
use super::stream::MAX_DEPTH;

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
/// numbers in one exact decimal form (so `1.0` and `1` agree, and two numbers agree only if
/// they are the same decimal value; no float rounding).
///
/// # Errors
/// [`FingerprintError::Json`] if `body` is not JSON; [`FingerprintError::DuplicateMember`]
/// if an object names a member twice (parsers disagree on which one counts).
pub fn canonical_json(body: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    canonical_json_filtered(body, &JsonFields::all())
}

/// Checks that `body` is JSON that means one thing: valid, and no object naming a member
/// twice. A reader of single fields (a business key) calls this before trusting a parser
/// that silently keeps one of the duplicates.
///
/// # Errors
/// As [`canonical_json`].
pub fn validate_json(body: &[u8]) -> Result<(), FingerprintError> {
    let mut scratch = Vec::with_capacity(body.len());
    super::stream::canonicalize(body, &mut scratch)
}

/// [`canonical_json`] after applying an include/exclude field selection.
///
/// # Errors
/// As [`canonical_json`].
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

/// [`canonical_json`] through a tree parsed by serde_json (numbers and duplicate names
/// checked on the way): the reference the one-pass path is tested against. Not part of the
/// API.
///
/// # Errors
/// As [`canonical_json`].
#[doc(hidden)]
pub fn canonical_json_tree(body: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    let text = std::str::from_utf8(body).map_err(|e| FingerprintError::Json(e.to_string()))?;
    let raw: &RawValue = serde_json::from_str(text).map_err(json_error)?;
    let node = Node::from_raw(raw.get(), 0)?;
    let mut out = Vec::with_capacity(body.len());
    node.write(&mut out);
    Ok(out)
}

/// A field selection: the one-pass canonical form (which validates the body, refuses
/// duplicate names and writes exact numbers), read back as a tree, narrowed, written again.
pub(super) fn canonical_via_value(
    body: &[u8],
    fields: &JsonFields,
) -> Result<Vec<u8>, FingerprintError> {
    let mut canonical = Vec::with_capacity(body.len());
    super::stream::canonicalize(body, &mut canonical)?;
    if fields.is_all() {
        return Ok(canonical);
    }
    let mut value = Node::from_canonical(&canonical, &mut 0)?;
    if !fields.include.is_empty() {
        value = keep_paths(&value, &fields.include);
    }
    for path in &fields.exclude {
        remove_path(&mut value, path);
    }
    let mut out = Vec::with_capacity(canonical.len());
    value.write(&mut out);
    Ok(out)
}

fn json_error(e: serde_json::Error) -> FingerprintError {
    FingerprintError::Json(e.to_string())
}

/// A JSON value whose scalars are already in canonical text.
#[derive(Debug, Clone)]
enum Node {
    /// `null`, `true`, `false`, a number or a string, as canonical text.
    Scalar(Vec<u8>),
    Array(Vec<Node>),
    /// Members sorted by name; no name twice.
    Object(Vec<(String, Node)>),
}

/// An object's members as serde_json reads them, values left as raw text.
struct RawMembers<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for RawMembers<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = RawMembers<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(RawMembers(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

impl Node {
    /// Parses a raw serde_json value; `depth` brackets are open around it.
    fn from_raw(raw: &str, depth: usize) -> Result<Self, FingerprintError> {
        let raw = raw.trim_matches([' ', '\n', '\t', '\r']);
        let too_deep = || FingerprintError::Json("nesting too deep".to_owned());
        match raw.as_bytes().first() {
            Some(b'{') => {
                if depth + 1 > MAX_DEPTH {
                    return Err(too_deep());
                }
                let RawMembers(members) = serde_json::from_str(raw).map_err(json_error)?;
                let mut members = members
                    .into_iter()
                    .map(|(name, v)| Ok((name, Self::from_raw(v.get(), depth + 1)?)))
                    .collect::<Result<Vec<_>, FingerprintError>>()?;
                Self::object(&mut members)?;
                Ok(Self::Object(members))
            }
            Some(b'[') => {
                if depth + 1 > MAX_DEPTH {
                    return Err(too_deep());
                }
                let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(json_error)?;
                let items = items
                    .into_iter()
                    .map(|v| Self::from_raw(v.get(), depth + 1))
                    .collect::<Result<_, _>>()?;
                Ok(Self::Array(items))
            }
            Some(b'"') => {
                let text: String = serde_json::from_str(raw).map_err(json_error)?;
                let mut out = Vec::new();
                write_string(&text, &mut out);
                Ok(Self::Scalar(out))
            }
            Some(b'-' | b'0'..=b'9') => {
                let mut out = Vec::new();
                super::number::write_exact(raw.as_bytes(), &mut out)?;
                Ok(Self::Scalar(out))
            }
            _ => {
                let literal: serde_json::Value = serde_json::from_str(raw).map_err(json_error)?;
                Ok(Self::Scalar(literal.to_string().into_bytes()))
            }
        }
    }

    /// Sorts an object's members by name and refuses a name given twice.
    fn object(members: &mut [(String, Node)]) -> Result<(), FingerprintError> {
        members.sort_by(|a, b| a.0.cmp(&b.0));
        match members.windows(2).find(|w| w[0].0 == w[1].0) {
            Some(w) => Err(FingerprintError::DuplicateMember(w[0].0.clone())),
            None => Ok(()),
        }
    }

    /// Reads back the one-pass canonical form (no whitespace, sorted unique members,
    /// canonical scalars) starting at `*pos`.
    fn from_canonical(text: &[u8], pos: &mut usize) -> Result<Self, FingerprintError> {
        let broken = || FingerprintError::Json("canonical form unreadable".to_owned());
        let at = |i: usize| text.get(i).copied().ok_or_else(broken);
        match at(*pos)? {
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                *pos += 1;
                let mut items = Vec::new();
                let mut members = Vec::new();
                if at(*pos)? == close {
                    *pos += 1;
                } else {
                    loop {
                        if open == b'{' {
                            let end = string_end(text, *pos).ok_or_else(broken)?;
                            let name: String =
                                serde_json::from_slice(&text[*pos..end]).map_err(json_error)?;
                            if at(end)? != b':' {
                                return Err(broken());
                            }
                            *pos = end + 1;
                            members.push((name, Self::from_canonical(text, pos)?));
                        } else {
                            items.push(Self::from_canonical(text, pos)?);
                        }
                        let next = at(*pos)?;
                        *pos += 1;
                        if next == close {
                            break;
                        }
                        if next != b',' {
                            return Err(broken());
                        }
                    }
                }
                Ok(if open == b'{' {
                    Self::Object(members)
                } else {
                    Self::Array(items)
                })
            }
            b'"' => {
                let end = string_end(text, *pos).ok_or_else(broken)?;
                let scalar = text[*pos..end].to_vec();
                *pos = end;
                Ok(Self::Scalar(scalar))
            }
            _ => {
                let len = text[*pos..]
                    .iter()
                    .position(|b| matches!(b, b',' | b']' | b'}'))
                    .unwrap_or(text.len() - *pos);
                let scalar = text[*pos..*pos + len].to_vec();
                *pos += len;
                Ok(Self::Scalar(scalar))
            }
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Scalar(text) => out.extend_from_slice(text),
            Self::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Self::Object(members) => {
                out.push(b'{');
                for (i, (name, item)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(name, out);
                    out.push(b':');
                    item.write(out);
                }
                out.push(b'}');
            }
        }
    }

    fn get(&self, name: &str) -> Option<&Node> {
        match self {
            Self::Object(members) => members.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// The index just past the string that opens at `start` (which holds its `"`).
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match text.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

fn keep_paths(value: &Node, paths: &[Vec<String>]) -> Node {
    let mut kept: Vec<(String, Node)> = Vec::new();
    for path in paths {
        let Some((head, rest)) = path.split_first() else {
            continue;
        };
        let Some(child) = value.get(head) else {
            continue;
        };
        let picked = if rest.is_empty() {
            child.clone()
        } else {
            keep_paths(child, &[rest.to_vec()])
        };
        match (kept.iter_mut().find(|(n, _)| n == head), picked) {
            (Some((_, Node::Object(existing))), Node::Object(more)) => {
                for (name, item) in more {
                    match existing.iter_mut().find(|(n, _)| *n == name) {
                        Some(slot) => slot.1 = item,
                        None => existing.push((name, item)),
                    }
                }
                existing.sort_by(|a, b| a.0.cmp(&b.0));
            }
            (Some(slot), picked) => slot.1 = picked,
            (None, picked) => kept.push((head.clone(), picked)),
        }
    }
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    Node::Object(kept)
}

fn remove_path(value: &mut Node, path: &[String]) {
    let Node::Object(members) = value else { return };
    match path {
        [] => {}
        [last] => members.retain(|(n, _)| n != last),
        [head, rest @ ..] => {
            if let Some((_, child)) = members.iter_mut().find(|(n, _)| n == head) {
                remove_path(child, rest);
            }
        }
    }
}

pub(super) fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is already minimal and deterministic.
    let _ = serde_json::to_writer(&mut *out, s);
}
