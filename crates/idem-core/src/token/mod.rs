//! Server-issued one-time tokens: the server hands out a token (when a form is rendered, a
//! checkout starts), the submit presents it, and the token is consumed atomically, so a double
//! submit runs once. A consumed token is never restored, even if the work it guarded fails.
//!
//! - [`Token`]: 256 bits from the operating system's RNG, written as 64 lowercase hex digits.
//! - [`TokenStore`]: issue, consume (one atomic step: exactly one of any number of concurrent
//!   consumers wins), inspect. [`MemoryTokens`] here; Redis and SQL stores in their crates;
//!   every store passes the token conformance suite in `idem-testkit`.
//! - A token lives in a [`Scope`]: a token issued to one principal (or for one namespace) is
//!   [`ConsumeOutcome::Unknown`] to every other, and stays usable by its owner.
//! - Stores keep only a digest of scope and token ([`Token::digest`]), never the token, so
//!   reading a store gives nobody a usable token.
//! - An optional **bound payload** (a cart hash, an amount) is fixed at issue; a consumer must
//!   present the same bytes, or the answer is [`ConsumeOutcome::Mismatch`] and the token stays
//!   unused. A token issued without a payload accepts any.
//! - After its TTL a token is [`ConsumeOutcome::Expired`], distinct from unknown, for as long
//!   as the store's *retention* keeps its row (consumed tokens too); after that it is unknown.
//!
//! ```
//! use std::time::Duration;
//!
//! use idem_core::token::{ConsumeOutcome, IssueRequest, MemoryTokens, TokenStore};
//! use idem_core::Scope;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tokens = MemoryTokens::new(10_000);
//! let scope = Scope::new("checkout.submit")?.with_credential(b"api-key-of-alice");
//! let issued = tokens
//!     .issue(&IssueRequest::new(scope.clone(), Duration::from_secs(600))?.bind(&b"cart:9f2c"[..])?)
//!     .await?;
//! let first = tokens.consume(&scope, &issued.token, Some(b"cart:9f2c")).await?;
//! assert!(matches!(first, ConsumeOutcome::Consumed { .. }));
//! let again = tokens.consume(&scope, &issued.token, Some(b"cart:9f2c")).await?;
//! assert_eq!(again, ConsumeOutcome::AlreadyConsumed);
//! # Ok(()) }
//! ```

mod memory;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use crate::key::Scope;
use crate::record::Timestamp;
use crate::store::StoreError;

pub use memory::MemoryTokens;

/// Random bytes in a token.
pub const TOKEN_BYTES: usize = 32;

/// Longest bound payload accepted, in bytes. A payload is meant to be a hash or a short
/// identifier, not a document.
pub const MAX_PAYLOAD: usize = 1024;

/// Longest TTL accepted at issue.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a store keeps an expired or consumed token by default, so it still answers
/// [`ConsumeOutcome::Expired`] or [`ConsumeOutcome::AlreadyConsumed`] rather than unknown.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Why a token, TTL or payload was refused before reaching a store.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The text is not 64 lowercase hex digits.
    #[error("token must be {} lowercase hex digits", TOKEN_BYTES * 2)]
    Malformed,
    /// The TTL was zero or above [`MAX_TTL`].
    #[error("token ttl must be between 1 ms and {} days", MAX_TTL.as_secs() / 86_400)]
    BadTtl,
    /// The bound payload was longer than [`MAX_PAYLOAD`].
    #[error("token payload is {len} bytes; the limit is {MAX_PAYLOAD}")]
    PayloadTooLong {
        /// Length of the refused payload.
        len: usize,
    },
}

/// A one-time token: [`TOKEN_BYTES`] bytes from the OS RNG as lowercase hex.
///
/// `Debug` shows only a prefix, so logs never carry a usable token.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh token from the operating system's RNG.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the OS has no randomness to give (no token is better
    /// than a guessable one).
    pub fn generate() -> Result<Self, StoreError> {
        let mut raw = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut raw).map_err(|e| StoreError::unavailable(e.to_string()))?;
        Ok(Self(hex::encode(raw).into()))
    }

    /// Parses a token a client presented.
    ///
    /// # Errors
    /// [`TokenError::Malformed`] unless `raw` is exactly 64 lowercase hex digits.
    pub fn parse(raw: &str) -> Result<Self, TokenError> {
        let ok = raw.len() == TOKEN_BYTES * 2
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return Err(TokenError::Malformed);
        }
        Ok(Self(raw.into()))
    }

    /// The token text, to hand to the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 32-byte id a store keeps the token under: a keyed digest of scope and token, each
    /// part length-prefixed, so the same token in two scopes has two unrelated ids.
    pub fn digest(&self, scope: &Scope) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key("idem one-time token v1");
        crate::key::hash_scoped(&mut h, scope, self.as_str());
        *h.finalize().as_bytes()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", &self.0[..8])
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to issue: the scope the token lives in, how long it stays usable, and an optional
/// payload the consumer must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueRequest {
    /// The scope; only a consumer in the same scope can use the token.
    pub scope: Scope,
    /// How long the token stays usable, judged on the store's clock.
    pub ttl: Duration,
    /// The bound payload, if any.
    pub payload: Option<Bytes>,
}

impl IssueRequest {
    /// A request for a token in `scope` that stays usable for `ttl`.
    ///
    /// # Errors
    /// [`TokenError::BadTtl`] if `ttl` is zero or above [`MAX_TTL`].
    pub fn new(scope: Scope, ttl: Duration) -> Result<Self, TokenError> {
        if ttl.is_zero() || ttl > MAX_TTL {
            return Err(TokenError::BadTtl);
        }
        Ok(Self {
            scope,
            ttl,
            payload: None,
        })
    }

    /// Binds a payload the consumer must present unchanged.
    ///
    /// # Errors
    /// [`TokenError::PayloadTooLong`] above [`MAX_PAYLOAD`] bytes.
    pub fn bind(mut self, payload: impl Into<Bytes>) -> Result<Self, TokenError> {
        let payload = payload.into();
        if payload.len() > MAX_PAYLOAD {
            return Err(TokenError::PayloadTooLong { len: payload.len() });
        }
        self.payload = Some(payload);
        Ok(self)
    }
}

/// A token just issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The token to hand out.
    pub token: Token,
    /// When it stops being usable (store clock).
    pub expires_at: Timestamp,
}

/// What a consume did. Only [`ConsumeOutcome::Consumed`] used the token up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumeOutcome {
    /// This call consumed the token; no other call ever will.
    Consumed {
        /// The bound payload, if the token had one.
        payload: Option<Bytes>,
    },
    /// No such token in this scope (never issued, issued to another scope, or forgotten
    /// after its retention).
    Unknown,
    /// The token's TTL ran out before it was used.
    Expired,
    /// Another call consumed the token first.
    AlreadyConsumed,
    /// The token is bound to a payload and the consumer presented different bytes (or none).
    /// The token stays usable.
    Mismatch,
}

impl ConsumeOutcome {
    /// The payload if consumed, otherwise the refusal as an error.
    ///
    /// # Errors
    /// Every outcome but [`ConsumeOutcome::Consumed`], as a [`TokenRefused`].
    pub fn into_result(self) -> Result<Option<Bytes>, TokenRefused> {
        match self {
            Self::Consumed { payload } => Ok(payload),
            Self::Unknown => Err(TokenRefused::Unknown),
            Self::Expired => Err(TokenRefused::Expired),
            Self::AlreadyConsumed => Err(TokenRefused::AlreadyConsumed),
            Self::Mismatch => Err(TokenRefused::Mismatch),
        }
    }
}

/// A token that could not be consumed, as an error (see [`ConsumeOutcome::into_result`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TokenRefused {
    /// See [`ConsumeOutcome::Unknown`].
    #[error("token unknown")]
    Unknown,
    /// See [`ConsumeOutcome::Expired`].
    #[error("token expired")]
    Expired,
    /// See [`ConsumeOutcome::AlreadyConsumed`].
    #[error("token already used")]
    AlreadyConsumed,
    /// See [`ConsumeOutcome::Mismatch`].
    #[error("token bound to a different payload")]
    Mismatch,
}

/// A token's state, read without changing it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenState {
    /// Usable until `expires_at`.
    Live {
        /// When it stops being usable (store clock).
        expires_at: Timestamp,
        /// The bound payload, if any.
        payload: Option<Bytes>,
    },
    /// Consumed at `at` (store clock).
    Consumed {
        /// When.
        at: Timestamp,
    },
    /// Expired unused at `at` (store clock).
    Expired {
        /// When.
        at: Timestamp,
    },
    /// No such token in this scope.
    Unknown,
}

/// Whether `presented` satisfies a token's `bound` payload: a token without one accepts any.
pub fn binding_matches(bound: Option<&[u8]>, presented: Option<&[u8]>) -> bool {
    match bound {
        None => true,
        Some(b) => presented == Some(b),
    }
}

/// Keeps one-time tokens. Every method is one atomic step judged on the store's clock.
pub trait TokenStore: Send + Sync + 'static {
    /// Stores a new token with `req`'s scope, TTL and payload.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed (the token may or may not have been stored;
    /// it was never handed out, so it is never used), or when the OS RNG failed.
    ///
    /// # Cancel safety
    /// Dropping the future may leave a stored token nobody knows; it expires unused.
    fn issue(&self, req: &IssueRequest) -> impl Future<Output = Result<Issued, StoreError>> + Send;

    /// Consumes `token` in `scope` if it is live, unused and `presented` satisfies its bound
    /// payload. Of any number of concurrent calls, exactly one gets
    /// [`ConsumeOutcome::Consumed`].
    ///
    /// # Errors
    /// [`StoreError`] when the store failed; the token may or may not have been consumed (a
    /// consumed token is never restored, so the caller must treat it as used).
    ///
    /// # Cancel safety
    /// As the error case: the consume may or may not have happened.
    fn consume(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> impl Future<Output = Result<ConsumeOutcome, StoreError>> + Send;

    /// Reads `token`'s state in `scope` without changing it.
    ///
    /// # Errors
    /// [`StoreError`] when the store failed.
    ///
    /// # Cancel safety
    /// Read-only: dropping the future changes nothing.
    fn inspect(
        &self,
        scope: &Scope,
        token: &Token,
    ) -> impl Future<Output = Result<TokenState, StoreError>> + Send;
}

impl<T: TokenStore> TokenStore for Arc<T> {
    fn issue(&self, req: &IssueRequest) -> impl Future<Output = Result<Issued, StoreError>> + Send {
        (**self).issue(req)
    }

    fn consume(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> impl Future<Output = Result<ConsumeOutcome, StoreError>> + Send {
        (**self).consume(scope, token, presented)
    }

    fn inspect(
        &self,
        scope: &Scope,
        token: &Token,
    ) -> impl Future<Output = Result<TokenState, StoreError>> + Send {
        (**self).inspect(scope, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_and_differ() {
        let a = Token::generate().expect("rng");
        let b = Token::generate().expect("rng");
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 64);
        assert_eq!(Token::parse(a.as_str()), Ok(a.clone()));
        assert!(!format!("{a:?}").contains(&a.as_str()[8..]));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(Token::parse(""), Err(TokenError::Malformed));
        assert_eq!(Token::parse(&"A".repeat(64)), Err(TokenError::Malformed));
        assert_eq!(Token::parse(&"a".repeat(63)), Err(TokenError::Malformed));
        assert_eq!(Token::parse(&"g".repeat(64)), Err(TokenError::Malformed));
        assert!(Token::parse(&"0".repeat(64)).is_ok());
    }

    #[test]
    fn digests_separate_scopes() {
        let t = Token::parse(&"ab".repeat(32)).expect("valid");
        let ns = Scope::new("a").expect("ns");
        let alice = ns.clone().with_principal("alice");
        let bob = ns.clone().with_principal("bob");
        assert_ne!(t.digest(&ns), t.digest(&alice));
        assert_ne!(t.digest(&alice), t.digest(&bob));
        assert_eq!(t.digest(&alice), t.digest(&alice.clone()));
    }

    #[test]
    fn requests_are_validated() {
        let s = Scope::new("ns").expect("ns");
        assert_eq!(
            IssueRequest::new(s.clone(), Duration::ZERO),
            Err(TokenError::BadTtl)
        );
        assert_eq!(
            IssueRequest::new(s.clone(), MAX_TTL + Duration::from_secs(1)),
            Err(TokenError::BadTtl)
        );
        let r = IssueRequest::new(s, Duration::from_secs(1)).expect("ok");
        assert_eq!(
            r.clone().bind(vec![0u8; MAX_PAYLOAD + 1]),
            Err(TokenError::PayloadTooLong {
                len: MAX_PAYLOAD + 1
            })
        );
        assert!(r.bind(vec![0u8; MAX_PAYLOAD]).is_ok());
    }

    #[test]
    fn binding_rule() {
        assert!(binding_matches(None, None));
        assert!(binding_matches(None, Some(b"x")));
        assert!(binding_matches(Some(b"x"), Some(b"x")));
        assert!(!binding_matches(Some(b"x"), Some(b"y")));
        assert!(!binding_matches(Some(b"x"), None));
        assert!(!binding_matches(Some(b""), None));
    }
}
