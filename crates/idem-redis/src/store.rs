//! [`RedisStore`]: idem's [`Store`] on Redis, one Lua script per operation.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use idem_core::audit::{AuditEvent, AuditLevel, AuditQuery};
use idem_core::record::duration_ms;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, ListFilter, RenewOutcome, Resolution, ResolveOutcome, SettleOutcome,
};
use idem_core::store::{Completion, Hold};
use idem_core::{
    Fingerprint, Lease, Record, ReleaseKind, ScopedKey, StateKind, Store, StoreError,
    StoredResponse, TakeoverPolicy, Timestamp, decide,
};
use redis::Value;

use crate::batch::{self, Batcher, Kind, Op, Reply, malformed, redis_err};
use crate::codec::{
    HOLDER_TOKEN_LEN, Header, decode_record, holder_token, meta_tail_len, parse_fence,
    push_decimal, push_hex, push_hex_str, push_holder_token, push_meta_tail,
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

/// Claim and complete are Lua functions (`lua/claim.lua`, `lua/complete.lua`) that both their
/// single script and the batch script call, so each operation is defined once.
macro_rules! function_script {
    ($name:literal, $call:literal) => {
        NamedScript::new(
            $name,
            concat!(
                include_str!("lua/prelude.lua"),
                include_str!("lua/text_single.lua"),
                include_str!(concat!("lua/", $name, ".lua")),
                $call
            ),
        )
    };
}

/// The record scripts, one per operation that writes, and the batch of claims and
/// completions.
struct Scripts {
    claim: NamedScript,
    renew: NamedScript,
    complete: NamedScript,
    release: NamedScript,
    resolve: NamedScript,
    delete: NamedScript,
    batch: NamedScript,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: function_script!(
        "claim",
        "return claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], KEYS[2], ARGV[7], ARGV[8])\n"
    ),
    renew: record_script!("renew"),
    complete: function_script!(
        "complete",
        "return complete(KEYS[1], ARGV[1], ARGV[2], ARGV[3], KEYS[2], ARGV[4], ARGV[5])\n"
    ),
    release: record_script!("release"),
    resolve: record_script!("resolve"),
    delete: record_script!("delete"),
    batch: NamedScript::new(
        "batch",
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/text_batch.lua"),
            include_str!("lua/claim.lua"),
            include_str!("lua/complete.lua"),
            include_str!("lua/batch.lua")
        ),
    ),
});

fn op_scripts() -> batch::Scripts<'static> {
    batch::Scripts {
        claim: &SCRIPTS.claim,
        complete: &SCRIPTS.complete,
        batch: &SCRIPTS.batch,
    }
}

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
    /// The `MAXLEN ~` of each audit stream, as the scripts take it.
    audit_max: Vec<u8>,
    /// Whether claims and completions record their routine events too (`1`, at
    /// [`AuditLevel::All`]) or leave them to the record (`0`), as the scripts take it.
    audit_all: &'static [u8],
    /// This process's instance id, for the events of resolves and deletes.
    instance: String,
    /// Coalesces claims and completions; `None` on a cluster or when batching is off.
    batcher: Option<Arc<Batcher>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("conn", &self.shared.conn)
            .field("prefix", &self.shared.prefix)
            .field("op_timeout", &self.shared.op_timeout)
            .field("durability", &self.shared.durability)
            .field("batching", &self.shared.batcher.is_some())
            .field("audit_all", &(self.shared.audit_all == b"1"))
            .finish_non_exhaustive()
    }
}

fn int(v: Option<&Value>) -> Result<u64, StoreError> {
    match v {
        Some(Value::Int(n)) => {
            u64::try_from(*n).map_err(|_| malformed("negative number from script"))
        }
        _ => Err(malformed("unexpected script reply")),
    }
}

/// A fence a script answers as the record's 20-digit field.
fn fence(v: Option<&Value>) -> Result<u64, StoreError> {
    match v {
        Some(Value::BulkString(raw)) => Ok(parse_fence(raw)?),
        _ => Err(malformed("unexpected script reply")),
    }
}

/// Longest lease or TTL passed to the scripts: 100 years. Deadlines then keep the 13 digits
/// the stored header's fixed width relies on.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

fn ms_arg(d: Duration) -> Vec<u8> {
    let mut out = Vec::with_capacity(13);
    push_ms(&mut out, d);
    out
}

fn push_ms(out: &mut Vec<u8>, d: Duration) {
    push_decimal(out, duration_ms(d).clamp(1, MAX_MS), 1);
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
            Target::Single(url) => Connection::single(url, timeouts, config.tls.as_ref()).await?,
            Target::Cluster(nodes) => {
                Connection::cluster(nodes, timeouts, config.tls.as_ref()).await?
            }
        };
        Ok(Self::with_connection(conn, config))
    }

    /// A store over an existing connection; `config`'s target is ignored.
    pub fn with_connection(conn: Connection, config: RedisConfig) -> Self {
        let wait = config.durability.map_or(Duration::ZERO, |d| d.timeout);
        let batcher = (config.batching && !conn.is_cluster()).then(|| {
            Arc::new(Batcher::new(
                conn.clone(),
                op_scripts(),
                config.batches_in_flight,
                config.op_timeout + wait,
                config.durability,
            ))
        });
        Self {
            shared: Arc::new(Shared {
                conn,
                prefix: config.prefix,
                op_timeout: config.op_timeout,
                admin_timeout: config.admin_timeout,
                durability: config.durability,
                tombstone_ms: ms_arg(config.tombstone_ttl),
                audit_max: config.audit_max_events.to_string().into_bytes(),
                audit_all: if config.audit_level == AuditLevel::All {
                    b"1"
                } else {
                    b"0"
                },
                instance: idem_core::audit::this_instance(),
                batcher,
            }),
        }
    }

    /// The connection, for other script users sharing it.
    pub fn connection(&self) -> &Connection {
        &self.shared.conn
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The Redis key that holds `key`'s record.
    pub fn record_key(&self, key: &ScopedKey) -> String {
        let (prefix, digest) = (&self.shared.prefix, key.digest());
        let mut rk = String::with_capacity(prefix.len() + 2 * digest.len() + 2);
        rk.push_str(prefix);
        rk.push('{');
        push_hex_str(&mut rk, &digest);
        rk.push('}');
        rk
    }

    /// The bound of one write: the op timeout, plus the replica wait in durability mode.
    fn write_limit(&self) -> Duration {
        self.shared.op_timeout + self.shared.durability.map_or(Duration::ZERO, |d| d.timeout)
    }

    /// Runs a record script on the record `rk` of `key`, with the key's audit stream.
    async fn run(
        &self,
        script: &NamedScript,
        key: &ScopedKey,
        rk: &str,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let stream = self.audit_stream(key);
        script
            .run(&self.shared.conn, &[rk.as_bytes(), stream.as_bytes()], args)
            .await
            .map_err(|e| {
                tracing::debug!(script = script.name(), error = %e, "redis script failed");
                redis_err(e)
            })
    }

    /// In durability mode, waits until enough replicas have this connection's writes.
    async fn wait_replicas(&self, rk: &str) -> Result<(), StoreError> {
        match self.shared.durability {
            Some(d) => batch::wait_replicas(&self.shared.conn, d, rk.as_bytes()).await,
            None => Ok(()),
        }
    }

    /// Runs a claim or completion: through the batcher when batching, else alone.
    async fn exec(&self, op: Op) -> Result<Reply, StoreError> {
        match &self.shared.batcher {
            Some(b) => b.submit(op).await,
            None => Ok(Reply {
                value: batch::run_alone(&self.shared.conn, &op_scripts(), &op).await?,
                waited: None,
            }),
        }
    }

    /// The replica wait after a write: done by its batch already, or now (in durability
    /// mode) on the master of `key`.
    async fn waited(
        &self,
        done: Option<Result<(), StoreError>>,
        key: &ScopedKey,
    ) -> Result<(), StoreError> {
        match done {
            Some(done) => done,
            None if self.shared.durability.is_some() => {
                self.wait_replicas(&self.record_key(key)).await
            }
            None => Ok(()),
        }
    }

    async fn claim_once(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        // The eight arguments of `lua/claim.lua`, written straight into one buffer.
        let tail_len = meta_tail_len(&req.key, req.request_id.as_deref());
        let mut op = Op::new(
            Kind::Claim,
            self.record_key(&req.key),
            self.audit_stream(&req.key),
            2 * 34 + 32 + 2 * 13 + 1 + tail_len + 10 + 1,
        );
        push_hex(op.buf(), &req.fingerprint.to_bytes());
        op.end_arg();
        push_hex(op.buf(), &req.owner.to_bytes());
        op.end_arg();
        push_ms(op.buf(), req.lease);
        op.end_arg();
        push_ms(op.buf(), req.ttl);
        op.end_arg();
        op.arg(if req.takeover == TakeoverPolicy::Hold {
            b"1"
        } else {
            b"0"
        });
        push_meta_tail(op.buf(), &req.key, req.request_id.as_deref());
        op.end_arg();
        op.arg(&self.shared.audit_max);
        op.arg(self.shared.audit_all);
        let reply = self.exec(op).await?;
        let outcome = claim_outcome(reply.value, req)?;
        if let ClaimOutcome::Claimed { lease, .. } = &outcome
            && let Err(e) = self.waited(reply.waited, &req.key).await
        {
            let rk = self.record_key(&req.key);
            // The handler will not run: give the claim back (best effort) so a retry can.
            let token = holder_token(lease.owner, lease.fence);
            let args: [&[u8]; 4] = [
                token.as_bytes(),
                b"r",
                &self.shared.tombstone_ms,
                &self.shared.audit_max,
            ];
            if let Err(undo_err) = self.run(&SCRIPTS.release, &req.key, &rk, &args).await {
                tracing::warn!(key = %req.key, error = %undo_err, "could not release an uncertain claim; its lease will expire");
            }
            return Err(e);
        }
        Ok(outcome)
    }

    async fn scan_records(&self) -> Result<(Timestamp, Vec<Record>), StoreError> {
        let conn = &self.shared.conn;
        let now = server_now(conn).await?;
        let pattern = format!("{}{{*}}", glob_escape(&self.shared.prefix));
        let keys: Vec<Vec<u8>> = conn.scan_keys(&pattern, None).await.map_err(redis_err)?;
        let mut records = Vec::new();
        for page in keys.chunks(1000) {
            let gets: Vec<redis::Cmd> = page
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
        }
        Ok((now, records))
    }
}

pub(crate) fn glob_escape(s: &str) -> String {
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

/// Reads a settling script's reply: 1 settled, 0 fenced.
fn settle_outcome(reply: &Value) -> Result<SettleOutcome, StoreError> {
    match reply {
        Value::Int(1) => Ok(SettleOutcome::Settled),
        Value::Int(0) => Ok(SettleOutcome::Fenced),
        _ => Err(malformed("unexpected script reply")),
    }
}

/// Reads the claim script's reply (see `lua/claim.lua`).
fn claim_outcome(reply: Value, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let items = match reply {
        Value::BulkString(raw) => return found(&raw, req.fingerprint),
        Value::Array(items) => items,
        _ => return Err(malformed("unexpected claim reply")),
    };
    Ok(match int(items.first())? {
        1 => ClaimOutcome::Busy {
            retry_after: Duration::from_millis(int(items.get(1))?),
        },
        2 => ClaimOutcome::Unknown {
            fence: fence(items.get(1))?,
            age: Duration::from_millis(int(items.get(2))?),
        },
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

/// A record the claim found and left alone: replay or mismatch. (An unknown record of the same
/// fingerprint comes back as a table with its fence and age: they need the server's clock.)
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
        _ => Err(malformed(
            "claim returned a processing or unknown record of the same fingerprint",
        )),
    }
}

impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        bounded(self.write_limit(), self.claim_once(req)).await
    }

    async fn renew(&self, hold: &Hold<'_>, lease: Duration) -> Result<RenewOutcome, StoreError> {
        let (key, rk) = (hold.key, self.record_key(hold.key));
        let token = holder_token(hold.owner, hold.fence);
        bounded(self.shared.op_timeout, async {
            let reply = self
                .run(
                    &SCRIPTS.renew,
                    key,
                    &rk,
                    &[token.as_bytes(), &ms_arg(lease)],
                )
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

    async fn complete(&self, completion: &Completion<'_>) -> Result<SettleOutcome, StoreError> {
        let Completion {
            hold: Hold { key, owner, fence },
            response,
            ttl,
        } = *completion;
        let body = response.encode();
        let mut op = Op::new(
            Kind::Complete,
            self.record_key(key),
            self.audit_stream(key),
            HOLDER_TOKEN_LEN + 13 + body.len() + 10 + 1,
        );
        push_holder_token(op.buf(), owner, fence);
        op.end_arg();
        push_ms(op.buf(), ttl);
        op.end_arg();
        op.arg(&body);
        op.arg(&self.shared.audit_max);
        op.arg(self.shared.audit_all);
        drop(body);
        bounded(self.write_limit(), async {
            let reply = self.exec(op).await?;
            let settled = settle_outcome(&reply.value)?;
            if settled == SettleOutcome::Settled {
                self.waited(reply.waited, key).await?;
            }
            Ok(settled)
        })
        .await
    }

    async fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let (key, token) = (hold.key, holder_token(hold.owner, hold.fence));
        let kind: &[u8] = if kind == ReleaseKind::Unknown {
            b"u"
        } else {
            b"r"
        };
        let args: [&[u8]; 4] = [
            token.as_bytes(),
            kind,
            &self.shared.tombstone_ms,
            &self.shared.audit_max,
        ];
        let rk = self.record_key(key);
        bounded(self.shared.op_timeout, async {
            settle_outcome(&self.run(&SCRIPTS.release, key, &rk, &args).await?)
        })
        .await
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
        fence_named: Option<u64>,
    ) -> Result<ResolveOutcome, StoreError> {
        let rk = self.record_key(key);
        // The record's fence field compared whole: 20 digits, or '' for any fence.
        let mut named = Vec::with_capacity(20);
        if let Some(f) = fence_named {
            push_decimal(&mut named, f, 20);
        }
        let (mode, ttl, body): (&[u8], Vec<u8>, Vec<u8>) = match resolution {
            Resolution::Complete { response, ttl } => (b"c", ms_arg(*ttl), response.encode()),
            _ => (b"r", b"1".to_vec(), Vec::new()),
        };
        let actor = idem_core::audit::current_actor().unwrap_or_default();
        bounded(self.shared.op_timeout, async {
            let reply = self
                .run(
                    &SCRIPTS.resolve,
                    key,
                    &rk,
                    &[
                        mode,
                        &ttl,
                        &body,
                        &self.shared.tombstone_ms,
                        &self.shared.audit_max,
                        actor.as_bytes(),
                        self.shared.instance.as_bytes(),
                        &named,
                    ],
                )
                .await?;
            let Value::Array(items) = reply else {
                return Err(malformed("unexpected resolve reply"));
            };
            Ok(match int(items.first())? {
                1 => ResolveOutcome::Resolved,
                0 => ResolveOutcome::NotFound,
                2 => {
                    let state = match items.get(1) {
                        Some(Value::BulkString(s)) if s == b"c" => StateKind::Completed,
                        _ => StateKind::Processing,
                    };
                    ResolveOutcome::NotResolvable { state }
                }
                3 => ResolveOutcome::Fenced {
                    fence: fence(items.get(1))?,
                },
                _ => return Err(malformed("unexpected resolve reply")),
            })
        })
        .await
    }

    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let rk = self.record_key(key);
        let actor = idem_core::audit::current_actor().unwrap_or_default();
        let args: [&[u8]; 4] = [
            &self.shared.tombstone_ms,
            &self.shared.audit_max,
            actor.as_bytes(),
            self.shared.instance.as_bytes(),
        ];
        bounded(self.shared.op_timeout, async {
            match self.run(&SCRIPTS.delete, key, &rk, &args).await? {
                Value::Int(n) => Ok(n == 1),
                _ => Err(malformed("unexpected delete reply")),
            }
        })
        .await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEvent>, StoreError> {
        bounded(self.shared.admin_timeout, self.read_audit(query)).await
    }
}
