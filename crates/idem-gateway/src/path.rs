//! Request paths in one canonical spelling, so that no spelling of a protected path reaches
//! the upstream around its route.
//!
//! Servers behind a proxy decode and tidy paths before routing: `/%63harge`, `//charge`,
//! `/./charge`, `/a/../charge` and (in many frameworks) `/charge/` and `/CHARGE` all reach the
//! `/charge` handler. The gateway therefore matches routes on the normalised path and
//! forwards that same path, so what the route protects is what the upstream runs:
//!
//! 1. percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, and the
//!    hex digits of every other escape are upper-cased (RFC 3986 §6.2.2);
//! 2. empty segments (`//`) are merged, and `.` and `..` segments are resolved, never above
//!    the root (RFC 3986 §5.2.4);
//! 3. a trailing slash is dropped, unless the route set asks for strict trailing slashes;
//! 4. spellings that servers disagree on are refused instead of guessed: an escape that is
//!    not `%` and two hex digits, an encoded NUL, an encoded `/` or `\`, a raw `\`, and `;`
//!    path parameters (some servers drop `;x`, others keep it).
//!
//! Letter case is left as sent; route literals compare without regard to case unless the
//! configuration asks otherwise (see [`crate::matcher`]).

use std::borrow::Cow;
use std::fmt;

/// What happens to a trailing slash (`trailing_slash`, default `ignore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrailingSlash {
    /// `/charge/` is `/charge` (what most frameworks do).
    #[default]
    Ignore,
    /// `/charge/` is a path of its own.
    Strict,
}

/// Why a path was refused. Answered with 400 `path-rejected`; nothing is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathRejection {
    /// Not an absolute path (`*`, or no leading `/`).
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// `%00`.
    EncodedNul,
    /// `%2F` or `%5C`: a separator some servers decode before routing and others do not.
    EncodedSeparator,
    /// A raw `\`, which some servers treat as `/`.
    Backslash,
    /// A `;` path parameter, which some servers strip before routing and others keep.
    PathParameter,
}

impl fmt::Display for PathRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotAbsolute => "the request path must start with /",
            Self::BadEscape => "the request path has a % not followed by two hex digits",
            Self::EncodedNul => "the request path holds an encoded NUL (%00)",
            Self::EncodedSeparator => {
                "the request path holds an encoded / or \\ (%2F, %5C), which servers route differently"
            }
            Self::Backslash => {
                "the request path holds a \\, which some servers read as / and others do not"
            }
            Self::PathParameter => {
                "the request path holds a ; path parameter, which some servers strip before routing and others keep"
            }
        })
    }
}

impl std::error::Error for PathRejection {}

/// The canonical spelling of `path` (no query), per the module rules; borrowed when `path`
/// already is canonical, as almost every request's path is.
///
/// # Errors
/// [`PathRejection`] for a spelling servers disagree on.
pub fn normalize(path: &str, trailing: TrailingSlash) -> Result<Cow<'_, str>, PathRejection> {
    if is_canonical(path, trailing) {
        return Ok(Cow::Borrowed(path));
    }
    rewrite(path, trailing).map(Cow::Owned)
}

/// Whether `path` needs no rewriting: absolute, no escape, backslash or `;`, no empty, `.` or
/// `..` segment, and no trailing slash unless trailing slashes are strict.
fn is_canonical(path: &str, trailing: TrailingSlash) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') || bytes.iter().any(|b| matches!(b, b'%' | b'\\' | b';')) {
        return false;
    }
    if path == "/" {
        return true;
    }
    let body = &path[1..];
    let mut segments = body.split('/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            "." | ".." => return false,
            "" if !(last && trailing == TrailingSlash::Strict) => return false,
            _ => {}
        }
    }
    true
}

fn rewrite(path: &str, trailing: TrailingSlash) -> Result<String, PathRejection> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathRejection::NotAbsolute);
    }
    let mut segments: Vec<String> = Vec::new();
    // Whether the path ends in `/`, `/.` or `/..`, i.e. names a directory.
    let mut ends_in_slash = false;
    for raw in path[1..].split('/') {
        let segment = decode_segment(raw)?;
        ends_in_slash = matches!(segment.as_str(), "" | "." | "..");
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    // A directory keeps its trailing slash only when trailing slashes are strict.
    if out.is_empty() || (trailing == TrailingSlash::Strict && ends_in_slash) {
        out.push('/');
    }
    Ok(out)
}

/// Decodes unreserved escapes in one segment, upper-cases the rest, and refuses what servers
/// disagree on.
fn decode_segment(raw: &str) -> Result<String, PathRejection> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .ok_or(PathRejection::BadEscape)?;
                let mut value = [0u8; 1];
                hex::decode_to_slice(hex, &mut value).map_err(|_| PathRejection::BadEscape)?;
                match value[0] {
                    0 => return Err(PathRejection::EncodedNul),
                    b'/' | b'\\' => return Err(PathRejection::EncodedSeparator),
                    c if is_unreserved(c) => out.push(char::from(c)),
                    _ => {
                        out.push('%');
                        out.push_str(&hex::encode_upper(value));
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathRejection::Backslash),
            b';' => return Err(PathRejection::PathParameter),
            _ => {
                // `raw` is a `&str` cut at `/`, so every byte up to the next ASCII one
                // belongs to one character, copied whole.
                let len = utf8_len(b);
                let end = (i + len).min(bytes.len());
                out.push_str(raw.get(i..end).unwrap_or_default());
                i = end;
                continue;
            }
        }
    }
    Ok(out)
}

fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(path: &str) -> Result<String, PathRejection> {
        normalize(path, TrailingSlash::Ignore).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_become_one() {
        for variant in [
            "/charge",
            "/charge/",
            "//charge",
            "/%63harge",
            "/%63%68%61%72%67%65",
            "/./charge",
            "/a/../charge",
            "/../charge",
            "/charge/.",
            "/x/y/../../charge",
            "///charge//",
        ] {
            assert_eq!(n(variant).as_deref(), Ok("/charge"), "{variant}");
        }
        assert_eq!(n("/").as_deref(), Ok("/"));
        assert_eq!(n("/..").as_deref(), Ok("/"));
        assert_eq!(
            n("/a/%2e%2E/b").as_deref(),
            Ok("/b"),
            "encoded dots resolve too"
        );
        assert_eq!(n("/CHARGE").as_deref(), Ok("/CHARGE"), "case is kept");
        assert_eq!(n("/a%20b%c3%a9").as_deref(), Ok("/a%20b%C3%A9"));
        assert_eq!(n("/é").as_deref(), Ok("/é"));
    }

    #[test]
    fn strict_trailing_slashes_keep_theirs() {
        let strict = |p| normalize(p, TrailingSlash::Strict);
        assert_eq!(strict("/charge/").as_deref(), Ok("/charge/"));
        assert_eq!(strict("//charge//").as_deref(), Ok("/charge/"));
        assert_eq!(strict("/charge").as_deref(), Ok("/charge"));
        assert_eq!(strict("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(strict("/a/b/%2e%2E").as_deref(), Ok("/a/"));
        assert_eq!(strict("/").as_deref(), Ok("/"));
    }

    #[test]
    fn spellings_servers_disagree_on_are_refused() {
        assert_eq!(n("charge"), Err(PathRejection::NotAbsolute));
        assert_eq!(n("*"), Err(PathRejection::NotAbsolute));
        assert_eq!(n("/ch%zzarge"), Err(PathRejection::BadEscape));
        assert_eq!(n("/charge%2"), Err(PathRejection::BadEscape));
        assert_eq!(n("/charge%00"), Err(PathRejection::EncodedNul));
        assert_eq!(n("/a%2Fcharge"), Err(PathRejection::EncodedSeparator));
        assert_eq!(n("/a%5ccharge"), Err(PathRejection::EncodedSeparator));
        assert_eq!(n("/a\\charge"), Err(PathRejection::Backslash));
        assert_eq!(n("/charge;x"), Err(PathRejection::PathParameter));
    }

    #[test]
    fn the_borrowed_fast_path_agrees_with_the_rewrite() {
        for p in [
            "/", "/a", "/a/", "/a/b", "//", "/a//b", "/.", "/a/.", "/..", "/a/..", "/a.b", "/..a",
            "/a/.b/", "/%41", "/a;b", "/a\\b", "/é/ü", "/a/b/c/",
        ] {
            for t in [TrailingSlash::Ignore, TrailingSlash::Strict] {
                assert_eq!(
                    normalize(p, t).map(|c| c.into_owned()),
                    rewrite(p, t),
                    "{p} {t:?}"
                );
            }
        }
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        for p in [
            "/a/./b/../c/",
            "/%41%7e%2d",
            "/x%2a%2A",
            "//a//b//",
            "/a/b/%2E%2E/",
        ] {
            let once = n(p).expect("valid");
            assert_eq!(n(&once).as_deref(), Ok(once.as_str()), "{p}");
            let strict = normalize(p, TrailingSlash::Strict)
                .expect("valid")
                .into_owned();
            assert_eq!(
                normalize(&strict, TrailingSlash::Strict).as_deref(),
                Ok(strict.as_str()),
                "{p}"
            );
        }
    }
}
