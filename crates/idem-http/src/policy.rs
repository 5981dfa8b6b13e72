//! The behaviour a route plugs in: small traits with named defaults, like tower-http's
//! `MakeRequestId`.
//!
//! | trait | decides | shipped values |
//! |---|---|---|
//! | [`ExtractKey`] | which header holds the key, how it parses | [`HeaderKey`] |
//! | [`ExtractPrincipal`] | whose key it is (part of the scope) | [`NoPrincipal`], [`HeaderPrincipal`], [`ExtensionPrincipal`] |
//! | [`FingerprintRequest`] | what "the same request" means | [`CanonicalJson`], [`RawBody`] |
//! | [`StorePolicy`] | which responses are kept for replay | [`StoreUnless5xx`] |

use std::fmt;
use std::marker::PhantomData;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, StatusCode};
use idem_core::key::{INTERNAL_PRINCIPAL_PREFIX, credential_principal, is_internal_principal};
use idem_core::{Fingerprint, FingerprintError, JsonFields, Key, Refusal, ReleaseKind};
use idem_wire::{GrpcCode, Reason};

use crate::key::{KeyRejection, parse_key};

pub use idem_wire::header::{
    IDEMPOTENCY_FENCE, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, X_IDEMPOTENCY_KEY, X_REQUEST_ID,
};

/// The request's [`X_REQUEST_ID`] (a gRPC call's `x-request-id` metadata), kept on the record
/// it claims; `None` when absent or not visible ASCII.
pub fn request_id(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A key found in a request, with the header it came in, if it came in one (echoed on
/// replays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundKey {
    /// The parsed key.
    pub key: Key,
    /// The header it was read from and its value as sent; `None` for a key taken from the
    /// request itself (a business key).
    pub echo: Option<(HeaderName, HeaderValue)>,
}

/// Finds the idempotency key in a request.
pub trait ExtractKey: fmt::Debug + Send + Sync + 'static {
    /// The key, `Ok(None)` when the request carries none.
    ///
    /// # Errors
    /// [`KeyRejection`] for anything that is not clearly one valid key (answered with 400).
    fn extract(&self, parts: &Parts) -> Result<Option<FoundKey>, KeyRejection>;

    /// Whether the key may come from the body; the layer then buffers the body first and
    /// calls [`ExtractKey::extract_with_body`]. Default: no.
    fn needs_body(&self) -> bool {
        false
    }

    /// The key, from the request head and its buffered body.
    ///
    /// # Errors
    /// As [`ExtractKey::extract`].
    fn extract_with_body(
        &self,
        parts: &Parts,
        _body: &[u8],
    ) -> Result<Option<FoundKey>, KeyRejection> {
        self.extract(parts)
    }

    /// What a required key's absence is answered with (400 `key-missing`).
    fn missing(&self) -> KeyRejection {
        KeyRejection::Missing
    }
}

/// Reads the key from `Idempotency-Key` and any opt-in aliases. Exactly one header instance
/// across all of them may be present.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    names: Vec<HeaderName>,
}

impl Default for HeaderKey {
    fn default() -> Self {
        Self {
            names: vec![IDEMPOTENCY_KEY],
        }
    }
}

impl HeaderKey {
    /// `Idempotency-Key` only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Exactly these header names (none means the default).
    pub fn names(names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<_> = names.into_iter().collect();
        if names.is_empty() {
            Self::default()
        } else {
            Self { names }
        }
    }

    /// Also accepts `name` (e.g. [`X_IDEMPOTENCY_KEY`] or [`X_REQUEST_ID`]).
    #[must_use]
    pub fn with_alias(mut self, name: HeaderName) -> Self {
        if !self.names.contains(&name) {
            self.names.push(name);
        }
        self
    }

    /// The header names read, in order.
    pub fn header_names(&self) -> &[HeaderName] {
        &self.names
    }
}

impl ExtractKey for HeaderKey {
    fn extract(&self, parts: &Parts) -> Result<Option<FoundKey>, KeyRejection> {
        let mut found: Option<(&HeaderName, &HeaderValue)> = None;
        for name in &self.names {
            for value in parts.headers.get_all(name) {
                if found.is_some() {
                    return Err(KeyRejection::Multiple);
                }
                found = Some((name, value));
            }
        }
        let Some((header, raw)) = found else {
            return Ok(None);
        };
        let key = parse_key(raw.as_bytes())?;
        Ok(Some(FoundKey {
            key,
            echo: Some((header.clone(), raw.clone())),
        }))
    }
}

/// Why a principal could not be determined; each kind owns its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrincipalRejection {
    /// The credential is missing or does not verify: `401` `unauthenticated`.
    #[error("{0}")]
    Unauthenticated(String),
    /// The credential was sent more than once (two headers of its name): `400`
    /// `credential-ambiguous`. Verifying one while the service behind reads another would
    /// act for a principal nobody checked.
    #[error("{0}")]
    Ambiguous(String),
}

impl PrincipalRejection {
    /// The explanation for this occurrence.
    pub fn detail(&self) -> &str {
        match self {
            Self::Unauthenticated(d) | Self::Ambiguous(d) => d,
        }
    }

    /// The reason it is answered with: `unauthenticated` (401) or `credential-ambiguous`
    /// (400).
    pub fn reason(&self) -> idem_wire::Reason {
        match self {
            Self::Unauthenticated(_) => idem_wire::Reason::Unauthenticated,
            Self::Ambiguous(_) => idem_wire::Reason::CredentialAmbiguous,
        }
    }

    /// The refusal it is reported as.
    pub fn refusal(&self) -> Refusal {
        match self {
            Self::Unauthenticated(_) => Refusal::Unauthenticated,
            Self::Ambiguous(_) => Refusal::CredentialAmbiguous,
        }
    }
}

/// Finds whose key this is. The principal becomes part of the scope, so two principals'
/// keys never meet.
///
/// An implementation that passes a caller's own text through must refuse a value in idem's
/// internal space ([`idem_core::key::is_internal_principal`], the `idem:` prefix), as the
/// shipped ones do: it would share a scope with a relay's keys.
pub trait ExtractPrincipal: fmt::Debug + Send + Sync + 'static {
    /// The principal, or `Ok(None)` for an anonymous scope.
    ///
    /// # Errors
    /// [`PrincipalRejection`] refuses the request: `401`, or `400` for a credential sent
    /// more than once.
    fn principal(&self, parts: &Parts) -> Result<Option<String>, PrincipalRejection>;
}

/// No principal: every caller shares the namespace's keys, so two callers who pick the same
/// key see each other's answers. Only for single-tenant services; the default of
/// [`IdempotencyConfig`](crate::IdempotencyConfig), whose `Debug` output says so.
#[derive(Clone, Copy, Default)]
pub struct NoPrincipal;

impl fmt::Debug for NoPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NoPrincipal (one key space shared by every caller)")
    }
}

impl ExtractPrincipal for NoPrincipal {
    fn principal(&self, _parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        Ok(None)
    }
}

/// The principal is a header's value (an API key, a tenant token), stored only as
/// [`credential_principal`], the same principal the gateway's `from = "header"` stores.
///
/// Use a credential that stays the same across a client's retries. A short-lived bearer token
/// is a poor principal: refreshed between two attempts, the retry lands in another scope and
/// runs again.
#[derive(Clone, Debug)]
pub struct HeaderPrincipal {
    name: HeaderName,
    required: bool,
}

impl HeaderPrincipal {
    /// Reads `name`; a request without it is anonymous.
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
            required: false,
        }
    }

    /// Refuses requests without the header (401) instead of treating them as anonymous.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// The header read.
    pub fn header(&self) -> &HeaderName {
        &self.name
    }

    /// Whether a request without the header is refused.
    pub fn is_required(&self) -> bool {
        self.required
    }
}

impl ExtractPrincipal for HeaderPrincipal {
    fn principal(&self, parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        let mut values = parts.headers.get_all(&self.name).iter();
        match (values.next(), values.next()) {
            (Some(_), Some(_)) => Err(PrincipalRejection::Ambiguous(format!(
                "more than one {} header: send the credential once",
                self.name
            ))),
            // An empty value is no credential at all.
            (Some(v), None) if !v.is_empty() => Ok(Some(credential_principal(v.as_bytes()))),
            _ if self.required => Err(PrincipalRejection::Unauthenticated(format!(
                "the {} header is required",
                self.name
            ))),
            _ => Ok(None),
        }
    }
}

/// A principal set by the application's own authentication, as a request extension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads the principal from a request extension of type `T` (by default [`Principal`]) that
/// the application's auth middleware inserted. Put the auth layer *outside* this one.
///
/// A request without the extension is refused (401): an authenticated route must not fall
/// back to a shared anonymous scope.
pub struct ExtensionPrincipal<T = Principal> {
    _t: PhantomData<fn() -> T>,
}

impl<T> ExtensionPrincipal<T> {
    /// Reads extension `T`.
    pub fn new() -> Self {
        Self { _t: PhantomData }
    }
}

impl<T> Default for ExtensionPrincipal<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionPrincipal<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionPrincipal<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionPrincipal<{}>", std::any::type_name::<T>())
    }
}

impl<T: fmt::Display + Send + Sync + Clone + 'static> ExtractPrincipal for ExtensionPrincipal<T> {
    fn principal(&self, parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        match parts.extensions.get::<T>() {
            Some(p) => {
                let p = p.to_string();
                // A principal in the internal space would share a scope with a relay's keys.
                if is_internal_principal(&p) {
                    return Err(PrincipalRejection::Unauthenticated(format!(
                        "the principal starts with the reserved `{INTERNAL_PRINCIPAL_PREFIX}`"
                    )));
                }
                Ok(Some(p))
            }
            None => Err(PrincipalRejection::Unauthenticated(
                "the request is not authenticated".into(),
            )),
        }
    }
}

/// Computes a request's fingerprint from its head and buffered body.
pub trait FingerprintRequest: fmt::Debug + Send + Sync + 'static {
    /// The fingerprint. Must be deterministic.
    ///
    /// # Errors
    /// [`AmbiguousBody`] when the body can be read two ways (a JSON object naming a member
    /// twice): two requests that mean different things to the handler could share one
    /// fingerprint. The layer answers `400` (`body-ambiguous`) and nothing runs.
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Fingerprint, AmbiguousBody>;
}

/// A request body that could mean two things to two readers, such as a JSON object that
/// names a member twice (one parser keeps the first, another the last).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AmbiguousBody(pub String);

impl AmbiguousBody {
    /// The ambiguity `error` describes, if it is one (anything else is not JSON at all).
    pub fn from_json_error(error: &FingerprintError) -> Option<Self> {
        match error {
            FingerprintError::DuplicateMember(_) => Some(Self(error.to_string())),
            _ => None,
        }
    }
}

fn route(parts: &Parts) -> &str {
    parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
}

/// Method + path and query + the canonical form of a JSON body, so member order and
/// whitespace do not change it; a body that is not JSON is hashed as raw bytes, and a JSON
/// body that names a member twice is refused ([`AmbiguousBody`]).
#[derive(Clone, Debug, Default)]
pub struct CanonicalJson {
    version: u16,
    fields: JsonFields,
}

impl CanonicalJson {
    /// Version 1, every field.
    pub fn new() -> Self {
        Self {
            version: 1,
            fields: JsonFields::all(),
        }
    }

    /// Fingerprint version: bump it together with a new namespace when what is hashed changes.
    #[must_use]
    pub fn version(mut self, version: u16) -> Self {
        self.version = version;
        self
    }

    /// Which JSON fields count (include/exclude lists of dotted paths).
    #[must_use]
    pub fn fields(mut self, fields: JsonFields) -> Self {
        self.fields = fields;
        self
    }
}

impl FingerprintRequest for CanonicalJson {
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Fingerprint, AmbiguousBody> {
        let method = parts.method.as_str();
        if !body.is_empty() {
            match Fingerprint::http_json(self.version, method, route(parts), body, &self.fields) {
                Ok(fp) => return Ok(fp),
                Err(e) => {
                    if let Some(ambiguous) = AmbiguousBody::from_json_error(&e) {
                        return Err(ambiguous);
                    }
                }
            }
        }
        Ok(Fingerprint::http_raw(
            self.version,
            method,
            route(parts),
            body,
        ))
    }
}

/// Method + path and query + the raw body bytes.
#[derive(Clone, Debug)]
pub struct RawBody {
    version: u16,
}

impl Default for RawBody {
    fn default() -> Self {
        Self { version: 1 }
    }
}

impl RawBody {
    /// Version 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fingerprint version.
    #[must_use]
    pub fn version(mut self, version: u16) -> Self {
        self.version = version;
        self
    }
}

impl FingerprintRequest for RawBody {
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Fingerprint, AmbiguousBody> {
        Ok(Fingerprint::http_raw(
            self.version,
            parts.method.as_str(),
            route(parts),
            body,
        ))
    }
}

/// What to do with a handler's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreDecision {
    /// Keep it and replay it to every retry.
    Store,
    /// Keep nothing; release the claim as this kind.
    Release(ReleaseKind),
}

/// What a [`StorePolicy`] sees of a handler's answer: its status, headers and extensions (the
/// typed notes a carrier attached: the [`Problem`](crate::Problem) of an answer idem made
/// itself, a [`GrpcCode`] the idem gateway read from trailers it holds), and its trailers
/// where they are known when the decision is made (the gRPC layer reads the whole answer
/// first; the HTTP layer decides on the head, before the body).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct AnswerHead<'a> {
    /// The HTTP status.
    pub status: StatusCode,
    /// The head's fields.
    pub headers: &'a HeaderMap,
    /// The answer's extensions.
    pub extensions: &'a Extensions,
    /// The trailers, where they are known.
    pub trailers: Option<&'a HeaderMap>,
}

impl<'a> AnswerHead<'a> {
    /// The head of an answer with `status`, `headers` and `extensions`, trailers not known.
    pub fn new(status: StatusCode, headers: &'a HeaderMap, extensions: &'a Extensions) -> Self {
        Self {
            status,
            headers,
            extensions,
            trailers: None,
        }
    }

    /// The head of the answer `parts` describe.
    pub fn of(parts: &'a http::response::Parts) -> Self {
        Self::new(parts.status, &parts.headers, &parts.extensions)
    }

    /// The same head with its `trailers` known.
    #[must_use]
    pub fn with_trailers(mut self, trailers: &'a HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// Whether the answer is gRPC's (`content-type: application/grpc…`).
    pub fn is_grpc(&self) -> bool {
        idem_wire::header::is_grpc(self.headers)
    }

    /// The gRPC status the answer carries: a [`GrpcCode`] extension, else `grpc-status` in
    /// the head (a trailers-only answer) or the trailers; `None` when none says.
    pub fn grpc_status(&self) -> Option<GrpcCode> {
        self.extensions
            .get::<GrpcCode>()
            .copied()
            .or_else(|| GrpcCode::of_answer(self.headers, self.trailers))
    }

    /// The reason of an answer idem made itself (its [`Problem`](crate::Problem)); `None`
    /// for the handler's own answers, whatever their body says.
    pub fn reason(&self) -> Option<Reason> {
        self.extensions.get::<crate::Problem>().map(|p| p.reason)
    }
}

/// Decides, from the head of the handler's answer, whether it is kept for replay, released
/// for a retry to run, or held as unknown ([`StoreDecision::Release`] with
/// [`ReleaseKind::Unknown`]). The one classifier of answers every carrier uses: named
/// defaults are [`StoreUnless5xx`] for HTTP and idem-grpc's `StoreDeterministic` for gRPC.
pub trait StorePolicy: fmt::Debug + Send + Sync + 'static {
    /// The decision for `answer`.
    fn decide(&self, answer: &AnswerHead<'_>) -> StoreDecision;
}

/// The default: 2xx, 3xx and deterministic 4xx are stored; 401, 403, 408, 409 and 429
/// (rejected before running) and every 5xx are released so a retry runs again.
#[derive(Clone, Debug, Default)]
pub struct StoreUnless5xx {
    ambiguous_unknown: bool,
}

impl StoreUnless5xx {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// 502 and 504 (an upstream that may have acted) become *unknown* instead of released:
    /// for proxies in front of handlers that are not idempotent downstream.
    #[must_use]
    pub fn ambiguous_as_unknown(mut self) -> Self {
        self.ambiguous_unknown = true;
        self
    }
}

impl StoreUnless5xx {
    /// The decision for an answer with `status`: the table above.
    pub fn decide_status(&self, status: StatusCode) -> StoreDecision {
        match status.as_u16() {
            502 | 504 if self.ambiguous_unknown => StoreDecision::Release(ReleaseKind::Unknown),
            401 | 403 | 408 | 409 | 429 => StoreDecision::Release(ReleaseKind::Retryable),
            s if !(200..500).contains(&s) => StoreDecision::Release(ReleaseKind::Retryable),
            _ => StoreDecision::Store,
        }
    }
}

impl StorePolicy for StoreUnless5xx {
    fn decide(&self, answer: &AnswerHead<'_>) -> StoreDecision {
        self.decide_status(answer.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method("POST").uri("/charge");
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn header_key_refuses_two_headers_and_reads_aliases() {
        let plain = HeaderKey::new();
        assert_eq!(plain.extract(&parts(&[])), Ok(None));
        let k = plain
            .extract(&parts(&[("idempotency-key", "a")]))
            .expect("ok")
            .expect("some");
        assert_eq!(k.key.as_str(), "a");
        assert_eq!(
            plain.extract(&parts(&[("x-idempotency-key", "a")])),
            Ok(None)
        );
        assert_eq!(
            plain.extract(&parts(&[
                ("idempotency-key", "a"),
                ("idempotency-key", "a")
            ])),
            Err(KeyRejection::Multiple)
        );
        let aliased = HeaderKey::new().with_alias(X_IDEMPOTENCY_KEY);
        assert_eq!(
            aliased.extract(&parts(&[
                ("idempotency-key", "a"),
                ("x-idempotency-key", "b")
            ])),
            Err(KeyRejection::Multiple)
        );
        let k = aliased
            .extract(&parts(&[("x-idempotency-key", "b")]))
            .expect("ok")
            .expect("some");
        assert_eq!(
            (k.key.as_str(), k.echo.as_ref().map(|(h, _)| h.as_str())),
            ("b", Some("x-idempotency-key"))
        );
    }

    #[test]
    fn default_store_policy() {
        let p = StoreUnless5xx::new();
        for s in [200, 201, 204, 302, 400, 404, 422] {
            assert_eq!(
                p.decide_status(StatusCode::from_u16(s).expect("status")),
                StoreDecision::Store,
                "{s}"
            );
        }
        for s in [401, 403, 408, 409, 429, 500, 502, 503, 504] {
            let d = p.decide_status(StatusCode::from_u16(s).expect("status"));
            assert_eq!(d, StoreDecision::Release(ReleaseKind::Retryable), "{s}");
        }
        let held = StoreUnless5xx::new().ambiguous_as_unknown();
        assert_eq!(
            held.decide_status(StatusCode::BAD_GATEWAY),
            StoreDecision::Release(ReleaseKind::Unknown)
        );
        assert_eq!(
            held.decide_status(StatusCode::INTERNAL_SERVER_ERROR),
            StoreDecision::Release(ReleaseKind::Retryable)
        );
    }

    #[test]
    fn answer_heads_say_grpc_status_and_idem_reason() {
        let (mut headers, mut extensions) = (HeaderMap::new(), Extensions::new());
        let bare = AnswerHead::new(StatusCode::OK, &headers, &extensions);
        assert_eq!(
            (bare.is_grpc(), bare.grpc_status(), bare.reason()),
            (false, None, None)
        );
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("14"));
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        let late = AnswerHead::new(StatusCode::OK, &headers, &extensions).with_trailers(&trailers);
        assert!(late.is_grpc());
        assert_eq!(
            late.grpc_status(),
            Some(GrpcCode::Unavailable),
            "from the trailers"
        );
        // A carrier's typed note wins over what the fields say.
        extensions.insert(GrpcCode::NotFound);
        extensions.insert(crate::Problem::new(Reason::UpstreamTls, "d"));
        let noted = AnswerHead::new(StatusCode::OK, &headers, &extensions).with_trailers(&trailers);
        assert_eq!(noted.grpc_status(), Some(GrpcCode::NotFound));
        assert_eq!(noted.reason(), Some(Reason::UpstreamTls));
        assert_eq!(
            StoreUnless5xx::new().decide(&noted),
            StoreDecision::Store,
            "the HTTP default reads the status alone"
        );
    }

    #[test]
    fn principals_are_hashed_and_extensions_required() {
        let p = HeaderPrincipal::new(http::header::AUTHORIZATION);
        let got = p
            .principal(&parts(&[("authorization", "Bearer secret")]))
            .expect("ok")
            .expect("some");
        assert_eq!(got, credential_principal(b"Bearer secret"));
        assert_eq!(p.principal(&parts(&[])), Ok(None));
        assert!(p.clone().required().principal(&parts(&[])).is_err());
        // Two credentials: which one a service behind reads is its own choice, so neither
        // names the principal.
        let twice = p
            .principal(&parts(&[
                ("authorization", "Bearer a"),
                ("authorization", "Bearer b"),
            ]))
            .expect_err("ambiguous");
        assert!(
            matches!(twice, PrincipalRejection::Ambiguous(_)),
            "{twice:?}"
        );
        assert_eq!(
            (
                twice.reason().http_status(),
                twice.reason().slug(),
                twice.refusal()
            ),
            (
                StatusCode::BAD_REQUEST,
                "credential-ambiguous",
                Refusal::CredentialAmbiguous
            )
        );
        let e = ExtensionPrincipal::<Principal>::new();
        assert!(e.principal(&parts(&[])).is_err());
        let mut with = parts(&[]);
        with.extensions.insert(Principal("alice".into()));
        assert_eq!(e.principal(&with), Ok(Some("alice".into())));
        // An application's principal in the internal space would share a relay's scope.
        with.extensions
            .insert(Principal("idem:relay:orders".into()));
        assert!(e.principal(&with).is_err());
    }

    #[test]
    fn canonical_json_is_a_fixed_point_for_long_exponents() {
        // Regression, found by fuzz/canonical_json: without serde_json's `float_roundtrip`,
        // `49e49` canonicalised to a spelling that canonicalised to yet another number.
        let once = idem_core::canonical_json(b"\t49e49").expect("json");
        assert_eq!(idem_core::canonical_json(&once).expect("json"), once);
        let fp = CanonicalJson::new();
        assert_eq!(
            fp.fingerprint(&parts(&[]), b"49e49"),
            fp.fingerprint(&parts(&[]), b"4.9e50")
        );
    }

    #[test]
    fn canonical_json_ignores_order_but_not_route() {
        let fp = CanonicalJson::new();
        let a = fp.fingerprint(&parts(&[]), br#"{"a":1,"b":2}"#);
        assert_eq!(a, fp.fingerprint(&parts(&[]), b"{ \"b\":2,\n \"a\":1 }"));
        assert_ne!(a, fp.fingerprint(&parts(&[]), br#"{"a":1,"b":3}"#));
        let mut other = parts(&[]);
        other.uri = http::Uri::from_static("/refund");
        assert_ne!(a, fp.fingerprint(&other, br#"{"a":1,"b":2}"#));
        assert_ne!(
            RawBody::new().fingerprint(&parts(&[]), br#"{"a":1,"b":2}"#),
            RawBody::new().fingerprint(&parts(&[]), br#"{"b":2,"a":1}"#)
        );
    }
}
