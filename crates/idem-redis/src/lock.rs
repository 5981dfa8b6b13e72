//! [`RedisLock`]: a fenced lease lock in Redis or a Redis Cluster.
//!
//! - **Acquire** is `SET NX PX` inside one script that also hands out a **fence**: a number
//!   strictly above every fence handed out earlier for that lock. Pass it to every system the
//!   critical section writes to, and let them refuse writes carrying an older fence
//!   (`idem_sql::backstop::fenced`): a holder that paused past its lease, while the next holder
//!   took over, is then refused instead of overwriting the newer work.
//! - **Release** is compare-and-delete: only the holder deletes the key. Each acquisition
//!   has an owner id of its own ([`OwnerId::random`]: a per-process random nonce and a
//!   counter), so the owner id alone names the holder.
//! - [`RedisLock::run`] holds the lock around a future: a watchdog renews the lease every third
//!   of it, and the moment a renewal is refused, fails, or cannot finish before the lease would
//!   run out, the future is dropped (cancelled) and the call returns [`LockError::Lost`]. The
//!   future also gets a [`LockLease`] whose [`LockLease::lost`] fires at that moment, for work
//!   that must stop at a safe point of its own choosing.
//!
//! # The fence rule, and its limits
//!
//! A fence is `max(previous fence + 1, Redis server time in microseconds)`. The previous
//! fence is kept in a counter key without expiry, so fences strictly increase while the
//! server keeps its data. When the data is lost (a restart without persistence, a failover to
//! a replica that missed the last write) the counter starts from nothing, and the clock term
//! takes over: every earlier fence was at most the clock reading of its acquisition plus the
//! acquisitions made within that same microsecond, and a restart takes far longer than that.
//! The rule fails only if the server's clock reads *earlier* than when the lost fences were
//! handed out: a clock stepped backwards, or a failover to a host whose clock lags. Keep the
//! servers' clocks synchronised (NTP, slewing rather than stepping).
//!
//! A lease lock is not mutual exclusion in the strict sense: a paused or partitioned holder
//! may still be running after its lease ran out. The fence is what makes its late writes
//! harmless; the watchdog only narrows the window.
//!
//! # Keys
//! `<prefix>lock:{<name>}` holds the holder's owner id (32 hex digits) with the lease as its
//! TTL; `<prefix>lock:{<name>}:fence` holds the last fence. The braces make both one hash tag,
//! so the script runs on one Redis Cluster slot.
//!
//! # Cost
//! Every operation is one `EVALSHA`; on a single node (with [`RedisConfig::batching`], on by
//! default) concurrent acquires and releases share one (see `coalesce.rs`). Acquire runs `SET NX PX` first, so a busy lock costs
//! one command; a free one adds `TIME`, `GET` and `SET` of the counter. Release and renewal
//! are `GET` then `DEL` or `PEXPIRE`. The client builds both keys in one allocation and keeps
//! the owner id as text in [`Held`], so an acquire-release pair allocates little besides the
//! command buffers.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use idem_core::lock::{LockError, LockLease};
use idem_core::record::duration_ms;
use idem_core::{OwnerId, StoreError};
use redis::Value;
use tokio::time::Instant;

use crate::batch::{malformed, redis_err};
use crate::coalesce::{self, Coalescer, Code};
use crate::config::{RedisConfig, Target};
use crate::script::{Connection, NamedScript, Timeouts, bounded};

/// Longest lock name accepted, in bytes.
pub const MAX_LOCK_NAME: usize = 200;

/// What the fence counter's key adds to the lock's key.
const FENCE_SUFFIX: &str = ":fence";

/// The renewal script; acquire and release live with the batch script in [`crate::coalesce`].
fn renew_script() -> &'static NamedScript {
    static SCRIPT: OnceLock<NamedScript> = OnceLock::new();
    SCRIPT.get_or_init(|| NamedScript::new("lock_renew", include_str!("lua/lock/renew.lua")))
}

/// A held lock: its fence and holder. Release it with [`RedisLock::release`]; if it is
/// dropped instead, the lease runs out on its own.
#[derive(Clone, PartialEq, Eq)]
pub struct Held {
    name: Arc<str>,
    /// The owner id as lowercase hex: the lock key's value while this holder has it.
    owner: [u8; 32],
    /// Strictly greater than every fence handed out earlier for this lock.
    pub fence: u64,
    /// The local time by which the lease has certainly run out on the server unless renewed
    /// (measured from when the acquire or renewal was sent).
    pub deadline: Instant,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("name", &self.name)
            .field("fence", &self.fence)
            .finish()
    }
}

impl Held {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A fenced lease lock on Redis. Cheap to clone (clones share a connection).
#[derive(Clone)]
pub struct RedisLock {
    shared: Arc<Shared>,
}

struct Shared {
    /// Acquires and releases are coalesced on it.
    scripts: Scripts,
    lease: Duration,
    /// The lease in milliseconds, as the scripts take it.
    lease_ms: String,
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("prefix", &self.shared.scripts.prefix)
            .field("lease", &self.shared.lease)
            .field("op_timeout", &self.shared.scripts.op_timeout)
            .finish()
    }
}

impl RedisLock {
    /// Connects with `config`'s target, key prefix and operation timeout, with leases of
    /// `lease` (at least three operation timeouts, so a renewal has time to land).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] for an unreachable server, [`StoreError::Timeout`] if
    /// connecting takes too long.
    pub async fn connect(config: RedisConfig, lease: Duration) -> Result<Self, StoreError> {
        let conn = Scripts::connect(&config).await?;
        Ok(Self::with_connection(conn, &config, lease))
    }

    /// A lock over an existing connection, with `config`'s prefix and operation timeout.
    pub fn with_connection(conn: Connection, config: &RedisConfig, lease: Duration) -> Self {
        let lease = lease.max(config.op_timeout * 3);
        Self {
            shared: Arc::new(Shared {
                scripts: Scripts::new(conn, config),
                lease,
                lease_ms: duration_ms(lease).to_string(),
            }),
        }
    }

    /// The lease each acquisition and renewal grants.
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// `<prefix>lock:{<name>}:fence`: the fence counter's key, which starts with the lock's
    /// key (all of it but [`FENCE_SUFFIX`]), so one allocation serves both.
    fn keys(&self, name: &str) -> Result<String, LockError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_LOCK_NAME
            && name
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b'{' && b != b'}');
        if !ok {
            return Err(LockError::BadName);
        }
        let prefix = &self.shared.scripts.prefix;
        let mut keys = String::with_capacity(prefix.len() + name.len() + 7 + FENCE_SUFFIX.len());
        keys.push_str(prefix);
        keys.push_str("lock:{");
        keys.push_str(name);
        keys.push('}');
        keys.push_str(FENCE_SUFFIX);
        Ok(keys)
    }

    /// The lock's key within [`RedisLock::keys`]'s text.
    fn lock_key(keys: &str) -> &[u8] {
        &keys.as_bytes()[..keys.len() - FENCE_SUFFIX.len()]
    }

    /// Acquires `name` if it is free.
    ///
    /// # Errors
    /// [`LockError::Busy`] when someone holds it, [`LockError::BadName`], or
    /// [`LockError::Store`] when Redis failed (the lock may then be held by nobody until its
    /// lease runs out).
    pub async fn try_acquire(&self, name: &str) -> Result<Held, LockError> {
        let keys = self.keys(name)?;
        let mut owner = [0u8; 32];
        hex::encode_to_slice(OwnerId::random().to_bytes(), &mut owner)
            .map_err(|_| malformed("owner id"))?;
        let sent = Instant::now();
        let reply = self
            .shared
            .scripts
            .call(
                Code::Acquire,
                &[Self::lock_key(&keys), keys.as_bytes()],
                &[&owner, self.shared.lease_ms.as_bytes()],
            )
            .await?;
        match reply {
            Value::Int(0) => Err(LockError::Busy),
            Value::Int(fence) => Ok(Held {
                name: name.into(),
                owner,
                fence: u64::try_from(fence).map_err(|_| malformed("lock fence"))?,
                deadline: sent + self.shared.lease,
            }),
            _ => Err(malformed("lock reply").into()),
        }
    }

    /// Acquires `name`, retrying every few milliseconds while it is busy, for at most `wait`.
    ///
    /// # Errors
    /// As [`RedisLock::try_acquire`]; [`LockError::Busy`] when `wait` ran out.
    pub async fn acquire(&self, name: &str, wait: Duration) -> Result<Held, LockError> {
        let give_up = Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        loop {
            match self.try_acquire(name).await {
                Err(LockError::Busy) if Instant::now() + pause < give_up => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Extends `held`'s lease; false when it was no longer held (expired, or taken over).
    ///
    /// # Errors
    /// [`StoreError`] when Redis failed or did not answer within `limit`.
    async fn renew_within(&self, held: &mut Held, limit: Duration) -> Result<bool, StoreError> {
        let keys = self.keys(&held.name).map_err(|_| malformed("lock name"))?;
        let sent = Instant::now();
        let reply = self
            .shared
            .scripts
            .script(
                renew_script(),
                &[Self::lock_key(&keys)],
                &[&held.owner, self.shared.lease_ms.as_bytes()],
                limit,
            )
            .await?;
        let renewed = matches!(reply, Value::Int(1));
        if renewed {
            held.deadline = sent + self.shared.lease;
        }
        Ok(renewed)
    }

    /// Extends `held`'s lease by a full lease; false when it was no longer held.
    ///
    /// # Errors
    /// [`StoreError`] when Redis failed or timed out: whether the lease was extended is
    /// unknown, so treat the lock as lost.
    pub async fn renew(&self, held: &mut Held) -> Result<bool, StoreError> {
        let limit = self.shared.scripts.op_timeout;
        self.renew_within(held, limit).await
    }

    /// Releases `held` if it still holds the lock (compare-and-delete); false when it had
    /// already expired or been taken over.
    ///
    /// # Errors
    /// [`StoreError`] when Redis failed; the lease then runs out on its own.
    pub async fn release(&self, held: Held) -> Result<bool, StoreError> {
        let keys = self.keys(&held.name).map_err(|_| malformed("lock name"))?;
        let reply = self
            .shared
            .scripts
            .call(Code::Release, &[Self::lock_key(&keys)], &[&held.owner])
            .await?;
        Ok(matches!(reply, Value::Int(1)))
    }

    /// Acquires `name` (waiting up to `wait`), runs `work` while a watchdog renews the lease,
    /// and releases the lock when `work` ends.
    ///
    /// The watchdog renews every third of the lease. A renewal that is refused, fails, or
    /// cannot finish before the lease would run out (each is bounded by the operation timeout
    /// and by the local deadline) makes the lock lost: `work` is dropped at once and the call
    /// returns [`LockError::Lost`]; [`LockLease::lost`] fires first for work that watches it.
    ///
    /// # Errors
    /// [`LockError::Busy`], [`LockError::BadName`] or [`LockError::Store`] before `work`
    /// starts; [`LockError::Lost`] when it was cancelled.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` and leaves the lease to run out (no release
    /// is sent from a destructor).
    pub async fn run<T, F, Fut>(&self, name: &str, wait: Duration, work: F) -> Result<T, LockError>
    where
        F: FnOnce(LockLease) -> Fut,
        Fut: Future<Output = T>,
    {
        let held = self.acquire(name, wait).await?;
        let (lease, lost) = LockLease::new(held.fence);
        let work = work(lease);
        // The watchdog runs beside the work (not between its polls), on its own copy of the
        // holder; it returns only when the lease is lost.
        let watchdog = async {
            let mut mine = held.clone();
            let every = self.shared.lease / 3;
            loop {
                tokio::time::sleep(every).await;
                let left = mine.deadline.saturating_duration_since(Instant::now());
                let limit = left.min(self.shared.scripts.op_timeout);
                let renewed = !limit.is_zero()
                    && matches!(self.renew_within(&mut mine, limit).await, Ok(true));
                if !renewed {
                    lost.raise();
                    tracing::warn!(lock = %mine.name, fence = mine.fence, "lock lease lost; work cancelled");
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            () = watchdog => Err(LockError::Lost),
            out = work => {
                // A failed release only leaves the lease to run out; the work is done.
                let _ = self.release(held).await;
                Ok(out)
            }
        }
    }
}

/// What the lock and the tokens ([`crate::tokens`]) run their scripts on: the connection,
/// the coalescer of concurrent calls on a single node, the key prefix and the operation
/// timeout.
#[derive(Clone)]
pub(crate) struct Scripts {
    conn: Connection,
    /// Coalesces concurrent calls; `None` on a cluster or with batching off.
    coalescer: Option<Arc<Coalescer>>,
    pub(crate) prefix: String,
    pub(crate) op_timeout: Duration,
}

impl Scripts {
    /// Connects to `config`'s target, waiting at most the operation timeout for any reply.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] for an unreachable server, [`StoreError::Timeout`] if
    /// connecting takes too long.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Connection, StoreError> {
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            response: config.op_timeout,
        };
        match &config.target {
            Target::Single(url) => Connection::single(url, timeouts, config.tls.as_ref()).await,
            Target::Cluster(nodes) => {
                Connection::cluster(nodes, timeouts, config.tls.as_ref()).await
            }
        }
    }

    /// Scripts on `conn` with `config`'s prefix, operation timeout and batching.
    pub(crate) fn new(conn: Connection, config: &RedisConfig) -> Self {
        let coalescer = (config.batching && !conn.is_cluster())
            .then(|| Arc::new(Coalescer::new(conn.clone(), config.op_timeout)));
        Self {
            conn,
            coalescer,
            prefix: config.prefix.clone(),
            op_timeout: config.op_timeout,
        }
    }

    /// Runs `script` alone, bounded by `limit`.
    pub(crate) async fn script(
        &self,
        script: &NamedScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        limit: Duration,
    ) -> Result<Value, StoreError> {
        bounded(limit, async {
            script.run(&self.conn, keys, args).await.map_err(redis_err)
        })
        .await
    }

    /// Runs the batched operation `code`: coalesced with concurrent ones on a single node,
    /// else alone; bounded by the operation timeout.
    pub(crate) async fn call(
        &self,
        code: Code,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        coalesce::run(
            &self.conn,
            self.coalescer.as_ref(),
            code,
            keys,
            args,
            self.op_timeout,
        )
        .await
    }
}
