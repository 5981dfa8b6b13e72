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
//! What this saves is the server's fixed cost per script call (parsing the command, setting
//! up and tearing down the script run), paid once per batch instead of once per operation.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use idem_core::StoreError;
use redis::Value;
use tokio::sync::oneshot;

use crate::batch::{malformed, redis_err};
use crate::script::{Connection, NamedScript, bounded};

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

/// The coalescing queue of one connection to one node.
pub(crate) struct Coalescer {
    queue: Mutex<Queue>,
    conn: Connection,
    /// Bound of one batch call (the op timeout).
    limit: Duration,
}

impl fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A call is in flight (a lone operation's or a task's).
    busy: bool,
}

struct Waiting {
    op: Op,
    tx: oneshot::Sender<Result<Value, StoreError>>,
}

enum Entered {
    Alone(Op, Slot),
    Queued(oneshot::Receiver<Result<Value, StoreError>>),
}

impl Coalescer {
    pub(crate) fn new(conn: Connection, limit: Duration) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            conn,
            limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Plain bookkeeping with no panics inside: a poisoned lock is still consistent.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `op`: alone at once when nothing is in flight, else in the next batch. The
    /// caller bounds the wait.
    ///
    /// # Cancel safety
    /// Dropping the future of a lone operation leaves its script run or not run; dropping a
    /// queued one takes it out of the next batch, or, if that batch already left, leaves it
    /// run or not run with the batch.
    pub(crate) async fn submit(self: &Arc<Self>, op: Op) -> Result<Value, StoreError> {
        match self.enter(op) {
            Entered::Alone(op, slot) => {
                let value = run_alone(&self.conn, &op).await;
                drop(slot);
                value
            }
            Entered::Queued(rx) => rx.await.unwrap_or_else(|_| {
                Err(StoreError::unavailable("batch dropped before it answered"))
            }),
        }
    }

    fn enter(self: &Arc<Self>, op: Op) -> Entered {
        let mut q = self.lock();
        if !q.busy {
            q.busy = true;
            return Entered::Alone(
                op,
                Slot {
                    owner: Some(Arc::clone(self)),
                    lone: true,
                },
            );
        }
        let (tx, rx) = oneshot::channel();
        q.waiting.push_back(Waiting { op, tx });
        Entered::Queued(rx)
    }

    /// Hands the in-flight slot to a new task that sends what waits. Outside any runtime the
    /// dropped slot fails what waits instead.
    fn spawn_driver(self: &Arc<Self>) {
        let slot = Slot {
            owner: Some(Arc::clone(self)),
            lone: false,
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(drive(slot));
        }
    }

    /// The next batch, skipping operations whose callers gave up; with nothing left, marks
    /// the connection idle (in the same critical section, so nothing is left waiting).
    fn take(&self) -> Option<Vec<Waiting>> {
        let mut q = self.lock();
        let mut batch = Vec::with_capacity(q.waiting.len().min(MAX_OPS));
        while batch.len() < MAX_OPS {
            let Some(next) = q.waiting.pop_front() else {
                break;
            };
            if !next.tx.is_closed() {
                batch.push(next);
            }
        }
        if batch.is_empty() {
            q.busy = false;
            return None;
        }
        Some(batch)
    }

    /// Sends one batch and answers each of its callers.
    async fn send(&self, batch: Vec<Waiting>) {
        if batch.len() == 1 {
            for w in batch {
                let result = bounded(self.limit, run_alone(&self.conn, &w.op)).await;
                let _ = w.tx.send(result);
            }
            return;
        }
        match bounded(self.limit, self.run_batch(&batch)).await {
            Ok(items) => {
                for (w, item) in batch.into_iter().zip(items) {
                    let _ = w.tx.send(own_reply(item));
                }
            }
            Err(e) => {
                tracing::debug!(ops = batch.len(), error = %e, "redis lock/token batch failed");
                let text = e.to_string();
                for w in batch {
                    let _ = w.tx.send(Err(match &e {
                        StoreError::Timeout(d) => StoreError::Timeout(*d),
                        _ => StoreError::unavailable(text.clone()),
                    }));
                }
            }
        }
    }

    async fn run_batch(&self, batch: &[Waiting]) -> Result<Vec<Value>, StoreError> {
        let keys: usize = batch.iter().map(|w| w.op.code.keys()).sum();
        let args = 1 + batch.iter().map(|w| w.op.parts).sum::<usize>() - keys;
        let bytes = batch.len() + batch.iter().map(|w| w.op.buf.len()).sum::<usize>();
        let script = &scripts().batch;
        let mut cmd = script.command(keys, args, bytes);
        for w in batch {
            for k in w.op.keys() {
                cmd.arg(k);
            }
        }
        let codes: Vec<u8> = batch.iter().map(|w| w.op.code.byte()).collect();
        cmd.arg(codes);
        for w in batch {
            for a in w.op.args() {
                cmd.arg(a);
            }
        }
        let reply = script
            .run_command(&self.conn, &cmd)
            .await
            .map_err(redis_err)?;
        match reply {
            Value::Array(items) if items.len() == batch.len() => Ok(items),
            _ => Err(malformed("unexpected batch reply")),
        }
    }
}

/// An operation's entry of the batch reply: `{-1, message}` is an error it raised alone.
fn own_reply(item: Value) -> Result<Value, StoreError> {
    if let Value::Array(parts) = &item
        && let Some(Value::Int(-1)) = parts.first()
    {
        let message = match parts.get(1) {
            Some(Value::BulkString(m)) => String::from_utf8_lossy(m).into_owned(),
            _ => "script error".to_owned(),
        };
        return Err(StoreError::unavailable(message));
    }
    Ok(item)
}

/// The in-flight slot, given back (or handed on) when dropped.
struct Slot {
    owner: Option<Arc<Coalescer>>,
    /// A lone operation's slot: when its caller is done (or gives up) while operations wait,
    /// a new task takes the slot to send them. A task's slot dropped early (the runtime
    /// shutting down) fails what waits instead, so a dying runtime cannot spawn forever.
    lone: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        let mut q = owner.lock();
        if q.waiting.is_empty() || !self.lone {
            q.waiting.clear();
            q.busy = false;
            return;
        }
        drop(q);
        owner.spawn_driver();
    }
}

/// The task that owns the slot: sends batches while operations wait, then gives it back.
async fn drive(mut slot: Slot) {
    let Some(owner) = slot.owner.clone() else {
        return;
    };
    while let Some(batch) = owner.take() {
        owner.send(batch).await;
    }
    // `take` marked the connection idle already.
    slot.owner = None;
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
