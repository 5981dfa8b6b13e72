//! Small parsers the sections' compilers share: durations and sizes that must be positive,
//! HTTP methods and header names, and the plain paths the gateway answers itself.

use std::time::Duration;

use anyhow::{anyhow, bail};
use http::{HeaderName, Method};

use crate::path::TrailingSlash;

/// A path the gateway answers itself (`trimmed`, as written in `path`): absolute, plain
/// (unreserved characters and `/` only), already in canonical spelling, and not the root;
/// `example` is shown in the error.
pub(super) fn plain_path(path: &str, trimmed: &str, example: &str) -> anyhow::Result<String> {
    if !trimmed.starts_with('/') {
        bail!("`{path}` must start with /");
    }
    if !trimmed
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
    {
        bail!("`{path}` may hold only letters, digits, `-`, `.`, `_`, `~` and `/`");
    }
    let normal = crate::path::normalize(trimmed, TrailingSlash::Ignore)
        .map_err(|e| anyhow!("`{path}`: {e}"))?;
    if normal != trimmed || normal == "/" {
        bail!("`{path}` must be a plain path below the root, such as {example}");
    }
    Ok(normal.into_owned())
}

pub(super) fn positive(
    d: Option<Duration>,
    default: Duration,
    field: &str,
) -> anyhow::Result<Duration> {
    match d {
        Some(d) if d.is_zero() => bail!("`{field}` must be greater than zero"),
        Some(d) => Ok(d),
        None => Ok(default),
    }
}

pub(super) fn size(v: Option<u64>, default: usize, field: &str) -> anyhow::Result<usize> {
    match v {
        None => Ok(default),
        Some(0) => bail!("`{field}` must be greater than zero"),
        Some(n) => usize::try_from(n).map_err(|_| anyhow!("`{field}` is too large")),
    }
}

pub(super) fn method(text: &str) -> anyhow::Result<Method> {
    let upper = text.trim().to_ascii_uppercase();
    if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic()) {
        bail!("`{text}` is not an HTTP method");
    }
    Method::from_bytes(upper.as_bytes()).map_err(|_| anyhow!("`{text}` is not an HTTP method"))
}

pub(super) fn header_name(text: &str) -> anyhow::Result<HeaderName> {
    HeaderName::from_bytes(text.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| anyhow!("`{text}` is not a valid header name"))
}
