//! Coalescing of concurrent claims and completions into one script call (single node).
//!
//! An operation that finds a free slot and nobody waiting runs its own single script at once,
//! in its caller's future: no added latency when the store is idle. Operations that arrive
//! while every slot is busy wait in a queue; when a slot frees up, a spawned task sends the
//! whole queue (up to a cap) as one `EVALSHA` of the batch script (`lua/batch.lua`), which
//! applies each operation in order with the same Lua function as its single script, and
//! hands each caller its own reply. The task keeps the slot while more operations queue up.
//!
//! Every caller still bounds its own wait (the store's op timeout); a batch that fails or
//! runs out of time fails each of its operations.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::StoreError;
use idem_core::record::{CodecError, duration_ms};
use redis::{Cmd, RedisError, Value};
use tokio::sync::oneshot;

use crate::config::Durability;
use crate::script::{Connection, NamedScript, bounded};

/// Most operations in one batch script call.
pub(crate) const MAX_OPS: usize = 128;
/// Most argument bytes in one batch script call (a lone larger operation still goes alone).
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// Which operation, with its code in the batch script's argument list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `claim.lua`, code `c`.
    Claim,
    /// `complete.lua`, code `d`.
    Complete,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Claim => b'c',
            Kind::Complete => b'd',
        }
    }
}

/// Most arguments of one operation (claim has 7).
const MAX_ARGS: usize = 7;

/// One operation: its record key and its single script's arguments, kept in one buffer.
#[derive(Debug)]
pub(crate) struct Op {
    kind: Kind,
    key: String,
    /// The audit stream the operation writes its event to.
    stream: String,
    buf: Vec<u8>,
    ends: [usize; MAX_ARGS],
    args: usize,
}

impl Op {
    /// An operation on the record at `key` that records its event in `stream`; `capacity`
    /// sizes the argument buffer.
    pub(crate) fn new(kind: Kind, key: String, stream: String, capacity: usize) -> Self {
        Self {
            kind,
            key,
            stream,
            buf: Vec::with_capacity(capacity),
            ends: [0; MAX_ARGS],
            args: 0,
        }
    }

    /// The argument buffer, to write the next argument into; close it with [`Op::end_arg`].
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Ends the argument written into [`Op::buf`] since the previous one.
    pub(crate) fn end_arg(&mut self) {
        // Callers push at most MAX_ARGS arguments (a fixed count per kind).
        if let Some(end) = self.ends.get_mut(self.args) {
            *end = self.buf.len();
            self.args += 1;
        }
    }

    /// Appends one argument.
    pub(crate) fn arg(&mut self, a: &[u8]) {
        self.buf.extend_from_slice(a);
        self.end_arg();
    }

    fn arg_slices(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends[..self.args].iter().map(move |&end| {
            let a = self.buf.get(start..end).unwrap_or_default();
            start = end;
            a
        })
    }

    fn size(&self) -> usize {
        self.key.len() + self.stream.len() + self.buf.len()
    }

    /// Whether `reply` (this operation's own reply) says it wrote a claim or a completion,
    /// which durability mode must see acknowledged by replicas.
    fn wrote(&self, reply: &Value) -> bool {
        match (self.kind, reply) {
            (Kind::Claim, Value::Array(items)) => matches!(items.first(), Some(Value::Int(3))),
            (Kind::Complete, Value::Int(1)) => true,
            _ => false,
        }
    }
}

/// One operation's reply.
#[derive(Debug)]
pub(crate) struct Reply {
    /// What its single script would have answered.
    pub(crate) value: Value,
    /// In durability mode, the outcome of the `WAIT` the batch already ran after its writes;
    /// `None` when the caller must wait itself (its operation ran alone).
    pub(crate) waited: Option<Result<(), StoreError>>,
}

/// The scripts an operation can run, and the batch script.
pub(crate) struct Scripts<'a> {
    pub(crate) claim: &'a NamedScript,
    pub(crate) complete: &'a NamedScript,
    pub(crate) batch: &'a NamedScript,
}

impl Scripts<'_> {
    fn single(&self, kind: Kind) -> &NamedScript {
        match kind {
            Kind::Claim => self.claim,
            Kind::Complete => self.complete,
        }
    }
}

/// Runs `op` alone with its single script.
pub(crate) async fn run_alone(
    conn: &Connection,
    scripts: &Scripts<'_>,
    op: &Op,
) -> Result<Value, StoreError> {
    let script = scripts.single(op.kind);
    let mut cmd = script.command(2, op.args, op.size());
    cmd.arg(op.key.as_bytes()).arg(op.stream.as_bytes());
    for a in op.arg_slices() {
        cmd.arg(a);
    }
    script.run_command(conn, &cmd).await.map_err(|e| {
        tracing::debug!(script = script.name(), error = %e, "redis script failed");
        redis_err(e)
    })
}

pub(crate) fn redis_err(e: RedisError) -> StoreError {
    StoreError::unavailable(e)
}

pub(crate) fn malformed(what: &'static str) -> StoreError {
    StoreError::Codec(CodecError(what))
}

/// The coalescing queue of one store (one connection to one node).
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    conn: Connection,
    scripts: Scripts<'static>,
    max_in_flight: usize,
    /// Bound of one batch: the op timeout plus the replica wait.
    limit: Duration,
    durability: Option<Durability>,
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    in_flight: usize,
}

enum Entered {
    Alone(Op, Slot),
    Queued(oneshot::Receiver<Result<Reply, StoreError>>),
}

struct Waiting {
    op: Op,
    tx: oneshot::Sender<Result<Reply, StoreError>>,
}

impl Batcher {
    pub(crate) fn new(
        conn: Connection,
        scripts: Scripts<'static>,
        max_in_flight: usize,
        limit: Duration,
        durability: Option<Durability>,
    ) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            conn,
            scripts,
            max_in_flight: max_in_flight.max(1),
            limit,
            durability,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The lock guards plain bookkeeping with no panics inside; a poisoned one is still
        // consistent.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `op`, alone at once if a slot is free and nobody waits, else in the next batch.
    ///
    /// # Cancel safety
    /// Dropping the future of a lone operation leaves its script run or not run, as
    /// [`NamedScript::run`]; dropping a queued one takes it out of the next batch, or, if
    /// that batch already left, leaves it run or not run with the batch.
    pub(crate) async fn submit(self: &Arc<Self>, op: Op) -> Result<Reply, StoreError> {
        match self.enter(op) {
            Entered::Alone(op, slot) => {
                let value = run_alone(&self.conn, &self.scripts, &op).await;
                drop(slot);
                value.map(|value| Reply {
                    value,
                    waited: None,
                })
            }
            Entered::Queued(rx) => rx.await.unwrap_or_else(|_| {
                Err(StoreError::unavailable("batch dropped before it answered"))
            }),
        }
    }

    /// Takes a free slot for `op` if nobody waits, else queues it (and starts a task if a
    /// slot is free).
    fn enter(self: &Arc<Self>, op: Op) -> Entered {
        let mut q = self.lock();
        if q.waiting.is_empty() && q.in_flight < self.max_in_flight {
            q.in_flight += 1;
            return Entered::Alone(
                op,
                Slot {
                    batcher: Some(Arc::clone(self)),
                    lone: true,
                },
            );
        }
        let (tx, rx) = oneshot::channel();
        q.waiting.push_back(Waiting { op, tx });
        if q.in_flight < self.max_in_flight {
            q.in_flight += 1;
            drop(q);
            self.spawn_driver();
        }
        Entered::Queued(rx)
    }

    /// Hands a held slot to a new task that sends what waits. Outside any runtime (a lone
    /// operation's future dropped there) the waiting operations fail at once instead.
    fn spawn_driver(self: &Arc<Self>) {
        let slot = Slot {
            batcher: Some(Arc::clone(self)),
            lone: false,
        };
        // Without a runtime, dropping the slot fails what waits and gives the slot back.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(drive(slot));
        }
    }

    /// Takes the next batch off the queue, skipping operations whose callers gave up. With
    /// nothing left it gives the slot back (in the same critical section, so no operation
    /// can be left waiting with every slot idle).
    fn take(&self) -> Option<Vec<Waiting>> {
        let mut q = self.lock();
        let mut batch = Vec::with_capacity(q.waiting.len().min(MAX_OPS));
        let mut bytes = 0;
        while let Some(next) = q.waiting.front() {
            if next.tx.is_closed() {
                q.waiting.pop_front();
                continue;
            }
            if !batch.is_empty() && (batch.len() == MAX_OPS || bytes + next.op.size() > MAX_BYTES) {
                break;
            }
            bytes += next.op.size();
            batch.extend(q.waiting.pop_front());
        }
        if batch.is_empty() {
            q.in_flight -= 1;
            return None;
        }
        Some(batch)
    }

    /// Sends one batch and answers each of its callers.
    async fn send(&self, batch: Vec<Waiting>) {
        if batch.len() == 1 {
            for w in batch {
                let result = bounded(self.limit, run_alone(&self.conn, &self.scripts, &w.op)).await;
                let _ = w.tx.send(result.map(|value| Reply {
                    value,
                    waited: None,
                }));
            }
            return;
        }
        match bounded(self.limit, self.run_batch(&batch)).await {
            Ok((items, waited)) => {
                for (w, item) in batch.into_iter().zip(items) {
                    let reply = own_reply(item).map(|value| Reply {
                        waited: waited
                            .as_ref()
                            .map(|r| r.as_ref().map(|_| ()).map_err(share)),
                        value,
                    });
                    let _ = w.tx.send(reply);
                }
            }
            Err(e) => {
                tracing::debug!(ops = batch.len(), error = %e, "redis batch failed");
                for w in batch {
                    let _ = w.tx.send(Err(share(&e)));
                }
            }
        }
    }

    /// The batch's replies, one per operation, and in durability mode the replica wait after
    /// its writes (if it wrote anything).
    async fn run_batch(
        &self,
        batch: &[Waiting],
    ) -> Result<(Vec<Value>, Option<Result<(), StoreError>>), StoreError> {
        let args = 1 + batch.iter().map(|w| w.op.args).sum::<usize>();
        let bytes = batch.iter().map(|w| 1 + w.op.size()).sum();
        let script = self.scripts.batch;
        let mut cmd: Cmd = script.command(2 * batch.len(), args, bytes);
        for w in batch {
            cmd.arg(w.op.key.as_bytes());
        }
        for w in batch {
            cmd.arg(w.op.stream.as_bytes());
        }
        let codes: Vec<u8> = batch.iter().map(|w| w.op.kind.code()).collect();
        cmd.arg(codes);
        for w in batch {
            for a in w.op.arg_slices() {
                cmd.arg(a);
            }
        }
        let reply = script.run_command(&self.conn, &cmd).await.map_err(|e| {
            tracing::debug!(script = script.name(), error = %e, "redis script failed");
            redis_err(e)
        })?;
        let Value::Array(items) = reply else {
            return Err(malformed("unexpected batch reply"));
        };
        if items.len() != batch.len() {
            return Err(malformed("unexpected batch reply"));
        }
        let waited = match self.durability {
            Some(d) if batch.iter().zip(&items).any(|(w, v)| w.op.wrote(v)) => {
                Some(wait_replicas(&self.conn, d, batch[0].op.key.as_bytes()).await)
            }
            _ => None,
        };
        Ok((items, waited))
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

/// `WAIT` for `d.replicas` after this connection's writes, on the node that owns `key`.
pub(crate) async fn wait_replicas(
    conn: &Connection,
    d: Durability,
    key: &[u8],
) -> Result<(), StoreError> {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(d.replicas).arg(duration_ms(d.timeout));
    let acked = match conn.query_at_key(cmd, key).await.map_err(redis_err)? {
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

/// One error of a whole batch, for each of its operations: the same variant where it says
/// something precise (timeout, short acknowledgement, codec), else the shared cause.
fn share(e: &StoreError) -> StoreError {
    match e {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Uncertain { acked, wanted } => StoreError::Uncertain {
            acked: *acked,
            wanted: *wanted,
        },
        StoreError::Codec(c) => StoreError::Codec(c.clone()),
        other => StoreError::unavailable(BatchError(other.to_string(), source_text(other))),
    }
}

fn source_text(e: &StoreError) -> Option<String> {
    e.source().map(ToString::to_string)
}

/// The cause of a failed batch, as each of its operations reports it.
#[derive(Debug)]
struct BatchError(String, Option<String>);

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.1 {
            Some(cause) => write!(f, "batch failed: {cause}"),
            None => write!(f, "batch failed: {}", self.0),
        }
    }
}

impl StdError for BatchError {}

/// A held in-flight slot, given back (or handed on) when dropped.
struct Slot {
    batcher: Option<Arc<Batcher>>,
    /// A lone operation's slot: if its caller gives up while operations wait, a new task
    /// takes the slot to send them. A task's slot dropped early (the runtime shutting down)
    /// fails what waits instead, so a dying runtime cannot spawn tasks forever.
    lone: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        let mut q = batcher.lock();
        if q.waiting.is_empty() || !self.lone {
            q.waiting.clear();
            q.in_flight -= 1;
            return;
        }
        drop(q);
        batcher.spawn_driver();
    }
}

/// The task that owns a slot: sends batches while operations wait, then gives it back.
async fn drive(mut slot: Slot) {
    let Some(batcher) = slot.batcher.clone() else {
        return;
    };
    while let Some(batch) = batcher.take() {
        batcher.send(batch).await;
    }
    // `take` gave the slot back already.
    slot.batcher = None;
}
