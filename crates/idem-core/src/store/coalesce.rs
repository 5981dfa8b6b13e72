//! Coalescing of concurrent store operations into batches, for store implementations: the
//! Redis store sends a batch as one script call, the SQL stores as one transaction.
//!
//! An operation that finds a free in-flight slot and nobody waiting runs alone at once, in
//! its caller's future: no added latency when the backend is idle. Operations that arrive
//! while every slot is busy wait in a queue; when a slot frees up, a spawned task (the
//! driver) takes the slot and sends the queue in batches until nothing waits. Every caller
//! still bounds its own wait; a batch that fails or runs out of time fails each of its
//! operations.
//!
//! What a batch is and how it is sent is each batcher's own ([`Batching`]); the bookkeeping
//! here (queue, slots, driver) is the same for all.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::{StoreError, bounded};

/// A batcher: the owner of a [`Queue`], and how it sends one operation or a batch.
pub trait Batching: Sized + Send + Sync + 'static {
    /// One queued operation.
    type Op: Send + Sync + 'static;
    /// What one operation's caller gets back.
    type Answer: Send + 'static;

    /// Most operations in one batch.
    const MAX_OPS: usize;
    /// Most bytes ([`Batching::size`]) in one batch; a lone larger operation still goes alone.
    const MAX_BYTES: usize;
    /// The debug log line of a failed batch.
    const FAILED: &'static str;
    /// Whether a driver yields to the runtime once after each batch, before it takes the
    /// next: the callers that batch answered then run first, and the operations they submit
    /// next join the queue instead of finding it empty (the driver would give its slot back,
    /// the first of them would run alone on it, and the rest would wait a whole call behind
    /// that one). Worth it where a call's fixed cost is a round trip; off by default.
    const GATHER: bool = false;

    /// The batcher's queue.
    fn queue(&self) -> &Queue<Self>;

    /// The bytes `op` adds to a batch.
    fn size(op: &Self::Op) -> usize;

    /// Runs `op` alone.
    fn run_alone(
        &self,
        op: &Self::Op,
    ) -> impl Future<Output = Result<Self::Answer, StoreError>> + Send;

    /// Runs two or more operations as one batch: each one's answer, in order, or the error
    /// of the whole batch.
    fn run_batch(
        &self,
        ops: &[Self::Op],
    ) -> impl Future<Output = Result<Vec<Result<Self::Answer, StoreError>>, StoreError>> + Send;

    /// The error of a whole batch, as each of its operations reports it.
    fn share(e: &StoreError) -> StoreError;
}

impl<B: Batching> fmt::Debug for Queue<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("max_in_flight", &self.max_in_flight)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// The waiting operations and the in-flight slots of one batcher.
pub struct Queue<B: Batching> {
    state: Mutex<State<B>>,
    max_in_flight: usize,
    /// Bound of one call a driver sends.
    limit: Duration,
}

struct State<B: Batching> {
    waiting: VecDeque<Waiting<B>>,
    in_flight: usize,
}

struct Waiting<B: Batching> {
    op: B::Op,
    tx: oneshot::Sender<Result<B::Answer, StoreError>>,
}

enum Entered<B: Batching> {
    Alone(B::Op, Slot<B>),
    Queued(oneshot::Receiver<Result<B::Answer, StoreError>>),
}

impl<B: Batching> Queue<B> {
    /// An empty queue with `max_in_flight` slots (at least one); `limit` bounds each call a
    /// driver sends.
    pub fn new(max_in_flight: usize, limit: Duration) -> Self {
        Self {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                in_flight: 0,
            }),
            max_in_flight: max_in_flight.max(1),
            limit,
        }
    }

    /// How many calls may be in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // The lock guards plain bookkeeping with no panics inside; a poisoned one is still
        // consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs `op` on `owner`'s queue, alone at once if a slot is free and nobody waits, else in
/// the next batch. The caller bounds the wait.
///
/// # Cancel safety
/// Dropping the future of a lone operation leaves it run or not run; dropping a
/// queued one takes it out of the next batch, or, if that batch already left, leaves it run
/// or not run with the batch.
pub async fn submit<B: Batching>(owner: &Arc<B>, op: B::Op) -> Result<B::Answer, StoreError> {
    match enter(owner, op) {
        Entered::Alone(op, slot) => {
            let answer = owner.run_alone(&op).await;
            drop(slot);
            answer
        }
        Entered::Queued(rx) => rx
            .await
            .unwrap_or_else(|_| Err(StoreError::unavailable("batch dropped before it answered"))),
    }
}

/// Takes a free slot for `op` if nobody waits, else queues it (and starts a driver if a slot
/// is free).
fn enter<B: Batching>(owner: &Arc<B>, op: B::Op) -> Entered<B> {
    let queue = owner.queue();
    let mut q = queue.lock();
    if q.waiting.is_empty() && q.in_flight < queue.max_in_flight {
        q.in_flight += 1;
        return Entered::Alone(
            op,
            Slot {
                owner: Some(Arc::clone(owner)),
                lone: true,
            },
        );
    }
    let (tx, rx) = oneshot::channel();
    q.waiting.push_back(Waiting { op, tx });
    if q.in_flight < queue.max_in_flight {
        q.in_flight += 1;
        drop(q);
        spawn_driver(owner);
    }
    Entered::Queued(rx)
}

/// Hands a held slot to a new task that sends what waits. Outside any runtime (a lone
/// operation's future dropped there) the waiting operations fail at once instead.
fn spawn_driver<B: Batching>(owner: &Arc<B>) {
    let slot = Slot {
        owner: Some(Arc::clone(owner)),
        lone: false,
    };
    // Without a runtime, dropping the slot fails what waits and gives the slot back.
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(drive(slot));
    }
}

/// Takes the next batch off the queue, skipping operations whose callers gave up. With
/// nothing left it gives the slot back (in the same critical section, so no operation can be
/// left waiting with every slot idle).
fn take<B: Batching>(queue: &Queue<B>) -> Option<Vec<Waiting<B>>> {
    let mut q = queue.lock();
    let mut batch = Vec::with_capacity(q.waiting.len().min(B::MAX_OPS));
    let mut bytes = 0;
    while let Some(next) = q.waiting.front() {
        if next.tx.is_closed() {
            q.waiting.pop_front();
            continue;
        }
        let size = B::size(&next.op);
        if !batch.is_empty() && (batch.len() == B::MAX_OPS || bytes + size > B::MAX_BYTES) {
            break;
        }
        bytes += size;
        batch.extend(q.waiting.pop_front());
    }
    if batch.is_empty() {
        q.in_flight -= 1;
        return None;
    }
    Some(batch)
}

/// Sends one batch and answers each of its callers.
async fn send<B: Batching>(owner: &B, batch: Vec<Waiting<B>>) {
    let limit = owner.queue().limit;
    if batch.len() == 1 {
        for w in batch {
            let answer = bounded(limit, owner.run_alone(&w.op)).await;
            let _ = w.tx.send(answer);
        }
        return;
    }
    let (ops, txs): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.op, w.tx)).unzip();
    match bounded(limit, owner.run_batch(&ops)).await {
        Ok(answers) => {
            for (tx, answer) in txs.into_iter().zip(answers) {
                let _ = tx.send(answer);
            }
        }
        Err(e) => {
            tracing::debug!(ops = ops.len(), error = %e, "{}", B::FAILED);
            for tx in txs {
                let _ = tx.send(Err(B::share(&e)));
            }
        }
    }
}

/// A held in-flight slot, given back (or handed on) when dropped.
struct Slot<B: Batching> {
    owner: Option<Arc<B>>,
    /// A lone operation's slot: when its caller is done (or gives up) while operations wait,
    /// a new task takes the slot to send them. A task's slot dropped early (the runtime
    /// shutting down) fails what waits instead, so a dying runtime cannot spawn tasks forever.
    lone: bool,
}

impl<B: Batching> Drop for Slot<B> {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        let mut q = owner.queue().lock();
        if q.waiting.is_empty() || !self.lone {
            q.waiting.clear();
            q.in_flight -= 1;
            return;
        }
        drop(q);
        spawn_driver(&owner);
    }
}

/// The task that owns a slot: sends batches while operations wait, then gives it back.
async fn drive<B: Batching>(mut slot: Slot<B>) {
    let Some(owner) = slot.owner.clone() else {
        return;
    };
    let mut sent = false;
    loop {
        if B::GATHER && sent {
            tokio::task::yield_now().await;
        }
        let Some(batch) = take(owner.queue()) else {
            break;
        };
        send(&*owner, batch).await;
        sent = true;
    }
    // `take` gave the slot back already.
    slot.owner = None;
}
