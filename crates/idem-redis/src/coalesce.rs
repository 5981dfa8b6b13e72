//! Coalescing of concurrent lock and token script calls into one script call (single node).
//!
//! The same scheme as the record store's batcher (`batch.rs`), for [`crate::RedisLock`]'s
//! acquire and release and [`crate::RedisTokens`]'s issue and consume: an operation that finds the
//! connection idle runs its own single script at once, in its caller's future (no added
//! latency when idle); operations that arrive while a call is in flight wait in a queue, and
//! a spawned task sends the whole queue (up to [`MAX_OPS`]) as one `EVALSHA` of
//! `lua/coalesce.lua`, which applies each in order with the same Lua function as its single
//! script and answers each separately. Every caller bounds its own wait; a batch that fails
//! or runs out of time fails each of its operations.
//!
//! The queue, its slot and that task are [`idem_core::store::coalesce`]'s; this file says what a lock or
//! token operation is and how a batch of them is sent.
//!
//! What this saves is the server's fixed cost per script call (parsing the command, setting
//! up and tearing down the script run), paid once per batch instead of once per operation.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::StoreError;
use idem_core::store::coalesce::{self as queue, Batching, Queue};
use redis::Value;

use crate::batch::{malformed, redis_err};
use crate::script::{Connection, NamedScript, bounded, own_reply};

/// Most operations in one batch.
const MAX_OPS: usize = 128;

/// Which operation: its code in the batch script, and how many keys and arguments it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    /// `acquire(lock, counter, owner, lease_ms)`.
    Acquire,
    /// `release(lock, owner)`.
    Release,
    /// `issue(key, value, px)`.
    Issue,
    /// `consume(key, flag, presented)`.
    Consume,
}

impl Code {
    fn byte(self) -> u8 {
        match self {
            Code::Acquire => b'a',
            Code::Release => b'r',
            Code::Issue => b'i',
            Code::Consume => b'c',
        }
    }

    fn keys(self) -> usize {
        match self {
            Code::Acquire => 2,
            Code::Release | Code::Issue | Code::Consume => 1,
        }
    }
}

/// One operation: its code, then its keys and arguments (parts), kept in one buffer.
pub(crate) struct Op {
    code: Code,
    buf: Vec<u8>,
    ends: [usize; 4],
    parts: usize,
}

impl Op {
    /// `code`'s keys, then its arguments.
    pub(crate) fn new(code: Code, keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let size = keys.iter().chain(args).map(|p| p.len()).sum();
        let mut op = Self {
            code,
            buf: Vec::with_capacity(size),
            ends: [0; 4],
            parts: 0,
        };
        for p in keys.iter().chain(args).take(4) {
            op.buf.extend_from_slice(p);
            op.ends[op.parts] = op.buf.len();
            op.parts += 1;
        }
        op
    }

    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends[..self.parts].iter().map(move |&end| {
            let p = self.buf.get(start..end).unwrap_or_default();
            start = end;
            p
        })
    }

    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.parts().take(self.code.keys())
    }

    fn args(&self) -> impl Iterator<Item = &[u8]> {
        self.parts().skip(self.code.keys())
    }
}

/// The single scripts and the batch script.
pub(crate) struct Scripts {
    pub(crate) acquire: NamedScript,
    pub(crate) release: NamedScript,
    pub(crate) issue: NamedScript,
    pub(crate) consume: NamedScript,
    batch: NamedScript,
}

impl Scripts {
    fn single(&self, code: Code) -> &NamedScript {
        match code {
            Code::Acquire => &self.acquire,
            Code::Release => &self.release,
            Code::Issue => &self.issue,
            Code::Consume => &self.consume,
        }
    }
}

/// The lock and token scripts: each single script is its function and one call of it; the
/// batch script holds all three functions.
pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let acquire = include_str!("lua/lock/acquire.lua");
        let release = include_str!("lua/lock/release.lua");
        let common = include_str!("lua/token/common.lua");
        let issue = include_str!("lua/token/issue.lua");
        let consume = include_str!("lua/token/consume.lua");
        Scripts {
            acquire: NamedScript::new(
                "lock_acquire",
                &format!("{acquire}\nreturn acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2])"),
            ),
            release: NamedScript::new(
                "lock_release",
                &format!("{release}\nreturn release(KEYS[1], ARGV[1])"),
            ),
            issue: NamedScript::new(
                "token_issue",
                &format!("{issue}\nreturn issue(KEYS[1], ARGV[1], ARGV[2])"),
            ),
            consume: NamedScript::new(
                "token_consume",
                &format!("{common}\n{consume}\nreturn consume(KEYS[1], ARGV[1], ARGV[2])"),
            ),
            batch: NamedScript::new(
                "lock_token_batch",
                &format!(
                    "{acquire}\n{release}\n{issue}\n{common}\n{consume}\n{}",
                    include_str!("lua/coalesce.lua")
                ),
            ),
        }
    })
}

/// Runs `op` alone with its single script.
async fn run_alone(conn: &Connection, op: &Op) -> Result<Value, StoreError> {
    let script = scripts().single(op.code);
    let mut cmd = script.command(op.code.keys(), op.parts - op.code.keys(), op.buf.len());
    for p in op.parts() {
        cmd.arg(p);
    }
    script.run_command(conn, &cmd).await.map_err(redis_err)
}

/// The coalescing queue of one connection to one node, with a single in-flight slot.
pub(crate) struct Coalescer {
    queue: Queue<Coalescer>,
    conn: Connection,
}

impl fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

impl Coalescer {
    /// A coalescer on `conn`; `limit` bounds one batch call (the op timeout).
    pub(crate) fn new(conn: Connection, limit: Duration) -> Self {
        Self {
            // One call in flight at a time: a lone operation's or a task's.
            queue: Queue::new(1, limit),
            conn,
        }
    }

    /// Runs `op`: alone at once when nothing is in flight, else in the next batch. The
    /// caller bounds the wait.
    ///
    /// # Cancel safety
    /// Dropping the future of a lone operation leaves its script run or not run; dropping a
    /// queued one takes it out of the next batch, or, if that batch already left, leaves it
    /// run or not run with the batch.
    pub(crate) async fn submit(self: &Arc<Self>, op: Op) -> Result<Value, StoreError> {
        queue::submit(self, op).await
    }
}

impl Batching for Coalescer {
    type Op = Op;
    type Answer = Value;

    const MAX_OPS: usize = MAX_OPS;
    /// No byte cap: lock and token operations are small.
    const MAX_BYTES: usize = usize::MAX;
    const FAILED: &'static str = "redis lock/token batch failed";

    fn queue(&self) -> &Queue<Self> {
        &self.queue
    }

    fn size(op: &Op) -> usize {
        op.buf.len()
    }

    async fn run_alone(&self, op: &Op) -> Result<Value, StoreError> {
        run_alone(&self.conn, op).await
    }

    async fn run_batch(&self, batch: &[Op]) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let keys: usize = batch.iter().map(|op| op.code.keys()).sum();
        let args = 1 + batch.iter().map(|op| op.parts).sum::<usize>() - keys;
        let bytes = batch.len() + batch.iter().map(|op| op.buf.len()).sum::<usize>();
        let script = &scripts().batch;
        let mut cmd = script.command(keys, args, bytes);
        for op in batch {
            for k in op.keys() {
                cmd.arg(k);
            }
        }
        let codes: Vec<u8> = batch.iter().map(|op| op.code.byte()).collect();
        cmd.arg(codes);
        for op in batch {
            for a in op.args() {
                cmd.arg(a);
            }
        }
        let reply = script
            .run_command(&self.conn, &cmd)
            .await
            .map_err(redis_err)?;
        match reply {
            Value::Array(items) if items.len() == batch.len() => {
                Ok(items.into_iter().map(own_reply).collect())
            }
            _ => Err(malformed("unexpected batch reply")),
        }
    }

    /// A timeout stays a timeout; any other error is shared as its text.
    fn share(e: &StoreError) -> StoreError {
        match e {
            StoreError::Timeout(d) => StoreError::Timeout(*d),
            _ => StoreError::unavailable(e.to_string()),
        }
    }
}

/// Runs `code` with `keys` and `args` for at most `limit`: through `coalescer` when there is
/// one, else alone on `conn`.
///
/// # Errors
/// The script's or the connection's error, or [`StoreError::Timeout`].
pub(crate) async fn run(
    conn: &Connection,
    coalescer: Option<&Arc<Coalescer>>,
    code: Code,
    keys: &[&[u8]],
    args: &[&[u8]],
    limit: Duration,
) -> Result<Value, StoreError> {
    match coalescer {
        Some(c) => bounded(limit, c.submit(Op::new(code, keys, args))).await,
        None => {
            let script = scripts().single(code);
            bounded(limit, async {
                script.run(conn, keys, args).await.map_err(redis_err)
            })
            .await
        }
    }
}
