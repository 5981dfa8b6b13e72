//! JSON numbers as key text, exactly.
//!
//! serde_json (without `arbitrary_precision`) holds u64 and i64 integers exactly and every
//! other number as the nearest f64, so `10000000000000000000001` and `…0002` are one value
//! to it. A key number it holds as f64 is read again, as written, from the body's bytes.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Number;
use serde_json::value::RawValue;

use super::{FieldPath, KeySourceError};
use crate::fingerprint::write_exact;

/// The key text of the number `n` found at `path`, whose document was parsed from `json`
/// (when the carrier has those bytes).
///
/// An integer is its digits, as it always was. An f64 is its shortest text (`12.5`,
/// `1e+22`) when that is exactly the number as written, else the exact canonical decimal of
/// the number as written (`1.0000000000000000000001e22`). Two different numbers never share
/// a key text: either way the text denotes exactly the decimal value the body wrote, so equal
/// texts mean equal values.
///
/// # Errors
/// [`KeySourceError::InexactNumber`] for an f64 with no bytes to check it against, or bytes
/// that do not hold the same number at `path`; [`KeySourceError::Repeated`] when an object
/// on the path names a member twice in the bytes (which one the document kept is unknown).
pub(super) fn key_text(
    n: &Number,
    path: &FieldPath,
    json: Option<&[u8]>,
) -> Result<String, KeySourceError> {
    let shortest = n.to_string();
    if n.is_u64() || n.is_i64() {
        return Ok(shortest);
    }
    let inexact = || KeySourceError::InexactNumber(path.as_str().to_owned());
    let lexeme = match raw_at(json.ok_or_else(inexact)?, &path.members) {
        Ok(Some(raw)) => raw.get(),
        Ok(None) | Err(Walk::Unreadable) => return Err(inexact()),
        Err(Walk::Repeated) => return Err(KeySourceError::Repeated(path.as_str().to_owned())),
    };
    // The bytes must be the document the number came from: the same number at the same path.
    if serde_json::from_str::<Number>(lexeme).ok().as_ref() != Some(n) {
        return Err(inexact());
    }
    // Both texts are JSON numbers, as `write_exact` requires: the lexeme parsed as one, and
    // serde_json writes its numbers as JSON.
    let canonical = |text: &str| {
        let mut out = Vec::new();
        write_exact(text.as_bytes(), &mut out).map(|()| out)
    };
    let exact = canonical(lexeme).map_err(|_| inexact())?;
    if canonical(&shortest).is_ok_and(|c| c == exact) {
        return Ok(shortest);
    }
    // `write_exact` writes ASCII digits, `.`, `-` and `e` only.
    String::from_utf8(exact).map_err(|_| inexact())
}

/// Why the bytes could not be walked to a member.
enum Walk {
    /// Not JSON, or a level on the path is not an object.
    Unreadable,
    /// An object on the path names the member twice.
    Repeated,
}

/// The raw JSON of the member at `members`, `Ok(None)` when a level lacks it.
fn raw_at<'j>(json: &'j [u8], members: &[String]) -> Result<Option<&'j RawValue>, Walk> {
    let mut raw: &'j RawValue = serde_json::from_slice(json).map_err(|_| Walk::Unreadable)?;
    for name in members {
        let mut de = serde_json::Deserializer::from_str(raw.get());
        raw = match de
            .deserialize_map(Member(name))
            .map_err(|_| Walk::Unreadable)?
        {
            Found::Absent => return Ok(None),
            Found::One(v) => v,
            Found::Repeated => return Err(Walk::Repeated),
        };
    }
    Ok(Some(raw))
}

enum Found<'j> {
    Absent,
    One(&'j RawValue),
    Repeated,
}

/// Visits an object for the member named `.0`, skipping the others unparsed.
struct Member<'n>(&'n str);

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let mut found = Found::Absent;
        while let Some(is_it) = map.next_key_seed(NameIs(self.0))? {
            if !is_it {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value: &'de RawValue = map.next_value()?;
            // The whole object is still read, so the reader ends where the object does.
            found = match found {
                Found::Absent => Found::One(value),
                _ => Found::Repeated,
            };
        }
        Ok(found)
    }
}

/// Whether a member name (escapes decoded) is `.0`.
struct NameIs<'n>(&'n str);

impl<'de> DeserializeSeed<'de> for NameIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for NameIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}
