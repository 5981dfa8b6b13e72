//! [`RedisTokens`]: one-time tokens in Redis, one key per token, one script per operation.
//!
//! - Key `<prefix>tok:{<hex of the token's scoped digest>}`: the braces make the whole key
//!   its own hash tag, so every script touches one slot and runs on a Redis Cluster.
//! - The value is `L<bound><retention: 11 digits><payload>` while live and `C<PTTL when
//!   consumed>` once consumed (see `lua/token/common.lua`). The key never holds the token
//!   itself. The key's own expiry is the clock: it is set to TTL + retention at issue, the
//!   token has expired once the key has no more than the retention left, and the expiry
//!   reported is the key's `PEXPIRETIME` minus the retention (Redis 7.0 or later).
//! - **issue** is one script: `SET … NX PX` and `PEXPIRETIME` (the expiry reported is the
//!   key's expiry minus the retention, on the server clock).
//! - **consume** is one script: `PTTL` (an absent key is unknown at once), then
//!   `SET <marker> KEEPTTL GET` writes the consumed marker and reads the old value in one
//!   command; the script judges expiry and the bound payload and, when it refuses, puts the
//!   old value back. Redis runs it atomically, so of any number of concurrent consumers
//!   exactly one sees the live token, and nobody sees a refused consume's marker. The reply
//!   is the consumed value (the client reads the payload from it) or a small integer naming
//!   the refusal.
//! - On a single node (with [`RedisConfig::batching`], on by default) concurrent issues and
//!   consumes share one script call (see `coalesce.rs`); each is applied on its own, in
//!   order.
//! - **inspect** is one read-only script returning the value, `PEXPIRETIME` and the server
//!   time; the client reads the state.
//! - The key lives until expiry plus the retention ([`RedisTokens::retention`]), so expired
//!   and consumed tokens answer as such, then as unknown.

use std::fmt;
use std::io::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use idem_core::record::duration_ms;
use idem_core::token::{
    ConsumeOutcome, DEFAULT_RETENTION, IssueRequest, Issued, Token, TokenState, TokenStore,
};
use idem_core::{Scope, StoreError, Timestamp};
use redis::Value;

use crate::batch::malformed;
use crate::coalesce::Code;
use crate::config::RedisConfig;
use crate::lock::Scripts;
use crate::script::{Connection, NamedScript};

/// Longest retention accepted (a year).
const MAX_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);

/// The inspect script; consume lives with the batch script in [`crate::coalesce`].
fn inspect_script() -> &'static NamedScript {
    static SCRIPT: OnceLock<NamedScript> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let source = format!(
            "{}\n{}",
            include_str!("lua/token/common.lua"),
            include_str!("lua/token/inspect.lua")
        );
        NamedScript::new("token_inspect", &source)
    })
}

/// One-time tokens in Redis or a Redis Cluster. Cheap to clone (clones share a connection).
#[derive(Clone)]
pub struct RedisTokens {
    shared: Arc<Shared>,
}

struct Shared {
    /// Issues and consumes are coalesced on it.
    scripts: Scripts,
    retention: Duration,
}

impl fmt::Debug for RedisTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTokens")
            .field("prefix", &self.shared.scripts.prefix)
            .field("op_timeout", &self.shared.scripts.op_timeout)
            .field("retention", &self.shared.retention)
            .finish()
    }
}

impl RedisTokens {
    /// Connects with `config`'s target, key prefix and operation timeout (its other settings
    /// concern the record store).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] for an unreachable server, [`StoreError::Timeout`] if
    /// connecting takes too long.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let conn = Scripts::connect(&config).await?;
        Ok(Self::with_connection(conn, &config))
    }

    /// Tokens over an existing connection (a record store's, see
    /// [`crate::RedisStore::connection`]), with `config`'s prefix and operation timeout.
    pub fn with_connection(conn: Connection, config: &RedisConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                scripts: Scripts::new(conn, config),
                retention: DEFAULT_RETENTION,
            }),
        }
    }

    /// Keeps expired and consumed tokens for `retention` past their expiry (default
    /// [`DEFAULT_RETENTION`]), so they answer "expired" or "already used" rather than
    /// "unknown". Capped at a year.
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        let s = &self.shared;
        Self {
            shared: Arc::new(Shared {
                scripts: s.scripts.clone(),
                retention: retention.min(MAX_RETENTION),
            }),
        }
    }

    /// The Redis key holding `token` in `scope`.
    pub fn token_key(&self, scope: &Scope, token: &Token) -> String {
        let prefix = &self.shared.scripts.prefix;
        let mut digest = [0u8; 64];
        // 32 bytes always fit 64 hex digits.
        let _ = hex::encode_to_slice(token.digest(scope), &mut digest);
        let mut key = String::with_capacity(prefix.len() + 5 + digest.len() + 1);
        key.push_str(prefix);
        key.push_str("tok:{");
        key.extend(digest.iter().map(|&b| char::from(b)));
        key.push('}');
        key
    }
}

/// Offset of the payload in a live value: `L`, the bound flag, 11 digits of retention.
const PAYLOAD: usize = 13;

/// A token's stored value, as the scripts hand it back.
enum Stored {
    Live {
        retention: u64,
        payload: Option<Bytes>,
    },
    /// The key's PTTL when it was consumed.
    Consumed { left: u64 },
}

fn digits(text: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(malformed("token value"))
}

impl Stored {
    fn parse(value: Vec<u8>) -> Result<Self, StoreError> {
        match value.first() {
            Some(b'L') if value.len() >= PAYLOAD => {
                let retention = digits(&value[2..PAYLOAD])?;
                let payload = match value[1] {
                    b'1' => Some(Bytes::from(value).slice(PAYLOAD..)),
                    b'0' => None,
                    _ => return Err(malformed("token payload")),
                };
                Ok(Stored::Live { retention, payload })
            }
            Some(b'C') => Ok(Stored::Consumed {
                left: digits(&value[1..])?,
            }),
            _ => Err(malformed("token value")),
        }
    }
}

/// A reply that must be a time in milliseconds (`PEXPIRETIME`, the server clock).
fn millis(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(n) => u64::try_from(*n).map_err(|_| malformed("token time")),
        _ => Err(malformed("token time")),
    }
}

/// The live value `L<bound><retention><payload>`.
fn live_value(retention_ms: u64, payload: Option<&[u8]>) -> Vec<u8> {
    let body = payload.unwrap_or_default();
    let mut value = Vec::with_capacity(PAYLOAD + body.len());
    value.push(b'L');
    value.push(if payload.is_some() { b'1' } else { b'0' });
    // Writing to a Vec cannot fail.
    let _ = write!(value, "{retention_ms:011}");
    value.extend_from_slice(body);
    value
}

impl TokenStore for RedisTokens {
    async fn issue(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
        let token = Token::generate()?;
        let key = self.token_key(&req.scope, &token);
        // At least 1 ms, so the key outlives the token; at most a year (11 digits).
        let retention = duration_ms(self.shared.retention).max(1);
        let value = live_value(retention, req.payload.as_deref());
        let px = duration_ms(req.ttl).saturating_add(retention).to_string();
        let reply = self
            .shared
            .scripts
            .call(Code::Issue, &[key.as_bytes()], &[&value, px.as_bytes()])
            .await?;
        match reply {
            Value::Int(-1) => Err(StoreError::unavailable("token collision")),
            at => Ok(Issued {
                token,
                expires_at: Timestamp(millis(&at)?.saturating_sub(retention)),
            }),
        }
    }

    async fn consume(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> Result<ConsumeOutcome, StoreError> {
        let key = self.token_key(scope, token);
        let (flag, body): (&[u8], &[u8]) = match presented {
            Some(p) => (b"1", p),
            None => (b"0", b""),
        };
        Ok(
            match self
                .shared
                .scripts
                .call(Code::Consume, &[key.as_bytes()], &[flag, body])
                .await?
            {
                Value::BulkString(value) => match Stored::parse(value)? {
                    Stored::Live { payload, .. } => ConsumeOutcome::Consumed { payload },
                    Stored::Consumed { .. } => return Err(malformed("token reply")),
                },
                Value::Int(0) => ConsumeOutcome::Unknown,
                Value::Int(1) => ConsumeOutcome::AlreadyConsumed,
                Value::Int(2) => ConsumeOutcome::Expired,
                Value::Int(3) => ConsumeOutcome::Mismatch,
                _ => return Err(malformed("token reply")),
            },
        )
    }

    async fn inspect(&self, scope: &Scope, token: &Token) -> Result<TokenState, StoreError> {
        let key = self.token_key(scope, token);
        let s = &self.shared.scripts;
        let reply = s
            .script(inspect_script(), &[key.as_bytes()], &[], s.op_timeout)
            .await?;
        let (value, key_expiry, now) = match reply {
            Value::Int(0) => return Ok(TokenState::Unknown),
            Value::Array(items) => match <[Value; 3]>::try_from(items) {
                Ok([Value::BulkString(value), expiry, now]) => {
                    (value, millis(&expiry)?, millis(&now)?)
                }
                _ => return Err(malformed("token reply")),
            },
            _ => return Err(malformed("token reply")),
        };
        Ok(match Stored::parse(value)? {
            Stored::Consumed { left } => TokenState::Consumed {
                at: Timestamp(key_expiry.saturating_sub(left)),
            },
            Stored::Live { retention, payload } => {
                let expires_at = Timestamp(key_expiry.saturating_sub(retention));
                if now >= expires_at.0 {
                    TokenState::Expired { at: expires_at }
                } else {
                    TokenState::Live {
                        expires_at,
                        payload,
                    }
                }
            }
        })
    }
}
