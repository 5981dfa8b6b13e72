//! Parsing the `Idempotency-Key` header value.
//!
//! The header is a structured-field item (RFC 8941) holding a string, so a client may send
//! `"abc"` (an sf-string, with `\"` and `\\` escapes) or, as most clients do, the bare
//! value `abc`. Both give the same key. Anything that is not clearly one key is refused:
//! the layer answers 400 and never "ignores the key".

use idem_core::key::MAX_KEY_LEN;
use idem_core::{Key, Refusal};
use thiserror::Error;

/// Why a key header was refused. Every variant answers 400.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyRejection {
    /// The route requires a key and none was sent.
    #[error("the idempotency key header is required")]
    Missing,
    /// More than one key header was sent (or the same header twice).
    #[error("more than one idempotency key header was sent")]
    Multiple,
    /// The header holds a list (a comma outside a quoted string).
    #[error("the idempotency key header holds a list; send exactly one key")]
    List,
    /// The key is empty.
    #[error("the idempotency key is empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("the idempotency key is {len} characters long; the limit is 255")]
    TooLong {
        /// Length of the refused key (after unescaping).
        len: usize,
    },
    /// The key holds a byte outside printable ASCII (control byte, DEL, non-ASCII).
    #[error("the idempotency key has a byte outside printable ASCII (0x{byte:02x})")]
    NotPrintable {
        /// The offending byte.
        byte: u8,
    },
    /// A quoted key has a backslash not followed by `"` or `\`.
    #[error("the quoted idempotency key has an invalid escape")]
    BadEscape,
    /// A quoted key has no closing quote.
    #[error("the quoted idempotency key is not terminated")]
    Unterminated,
    /// Something follows the closing quote, or a bare key holds a quote or backslash.
    #[error("the idempotency key header is not a single string")]
    Malformed,
    /// No key source of the route is present in the request.
    #[error("the request has no idempotency key (looked for: {0})")]
    NotFound(String),
    /// A key source is present but unusable (a field that is not a scalar, too long, …).
    #[error("{0}")]
    Source(idem_core::key_source::KeySourceError),
    /// The key would be read from a body that could mean two things (a JSON object naming
    /// a member twice: which one is the key depends on the parser).
    #[error("{0}")]
    AmbiguousBody(crate::policy::AmbiguousBody),
}

impl KeyRejection {
    /// The reason it is answered with: `key-missing`, `key-multiple`, `key-malformed` or
    /// `body-ambiguous`.
    pub fn reason(&self) -> idem_wire::Reason {
        use idem_wire::Reason;
        match self.refusal() {
            Refusal::KeyMissing => Reason::KeyMissing,
            Refusal::KeyMultiple => Reason::KeyMultiple,
            Refusal::BodyAmbiguous => Reason::BodyAmbiguous,
            _ => Reason::KeyMalformed,
        }
    }

    /// The refusal this rejection is reported as.
    pub fn refusal(&self) -> Refusal {
        match self {
            Self::Missing | Self::NotFound(_) => Refusal::KeyMissing,
            Self::Multiple | Self::List => Refusal::KeyMultiple,
            Self::AmbiguousBody(_) => Refusal::BodyAmbiguous,
            _ => Refusal::KeyMalformed,
        }
    }
}

/// Parses one header value into a key: a bare token or an RFC 8941 sf-string.
///
/// Leading and trailing spaces and tabs around the value are ignored (HTTP trims them).
///
/// # Errors
/// [`KeyRejection`] names the rule the value broke.
pub fn parse_key(raw: &[u8]) -> Result<Key, KeyRejection> {
    let value = trim_ows(raw);
    // Cheap bound before any work: a quoted 255-character key escapes to at most 512 bytes.
    if value.len() > 2 * MAX_KEY_LEN + 2 {
        return Err(KeyRejection::TooLong { len: value.len() });
    }
    let unquoted: std::borrow::Cow<'_, [u8]> = match value.first() {
        Some(b'"') => parse_sf_string(value)?.into(),
        _ => {
            if let Some(&byte) = value.iter().find(|b| !(0x20..=0x7e).contains(*b)) {
                return Err(KeyRejection::NotPrintable { byte });
            }
            if value.contains(&b',') {
                return Err(KeyRejection::List);
            }
            if value.iter().any(|&b| b == b'"' || b == b'\\') {
                return Err(KeyRejection::Malformed);
            }
            value.into()
        }
    };
    Key::from_bytes(&unquoted).map_err(|e| match e {
        idem_core::KeyError::Empty => KeyRejection::Empty,
        idem_core::KeyError::TooLong { len } => KeyRejection::TooLong { len },
        idem_core::KeyError::NotPrintable { byte, .. } => KeyRejection::NotPrintable { byte },
        // Outer spaces inside quotes would be trimmed by some intermediaries: refuse them.
        _ => KeyRejection::Malformed,
    })
}

/// Writes a key as an RFC 8941 sf-string (quoted, escaping `"` and `\`).
pub fn to_sf_string(key: &Key) -> String {
    let mut out = String::with_capacity(key.as_str().len() + 2);
    out.push('"');
    for c in key.as_str().chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn trim_ows(raw: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = raw.iter().position(|b| !is_ows(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &raw[start..end]
}

/// RFC 8941 §4.2.5: a quoted string with `\"` and `\\` as the only escapes, and nothing after
/// the closing quote.
fn parse_sf_string(value: &[u8]) -> Result<Vec<u8>, KeyRejection> {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 1;
    while let Some(&b) = value.get(i) {
        match b {
            b'\\' => match value.get(i + 1) {
                Some(&e @ (b'"' | b'\\')) => {
                    out.push(e);
                    i += 2;
                }
                Some(_) => return Err(KeyRejection::BadEscape),
                None => return Err(KeyRejection::Unterminated),
            },
            b'"' => {
                let after = trim_ows(&value[i + 1..]);
                return match after.first() {
                    None => Ok(out),
                    // `"a", "b"` is a list of two keys.
                    Some(b',') => Err(KeyRejection::List),
                    Some(_) => Err(KeyRejection::Malformed),
                };
            }
            0x20..=0x7e => {
                out.push(b);
                i += 1;
            }
            other => return Err(KeyRejection::NotPrintable { byte: other }),
        }
    }
    Err(KeyRejection::Unterminated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Result<String, KeyRejection> {
        parse_key(s.as_bytes()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn bare_and_quoted_forms_agree() {
        assert_eq!(key("abc-123"), Ok("abc-123".into()));
        assert_eq!(key("\"abc-123\""), Ok("abc-123".into()));
        assert_eq!(key("  abc \t"), Ok("abc".into()));
        assert_eq!(key(r#""a\"b\\c""#), Ok(r#"a"b\c"#.into()));
        assert_eq!(key("\"a,b\""), Ok("a,b".into()));
        let k = Key::new(r#"we"ird\"#).expect("valid");
        assert_eq!(parse_key(to_sf_string(&k).as_bytes()), Ok(k));
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert_eq!(key(""), Err(KeyRejection::Empty));
        assert_eq!(key("\"\""), Err(KeyRejection::Empty));
        assert_eq!(key(&"x".repeat(255)).map(|k| k.len()), Ok(255));
        assert_eq!(
            key(&"x".repeat(256)),
            Err(KeyRejection::TooLong { len: 256 })
        );
        assert_eq!(
            key(&format!("\"{}\"", "x".repeat(256))),
            Err(KeyRejection::TooLong { len: 256 })
        );
        assert_eq!(key("a\x01b"), Err(KeyRejection::NotPrintable { byte: 1 }));
        assert_eq!(
            key("a\x7fb"),
            Err(KeyRejection::NotPrintable { byte: 0x7f })
        );
        assert_eq!(
            parse_key("clé".as_bytes()),
            Err(KeyRejection::NotPrintable { byte: 0xc3 })
        );
        assert_eq!(key(r#""a\nb""#), Err(KeyRejection::BadEscape));
        assert_eq!(key(r#""abc"#), Err(KeyRejection::Unterminated));
        assert_eq!(key(r#""abc\"#), Err(KeyRejection::Unterminated));
        assert_eq!(key(r#""abc"x"#), Err(KeyRejection::Malformed));
        assert_eq!(key(r#"ab"c"#), Err(KeyRejection::Malformed));
        assert_eq!(key("a,b"), Err(KeyRejection::List));
        assert_eq!(key(r#""a", "b""#), Err(KeyRejection::List));
        assert_eq!(key("\" a\""), Err(KeyRejection::Malformed));
    }
}
