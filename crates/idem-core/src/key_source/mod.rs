//! Where a request's idempotency key comes from: a header the client sends, or the request
//! itself (a business key such as the order id plus the operation).
//!
//! One abstraction for every carrier: a [`KeySources`] list is tried in order and the first
//! source present gives the key (`header first, else the body's order.id`). A carrier shows
//! its request through [`KeyInputs`] (headers or metadata, the JSON body or payload, the
//! route's path parameters, the query).
//!
//! A value taken from the request becomes key text by one rule, so two different requests
//! never render to the same key: bytes outside printable ASCII (`!`..`~`), `%`, and in a
//! [`Template`] every byte of its literal text, are percent-escaped (`%XX`). `order 42` is
//! `order%2042`, and in `{path.id}:pay` an id holding `:` cannot imitate another one. A key
//! longer than 255 bytes after escaping is refused, never truncated or hashed, so the caller
//! learns which field is too long. A JSON number is read exactly: an integer is its digits,
//! and a number f64 cannot hold (`10000000000000000000001`, `0.1000000000000000000001`) the
//! exact decimal as written, from [`KeyInputs::json_bytes`].
//!
//! ```
//! use idem_core::key_source::{KeyInputs, KeySourceError, KeySources};
//! use serde_json::Value;
//!
//! struct Req {
//!     raw: Vec<u8>,
//!     body: Value,
//! }
//!
//! impl KeyInputs for Req {
//!     fn header(&self, _name: &str) -> Result<Option<&[u8]>, KeySourceError> {
//!         Ok(None)
//!     }
//!     fn json(&self) -> Option<&Value> {
//!         Some(&self.body)
//!     }
//!     fn json_bytes(&self) -> Option<&[u8]> {
//!         Some(&self.raw)
//!     }
//!     fn path_param(&self, _name: &str) -> Option<&str> {
//!         None
//!     }
//!     fn query(&self, _name: &str) -> Result<Option<&str>, KeySourceError> {
//!         Ok(None)
//!     }
//! }
//!
//! let sources = KeySources::parse(&["header:idempotency-key", "{json.order.id}:pay"])?;
//! let raw = br#"{"order": {"id": 42}, "amount": 100}"#.to_vec();
//! let req = Req { body: serde_json::from_slice(&raw).expect("JSON"), raw };
//! let found = sources.resolve(&req)?.expect("present");
//! assert_eq!(found.key.as_str(), "42:pay");
//!
//! // A number f64 cannot hold is read from the bytes as written.
//! let raw = br#"{"order": {"id": 10000000000000000000001}}"#.to_vec();
//! let req = Req { body: serde_json::from_slice(&raw).expect("JSON"), raw };
//! let found = sources.resolve(&req)?.expect("present");
//! assert_eq!(found.key.as_str(), "1.0000000000000000000001e22:pay");
//! # Ok::<(), KeySourceError>(())
//! ```

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;
use thiserror::Error;

use crate::key::{Key, MAX_KEY_LEN};

mod number;
mod template;
#[cfg(test)]
mod tests;

use template::Part;
pub use template::Template;

/// Why a key could not be taken from a request. Carriers answer 400 (or their equivalent),
/// naming the field; nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeySourceError {
    /// A source description that does not parse (configuration, not a request).
    #[error("key source `{0}`: {1}")]
    BadSource(String, &'static str),
    /// The field is present but is an object, an array or null.
    #[error("the key field `{0}` is not a string, number or boolean")]
    NotScalar(String),
    /// The field holds an empty value.
    #[error("the key field `{0}` is empty")]
    Empty(String),
    /// The field is present more than once, so which one is the key is ambiguous.
    #[error("the key field `{0}` is present more than once")]
    Repeated(String),
    /// The key would be longer than 255 bytes.
    #[error("the key from `{source_name}` is {len} bytes long after escaping; the limit is 255")]
    TooLong {
        /// The source that rendered it.
        source_name: String,
        /// Its length.
        len: usize,
    },
    /// A header holds something that is not one valid key (the carrier's reason).
    #[error("the key header `{0}` is not one valid key: {1}")]
    Header(String, String),
    /// The message holding the key field could not be read (the carrier's reason).
    #[error("the key field `{0}` cannot be read: {1}")]
    Unreadable(String, String),
    /// The field is a JSON number held as f64 (a fraction, an exponent, an integer beyond
    /// u64/i64) that cannot be checked against the body as written
    /// ([`KeyInputs::json_bytes`]), so its key text could stand for another number too.
    #[error(
        "the key field `{0}` is a number that cannot be read exactly here; send it as a string"
    )]
    InexactNumber(String),
}

/// One place a key can come from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A header (HTTP header, gRPC metadata entry, message header), parsed the way the
    /// carrier parses key headers.
    Header(String),
    /// A member of the JSON body or payload, by dot path (`order.id`).
    Json(FieldPath),
    /// A named parameter of the route's path (`id` in `/v1/orders/{id}/pay`).
    Path(String),
    /// A query parameter.
    Query(String),
    /// Fields joined with literal text: `{path.id}:pay`.
    Template(Template),
    /// A field of a binary protobuf message (a gRPC request), by field-number path:
    /// `proto:1.2` is field 2 of the message in field 1. The carrier reads it from the wire
    /// bytes ([`KeyInputs::proto_field`]).
    Proto(FieldNumbers),
}

/// A path of protobuf field numbers: `1.2` is field 2 of the message in field 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldNumbers {
    text: String,
    numbers: Vec<u32>,
}

/// Largest protobuf field number (2^29 - 1).
const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

impl FieldNumbers {
    /// Parses `1.2`: field numbers (1 to 2^29 - 1) joined by dots.
    ///
    /// # Errors
    /// [`KeySourceError::BadSource`] for anything else.
    pub fn parse(text: &str) -> Result<Self, KeySourceError> {
        let numbers: Option<Vec<u32>> = text
            .split('.')
            .map(|n| {
                n.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_FIELD_NUMBER).contains(n))
            })
            .collect();
        let numbers = numbers.ok_or_else(|| {
            KeySourceError::BadSource(
                text.into(),
                "a protobuf field path is field numbers (1 to 536870911) joined by dots",
            )
        })?;
        Ok(Self {
            text: text.to_owned(),
            numbers,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The field numbers, outermost first.
    pub fn numbers(&self) -> &[u32] {
        &self.numbers
    }
}

/// A dot path into a JSON document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    members: Vec<String>,
}

impl FieldPath {
    /// Parses `order.id`.
    ///
    /// # Errors
    /// [`KeySourceError::BadSource`] for an empty path or an empty member.
    pub fn parse(text: &str) -> Result<Self, KeySourceError> {
        let members: Vec<String> = text.split('.').map(str::to_owned).collect();
        if members.iter().any(String::is_empty) {
            return Err(KeySourceError::BadSource(
                text.into(),
                "a JSON path is member names joined by dots",
            ));
        }
        Ok(Self {
            text: text.to_owned(),
            members,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn find<'v>(&self, doc: &'v Value) -> Option<&'v Value> {
        self.members
            .iter()
            .try_fold(doc, |v, m| v.as_object()?.get(m))
    }
}

impl KeySource {
    /// Parses one source: `header:NAME`, `json:PATH`, `path:NAME`, `query:NAME`,
    /// `proto:FIELDS`, or a template (anything holding `{`).
    ///
    /// # Errors
    /// [`KeySourceError::BadSource`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, KeySourceError> {
        if text.contains('{') {
            return Template::parse(text).map(Self::Template);
        }
        let bad = || {
            KeySourceError::BadSource(
                text.to_owned(),
                "write header:NAME, json:PATH, path:NAME, query:NAME, proto:FIELDS or a template such as {path.id}:pay",
            )
        };
        let (kind, name) = text.split_once(':').ok_or_else(bad)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(bad());
        }
        Ok(match kind.trim() {
            "header" => Self::Header(name.to_ascii_lowercase()),
            "json" => Self::Json(FieldPath::parse(name)?),
            "path" => Self::Path(name.to_owned()),
            "query" => Self::Query(name.to_owned()),
            "proto" => Self::Proto(FieldNumbers::parse(name)?),
            _ => return Err(bad()),
        })
    }

    /// Whether this source reads the request body (so the carrier must buffer it first).
    pub fn needs_body(&self) -> bool {
        match self {
            Self::Json(_) | Self::Proto(_) => true,
            Self::Template(t) => t.needs_body(),
            _ => false,
        }
    }

    /// The path parameters this source names, for checking them against a route.
    pub fn path_params(&self) -> Vec<&str> {
        match self {
            Self::Path(name) => vec![name.as_str()],
            Self::Template(t) => t
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Field(KeySource::Path(name)) => Some(name.as_str()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header {name}"),
            Self::Json(path) => write!(f, "JSON field {}", path.as_str()),
            Self::Path(name) => write!(f, "path parameter {name}"),
            Self::Query(name) => write!(f, "query parameter {name}"),
            Self::Template(t) => write!(f, "template {}", t.as_str()),
            Self::Proto(fields) => write!(f, "protobuf field {}", fields.as_str()),
        }
    }
}

/// What a request shows key sources.
pub trait KeyInputs {
    /// The raw value of header (metadata entry, message header) `name`, `Ok(None)` when
    /// absent.
    ///
    /// # Errors
    /// [`KeySourceError::Repeated`] when it is present more than once.
    fn header(&self, name: &str) -> Result<Option<&[u8]>, KeySourceError>;

    /// The header `name` parsed as a key the way the carrier parses key headers (HTTP's
    /// accepts an RFC 8941 quoted string). The default takes the raw value as it is.
    ///
    /// # Errors
    /// [`KeySourceError::Header`] for a value that is not one valid key.
    fn header_key(&self, name: &str) -> Result<Option<Key>, KeySourceError> {
        match self.header(name)? {
            None => Ok(None),
            Some(raw) => Key::from_bytes(raw)
                .map(Some)
                .map_err(|e| KeySourceError::Header(name.to_owned(), e.to_string())),
        }
    }

    /// The JSON body or payload, when there is one and it parses.
    fn json(&self) -> Option<&Value>;

    /// The bytes [`json`](Self::json) was parsed from. A key number serde_json holds as f64
    /// (a fraction, an exponent, an integer beyond u64/i64) is read from them as written, so
    /// numbers f64 cannot tell apart still give different keys. The default has none, and
    /// such a number is refused ([`KeySourceError::InexactNumber`]); integers need no bytes.
    fn json_bytes(&self) -> Option<&[u8]> {
        None
    }

    /// The route's path parameter `name`.
    fn path_param(&self, name: &str) -> Option<&str>;

    /// Query parameter `name`, decoded; `Ok(None)` when absent.
    ///
    /// # Errors
    /// [`KeySourceError::Repeated`] when it is present more than once.
    fn query(&self, name: &str) -> Result<Option<&str>, KeySourceError>;

    /// The scalar at a protobuf field-number path of the request message, as text (a
    /// string's or bytes' contents; a number in decimal); `Ok(None)` when absent. Carriers
    /// without protobuf messages keep the default, which finds nothing.
    ///
    /// # Errors
    /// [`KeySourceError::Repeated`], [`KeySourceError::NotScalar`] or
    /// [`KeySourceError::Unreadable`] naming the field.
    fn proto_field(&self, _path: &FieldNumbers) -> Result<Option<Cow<'_, [u8]>>, KeySourceError> {
        Ok(None)
    }
}

/// A key and the source it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundKey {
    /// The key.
    pub key: Key,
    /// Which source of the list gave it.
    pub source: usize,
}

/// Key sources tried in order; the first one present gives the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySources(Vec<KeySource>);

impl Default for KeySources {
    /// The `Idempotency-Key` header alone.
    fn default() -> Self {
        Self(vec![KeySource::Header("idempotency-key".into())])
    }
}

impl KeySources {
    /// These sources, in order.
    ///
    /// # Errors
    /// [`KeySourceError::BadSource`] for an empty list.
    pub fn new(sources: Vec<KeySource>) -> Result<Self, KeySourceError> {
        if sources.is_empty() {
            return Err(KeySourceError::BadSource(
                String::new(),
                "give at least one key source",
            ));
        }
        Ok(Self(sources))
    }

    /// Parses each of `texts` with [`KeySource::parse`].
    ///
    /// # Errors
    /// The first source that does not parse, or an empty list.
    pub fn parse(texts: &[&str]) -> Result<Self, KeySourceError> {
        Self::new(
            texts
                .iter()
                .map(|t| KeySource::parse(t))
                .collect::<Result<_, _>>()?,
        )
    }

    /// The sources, in order.
    pub fn sources(&self) -> &[KeySource] {
        &self.0
    }

    /// Whether any source reads the request body.
    pub fn needs_body(&self) -> bool {
        self.0.iter().any(KeySource::needs_body)
    }

    /// The key from the first source present, `Ok(None)` when none is.
    ///
    /// # Errors
    /// A source that is present but unusable (see [`KeySourceError`]); later sources are not
    /// tried, so a bad value is never silently replaced by another.
    pub fn resolve(&self, inputs: &impl KeyInputs) -> Result<Option<FoundKey>, KeySourceError> {
        for (source, s) in self.0.iter().enumerate() {
            if let Some(key) = render(s, inputs)? {
                return Ok(Some(FoundKey { key, source }));
            }
        }
        Ok(None)
    }
}

impl fmt::Display for KeySources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", else ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

fn render(source: &KeySource, inputs: &impl KeyInputs) -> Result<Option<Key>, KeySourceError> {
    let name = || source.to_string();
    let text = match source {
        KeySource::Header(h) => return inputs.header_key(h),
        KeySource::Template(t) => {
            let mut out = String::new();
            for part in &t.parts {
                match part {
                    Part::Literal(l) => out.push_str(l),
                    Part::Field(field) => {
                        let Some(value) = value(field, inputs)? else {
                            return Ok(None);
                        };
                        escape_into(&value, &t.literal_bytes, &mut out);
                    }
                }
            }
            out
        }
        field => {
            let Some(value) = value(field, inputs)? else {
                return Ok(None);
            };
            let mut out = String::new();
            escape_into(&value, &[], &mut out);
            out
        }
    };
    if text.len() > MAX_KEY_LEN {
        return Err(KeySourceError::TooLong {
            source_name: name(),
            len: text.len(),
        });
    }
    // Escaping leaves printable ASCII with no outer space; only emptiness can still fail.
    Key::new(text)
        .map(Some)
        .map_err(|_| KeySourceError::Empty(name()))
}

/// The scalar text of one field, `Ok(None)` when absent.
fn value<'a>(
    field: &KeySource,
    inputs: &'a impl KeyInputs,
) -> Result<Option<Cow<'a, [u8]>>, KeySourceError> {
    let name = || field.to_string();
    let raw: Option<Cow<'a, [u8]>> = match field {
        KeySource::Header(h) => inputs.header(h)?.map(Cow::Borrowed),
        KeySource::Path(p) => inputs.path_param(p).map(|v| Cow::Borrowed(v.as_bytes())),
        KeySource::Query(q) => inputs.query(q)?.map(|v| Cow::Borrowed(v.as_bytes())),
        KeySource::Json(path) => match inputs.json().and_then(|doc| path.find(doc)) {
            None => None,
            Some(Value::String(s)) => Some(Cow::Borrowed(s.as_bytes())),
            Some(Value::Number(n)) => Some(Cow::Owned(
                number::key_text(n, path, inputs.json_bytes())?.into_bytes(),
            )),
            Some(Value::Bool(b)) => Some(Cow::Borrowed(if *b { b"true" } else { b"false" })),
            Some(_) => return Err(KeySourceError::NotScalar(path.as_str().to_owned())),
        },
        KeySource::Proto(path) => inputs.proto_field(path)?,
        KeySource::Template(_) => return Ok(None),
    };
    match raw {
        Some(v) if v.is_empty() => Err(KeySourceError::Empty(name())),
        other => Ok(other),
    }
}

/// Appends `value`, escaping bytes outside `!`..`~`, `%`, and the bytes in `reserved`.
fn escape_into(value: &[u8], reserved: &[u8], out: &mut String) {
    for &b in value {
        if (0x21..=0x7e).contains(&b) && b != b'%' && !reserved.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push_str(&hex::encode_upper([b]));
        }
    }
}
