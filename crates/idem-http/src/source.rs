//! Keys taken from the request itself: [`SourceKey`] reads the route's
//! [`KeySources`](idem_core::key_source::KeySources) (a header, a JSON body field, a path or
//! query parameter, or a template such as `{path.id}:pay`) from an HTTP request.
//!
//! ```
//! use idem_core::key_source::KeySources;
//! use idem_http::{IdempotencyConfig, SourceKey};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The client's header if it sends one, else the order id from the body, for this operation.
//! let sources = KeySources::parse(&["header:idempotency-key", "{json.order.id}:pay"])?;
//! let config = IdempotencyConfig::new("orders.pay")?.key(SourceKey::new(sources));
//! # let _ = config; Ok(()) }
//! ```
//!
//! The fingerprint still covers the whole request, the key field included: the same order
//! paid again with another amount is a mismatch (422), not a replay.

use std::collections::HashMap;

use http::request::Parts;
use http::{HeaderName, HeaderValue};
use idem_core::Key;
use idem_core::fingerprint::validate_json;
use idem_core::key_source::{KeyInputs, KeySource, KeySourceError, KeySources};
use serde_json::Value;

use crate::key::{KeyRejection, parse_key};
use crate::policy::{AmbiguousBody, ExtractKey, FoundKey};

/// The route's path parameters, as a request extension: `id` → `42` for
/// `/v1/orders/{id}/pay`. The gateway sets it from its route; an application puts it there
/// from its router's match before the layer runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathParams(pub Vec<(String, String)>);

impl PathParams {
    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Finds the key through a list of [`KeySources`], tried in order.
#[derive(Clone, Debug)]
pub struct SourceKey {
    sources: KeySources,
}

impl SourceKey {
    /// Keys from `sources`.
    pub fn new(sources: KeySources) -> Self {
        Self { sources }
    }

    /// The sources.
    pub fn sources(&self) -> &KeySources {
        &self.sources
    }

    fn find(&self, parts: &Parts, body: Option<&[u8]>) -> Result<Option<FoundKey>, KeyRejection> {
        let inputs = Inputs::new(parts, body)?;
        let found = self
            .sources
            .resolve(&inputs)
            .map_err(KeyRejection::Source)?;
        let Some(found) = found else {
            return Ok(None);
        };
        // A key from a header is echoed on replays, as the plain header key is.
        let echo = match self.sources.sources().get(found.source) {
            Some(KeySource::Header(name)) => HeaderName::from_bytes(name.as_bytes())
                .ok()
                .and_then(|n| parts.headers.get(&n).map(|v| (n, v.clone()))),
            _ => None,
        };
        Ok(Some(FoundKey {
            key: found.key,
            echo,
        }))
    }
}

impl ExtractKey for SourceKey {
    fn extract(&self, parts: &Parts) -> Result<Option<FoundKey>, KeyRejection> {
        self.find(parts, None)
    }

    fn needs_body(&self) -> bool {
        self.sources.needs_body()
    }

    fn extract_with_body(
        &self,
        parts: &Parts,
        body: &[u8],
    ) -> Result<Option<FoundKey>, KeyRejection> {
        self.find(parts, Some(body))
    }

    fn missing(&self) -> KeyRejection {
        KeyRejection::NotFound(self.sources.to_string())
    }
}

/// An HTTP request as key sources see it.
struct Inputs<'a> {
    parts: &'a Parts,
    json: Option<Value>,
    /// The bytes `json` was parsed from.
    body: Option<&'a [u8]>,
    query: HashMap<String, Vec<String>>,
}

impl<'a> Inputs<'a> {
    /// # Errors
    /// [`KeyRejection::AmbiguousBody`] for a JSON body that names a member twice: serde_json
    /// keeps the last, an upstream may keep the first, so the key could name another order
    /// than the one the upstream acts on.
    fn new(parts: &'a Parts, body: Option<&'a [u8]>) -> Result<Self, KeyRejection> {
        let body = body.filter(|b| !b.is_empty());
        let json = match body {
            None => None,
            Some(b) => match validate_json(b) {
                Ok(()) => serde_json::from_slice(b).ok(),
                Err(e) => match AmbiguousBody::from_json_error(&e) {
                    Some(ambiguous) => return Err(KeyRejection::AmbiguousBody(ambiguous)),
                    // Not JSON: a JSON key source finds nothing in it.
                    None => None,
                },
            },
        };
        let mut query: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            query
                .entry(k.into_owned())
                .or_default()
                .push(v.into_owned());
        }
        Ok(Self {
            parts,
            body: body.filter(|_| json.is_some()),
            json,
            query,
        })
    }
}

fn one<'v, T: ?Sized>(
    name: &str,
    mut values: impl Iterator<Item = &'v T>,
) -> Result<Option<&'v T>, KeySourceError> {
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => Ok(Some(v)),
        (Some(_), Some(_)) => Err(KeySourceError::Repeated(name.to_owned())),
    }
}

impl KeyInputs for Inputs<'_> {
    fn header(&self, name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        one(name, self.parts.headers.get_all(name).iter()).map(|v| v.map(HeaderValue::as_bytes))
    }

    fn header_key(&self, name: &str) -> Result<Option<Key>, KeySourceError> {
        match self.header(name)? {
            None => Ok(None),
            Some(raw) => parse_key(raw)
                .map(Some)
                .map_err(|e| KeySourceError::Header(name.to_owned(), e.to_string())),
        }
    }

    fn json(&self) -> Option<&Value> {
        self.json.as_ref()
    }

    fn json_bytes(&self) -> Option<&[u8]> {
        self.body
    }

    fn path_param(&self, name: &str) -> Option<&str> {
        self.parts.extensions.get::<PathParams>()?.get(name)
    }

    fn query(&self, name: &str) -> Result<Option<&str>, KeySourceError> {
        let values = self.query.get(name).map(Vec::as_slice).unwrap_or_default();
        one(name, values.iter()).map(|v| v.map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)], params: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method("POST").uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        let mut parts = b.body(()).expect("request").into_parts().0;
        parts.extensions.insert(PathParams(
            params
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
        ));
        parts
    }

    fn extractor(sources: &[&str]) -> SourceKey {
        SourceKey::new(KeySources::parse(sources).expect("sources"))
    }

    #[test]
    fn keys_come_from_the_request() {
        let k = extractor(&["header:idempotency-key", "{path.id}:pay"]);
        let p = parts("/orders/42/pay", &[], &[("id", "42")]);
        let found = k.extract(&p).expect("ok").expect("some");
        assert_eq!((found.key.as_str(), found.echo), ("42:pay", None));
        let p = parts(
            "/orders/42/pay",
            &[("idempotency-key", "\"client\"")],
            &[("id", "42")],
        );
        let found = k.extract(&p).expect("ok").expect("some");
        assert_eq!(
            found.key.as_str(),
            "client",
            "header values parse as sf-strings"
        );
        assert!(found.echo.is_some());

        let body = extractor(&["json:order.id"]);
        assert!(body.needs_body());
        let p = parts("/pay", &[], &[]);
        let found = body
            .extract_with_body(&p, br#"{"order":{"id":"o-1"}}"#)
            .expect("ok")
            .expect("some");
        assert_eq!(found.key.as_str(), "o-1");
        assert_eq!(body.extract_with_body(&p, b"not json").expect("ok"), None);
        // Security issue 28: a number f64 cannot hold is read from the body as written.
        let number = |b: &[u8]| {
            let found = body.extract_with_body(&p, b).expect("ok").expect("some");
            found.key.as_str().to_owned()
        };
        assert_eq!(
            number(br#"{"order":{"id":10000000000000000000001}}"#),
            "1.0000000000000000000001e22"
        );
        assert_eq!(
            number(br#"{"order":{"id":10000000000000000000002}}"#),
            "1.0000000000000000000002e22"
        );
        assert_eq!(number(br#"{"order":{"id":12.5}}"#), "12.5");

        let query = extractor(&["query:ref"]);
        let found = query
            .extract(&parts("/pay?ref=a%20b", &[], &[]))
            .expect("ok")
            .expect("some");
        assert_eq!(found.key.as_str(), "a%20b", "decoded, then escaped");
        assert!(matches!(
            query.extract(&parts("/pay?ref=1&ref=2", &[], &[])),
            Err(KeyRejection::Source(KeySourceError::Repeated(_)))
        ));
    }
}
