//! [`RedisTokens`]: one-time tokens in Redis, one key per token, one script per operation.
//!
//! - Key `<prefix>tok:{<hex of the token's scoped digest>}`: the braces make the whole key
//!   its own hash tag, so every script touches one slot and runs on a Redis Cluster.
//! - **issue** is `SET … NX PXAT` inside a script that reads the server clock (`TIME`).
//! - **consume** is one script: read, judge expiry on the server clock and the bound payload,
//!   and mark consumed (`SET … KEEPTTL`); Redis runs it atomically, so of any number of
//!   concurrent consumers exactly one sees the live token.
//! - **inspect** is one read-only script.
//! - The key lives until expiry plus the retention ([`RedisTokens::retention`]), so expired
//!   and consumed tokens answer as such, then as unknown.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use idem_core::record::duration_ms;
use idem_core::token::{
    ConsumeOutcome, DEFAULT_RETENTION, IssueRequest, Issued, Token, TokenState, TokenStore,
};
use idem_core::{Scope, StoreError, Timestamp};
use redis::Value;

use crate::batch::{malformed, redis_err};
use crate::config::{RedisConfig, Target};
use crate::script::{Connection, NamedScript, Timeouts, bounded};

/// Longest retention accepted (a year).
const MAX_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);

struct Scripts {
    issue: NamedScript,
    consume: NamedScript,
    inspect: NamedScript,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let common = include_str!("lua/token/common.lua");
        let with = |body: &str| format!("{common}\n{body}");
        Scripts {
            issue: NamedScript::new("token_issue", &with(include_str!("lua/token/issue.lua"))),
            consume: NamedScript::new(
                "token_consume",
                &with(include_str!("lua/token/consume.lua")),
            ),
            inspect: NamedScript::new(
                "token_inspect",
                &with(include_str!("lua/token/inspect.lua")),
            ),
        }
    })
}

/// One-time tokens in Redis or a Redis Cluster. Cheap to clone (clones share a connection).
#[derive(Clone)]
pub struct RedisTokens {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Connection,
    prefix: String,
    op_timeout: Duration,
    retention: Duration,
}

impl fmt::Debug for RedisTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTokens")
            .field("prefix", &self.shared.prefix)
            .field("op_timeout", &self.shared.op_timeout)
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
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            response: config.op_timeout,
        };
        let conn = match &config.target {
            Target::Single(url) => Connection::single(url, timeouts).await?,
            Target::Cluster(nodes) => Connection::cluster(nodes, timeouts).await?,
        };
        Ok(Self::with_connection(conn, &config))
    }

    /// Tokens over an existing connection (a record store's, see
    /// [`crate::RedisStore::connection`]), with `config`'s prefix and operation timeout.
    pub fn with_connection(conn: Connection, config: &RedisConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                conn,
                prefix: config.prefix.clone(),
                op_timeout: config.op_timeout,
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
                conn: s.conn.clone(),
                prefix: s.prefix.clone(),
                op_timeout: s.op_timeout,
                retention: retention.min(MAX_RETENTION),
            }),
        }
    }

    /// The Redis key holding `token` in `scope`.
    pub fn token_key(&self, scope: &Scope, token: &Token) -> String {
        format!(
            "{}tok:{{{}}}",
            self.shared.prefix,
            hex::encode(token.digest(scope))
        )
    }

    async fn run(
        &self,
        script: &NamedScript,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        bounded(self.shared.op_timeout, async {
            script
                .run(&self.shared.conn, &[key.as_bytes()], args)
                .await
                .map_err(redis_err)
        })
        .await
    }
}

fn int(v: Option<&Value>) -> Result<u64, StoreError> {
    match v {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| malformed("negative time")),
        Some(Value::BulkString(s)) => std::str::from_utf8(s)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(malformed("token time")),
        _ => Err(malformed("token time")),
    }
}

fn payload(bound: Option<&Value>, body: Option<&Value>) -> Result<Option<Bytes>, StoreError> {
    match (bound, body) {
        (Some(Value::BulkString(b)), Some(Value::BulkString(p))) if b == b"1" => {
            Ok(Some(Bytes::copy_from_slice(p)))
        }
        (Some(Value::BulkString(b)), _) if b == b"0" => Ok(None),
        _ => Err(malformed("token payload")),
    }
}

/// The first element of a script's array reply, and the reply.
fn tagged(reply: Value) -> Result<(Vec<u8>, Vec<Value>), StoreError> {
    let Value::Array(items) = reply else {
        return Err(malformed("token reply"));
    };
    match items.first() {
        Some(Value::BulkString(tag)) => Ok((tag.clone(), items)),
        _ => Err(malformed("token reply")),
    }
}

impl TokenStore for RedisTokens {
    async fn issue(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
        let token = Token::generate()?;
        let key = self.token_key(&req.scope, &token);
        let ttl = duration_ms(req.ttl).to_string();
        let retention = duration_ms(self.shared.retention).max(1).to_string();
        let (bound, body): (&[u8], &[u8]) = match &req.payload {
            Some(p) => (b"1", p),
            None => (b"0", b""),
        };
        let reply = self
            .run(
                &scripts().issue,
                &key,
                &[ttl.as_bytes(), retention.as_bytes(), bound, body],
            )
            .await?;
        match reply {
            Value::Int(-1) => Err(StoreError::unavailable("token collision")),
            other => Ok(Issued {
                token,
                expires_at: Timestamp(int(Some(&other))?),
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
        let (tag, items) = tagged(self.run(&scripts().consume, &key, &[flag, body]).await?)?;
        Ok(match tag.as_slice() {
            b"ok" => ConsumeOutcome::Consumed {
                payload: payload(items.get(1), items.get(2))?,
            },
            b"unknown" => ConsumeOutcome::Unknown,
            b"used" => ConsumeOutcome::AlreadyConsumed,
            b"expired" => ConsumeOutcome::Expired,
            b"mismatch" => ConsumeOutcome::Mismatch,
            _ => return Err(malformed("token reply")),
        })
    }

    async fn inspect(&self, scope: &Scope, token: &Token) -> Result<TokenState, StoreError> {
        let key = self.token_key(scope, token);
        let (tag, items) = tagged(self.run(&scripts().inspect, &key, &[]).await?)?;
        Ok(match tag.as_slice() {
            b"unknown" => TokenState::Unknown,
            b"used" => TokenState::Consumed {
                at: Timestamp(int(items.get(1))?),
            },
            b"expired" => TokenState::Expired {
                at: Timestamp(int(items.get(1))?),
            },
            b"live" => TokenState::Live {
                expires_at: Timestamp(int(items.get(1))?),
                payload: payload(items.get(2), items.get(3))?,
            },
            _ => return Err(malformed("token reply")),
        })
    }
}
