//! A route's key sources: `key_header`, or `key` as one source or a list tried in order.

use anyhow::{anyhow, bail};
use idem_core::key_source::{FieldPath, KeySource, KeySources, Template};

use super::{RawKey, RawKeySource};
use crate::matcher::PathPattern;

/// The route's key sources; the `Idempotency-Key` header when neither field is set.
///
/// # Errors
/// Both fields set, or a source that does not parse, naming it.
pub(super) fn sources(
    key_header: Option<&str>,
    key: Option<&RawKey>,
) -> anyhow::Result<KeySources> {
    let list: Vec<KeySource> = match (key_header, key) {
        (Some(_), Some(_)) => bail!("set `key` or `key_header`, not both"),
        (Some(h), None) => vec![KeySource::Header(header(h)?)],
        (None, None) => vec![KeySource::Header(
            idem_http::IDEMPOTENCY_KEY.as_str().into(),
        )],
        (None, Some(RawKey::One(one))) => vec![source(one)?],
        (None, Some(RawKey::Many(many))) => {
            many.iter().map(source).collect::<anyhow::Result<_>>()?
        }
    };
    KeySources::new(list).map_err(|e| anyhow!("{e}"))
}

fn source(raw: &RawKeySource) -> anyhow::Result<KeySource> {
    let named = |what: &str, value: &Option<String>| {
        value
            .clone()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| anyhow!("`from = \"{what}\"` needs `param`"))
    };
    match (raw.from.as_deref(), &raw.template) {
        (Some(_), Some(_)) => bail!("a key source has either `from` or `template`, not both"),
        (None, Some(t)) => Template::parse(t)
            .map(KeySource::Template)
            .map_err(|e| anyhow!("{e}")),
        (Some("header"), None) => Ok(KeySource::Header(header(
            raw.header
                .as_deref()
                .unwrap_or(idem_http::IDEMPOTENCY_KEY.as_str()),
        )?)),
        (Some("json"), None) => {
            let path = raw
                .path
                .as_deref()
                .ok_or_else(|| anyhow!("`from = \"json\"` needs `path`, e.g. \"order.id\""))?;
            FieldPath::parse(path)
                .map(KeySource::Json)
                .map_err(|e| anyhow!("{e}"))
        }
        (Some("path"), None) => Ok(KeySource::Path(named("path", &raw.param)?)),
        (Some("query"), None) => Ok(KeySource::Query(named("query", &raw.param)?)),
        (Some(other), None) => {
            bail!(
                "`from = \"{other}\"` is not one of header, json, path, query (or use `template`)"
            )
        }
        (None, None) => bail!("a key source needs `from` or `template`"),
    }
}

fn header(name: &str) -> anyhow::Result<String> {
    http::HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
        .map(|h| h.as_str().to_owned())
        .map_err(|_| anyhow!("`{name}` is not a valid header name"))
}

/// Checks that every path parameter a source names is one of the route's; returns whether
/// any source reads path parameters.
///
/// # Errors
/// A parameter the route's path does not have.
pub(super) fn check_path_params(
    sources: &KeySources,
    pattern: &PathPattern,
) -> anyhow::Result<bool> {
    let names = pattern.param_names();
    let mut any = false;
    for source in sources.sources() {
        for p in source.path_params() {
            any = true;
            if !names.contains(&p) {
                bail!(
                    "{source} reads path parameter `{p}`, which `{}` does not have",
                    pattern.as_str()
                );
            }
        }
    }
    Ok(any)
}
