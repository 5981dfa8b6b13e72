//! The principal a key belongs to, per route: none, a header's credential (stored as
//! [`idem_core::key::credential_principal`], through idem-http's
//! [`HeaderPrincipal`](idem_http::HeaderPrincipal)), or a verified JWT claim.
//!
//! Two callers' keys never meet: the principal is part of the record's scope.
//!
//! A route's `principal` table as written ([`RawPrincipal`]) and as checked
//! ([`PrincipalSource`], which `config` compiles) live here, beside the code that reads a
//! request's principal with them.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use http::HeaderName;
use http::request::Parts;
use idem_http::policy::{ExtractPrincipal, PrincipalRejection};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `principal.from` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrincipalFrom {
    /// No principal: keys are not scoped by caller.
    None,
    /// A header, such as an API key (stored hashed).
    Header,
    /// A verified JWT claim.
    Jwt,
}

/// Where the principal comes from.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrincipal {
    /// `none`, `header` or `jwt` (default `header` when `header` is set).
    pub from: Option<PrincipalFrom>,
    /// The header to read (default `authorization` for jwt; required for `header`).
    pub header: Option<String>,
    /// Whether a request without a principal gets 401 (default: true unless `from = "none"`).
    pub required: Option<bool>,
    /// HS256 shared secret.
    pub hs256_secret: Option<String>,
    /// RS256 public key, PEM text.
    pub rs256_public_key: Option<String>,
    /// RS256 public key, PEM file.
    pub rs256_public_key_file: Option<PathBuf>,
    /// The claim naming the principal (default `sub`).
    pub claim: Option<String>,
    /// Required `iss`.
    pub issuer: Option<String>,
    /// Required `aud`.
    pub audience: Option<String>,
}

/// Where a route's principal comes from.
#[derive(Debug, Clone)]
pub enum PrincipalSource {
    /// No principal: keys are shared by every caller of the route.
    None,
    /// A header's credential, stored only as its principal hash.
    Header(idem_http::HeaderPrincipal),
    /// The claim of a verified JWT.
    Jwt(Arc<JwtSettings>),
}

/// A JWT principal source.
#[derive(Debug)]
pub struct JwtSettings {
    /// Header carrying `Bearer <token>`.
    pub header: HeaderName,
    /// Missing token is 401.
    pub required: bool,
    /// Key kind, for `check-config`.
    pub key: JwtKey,
    /// The verifier.
    pub verifier: JwtVerifier,
}

/// Which key verifies tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtKey {
    /// HMAC-SHA256 shared secret.
    Hs256,
    /// RSA-SHA256 public key.
    Rs256,
}

impl ExtractPrincipal for PrincipalSource {
    fn principal(&self, parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        match self {
            Self::None => Ok(None),
            Self::Header(header) => header.principal(parts),
            Self::Jwt(jwt) => {
                let mut values = parts.headers.get_all(&jwt.header).iter();
                let (value, again) = (values.next(), values.next());
                // Verifying one token while the upstream reads the other would act for a
                // principal nobody checked.
                if again.is_some() {
                    return Err(PrincipalRejection::Ambiguous(format!(
                        "more than one {} header: send the credential once",
                        jwt.header
                    )));
                }
                let Some(value) = value else {
                    return if jwt.required {
                        Err(rejection(format!(
                            "missing credentials in `{}`",
                            jwt.header
                        )))
                    } else {
                        Ok(None)
                    };
                };
                let text = value
                    .to_str()
                    .map_err(|_| rejection("invalid credentials: token is not ASCII"))?
                    .trim();
                let token = match text.split_once(' ') {
                    Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
                    Some(_) => {
                        return Err(rejection("invalid credentials: expected `Bearer <token>`"));
                    }
                    None => text,
                };
                jwt.verifier.verify(token).map(Some)
            }
        }
    }
}

fn rejection(detail: impl Into<String>) -> PrincipalRejection {
    PrincipalRejection::Unauthenticated(detail.into())
}

/// Verifies JWTs with one key and reads the principal from one claim.
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    claim: String,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.validation.algorithms)
            .field("claim", &self.claim)
            .finish()
    }
}

impl JwtVerifier {
    /// A verifier for HS256 tokens signed with `secret`.
    ///
    /// # Errors
    /// The JWT library refuses the secret.
    pub fn hs256(secret: &[u8], p: &RawPrincipal) -> anyhow::Result<Self> {
        let key = DecodingKey::from_secret(secret).map_err(|e| anyhow!("{e}"))?;
        Ok(Self::with(key, Algorithm::HS256, p))
    }

    /// A verifier for RS256 tokens, from a PEM public key.
    ///
    /// # Errors
    /// The PEM is not an RSA public key.
    pub fn rs256(pem: &[u8], p: &RawPrincipal) -> anyhow::Result<Self> {
        let key = DecodingKey::from_rsa_pem(pem)
            .map_err(|e| anyhow!("{e}"))
            .context("the RS256 public key is not a PEM-encoded RSA public key")?;
        Ok(Self::with(key, Algorithm::RS256, p))
    }

    fn with(key: DecodingKey, alg: Algorithm, p: &RawPrincipal) -> Self {
        let mut validation = Validation::new(alg);
        // `exp` and `nbf` both, with one leeway for clocks a little apart.
        validation.leeway = 5;
        validation.validate_nbf = true;
        match &p.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &p.issuer {
            validation.set_issuer(&[iss]);
        }
        Self {
            key,
            validation,
            claim: p.claim.clone().unwrap_or_else(|| "sub".into()),
        }
    }

    /// The claim that names the principal.
    pub fn claim(&self) -> &str {
        &self.claim
    }

    /// Whether a token must carry the configured `aud`.
    pub fn checks_audience(&self) -> bool {
        self.validation.validate_aud && self.validation.aud.is_some()
    }

    /// Whether a token must carry the configured `iss`.
    pub fn checks_issuer(&self) -> bool {
        self.validation.iss.is_some()
    }

    /// Verifies `token` (signature, algorithm, `exp`, `nbf` when present, and `iss`/`aud`
    /// when configured) and returns the principal claim.
    ///
    /// # Errors
    /// A rejection naming what failed.
    pub fn verify(&self, token: &str) -> Result<String, PrincipalRejection> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(
            token,
            &self.key,
            &self.validation,
        )
        .map_err(|e| rejection(format!("invalid credentials: token rejected: {e}")))?;
        match data.claims.get(&self.claim) {
            // A claim in the internal space would share a scope with a relay's keys.
            Some(Value::String(s)) if idem_core::key::is_internal_principal(s) => {
                Err(rejection(format!(
                    "invalid credentials: the `{}` claim starts with the reserved `{}`",
                    self.claim,
                    idem_core::key::INTERNAL_PRINCIPAL_PREFIX
                )))
            }
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(rejection(format!(
                "invalid credentials: token has no `{}` claim",
                self.claim
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::{HeaderName, HeaderValue};
    use jsonwebtoken::{EncodingKey, Header};

    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn jwt_source(p: RawPrincipal) -> PrincipalSource {
        PrincipalSource::Jwt(Arc::new(JwtSettings {
            header: HeaderName::from_static("authorization"),
            required: true,
            key: JwtKey::Hs256,
            verifier: JwtVerifier::hs256(SECRET.as_bytes(), &p).expect("key"),
        }))
    }

    fn token(claims: Value, secret: &str) -> String {
        jsonwebtoken::encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()).expect("key"),
        )
        .expect("encode")
    }

    fn headers(name: &'static str, value: &str) -> Parts {
        let mut parts = http::Request::new(()).into_parts().0;
        parts
            .headers
            .insert(name, HeaderValue::from_str(value).expect("value"));
        parts
    }

    fn none() -> Parts {
        http::Request::new(()).into_parts().0
    }

    fn extract(src: &PrincipalSource, parts: &Parts) -> Result<Option<String>, PrincipalRejection> {
        src.principal(parts)
    }

    fn invalid(r: Result<Option<String>, PrincipalRejection>) -> bool {
        matches!(r, Err(PrincipalRejection::Unauthenticated(m)) if m.starts_with("invalid credentials"))
    }

    fn exp() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            + 600
    }

    #[test]
    fn header_principals_are_hashed_and_distinct() {
        let src = PrincipalSource::Header(
            idem_http::HeaderPrincipal::new(HeaderName::from_static("x-api-key")).required(),
        );
        let a = extract(&src, &headers("x-api-key", "alice-secret"))
            .expect("ok")
            .expect("some");
        let b = extract(&src, &headers("x-api-key", "bob-secret"))
            .expect("ok")
            .expect("some");
        assert_ne!(a, b);
        // The one scheme the library, the gateway and the admin API share.
        assert_eq!(a, idem_core::key::credential_principal(b"alice-secret"));
        assert!(extract(&src, &none()).is_err());
        assert!(extract(&src, &headers("x-api-key", "")).is_err(), "empty");
    }

    #[test]
    fn jwt_claims_in_the_internal_space_are_refused() {
        // Regression guard: a signed `sub` of `idem:relay:orders` would share the relay's
        // scope, as `x-api-key: relay:orders` once did.
        let src = jwt_source(RawPrincipal::default());
        let inside = token(
            serde_json::json!({"sub": idem_core::key::internal_principal("relay", "orders"), "exp": exp()}),
            SECRET,
        );
        assert!(invalid(extract(
            &src,
            &headers("authorization", &format!("Bearer {inside}"))
        )));
    }

    // Regression: `nbf` was not checked, so a token minted to start later (a pre-issued
    // credential, or one meant for a window not open yet) was accepted at once.
    #[test]
    fn jwts_not_yet_valid_are_refused_with_the_leeway_of_exp() {
        let src = jwt_source(RawPrincipal::default());
        let now = exp() - 600;
        let bearer = |nbf: u64| {
            let t = token(
                serde_json::json!({"sub": "alice", "exp": now + 1200, "nbf": nbf}),
                SECRET,
            );
            headers("authorization", &format!("Bearer {t}"))
        };
        let later = extract(&src, &bearer(now + 600));
        assert!(
            invalid(later.clone()),
            "a token valid only from later: {later:?}"
        );
        // Within the 5 s leeway `exp` has: clocks a little apart still agree.
        assert_eq!(extract(&src, &bearer(now + 2)), Ok(Some("alice".into())));
        assert_eq!(extract(&src, &bearer(now - 60)), Ok(Some("alice".into())));
    }

    #[test]
    fn jwts_are_verified() {
        let src = jwt_source(RawPrincipal {
            audience: Some("idem".into()),
            ..RawPrincipal::default()
        });
        let good = token(
            serde_json::json!({"sub": "alice", "exp": exp(), "aud": "idem"}),
            SECRET,
        );
        assert_eq!(
            extract(&src, &headers("authorization", &format!("Bearer {good}"))),
            Ok(Some("alice".into()))
        );
        let forged = token(
            serde_json::json!({"sub": "alice", "exp": exp(), "aud": "idem"}),
            "another-secret-another-secret-xx",
        );
        assert!(invalid(extract(
            &src,
            &headers("authorization", &format!("Bearer {forged}"))
        )));
        let expired = token(
            serde_json::json!({"sub": "alice", "exp": 1000, "aud": "idem"}),
            SECRET,
        );
        assert!(invalid(extract(
            &src,
            &headers("authorization", &format!("Bearer {expired}"))
        )));
        let wrong_aud = token(
            serde_json::json!({"sub": "alice", "exp": exp(), "aud": "other"}),
            SECRET,
        );
        assert!(
            extract(
                &src,
                &headers("authorization", &format!("Bearer {wrong_aud}"))
            )
            .is_err()
        );
        let no_sub = token(serde_json::json!({"exp": exp(), "aud": "idem"}), SECRET);
        assert!(extract(&src, &headers("authorization", &format!("Bearer {no_sub}"))).is_err());
        assert!(matches!(
            extract(&src, &none()),
            Err(PrincipalRejection::Unauthenticated(m)) if m.starts_with("missing credentials")
        ));
        assert!(extract(&src, &headers("authorization", "Basic abc")).is_err());
    }
}
