//! [`RedisStore`]: idem's [`Store`] on Redis, one Lua script per operation.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use idem_core::record::duration_ms;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome, SettleOutcome,
};
use idem_core::{
    Fingerprint, Lease, OwnerId, Record, ReleaseKind, ScopedKey, StateKind, Store, StoreError,
    StoredResponse, TakeoverPolicy, Timestamp, decide,
};
use redis::{RedisError, Value};

use crate::codec::{
    Header, decode_record, encode_meta_tail, fingerprint_hex, holder_token, owner_hex,
};
use crate::config::{Durability, RedisConfig, Target};
use crate::script::{Connection, NamedScript, Timeouts, bounded};

macro_rules! record_script {
    ($name:literal) => {
        NamedScript::new(
            $name,
            concat!(
                include_str!("lua/prelude.lua"),
                include_str!(concat!("lua/", $name, ".lua"))
            ),
        )
    };
}

/// The record scripts, one per operation that writes.
struct Scripts {
    claim: NamedScript,
    renew: NamedScript,
    complete: NamedScript,
    release: NamedScript,
    resolve: NamedScript,
    delete: NamedScript,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: record_script!("claim"),
    renew: record_script!("renew"),
    complete: record_script!("complete"),
    release: record_script!("release"),
    resolve: record_script!("resolve"),
    delete: record_script!("delete"),
});

/// idem's store on a Redis node or a Redis Cluster. Cheap to clone.
///
/// Each record is one string key `<prefix>{<digest of scope and key>}`; the braces are a hash
/// tag, so every key a record will ever need lands in one cluster slot. Every write is a Lua
/// script run by `EVALSHA`; `get` is a plain `GET`; `list` scans keys (admin use only).
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Connection,
    prefix: String,
    op_timeout: Duration,
    admin_timeout: Duration,
    durability: Option<Durability>,
    tombstone_ms: Vec<u8>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("conn", &self.shared.conn)
            .field("prefix", &self.shared.prefix)
            .field("op_timeout", &self.shared.op_timeout)
            .field("durability", &self.shared.durability)
            .finish_non_exhaustive()
    }
}

fn redis_err(e: RedisError) -> StoreError {
    StoreError::unavailable(e)
}

fn malformed(what: &'static str) -> StoreError {
    StoreError::Codec(idem_core::record::CodecError(what))
}

fn int(v: Option<&Value>) -> Result<u64, StoreError> {
    match v {
        Some(Value::Int(n)) => {
            u64::try_from(*n).map_err(|_| malformed("negative number from script"))
        }
        _ => Err(malformed("unexpected script reply")),
    }
}

/// Longest lease or TTL passed to the scripts: 100 years. Deadlines then keep the 13 digits
/// the stored header's fixed width relies on.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

fn ms_arg(d: Duration) -> Vec<u8> {
    duration_ms(d).clamp(1, MAX_MS).to_string().into_bytes()
}

impl RedisStore {
    /// Connects with the defaults of [`RedisConfig::from_url`] and the key prefix `idem:`.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] for a refused URL or an unreachable server,
    /// [`StoreError::Timeout`] if connecting takes too long.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(RedisConfig::from_url(url).map_err(StoreError::unavailable)?).await
    }

    /// Connects with a configuration.
    ///
    /// # Errors
    /// As [`RedisStore::open`].
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let wait = config.durability.map_or(Duration::ZERO, |d| d.timeout);
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            response: config.op_timeout.max(config.admin_timeout) + wait,
        };
        let conn = match &config.target {
            Target::Single(url) => Connection::single(url, timeouts).await?,
            Target::Cluster(nodes) => Connection::cluster(nodes, timeouts).await?,
        };
        Ok(Self::with_connection(conn, config))
    }

    /// A store over an existing connection; `config`'s target is ignored.
    pub fn with_connection(conn: Connection, config: RedisConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                conn,
                prefix: config.prefix,
                op_timeout: config.op_timeout,
                admin_timeout: config.admin_timeout,
                durability: config.durability,
                tombstone_ms: ms_arg(config.tombstone_ttl),
            }),
        }
    }

    /// The connection, for other script users sharing it.
    pub fn connection(&self) -> &Connection {
        &self.shared.conn
    }

    /// The Redis key that holds `key`'s record.
    pub fn record_key(&self, key: &ScopedKey) -> String {
        let (prefix, digest) = (&self.shared.prefix, key.digest_hex());
        let mut rk = String::with_capacity(prefix.len() + digest.len() + 2);
        rk.push_str(prefix);
        rk.push('{');
        rk.push_str(&digest);
        rk.push('}');
        rk
    }

    /// The bound of one write: the op timeout, plus the replica wait in durability mode.
    fn write_limit(&self) -> Duration {
        self.shared.op_timeout + self.shared.durability.map_or(Duration::ZERO, |d| d.timeout)
    }

    async fn run(
        &self,
        script: &NamedScript,
        rk: &str,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        script
            .run(&self.shared.conn, &[rk.as_bytes()], args)
            .await
            .map_err(|e| {
                tracing::debug!(script = script.name(), error = %e, "redis script failed");
                redis_err(e)
            })
    }

    /// In durability mode, waits until enough replicas have this connection's writes.
    async fn wait_replicas(&self, rk: &str) -> Result<(), StoreError> {
        let Some(d) = self.shared.durability else {
            return Ok(());
        };
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(d.replicas).arg(duration_ms(d.timeout));
        let acked = match self
            .shared
            .conn
            .query_at_key(cmd, rk.as_bytes())
            .await
            .map_err(redis_err)?
        {
            Value::Int(n) => u32::try_from(n).unwrap_or(0),
            _ => return Err(malformed("unexpected WAIT reply")),
        };
        if acked < d.replicas {
            return Err(StoreError::Uncertain {
                acked,
                wanted: d.replicas,
            });
        }
        Ok(())
    }

    async fn claim_once(&self, req: &ClaimRequest, rk: &str) -> Result<ClaimOutcome, StoreError> {
        let fp = fingerprint_hex(&req.fingerprint);
        let owner = owner_hex(req.owner);
        let hold: &[u8] = if req.takeover == TakeoverPolicy::Hold {
            b"1"
        } else {
            b"0"
        };
        let tail = encode_meta_tail(&req.key, req.request_id.as_deref());
        let reply = self
            .run(
                &SCRIPTS.claim,
                rk,
                &[
                    fp.as_bytes(),
                    owner.as_bytes(),
                    &ms_arg(req.lease),
                    &ms_arg(req.ttl),
                    hold,
                    &tail,
                ],
            )
            .await?;
        let outcome = claim_outcome(reply, req)?;
        if let ClaimOutcome::Claimed { lease, .. } = &outcome
            && let Err(e) = self.wait_replicas(rk).await
        {
            // The handler will not run: give the claim back (best effort) so a retry can.
            let token = holder_token(lease.owner, lease.fence);
            let args: [&[u8]; 3] = [token.as_bytes(), b"r", &self.shared.tombstone_ms];
            if let Err(undo_err) = self.run(&SCRIPTS.release, rk, &args).await {
                tracing::warn!(key = %req.key, error = %undo_err, "could not release an uncertain claim; its lease will expire");
            }
            return Err(e);
        }
        Ok(outcome)
    }

    async fn settle(
        &self,
        script: &NamedScript,
        key: &ScopedKey,
        args: &[&[u8]],
        wait: bool,
    ) -> Result<SettleOutcome, StoreError> {
        let rk = self.record_key(key);
        let limit = if wait {
            self.write_limit()
        } else {
            self.shared.op_timeout
        };
        bounded(limit, async {
            let settled = match self.run(script, &rk, args).await? {
                Value::Int(1) => SettleOutcome::Settled,
                Value::Int(0) => SettleOutcome::Fenced,
                _ => return Err(malformed("unexpected script reply")),
            };
            if wait && settled == SettleOutcome::Settled {
                self.wait_replicas(&rk).await?;
            }
            Ok(settled)
        })
        .await
    }

    async fn scan_records(&self) -> Result<(Timestamp, Vec<Record>), StoreError> {
        let conn = &self.shared.conn;
        let now = server_now(conn).await?;
        let pattern = format!("{}{{*}}", glob_escape(&self.shared.prefix));
        let mut records = Vec::new();
        for node in conn.masters().await.map_err(redis_err)? {
            let node = node.as_ref().map(|(h, p)| (h.as_str(), *p));
            let mut cursor = 0u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(
                    conn.query_at_node(cmd, node).await.map_err(redis_err)?,
                )
                .map_err(|e| redis_err(e.into()))?;
                let gets: Vec<redis::Cmd> = keys
                    .iter()
                    .map(|k| redis::cmd("GET").arg(k).clone())
                    .collect();
                let reads = gets.iter().map(|cmd| conn.query(cmd));
                for value in futures::future::join_all(reads).await {
                    if let Value::BulkString(raw) = value.map_err(redis_err)?
                        && let Some(record) = decode_record(&raw)?
                    {
                        records.push(record);
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok((now, records))
    }
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

async fn server_now(conn: &Connection) -> Result<Timestamp, StoreError> {
    let (secs, micros): (u64, u64) =
        redis::from_redis_value(conn.query(&redis::cmd("TIME")).await.map_err(redis_err)?)
            .map_err(|e| redis_err(e.into()))?;
    Ok(Timestamp(secs * 1000 + micros / 1000))
}

/// Reads the claim script's reply (see `lua/claim.lua`).
fn claim_outcome(reply: Value, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let Value::Array(items) = reply else {
        return Err(malformed("unexpected claim reply"));
    };
    Ok(match int(items.first())? {
        0 => {
            let Some(Value::BulkString(raw)) = items.get(1) else {
                return Err(malformed("unexpected claim reply"));
            };
            found(raw, req.fingerprint)?
        }
        1 => ClaimOutcome::Busy {
            retry_after: Duration::from_millis(int(items.get(1))?),
        },
        2 => ClaimOutcome::Unknown,
        3 => ClaimOutcome::Claimed {
            lease: Lease {
                owner: req.owner,
                fence: int(items.get(1))?,
                deadline: Timestamp(int(items.get(2))?),
            },
            takeover: int(items.get(3))? == 1,
        },
        _ => return Err(malformed("unexpected claim reply")),
    })
}

/// A record the claim found and left alone: replay, unknown, or mismatch.
fn found(raw: &[u8], fingerprint: Fingerprint) -> Result<ClaimOutcome, StoreError> {
    let h = Header::parse(raw)?;
    let stored = h
        .fingerprint
        .ok_or(malformed("tombstone returned by claim"))?;
    if stored != fingerprint {
        return Ok(ClaimOutcome::Mismatch { stored });
    }
    match h.state {
        b'c' => Ok(ClaimOutcome::Done {
            response: StoredResponse::decode(&raw[h.meta.end..])?,
        }),
        b'u' => Ok(ClaimOutcome::Unknown),
        _ => Err(malformed(
            "claim left a processing record of the same fingerprint",
        )),
    }
}

impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let rk = self.record_key(&req.key);
        bounded(self.write_limit(), self.claim_once(req, &rk)).await
    }

    async fn renew(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let rk = self.record_key(key);
        let token = holder_token(owner, fence);
        bounded(self.shared.op_timeout, async {
            let reply = self
                .run(&SCRIPTS.renew, &rk, &[token.as_bytes(), &ms_arg(lease)])
                .await?;
            let Value::Array(items) = reply else {
                return Err(malformed("unexpected renew reply"));
            };
            Ok(match int(items.first())? {
                1 => RenewOutcome::Renewed {
                    deadline: Timestamp(int(items.get(1))?),
                },
                _ => RenewOutcome::Lost,
            })
        })
        .await
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let (token, body) = (holder_token(owner, fence), response.encode());
        let args: [&[u8]; 3] = [token.as_bytes(), &ms_arg(ttl), &body];
        self.settle(&SCRIPTS.complete, key, &args, true).await
    }

    async fn release(
        &self,
        key: &ScopedKey,
        owner: OwnerId,
        fence: u64,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let token = holder_token(owner, fence);
        let kind: &[u8] = if kind == ReleaseKind::Unknown {
            b"u"
        } else {
            b"r"
        };
        let args: [&[u8]; 3] = [token.as_bytes(), kind, &self.shared.tombstone_ms];
        self.settle(&SCRIPTS.release, key, &args, false).await
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let rk = self.record_key(key);
        bounded(self.shared.op_timeout, async {
            match self
                .shared
                .conn
                .query(redis::cmd("GET").arg(&rk))
                .await
                .map_err(redis_err)?
            {
                Value::BulkString(raw) => Ok(decode_record(&raw)?),
                Value::Nil => Ok(None),
                _ => Err(malformed("unexpected GET reply")),
            }
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let (now, mut records) = bounded(self.shared.admin_timeout, self.scan_records()).await?;
        records.retain(|r| decide::matches_filter(now, r, filter));
        records.sort_by_key(|r| r.created_at);
        records.truncate(filter.effective_limit());
        Ok(records)
    }

    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        let rk = self.record_key(key);
        let (mode, ttl, body): (&[u8], Vec<u8>, Vec<u8>) = match resolution {
            Resolution::Complete { response, ttl } => (b"c", ms_arg(*ttl), response.encode()),
            _ => (b"r", b"1".to_vec(), Vec::new()),
        };
        bounded(self.shared.op_timeout, async {
            let reply = self
                .run(
                    &SCRIPTS.resolve,
                    &rk,
                    &[mode, &ttl, &body, &self.shared.tombstone_ms],
                )
                .await?;
            let Value::Array(items) = reply else {
                return Err(malformed("unexpected resolve reply"));
            };
            Ok(match int(items.first())? {
                1 => ResolveOutcome::Resolved,
                0 => ResolveOutcome::NotFound,
                _ => {
                    let state = match items.get(1) {
                        Some(Value::BulkString(s)) if s == b"c" => StateKind::Completed,
                        _ => StateKind::Processing,
                    };
                    ResolveOutcome::NotResolvable { state }
                }
            })
        })
        .await
    }

    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let rk = self.record_key(key);
        bounded(self.shared.op_timeout, async {
            match self
                .run(&SCRIPTS.delete, &rk, &[&self.shared.tombstone_ms])
                .await?
            {
                Value::Int(n) => Ok(n == 1),
                _ => Err(malformed("unexpected delete reply")),
            }
        })
        .await
    }
}
