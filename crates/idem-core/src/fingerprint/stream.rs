//! Canonical JSON in one pass, without building a tree.
//!
//! Every protected request is fingerprinted, so this is a hot path. It writes exactly what
//! the tree-based [`super::canonical_via_value`] writes, and accepts exactly the documents
//! that path accepts: escaped strings are handed to serde_json itself, numbers that are not
//! small integers to the exact [`super::number`] form, and the differential tests in
//! `super::tests` (and the `canonical_json` fuzz target) hold the two paths together.

use std::borrow::Cow;

use super::FingerprintError;
use super::json::write_string;

/// serde_json's nesting limit: the 128th nested array or object is refused.
pub(super) const MAX_DEPTH: usize = 127;

/// Appends the canonical form of `body` to `out`.
pub(super) fn canonicalize(body: &[u8], out: &mut Vec<u8>) -> Result<(), FingerprintError> {
    // serde_json refuses invalid UTF-8 inside strings, and any byte above 0x7F outside them,
    // so a body that is not UTF-8 is refused either way; checking it once up front is cheaper
    // than checking every string.
    let text = std::str::from_utf8(body).map_err(|e| {
        FingerprintError::Json(format!("invalid UTF-8 at byte {}", e.valid_up_to()))
    })?;
    let mut parser = Parser {
        text,
        pos: 0,
        depth: 0,
        members: Vec::new(),
    };
    parser.skip_ws();
    parser.value(out)?;
    parser.skip_ws();
    if parser.pos != body.len() {
        return Err(parser.error("trailing characters"));
    }
    Ok(())
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
    /// Members of the objects being written, innermost last (one buffer for all levels).
    members: Vec<Member<'a>>,
}

/// One object member already written to the output: its decoded name, and where its
/// `"name":value` text sits.
struct Member<'a> {
    name: Cow<'a, str>,
    start: usize,
    end: usize,
}

impl<'a> Parser<'a> {
    /// The input as bytes.
    fn src(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn error(&self, what: &str) -> FingerprintError {
        FingerprintError::Json(format!("{what} at byte {}", self.pos))
    }

    fn peek(&self) -> Option<u8> {
        self.src().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self, out: &mut Vec<u8>) -> Result<(), FingerprintError> {
        match self.peek() {
            Some(b'{') => self.object(out),
            Some(b'[') => self.array(out),
            Some(b'"') => self.string(out).map(drop),
            Some(b't') => self.literal(b"true", out),
            Some(b'f') => self.literal(b"false", out),
            Some(b'n') => self.literal(b"null", out),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of input")),
        }
    }

    fn literal(&mut self, word: &[u8], out: &mut Vec<u8>) -> Result<(), FingerprintError> {
        if !self.src()[self.pos..].starts_with(word) {
            return Err(self.error("invalid literal"));
        }
        self.pos += word.len();
        out.extend_from_slice(word);
        Ok(())
    }

    /// Steps over an opening bracket, one level deeper.
    fn enter(&mut self) -> Result<(), FingerprintError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.pos += 1;
        self.skip_ws();
        Ok(())
    }

    /// After an element: true if another follows (a comma was consumed), false at `close`.
    fn next_element(&mut self, close: u8) -> Result<bool, FingerprintError> {
        self.skip_ws();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                self.skip_ws();
                Ok(true)
            }
            Some(c) if c == close => {
                self.pos += 1;
                Ok(false)
            }
            _ => Err(self.error("expected a comma or a closing bracket")),
        }
    }

    fn array(&mut self, out: &mut Vec<u8>) -> Result<(), FingerprintError> {
        self.enter()?;
        out.push(b'[');
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                self.value(out)?;
                if !self.next_element(b']')? {
                    break;
                }
                out.push(b',');
            }
        }
        out.push(b']');
        self.depth -= 1;
        Ok(())
    }

    fn object(&mut self, out: &mut Vec<u8>) -> Result<(), FingerprintError> {
        self.enter()?;
        out.push(b'{');
        let body_start = out.len();
        let first = self.members.len();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                if self.peek() != Some(b'"') {
                    return Err(self.error("expected a member name"));
                }
                let start = out.len();
                let name = self.string(out)?;
                self.skip_ws();
                if self.peek() != Some(b':') {
                    return Err(self.error("expected a colon"));
                }
                self.pos += 1;
                self.skip_ws();
                out.push(b':');
                self.value(out)?;
                self.members.push(Member {
                    name,
                    start,
                    end: out.len(),
                });
                if !self.next_element(b'}')? {
                    break;
                }
                out.push(b',');
            }
        }
        // Written in input order; most bodies are already sorted and free of duplicates.
        let members = &mut self.members[first..];
        if !members.windows(2).all(|w| w[0].name < w[1].name) {
            sort_members(out, body_start, members)?;
        }
        self.members.truncate(first);
        out.push(b'}');
        self.depth -= 1;
        Ok(())
    }

    /// Writes a string in canonical form and returns its decoded text.
    fn string(&mut self, out: &mut Vec<u8>) -> Result<Cow<'a, str>, FingerprintError> {
        let open = self.pos;
        let mut i = open + 1;
        let mut escaped = false;
        loop {
            // Skip plain bytes in one tight loop; stop at a quote, a backslash or a control.
            let plain = self.src()[i.min(self.src().len())..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            let Some(n) = plain else {
                return Err(self.error("unterminated string"));
            };
            i += n;
            match self.src()[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                _ => {
                    self.pos = i;
                    return Err(self.error("control character in a string"));
                }
            }
        }
        let src = self.src();
        self.pos = i + 1;
        if !escaped {
            // Both ends are quotes, so they are character boundaries.
            let text = self
                .text
                .get(open + 1..i)
                .ok_or_else(|| self.error("invalid UTF-8"))?;
            // Nothing in it needs escaping, so it is already canonical.
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
            return Ok(Cow::Borrowed(text));
        }
        let text: String = serde_json::from_slice(&src[open..=i])
            .map_err(|e| FingerprintError::Json(e.to_string()))?;
        write_string(&text, out);
        Ok(Cow::Owned(text))
    }

    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), FingerprintError> {
        let (src, start) = (self.src(), self.pos);
        let digits_from = |i: usize| {
            src[i..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(src.len(), |n| i + n)
        };
        let mut i = start + usize::from(src[start] == b'-');
        match src.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i = digits_from(i),
            _ => return Err(self.error("invalid number")),
        }
        let int_end = i;
        if src.get(i) == Some(&b'.') {
            let end = digits_from(i + 1);
            if end == i + 1 {
                return Err(self.error("invalid number"));
            }
            i = end;
        }
        if let Some(b'e' | b'E') = src.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = src.get(i) {
                i += 1;
            }
            let end = digits_from(i);
            if end == i {
                return Err(self.error("invalid number"));
            }
            i = end;
        }
        self.pos = i;
        let lexeme = &src[start..i];
        // An integer of at most 18 digits (not `-0`) fits i64 and is written as it stands.
        let digits = int_end - start - usize::from(lexeme[0] == b'-');
        if i == int_end && digits <= 18 && lexeme != b"-0" {
            out.extend_from_slice(lexeme);
            return Ok(());
        }
        super::number::write_exact(lexeme, out)
    }
}

/// Rewrites an object's members in name order. A name given twice is refused: parsers
/// disagree on which member counts, so the body could mean two things.
fn sort_members(
    out: &mut Vec<u8>,
    body_start: usize,
    members: &mut [Member<'_>],
) -> Result<(), FingerprintError> {
    members.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = members.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(FingerprintError::DuplicateMember(
            w[0].name.clone().into_owned(),
        ));
    }
    let text = out.split_off(body_start);
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&text[m.start - body_start..m.end - body_start]);
    }
    Ok(())
}
