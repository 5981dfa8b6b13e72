//! The principal a key belongs to: a hashed header value or a verified JWT claim.
//!
//! Two callers' keys never meet: the principal is part of the record's scope.

use std::fmt;

use anyhow::{Context as _, anyhow};
use http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::config::{PrincipalSource, RawPrincipal};

/// Why a request has no usable principal. Answered with 401.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    /// The route requires a principal and the request carried none.
    #[error("missing credentials in `{0}`")]
    Missing(String),
    /// The credential was present but not acceptable.
    #[error("invalid credentials: {0}")]
    Invalid(String),
}

/// Finds the principal of a request, per the route's source. `Ok(None)`: no principal.
///
/// # Errors
/// [`PrincipalError`] when a required principal is missing or a token does not verify.
pub fn extract(
    source: &PrincipalSource,
    headers: &HeaderMap,
) -> Result<Option<String>, PrincipalError> {
    match source {
        PrincipalSource::None => Ok(None),
        PrincipalSource::Header { name, required } => {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(_), Some(_)) => Err(PrincipalError::Invalid(format!(
                    "more than one `{name}` header"
                ))),
                (Some(v), None) if !v.as_bytes().is_empty() => {
                    Ok(Some(hash_credential(v.as_bytes())))
                }
                _ if *required => Err(PrincipalError::Missing(name.to_string())),
                _ => Ok(None),
            }
        }
        PrincipalSource::Jwt(jwt) => {
            let Some(value) = headers.get(&jwt.header) else {
                return if jwt.required {
                    Err(PrincipalError::Missing(jwt.header.to_string()))
                } else {
                    Ok(None)
                };
            };
            let text = value
                .to_str()
                .map_err(|_| PrincipalError::Invalid("token is not ASCII".into()))?
                .trim();
            let token = match text.split_once(' ') {
                Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
                Some(_) => return Err(PrincipalError::Invalid("expected `Bearer <token>`".into())),
                None => text,
            };
            jwt.verifier.verify(token).map(Some)
        }
    }
}

/// A credential's stand-in: a keyed blake3 digest, so the store never holds the credential.
pub fn hash_credential(value: &[u8]) -> String {
    let mut h = blake3::Hasher::new_derive_key("idem gateway principal v1");
    h.update(value);
    let digest = h.finalize();
    let mut out = String::with_capacity(34);
    out.push_str("h:");
    for b in &digest.as_bytes()[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
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
    /// Never for a secret; kept fallible like [`JwtVerifier::rs256`].
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
        validation.leeway = 5;
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

    /// Verifies `token` (signature, algorithm, `exp`, and `iss`/`aud` when configured) and
    /// returns the principal claim.
    ///
    /// # Errors
    /// [`PrincipalError::Invalid`] naming what failed.
    pub fn verify(&self, token: &str) -> Result<String, PrincipalError> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(
            token,
            &self.key,
            &self.validation,
        )
        .map_err(|e| PrincipalError::Invalid(format!("token rejected: {e}")))?;
        match data.claims.get(&self.claim) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            _ => Err(PrincipalError::Invalid(format!(
                "token has no `{}` claim",
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
    use crate::config::{JwtKey, JwtSettings};

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

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).expect("value"));
        h
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
        let src = PrincipalSource::Header {
            name: HeaderName::from_static("x-api-key"),
            required: true,
        };
        let a = extract(&src, &headers("x-api-key", "alice-secret"))
            .expect("ok")
            .expect("some");
        let b = extract(&src, &headers("x-api-key", "bob-secret"))
            .expect("ok")
            .expect("some");
        assert_ne!(a, b);
        assert!(!a.contains("alice"));
        assert_eq!(
            extract(&src, &HeaderMap::new()),
            Err(PrincipalError::Missing("x-api-key".into()))
        );
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
        assert!(matches!(
            extract(&src, &headers("authorization", &format!("Bearer {forged}"))),
            Err(PrincipalError::Invalid(_))
        ));
        let expired = token(
            serde_json::json!({"sub": "alice", "exp": 1000, "aud": "idem"}),
            SECRET,
        );
        assert!(matches!(
            extract(
                &src,
                &headers("authorization", &format!("Bearer {expired}"))
            ),
            Err(PrincipalError::Invalid(_))
        ));
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
            extract(&src, &HeaderMap::new()),
            Err(PrincipalError::Missing(_))
        ));
        assert!(extract(&src, &headers("authorization", "Basic abc")).is_err());
    }
}
