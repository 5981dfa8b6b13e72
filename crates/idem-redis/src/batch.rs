//! Coalescing of concurrent claims and completions into one script call (single node).
//!
//! An operation that finds a free slot and nobody waiting runs its own single script at once,
//! in its caller's future: no added latency when the store is idle. Operations that arrive
//! while every slot is busy wait in a queue; when a slot frees up, a spawned task sends the
//! whole queue (up to a cap) as one `EVALSHA` of the batch script (`lua/batch.lua`), which
//! applies each operation in order with the same Lua function as its single script, and
//! hands each caller its own reply. The task keeps the slot while more operations queue up;
//! after each batch it yields once before it looks, so the callers it just answered (most
//! of them back with their next operation at once under load) make the next batch whole
//! instead of the first of them running alone ([`Batching::GATHER`]).
//! The queue, its slots and that task are [`idem_core::store::coalesce`]'s; this file says what a record
//! operation is and how a batch of them is sent.
//!
//! Every caller still bounds its own wait (the store's op timeout); a batch that fails or
//! runs out of time fails each of its operations.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use idem_core::record::{CodecError, duration_ms};
use idem_core::store::coalesce::{self as queue, Batching, Queue};
use redis::{Cmd, RedisError, Value};

use crate::config::Durability;
use crate::script::{Connection, NamedScript, own_reply};

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

/// Most arguments of one operation (claim has 8).
const MAX_ARGS: usize = 8;

/// Every operation's last two arguments are its store's audit stream bound and audit level
/// (see `lua/claim.lua`, `lua/complete.lua`); a batch sends them once for all its operations.
const AUDIT_ARGS: usize = 2;

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

    /// The operation's audit arguments (its last two), which a batch sends once.
    fn audit_args(&self) -> Option<(&[u8], &[u8])> {
        let mut last = self.arg_slices().skip(self.args.checked_sub(AUDIT_ARGS)?);
        Some((last.next()?, last.next()?))
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
    queue: Queue<Batcher>,
    conn: Connection,
    scripts: Scripts<'static>,
    durability: Option<Durability>,
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("max_in_flight", &self.queue.max_in_flight())
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher with `max_in_flight` calls at once; `limit` bounds one batch (the op
    /// timeout plus the replica wait).
    pub(crate) fn new(
        conn: Connection,
        scripts: Scripts<'static>,
        max_in_flight: usize,
        limit: Duration,
        durability: Option<Durability>,
    ) -> Self {
        Self {
            queue: Queue::new(max_in_flight, limit),
            conn,
            scripts,
            durability,
        }
    }

    /// Runs `op`, alone at once if a slot is free and nobody waits, else in the next batch.
    ///
    /// # Cancel safety
    /// Dropping the future of a lone operation leaves its script run or not run, as
    /// [`NamedScript::run`]; dropping a queued one takes it out of the next batch, or, if
    /// that batch already left, leaves it run or not run with the batch.
    pub(crate) async fn submit(self: &Arc<Self>, op: Op) -> Result<Reply, StoreError> {
        queue::submit(self, op).await
    }
}

impl Batching for Batcher {
    type Op = Op;
    type Answer = Reply;

    const MAX_OPS: usize = MAX_OPS;
    const MAX_BYTES: usize = MAX_BYTES;
    const FAILED: &'static str = "redis batch failed";
    const GATHER: bool = true;

    fn queue(&self) -> &Queue<Self> {
        &self.queue
    }

    fn size(op: &Op) -> usize {
        op.size()
    }

    async fn run_alone(&self, op: &Op) -> Result<Reply, StoreError> {
        let value = run_alone(&self.conn, &self.scripts, op).await?;
        Ok(Reply {
            value,
            waited: None,
        })
    }

    /// Each operation's reply, with, in durability mode, the replica wait after the batch's
    /// writes (if it wrote anything).
    async fn run_batch(&self, batch: &[Op]) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        // The layout of `lua/batch.lua`: the records, then each distinct stream once; the
        // operations' codes with their streams' positions; the audit arguments every
        // operation shares, once; then each operation's own arguments.
        let mut streams: Vec<&str> = Vec::new();
        let mut codes = Vec::with_capacity(2 * batch.len());
        for op in batch {
            let at = match streams.iter().position(|s| *s == op.stream) {
                Some(at) => at,
                None => {
                    streams.push(&op.stream);
                    streams.len() - 1
                }
            };
            codes.push(op.kind.code());
            // At most MAX_OPS (128) operations, so at most 128 streams: one byte holds it.
            codes.push(u8::try_from(at + 1).map_err(|_| malformed("too many streams in a batch"))?);
        }
        let (max, all) = match batch.first().map(Op::audit_args) {
            Some(Some(shared)) => shared,
            _ => return Err(malformed("batch operation without audit arguments")),
        };
        if batch.iter().any(|op| op.audit_args() != Some((max, all))) {
            return Err(malformed("batch operations with different audit arguments"));
        }
        let args = 3 + batch.iter().map(|op| op.args - AUDIT_ARGS).sum::<usize>();
        let bytes = codes.len()
            + max.len()
            + all.len()
            + batch
                .iter()
                .map(|op| op.key.len() + op.buf.len())
                .sum::<usize>()
            + streams.iter().map(|s| s.len()).sum::<usize>();
        let script = self.scripts.batch;
        let mut cmd: Cmd = script.command(batch.len() + streams.len(), args, bytes);
        for op in batch {
            cmd.arg(op.key.as_bytes());
        }
        for stream in &streams {
            cmd.arg(stream.as_bytes());
        }
        cmd.arg(codes).arg(max).arg(all);
        for op in batch {
            for a in op.arg_slices().take(op.args - AUDIT_ARGS) {
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
            Some(d) if batch.iter().zip(&items).any(|(op, v)| op.wrote(v)) => {
                Some(wait_replicas(&self.conn, d, batch[0].key.as_bytes()).await)
            }
            _ => None,
        };
        Ok(items
            .into_iter()
            .map(|item| {
                own_reply(item).map(|value| Reply {
                    waited: waited
                        .as_ref()
                        .map(|r| r.as_ref().map(|_| ()).map_err(share)),
                    value,
                })
            })
            .collect())
    }

    fn share(e: &StoreError) -> StoreError {
        share(e)
    }
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
