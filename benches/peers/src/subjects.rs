//! The four implementations the bench drives, each through its ordinary API, and the one
//! operation every row times: a call for one key (claim, trivial handler, complete), which on a
//! completed key is a replay.
//!
//! Every implementation gets the same key text, request bytes (fingerprinted per call by its
//! own strategy), lease, record TTL and response (status 200, one `content-type` header, a
//! 35-byte JSON body). Redis implementations each hold one redis-rs `ConnectionManager` (one
//! multiplexed connection), made once, as an application would.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Answer, Engine, Fingerprint, Key, MemoryStore, Policy, Scope, ScopedKey};
use idem_core::{Settlement, Store, StoredResponse};
use idem_redis::{RedisConfig, RedisStore};
use redis::aio::ConnectionManager;

use idempotent2::IdempotencyStore as Store2;
use idempotent03::fingerprint::{
    DefaultFingerprintStrategy as Strategy03, FingerprintStrategy as _,
};
use idempotent03::store::IdempotencyStore as Store03;

/// The request every call carries (fingerprinted with its method and route).
const REQUEST: &[u8] = br#"{"amount":100}"#;
/// The operation name the peers fingerprint; idem hashes method and route apart.
const OPERATION: &str = "POST /charges";
/// The handler's answer, stored by every implementation.
const RESPONSE_BODY: &[u8] = br#"{"id":"ch_1","status":"succeeded"}"#;
/// How long a claim holds its key while the handler runs.
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// How long a completed key replays.
pub(crate) const TTL: Duration = Duration::from_secs(300);
/// Every replay row replays these many completed keys, seeded before it is timed.
pub(crate) const REPLAY_KEYS: u64 = 1000;

/// One timed operation: worker `w`'s `i`-th call.
pub(crate) type Op = Arc<dyn Fn(usize, u64) -> OpFuture + Send + Sync>;
/// What an [`Op`] returns (boxed alike for every implementation).
pub(crate) type OpFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An implementation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Impl {
    /// The least the contract needs, no library (the floor).
    Floor,
    /// `idempotent` 0.3.0.
    V03,
    /// `idempotent` 2.0.0.
    V2,
    /// idem: `Engine::run` over its store.
    Idem,
}

impl Impl {
    /// Every implementation, in table order.
    pub(crate) const ALL: [Impl; 4] = [Impl::Floor, Impl::V03, Impl::V2, Impl::Idem];

    /// The column heading.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Impl::Floor => "floor",
            Impl::V03 => "idempotent 0.3.0",
            Impl::V2 => "idempotent 2.0.0",
            Impl::Idem => "idem",
        }
    }
}

/// Where the records live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Each implementation's in-process store, fresh for every measurement.
    Memory,
    /// Each implementation's Redis store, on the same server.
    Redis,
}

impl Backend {
    /// The name used in tables and `PEERS_STORES`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
        }
    }
}

/// What a row times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Row {
    /// A call on a fresh key: claim, handler, complete.
    First,
    /// The same call on a completed key.
    Replay,
}

impl Row {
    /// Both rows, in table order.
    pub(crate) const ALL: [Row; 2] = [Row::First, Row::Replay];

    /// The row heading.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Row::First => "first request",
            Row::Replay => "replay",
        }
    }
}

/// The key text of worker `w`'s `i`-th call in a measurement tagged `tag`: fresh keys for a
/// first request, one of the seeded completed keys for a replay. The same for everyone.
fn key_text(row: Row, tag: &str, w: usize, i: u64) -> String {
    match row {
        Row::First => format!("{tag}-{w}-{i}"),
        Row::Replay => format!("{tag}-done-{}", (i * 64 + w as u64) % REPLAY_KEYS),
    }
}

/// The Redis side of every implementation: one connection each, made once per run.
pub(crate) struct RedisSubjects {
    raw: ConnectionManager,
    idem: Engine<RedisStore>,
    v03: Arc<idempotent03::store::valkey::ValkeyStore>,
    v2: idempotent2::valkey::ValkeyStore,
    /// Every key this run writes starts with it (for the clean-up on a shared server).
    pub(crate) prefix: String,
}

impl std::fmt::Debug for RedisSubjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSubjects")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSubjects {
    /// Connects every implementation to `url`, each under its own prefix below `prefix`.
    pub(crate) async fn connect(url: &str, prefix: &str) -> RedisSubjects {
        let client = redis::Client::open(url).expect("redis url");
        let raw = client
            .get_connection_manager()
            .await
            .expect("raw connection");
        let config = RedisConfig::from_url(url)
            .and_then(|c| c.prefix(format!("{prefix}:idem:")))
            .and_then(|c| c.op_timeout(Duration::from_secs(2)))
            .expect("idem config");
        let idem = Engine::new(
            RedisStore::connect(config).await.expect("idem store"),
            policy(),
        );
        // 0.3.0 makes its own ConnectionManager from a client, with redis-rs's defaults.
        let v03 = idempotent03::store::valkey::ValkeyStore::with_prefix(
            client.clone(),
            Some(&format!("{prefix}-v03")),
        )
        .await
        .expect("idempotent 0.3.0 store");
        let v2 = idempotent2::valkey::ValkeyStore::with_url(url)
            .prefix(format!("{prefix}-v2"))
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .try_build()
            .await
            .expect("idempotent 2.0.0 store");
        RedisSubjects {
            raw,
            idem,
            v03: Arc::new(v03),
            v2,
            prefix: prefix.to_owned(),
        }
    }

    /// Resets the server's command statistics (`CONFIG RESETSTAT`), for `PEERS_COMMANDSTATS`.
    pub(crate) async fn reset_stats(&self) {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec_async(&mut self.raw.clone())
            .await
            .expect("CONFIG RESETSTAT");
    }

    /// The server's command statistics since the last reset, one `command calls usec/call`
    /// line per command, for `PEERS_COMMANDSTATS`.
    pub(crate) async fn stats(&self) -> String {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw.clone())
            .await
            .expect("INFO commandstats");
        let mut out = String::new();
        for line in info.lines() {
            let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .unwrap_or("?")
                    .to_owned()
            };
            if name == "config" || name == "info" {
                continue;
            }
            out.push_str(&format!(
                "    {name} calls={} usec_per_call={}\n",
                field("calls="),
                field("usec_per_call=")
            ));
        }
        out
    }

    /// Deletes every key this run wrote (all start with the prefix then `-` or `:`); returns
    /// how many.
    pub(crate) async fn clean_up(&self) -> usize {
        let mut conn = self.raw.clone();
        let pattern = format!("{}[-:]*", self.prefix);
        let (mut cursor, mut removed) = (0u64, 0);
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("SCAN");
            if !keys.is_empty() {
                removed += keys.len();
                redis::cmd("UNLINK")
                    .arg(&keys)
                    .exec_async(&mut conn)
                    .await
                    .expect("UNLINK");
            }
            if next == 0 {
                return removed;
            }
            cursor = next;
        }
    }
}

/// idem's policy for every store: the bench's lease and TTL, a 2 s store timeout.
fn policy() -> Policy {
    Policy::builder()
        .lease(LEASE)
        .record_ttl(TTL)
        .store_timeout(Duration::from_secs(2))
        .build()
        .expect("policy")
}

/// Builds the operation `which` runs for `row` on `backend` (a fresh memory store, or the
/// run's Redis connection), with the replay keys already completed, untimed.
pub(crate) async fn prepare(
    which: Impl,
    backend: Backend,
    row: Row,
    redis: Option<&RedisSubjects>,
    tag: String,
) -> Op {
    let tag: Arc<str> = tag.into();
    let op = match (which, backend) {
        (Impl::Floor, Backend::Memory) => floor_memory(),
        (Impl::Floor, Backend::Redis) => {
            floor_redis(redis_of(redis).raw.clone(), &redis_of(redis).prefix)
        }
        (Impl::V03, Backend::Memory) => v03(Arc::new(
            idempotent03::store::memory::MemoryStore::new(64, Duration::from_secs(60)),
        )),
        (Impl::V03, Backend::Redis) => v03(Arc::clone(&redis_of(redis).v03)),
        (Impl::V2, Backend::Memory) => v2(idempotent2::memory::MemoryStore::builder()
            .try_build()
            .expect("idempotent 2.0.0 memory store")),
        (Impl::V2, Backend::Redis) => v2(redis_of(redis).v2.clone()),
        // Big enough that no round fills it (a full memory store refuses new keys), and no
        // byte bound: the peers' maps are unbounded.
        (Impl::Idem, Backend::Memory) => idem(Engine::new(
            MemoryStore::bounded(
                16_000_000,
                usize::MAX,
                idem_core::SystemClock,
                idem_core::memory::MEMORY_AUDIT,
            ),
            policy(),
        )),
        (Impl::Idem, Backend::Redis) => idem(redis_of(redis).idem.clone()),
    };
    if row == Row::Replay {
        for n in 0..REPLAY_KEYS {
            op(Call::First, format!("{tag}-done-{n}")).await;
        }
    }
    Arc::new(move |w, i| op(Call::for_row(row), key_text(row, &tag, w, i)))
}

fn redis_of(redis: Option<&RedisSubjects>) -> &RedisSubjects {
    redis.expect("a redis backend needs the run's connections")
}

/// What a call must answer: executed on a fresh key, replayed on a completed one.
#[derive(Clone, Copy, Debug)]
enum Call {
    First,
    Replay,
}

impl Call {
    fn for_row(row: Row) -> Call {
        match row {
            Row::First => Call::First,
            Row::Replay => Call::Replay,
        }
    }
}

/// One call of an implementation for one key text.
type KeyOp = Arc<dyn Fn(Call, String) -> OpFuture + Send + Sync>;

fn idem<S: Store + 'static>(engine: Engine<S>) -> KeyOp {
    let scope = Scope::new("peers").expect("scope");
    let response = StoredResponse::new(200, Bytes::from_static(RESPONSE_BODY))
        .with_header("content-type", Bytes::from_static(b"application/json"));
    Arc::new(move |call, name| {
        let (engine, scope, response) = (engine.clone(), scope.clone(), response.clone());
        Box::pin(async move {
            let key = ScopedKey::new(scope, Key::new(name).expect("key"));
            let fp = Fingerprint::http_raw(1, "POST", "/charges", REQUEST);
            let answer = engine
                .run(&key, &fp, |_lease| async move {
                    Settlement::complete((), response)
                })
                .await
                .expect("idem run");
            match (call, answer) {
                (Call::First, Answer::Executed { .. }) | (Call::Replay, Answer::Replayed(_)) => {}
                (call, _) => panic!("idem: unexpected answer to a {call:?} call"),
            }
        })
    })
}

/// 0.3.0's documented flow: `try_insert` a processing entry, run the side effect, `complete`
/// with the claim's fencing token; a completed entry whose fingerprint matches is a replay.
fn v03<S: Store03>(store: Arc<S>) -> KeyOp {
    use idempotent03::entry::ExistingEntry;
    use idempotent03::store::InsertResult;
    use idempotent03::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};
    // 0.3.0's `Metadata` has no constructor but its serde one (a map of names to bytes).
    let metadata: Metadata =
        serde_json::from_value(serde_json::json!({ "content-type": b"application/json".to_vec() }))
            .expect("metadata");
    let response = CachedResponse {
        status_code: 200,
        metadata,
        body: Bytes::from_static(RESPONSE_BODY),
    };
    Arc::new(move |call, name| {
        let (store, response) = (Arc::clone(&store), response.clone());
        Box::pin(async move {
            let key = IdempotencyKey::new(name).expect("key");
            let fp = Strategy03.compute(OPERATION, REQUEST);
            let entry = IdempotencyEntry::new(fp, TTL);
            match (
                call,
                store
                    .try_insert(&key, entry.clone())
                    .await
                    .expect("try_insert"),
            ) {
                (Call::First, InsertResult::Claimed { fencing_token }) => {
                    let response = async move { response }.await;
                    store
                        .complete(&key, entry.complete(response), fencing_token)
                        .await
                        .expect("complete");
                }
                (Call::Replay, InsertResult::Exists(ExistingEntry::Completed(done)))
                    if done.fingerprint_matches(fp) =>
                {
                    std::hint::black_box(done.into_response());
                }
                (call, _) => panic!("idempotent 0.3.0: unexpected answer to a {call:?} call"),
            }
        })
    })
}

/// 2.0.0's one-call API: `claim(key, lease).fingerprint(..).execute_or_replay(ttl, side effect)`.
fn v2<S: Store2 + Clone + 'static>(store: S) -> KeyOp
where
    S::Error: std::fmt::Debug,
{
    use idempotent2::{CachedResponse, ExecutionOutcome, IdempotencyKey, Metadata};
    let mut metadata = Metadata::new();
    metadata.append("content-type", Bytes::from_static(b"application/json"));
    let response = CachedResponse::new(200, metadata, Bytes::from_static(RESPONSE_BODY));
    Arc::new(move |call, name| {
        let (store, response) = (store.clone(), response.clone());
        Box::pin(async move {
            let key = IdempotencyKey::new(name).expect("key");
            let outcome: ExecutionOutcome = store
                .claim(&key, LEASE)
                .fingerprint(OPERATION, REQUEST)
                .execute_or_replay(TTL, |_token| async move { Ok(response) })
                .await
                .expect("execute_or_replay");
            match (call, outcome) {
                (Call::First, ExecutionOutcome::Executed(_))
                | (Call::Replay, ExecutionOutcome::Replayed(_)) => {}
                (call, _) => panic!("idempotent 2.0.0: unexpected answer to a {call:?} call"),
            }
        })
    })
}

/// A key's state in the memory floor.
#[derive(Clone, Debug)]
enum FloorEntry {
    Running,
    Done(Bytes),
}

/// The least an in-process store can do: claim = insert-if-absent under one lock, complete =
/// one insert; a replay is the claim finding the response. No fence, lease, expiry, bound,
/// fingerprint or headers.
fn floor_memory() -> KeyOp {
    let map: Arc<Mutex<HashMap<String, FloorEntry>>> = Arc::default();
    Arc::new(move |call, name| {
        let map = Arc::clone(&map);
        Box::pin(async move {
            let found = {
                let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
                match map.get(&name) {
                    Some(entry) => Some(entry.clone()),
                    None => {
                        map.insert(name.clone(), FloorEntry::Running);
                        None
                    }
                }
            };
            match (call, found) {
                (Call::First, None) => {
                    let body = async { Bytes::from_static(RESPONSE_BODY) }.await;
                    map.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(name, FloorEntry::Done(body));
                }
                (Call::Replay, Some(FloorEntry::Done(body))) => {
                    std::hint::black_box(body);
                }
                (call, _) => panic!("memory floor: unexpected state for a {call:?} call"),
            }
        })
    })
}

/// The least a Redis store can do in one command per step: claim = `SET k - NX GET PX lease`
/// (nil: claimed; else the stored response), complete = `SET k <body> PX ttl`. No script,
/// fence, fingerprint or headers.
fn floor_redis(conn: ConnectionManager, prefix: &str) -> KeyOp {
    let prefix: Arc<str> = format!("{prefix}:raw:").into();
    Arc::new(move |call, name| {
        let (mut conn, key) = (conn.clone(), format!("{prefix}{name}"));
        Box::pin(async move {
            let found: Option<Vec<u8>> = redis::cmd("SET")
                .arg(&key)
                .arg("-")
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(LEASE.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("SET NX GET");
            match (call, found) {
                (Call::First, None) => {
                    let body = async { Bytes::from_static(RESPONSE_BODY) }.await;
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(body.as_ref())
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .exec_async(&mut conn)
                        .await
                        .expect("SET");
                }
                (Call::Replay, Some(body)) if body != b"-" => {
                    std::hint::black_box(body);
                }
                (call, _) => panic!("redis floor: unexpected reply to a {call:?} call"),
            }
        })
    })
}
