//! Idempotency keys and the scope they live in.

use std::fmt;
use std::sync::Arc;

use thiserror::Error;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// Why a key, namespace or principal was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key was empty.
    #[error("idempotency key is empty")]
    Empty,
    /// The key was longer than [`MAX_KEY_LEN`] bytes.
    #[error("idempotency key is {len} bytes long; the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// Length of the refused key.
        len: usize,
    },
    /// The key held a byte outside printable ASCII.
    #[error("idempotency key has a byte outside printable ASCII (0x{byte:02x}) at offset {at}")]
    NotPrintable {
        /// The offending byte.
        byte: u8,
        /// Its offset.
        at: usize,
    },
    /// The key started or ended with a space, which HTTP would silently trim.
    #[error("idempotency key starts or ends with a space")]
    OuterSpace,
    /// A namespace was empty or not printable ASCII without spaces.
    #[error("namespace must be 1-255 printable ASCII characters without spaces")]
    BadNamespace,
}

/// A validated idempotency key: 1–255 printable ASCII characters (0x20–0x7E), no outer spaces.
///
/// Cheap to clone (shared text): a request's key is copied into claims, records and logs.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// Validates `raw` as a key.
    ///
    /// # Errors
    /// [`KeyError`] says which rule the input broke.
    pub fn new(raw: impl Into<String>) -> Result<Self, KeyError> {
        let raw = raw.into();
        validate_key(raw.as_bytes())?;
        Ok(Self(raw.into()))
    }

    /// Validates raw bytes as a key (header values arrive as bytes).
    ///
    /// # Errors
    /// [`KeyError`] says which rule the input broke.
    pub fn from_bytes(raw: &[u8]) -> Result<Self, KeyError> {
        validate_key(raw)?;
        // Validated as ASCII above, so this never allocates a replacement.
        Ok(Self(String::from_utf8_lossy(raw).into()))
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate_key(raw: &[u8]) -> Result<(), KeyError> {
    if raw.is_empty() {
        return Err(KeyError::Empty);
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: raw.len() });
    }
    if let Some((at, &byte)) = raw
        .iter()
        .enumerate()
        .find(|&(_, b)| !(0x20..=0x7e).contains(b))
    {
        return Err(KeyError::NotPrintable { byte, at });
    }
    if raw.first() == Some(&b' ') || raw.last() == Some(&b' ') {
        return Err(KeyError::OuterSpace);
    }
    Ok(())
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for Key {
    type Error = KeyError;
    fn try_from(raw: &str) -> Result<Self, KeyError> {
        Self::new(raw)
    }
}

/// Who and what a key belongs to: a namespace (route or business operation, e.g.
/// `payments.charge`) and an optional principal (user or tenant, usually a hash).
///
/// Keys in two scopes never meet: a caller can never receive another scope's response.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    // Shared text: a route's scope is cloned into every request's key.
    namespace: Arc<str>,
    principal: Option<Arc<str>>,
}

impl Scope {
    /// A scope with no principal.
    ///
    /// # Errors
    /// [`KeyError::BadNamespace`] unless the namespace is 1–255 printable ASCII characters
    /// without spaces.
    pub fn new(namespace: impl Into<String>) -> Result<Self, KeyError> {
        let namespace = namespace.into();
        let ok = !namespace.is_empty()
            && namespace.len() <= MAX_KEY_LEN
            && namespace.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !ok {
            return Err(KeyError::BadNamespace);
        }
        Ok(Self {
            namespace: namespace.into(),
            principal: None,
        })
    }

    /// The same scope narrowed to one principal. Any string is accepted; a credential should
    /// go through [`Scope::with_credential`] instead, so it is never stored.
    #[must_use]
    pub fn with_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(Arc::from(principal.into()));
        self
    }

    /// The same scope narrowed to the principal a credential stands for
    /// ([`credential_principal`]).
    #[must_use]
    pub fn with_credential(self, credential: &[u8]) -> Self {
        self.with_principal(credential_principal(credential))
    }

    /// The same scope narrowed to an internal principal ([`internal_principal`]): keys of
    /// idem's own components (a relay) that no caller's credential or claim can reach.
    #[must_use]
    pub fn with_internal(self, kind: &str, name: &str) -> Self {
        self.with_principal(internal_principal(kind, name))
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The principal, if any.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }
}

/// Derivation context of [`credential_principal`]. Changing it moves every credential-based
/// principal to a new scope, so records stored under the old one would no longer replay.
const CREDENTIAL_CONTEXT: &str = "idem gateway principal v1";

/// The stored principal for a credential (an API key, a tenant token): `h:` and 32 lowercase
/// hex digits of a blake3 key derivation. The one way every carrier turns a credential into
/// a principal, so the same credential lands on the same records whichever carrier it came
/// through; the credential itself is never stored.
///
/// A fixed derivation context, not an operator secret: instances sharing a store agree with
/// no secret to distribute, so no configuration slip can split or merge key spaces. The
/// context keeps the value from matching a plain hash of the credential kept elsewhere.
///
/// ```
/// let p = idem_core::key::credential_principal(b"sk_live_123");
/// assert!(p.starts_with("h:") && p.len() == 34 && !p.contains("sk_live"));
/// ```
pub fn credential_principal(credential: &[u8]) -> String {
    let mut h = blake3::Hasher::new_derive_key(CREDENTIAL_CONTEXT);
    h.update(credential);
    let digest = h.finalize();
    let mut out = String::with_capacity(34);
    out.push_str("h:");
    out.push_str(&hex::encode(&digest.as_bytes()[..16]));
    out
}

/// The prefix of every [`internal_principal`]. A credential principal starts with `h:`, so it
/// never carries it; principal sources that pass a caller's own text through (a JWT claim, an
/// application's extension) refuse a value that does ([`is_internal_principal`]).
pub const INTERNAL_PRINCIPAL_PREFIX: &str = "idem:";

/// The principal of one of idem's own components, `idem:<kind>:<name>` (a relay:
/// `idem:relay:orders`). It lives in a space no caller reaches: [`credential_principal`]
/// always answers `h:` and hex digits, and the shipped principal sources refuse any other
/// value starting with [`INTERNAL_PRINCIPAL_PREFIX`].
///
/// ```
/// use idem_core::key::{credential_principal, internal_principal, is_internal_principal};
/// let relay = internal_principal("relay", "orders");
/// assert_eq!(relay, "idem:relay:orders");
/// assert!(is_internal_principal(&relay));
/// assert!(!is_internal_principal(&credential_principal(relay.as_bytes())));
/// ```
pub fn internal_principal(kind: &str, name: &str) -> String {
    format!("{INTERNAL_PRINCIPAL_PREFIX}{kind}:{name}")
}

/// Whether `principal` lies in the internal space ([`internal_principal`]): a principal source
/// that reads a caller's text must refuse such a value, or that caller would share a scope
/// with one of idem's own components.
pub fn is_internal_principal(principal: &str) -> bool {
    principal.starts_with(INTERNAL_PRINCIPAL_PREFIX)
}

/// A key inside its scope: the unit the store keeps one record for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey {
    /// The scope.
    pub scope: Scope,
    /// The key.
    pub key: Key,
}

impl ScopedKey {
    /// Joins a scope and a key.
    pub fn new(scope: Scope, key: Key) -> Self {
        Self { scope, key }
    }

    /// A stable 32-byte digest of scope and key, for stores that want fixed-size ids.
    ///
    /// Each part is length-prefixed, so no two distinct scoped keys share an encoding.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"idem.scoped-key.v1");
        hash_scoped(&mut h, &self.scope, self.key.as_str());
        *h.finalize().as_bytes()
    }

    /// The digest as 64 lowercase hex characters.
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest())
    }
}

/// Feeds a scope and a key (or token) to `h`, each part length-prefixed and an absent
/// principal marked, so no two distinct (scope, key) pairs feed the same bytes.
pub(crate) fn hash_scoped(h: &mut blake3::Hasher, scope: &Scope, key: &str) {
    for part in [Some(scope.namespace()), scope.principal(), Some(key)] {
        match part {
            Some(p) => {
                h.update(&[1]);
                h.update(&(p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
    }
}

impl fmt::Display for ScopedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope.principal() {
            Some(p) => write!(f, "{}/{}/{}", self.scope.namespace(), p, self.key),
            None => write!(f, "{}/-/{}", self.scope.namespace(), self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(Key::new("a").is_ok());
        assert!(Key::new("x".repeat(255)).is_ok());
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert_eq!(
            Key::new("x".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            Key::new("a\tb"),
            Err(KeyError::NotPrintable { byte: 9, at: 1 })
        );
        assert!(matches!(Key::new("é"), Err(KeyError::NotPrintable { .. })));
        assert!(matches!(
            Key::from_bytes(b"a\x7f"),
            Err(KeyError::NotPrintable { .. })
        ));
        assert_eq!(Key::new(" a"), Err(KeyError::OuterSpace));
        assert!(Key::new("a b").is_ok());
    }

    #[test]
    fn credentials_become_fixed_hashed_principals() {
        // Pinned: a change here moves every stored credential-based record out of reach.
        assert_eq!(
            credential_principal(b"alice-secret"),
            credential_principal(b"alice-secret")
        );
        assert_ne!(
            credential_principal(b"alice-secret"),
            credential_principal(b"bob-secret")
        );
        let scope = Scope::new("ns")
            .expect("valid")
            .with_credential(b"alice-secret");
        assert_eq!(
            scope.principal(),
            Some(credential_principal(b"alice-secret").as_str())
        );
    }

    #[test]
    fn internal_principals_are_out_of_credentials_reach() {
        // Regression: a relay's scope was `credential_principal("relay:<name>")`, which an
        // HTTP caller reached by sending `relay:<name>` as its credential.
        let internal = Scope::new("ns")
            .expect("valid")
            .with_internal("relay", "rabbit");
        let caller = Scope::new("ns")
            .expect("valid")
            .with_credential(b"relay:rabbit");
        assert_ne!(internal, caller);
        assert_eq!(internal.principal(), Some("idem:relay:rabbit"));
        for credential in [&b"relay:rabbit"[..], b"idem:relay:rabbit", b"", b"\xff"] {
            assert!(!is_internal_principal(&credential_principal(credential)));
        }
    }

    #[test]
    fn scopes_do_not_collide() {
        let k = Key::new("k").expect("valid");
        let a = ScopedKey::new(
            Scope::new("ns").expect("valid").with_principal("ab"),
            k.clone(),
        );
        let b = ScopedKey::new(
            Scope::new("nsa").expect("valid").with_principal("b"),
            k.clone(),
        );
        let c = ScopedKey::new(Scope::new("ns").expect("valid"), k);
        assert_ne!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert!(Scope::new("").is_err());
        assert!(Scope::new("a b").is_err());
    }

    #[test]
    fn invalid_keys_are_refused_with_the_rule_they_break() {
        // Guards: malformed keys accepted (or "ignored") instead of refused with a precise reason.
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert_eq!(
            Key::new("k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            Key::new("a\nb"),
            Err(KeyError::NotPrintable { byte: b'\n', at: 1 })
        );
        assert_eq!(
            Key::from_bytes(b"ok\xff"),
            Err(KeyError::NotPrintable { byte: 0xff, at: 2 })
        );
        assert_eq!(Key::new("trailing "), Err(KeyError::OuterSpace));
        assert_eq!(Key::new(" leading"), Err(KeyError::OuterSpace));
        assert_eq!(Scope::new("has space"), Err(KeyError::BadNamespace));
        assert_eq!(Scope::new(""), Err(KeyError::BadNamespace));
        assert_eq!(Scope::new("n".repeat(256)), Err(KeyError::BadNamespace));
        // Edges that are valid.
        assert!(Key::new("k".repeat(255)).is_ok());
        assert!(Key::new("~ !").is_ok());
        let e = Key::new("a\tb").expect_err("tab");
        assert!(
            e.to_string().contains("0x09"),
            "the message names the byte: {e}"
        );
    }
}
