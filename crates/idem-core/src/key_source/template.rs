//! Templates: literal text with fields, `{path.id}:pay`.

use super::{FieldNumbers, FieldPath, KeySource, KeySourceError};

/// Literal text with fields: `{path.id}:pay`, `{json.order.id}-{header.x-tenant}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    text: String,
    pub(super) parts: Vec<Part>,
    /// Bytes of the literal text: escaped in field values so a value cannot imitate them.
    pub(super) literal_bytes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Part {
    Literal(String),
    Field(KeySource),
}

impl Template {
    /// Parses a template. A field is `{header.NAME}`, `{json.PATH}`, `{path.NAME}`,
    /// `{query.NAME}` or `{proto.FIELDS}`; `{{` and `}}` stand for literal braces.
    ///
    /// # Errors
    /// [`KeySourceError::BadSource`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, KeySourceError> {
        let bad = |why| KeySourceError::BadSource(text.to_owned(), why);
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(bad("a `}` without its `{` (write `}}` for a brace)")),
                '{' => {
                    let mut field = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => field.push(c),
                            None => return Err(bad("a `{` without its `}`")),
                        }
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(field_source(&field).ok_or_else(|| {
                        bad("a field is {header.NAME}, {json.PATH}, {path.NAME}, {query.NAME} or {proto.FIELDS}")
                    })?));
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if !parts.iter().any(|p| matches!(p, Part::Field(_))) {
            return Err(bad("a template needs at least one {field}"));
        }
        let literal_bytes = parts
            .iter()
            .filter_map(|p| match p {
                Part::Literal(l) => Some(l.as_bytes()),
                Part::Field(_) => None,
            })
            .flatten()
            .copied()
            .collect();
        Ok(Self {
            text: text.to_owned(),
            parts,
            literal_bytes,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether any field reads the JSON body.
    pub(super) fn needs_body(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Field(KeySource::Json(_) | KeySource::Proto(_))))
    }
}

fn field_source(field: &str) -> Option<KeySource> {
    let (kind, name) = field.split_once('.')?;
    if name.is_empty() {
        return None;
    }
    Some(match kind {
        "header" => KeySource::Header(name.to_ascii_lowercase()),
        "json" => KeySource::Json(FieldPath::parse(name).ok()?),
        "path" => KeySource::Path(name.to_owned()),
        "query" => KeySource::Query(name.to_owned()),
        "proto" => KeySource::Proto(FieldNumbers::parse(name).ok()?),
        _ => return None,
    })
}
