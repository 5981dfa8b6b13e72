//! Group commit: concurrent claims and completions on the store's own pool share a commit.
//!
//! Who runs alone, who waits and the task that sends a batch are
//! [`idem_core::store::coalesce`]'s, as for the Redis store's script batches. An operation
//! that finds a free slot ([`crate::SqlStore::with_group_slots`], 2 by default) runs alone at
//! once, so an idle store adds no latency; while every slot is busy, the operations that arrive wait and are sent
//! together when a slot frees up:
//!
//! - [`Grouping::Statement`] (PostgreSQL): the waiting claims as one statement and the
//!   waiting completions as another (the dialect's `CLAIM_MANY` and `COMPLETE_MANY`);
//! - [`Grouping::Transaction`] (SQLite, one writer): every operation's own statement, in one
//!   transaction, so one commit (one log flush) serves them all.
//!
//! The guarantees are a lone operation's. A grouped statement applies the same guards as the
//! single one, and what it cannot decide alone runs again alone after it: a key it found
//! claimable but did not write (an expired record, a lease to take over), a key another
//! transaction was inserting, a second operation on a key already in the batch. A batch the
//! database rolled back whole (two batches deadlocked, a failed statement inside the
//! transaction) runs each of its operations alone instead. A batch whose fate is unknown (the
//! connection dropped before the answer) fails each operation with
//! [`StoreError::Unavailable`], as a lone operation's lost answer does.

use std::fmt;
use std::time::Duration;

use idem_core::store::Completion;
use idem_core::store::coalesce::{Batching, Queue};
use idem_core::{ClaimOutcome, ClaimRequest, OwnerId, ScopedKey, SettleOutcome, StoreError};

use crate::dialect::{ClaimColumns, CompleteColumns, Dialect, Grouping};
use crate::driver::On;
use crate::record::{ClaimRow, fence_param, ms};
use crate::store::SqlStore;

/// Most operations in one batch.
const MAX_OPS: usize = 64;
/// Most bytes (keys and responses) in one batch; a lone larger operation still goes alone.
const MAX_BYTES: usize = 1 << 20;
/// The column of the row id in a grouped claim's rows: after `wrote`, `now_ms` and the 14
/// record columns.
const CLAIM_ID_COLUMN: usize = 16;

/// An operation's place in its batch and the id of the row it is about.
type Placed = (usize, [u8; 32]);

/// One operation a batch can hold.
#[derive(Debug)]
pub(crate) enum Op {
    Claim(ClaimRequest),
    Complete(Encoded),
}

/// A completion as a group holds it: the claim it settles and the encoded response it stores.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) key: ScopedKey,
    pub(crate) owner: OwnerId,
    pub(crate) fence: u64,
    pub(crate) response: Vec<u8>,
    pub(crate) ttl: Duration,
}

impl Encoded {
    /// `completion`, with its response encoded.
    pub(crate) fn new(completion: &Completion<'_>) -> Self {
        let Completion {
            hold,
            response,
            ttl,
        } = *completion;
        Self {
            key: hold.key.clone(),
            owner: hold.owner,
            fence: hold.fence,
            response: response.encode(),
            ttl,
        }
    }
}

/// What an operation's caller gets back.
#[derive(Debug)]
pub(crate) enum Answer {
    Claim(ClaimOutcome),
    Settle(SettleOutcome),
}

impl Answer {
    pub(crate) fn claim(self) -> Result<ClaimOutcome, StoreError> {
        match self {
            Self::Claim(outcome) => Ok(outcome),
            Self::Settle(_) => Err(StoreError::unavailable("a claim answered as a completion")),
        }
    }

    pub(crate) fn settle(self) -> Result<SettleOutcome, StoreError> {
        match self {
            Self::Settle(outcome) => Ok(outcome),
            Self::Claim(_) => Err(StoreError::unavailable("a completion answered as a claim")),
        }
    }
}

/// The group-commit queue of one store. Holds a clone of the store without a queue of its
/// own, to run the operations.
pub(crate) struct Group<D: Dialect> {
    queue: Queue<Self>,
    store: SqlStore<D>,
}

impl<D: Dialect> fmt::Debug for Group<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("max_in_flight", &self.queue.max_in_flight())
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Group<D> {
    /// A queue with `slots` operations or batches in flight at once (at most one per
    /// connection `store`'s writer may open). `limit` bounds the call a batch makes.
    pub(crate) fn new(store: SqlStore<D>, slots: usize, limit: Duration) -> Self {
        let slots = slots.min(store.writer.options().get_max_connections() as usize);
        Self {
            queue: Queue::new(slots, limit),
            store,
        }
    }

    /// Each operation in its own statements, in one transaction of the store's own.
    async fn in_transaction(&self, ops: &[Op]) -> Vec<Result<Answer, StoreError>> {
        match self.try_transaction(ops).await {
            Ok(answers) => answers,
            Err(Failed::RolledBack) => self.each_alone(ops).await,
            Err(Failed::Unknown(e)) => ops.iter().map(|_| Err(unavailable(&e))).collect(),
        }
    }

    async fn try_transaction(&self, ops: &[Op]) -> Result<Vec<Result<Answer, StoreError>>, Failed> {
        let store = &self.store;
        let mut tx = store
            .begin()
            .await
            .map_err(|e| Failed::Unknown(e.to_string()))?;
        let mut answers = Vec::with_capacity(ops.len());
        for op in ops {
            let answer = match op {
                Op::Claim(req) => store.claim_on(Some(&mut *tx), req).await.map(Answer::Claim),
                Op::Complete(c) => store
                    .complete_encoded(On::Conn(&mut *tx), c)
                    .await
                    .map(Answer::Settle),
            };
            // Any failure inside the transaction rolls it back (dropping it does); each
            // operation then runs alone and reports its own error.
            answers.push(answer.map_err(|_| Failed::RolledBack)?);
        }
        tx.commit()
            .await
            .map_err(|e| Failed::Unknown(e.to_string()))?;
        self.audit_fenced(ops, &answers).await;
        Ok(answers.into_iter().map(Ok).collect())
    }

    /// The claims in one statement and the completions in another; what they leave undecided
    /// runs alone after them, in order.
    async fn in_statements(&self, ops: &[Op]) -> Vec<Result<Answer, StoreError>> {
        let none =
            || -> Vec<Option<Result<Answer, StoreError>>> { ops.iter().map(|_| None).collect() };
        let (mut by_claims, mut by_completions) = (none(), none());
        let (claims, completions) = distinct(ops);
        // Side by side, each on a connection of its own: neither holds one while it waits for
        // another, so the two cannot starve each other of the pool.
        futures::future::join(
            async {
                if claims.len() > 1 {
                    self.claim_many(ops, &claims, &mut by_claims).await;
                }
            },
            async {
                if completions.len() > 1 {
                    self.complete_many(ops, &completions, &mut by_completions)
                        .await;
                }
            },
        )
        .await;
        let mut out = Vec::with_capacity(ops.len());
        for ((op, claimed), completed) in ops.iter().zip(by_claims).zip(by_completions) {
            out.push(match claimed.or(completed) {
                Some(answer) => answer,
                None => self.store.alone(op).await,
            });
        }
        out
    }

    /// Runs the claims at `claims` (distinct ids, sorted) as one statement.
    async fn claim_many(
        &self,
        ops: &[Op],
        claims: &[Placed],
        answers: &mut [Option<Result<Answer, StoreError>>],
    ) {
        let Some(sql) = self.store.sql.claim_many.as_deref() else {
            return;
        };
        let mut columns = ClaimColumns::default();
        for (i, id) in claims {
            let Some(Op::Claim(req)) = ops.get(*i) else {
                continue;
            };
            columns.id.push(id.to_vec());
            columns.namespace.push(req.key.scope.namespace().to_owned());
            columns
                .principal
                .push(req.key.scope.principal().map(str::to_owned));
            columns.key.push(req.key.key.as_str().to_owned());
            columns
                .fingerprint
                .push(req.fingerprint.to_bytes().to_vec());
            columns.owner.push(req.owner.to_bytes().to_vec());
            columns.lease.push(ms(req.lease));
            columns.ttl.push(ms(req.ttl));
            columns.request_id.push(req.request_id.clone());
        }
        let rows = match D::claim_many(&self.store.writer, sql, columns).await {
            Ok(rows) => rows,
            // Rolled back whole: each claim runs alone.
            Err(e) if rolled_back(&e) => return,
            Err(e) => {
                let e = e.to_string();
                for (i, _) in claims {
                    answers[*i] = Some(Err(unavailable(&e)));
                }
                return;
            }
        };
        for row in rows {
            let at = match D::bytes(&row, CLAIM_ID_COLUMN) {
                Ok(Some(id)) => claims.binary_search_by(|(_, c)| c.as_slice().cmp(&id)).ok(),
                _ => None,
            };
            let Some(&(i, _)) = at.and_then(|at| claims.get(at)) else {
                continue;
            };
            let Some(Op::Claim(req)) = ops.get(i) else {
                continue;
            };
            answers[i] = match ClaimRow::decode::<D>(&row).and_then(|r| r.outcome(req)) {
                Ok(Some(outcome)) => Some(Ok(Answer::Claim(outcome))),
                // Claimable but not written by this statement: alone.
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            };
        }
    }

    /// Runs the completions at `completions` (distinct ids) as one statement.
    async fn complete_many(
        &self,
        ops: &[Op],
        completions: &[Placed],
        answers: &mut [Option<Result<Answer, StoreError>>],
    ) {
        let Some(sql) = self.store.sql.complete_many.as_deref() else {
            return;
        };
        let mut columns = CompleteColumns::default();
        for (i, id) in completions {
            let Some(Op::Complete(c)) = ops.get(*i) else {
                continue;
            };
            columns.id.push(id.to_vec());
            columns.owner.push(c.owner.to_bytes().to_vec());
            columns.fence.push(fence_param(c.fence));
            columns.response.push(c.response.clone());
            columns.ttl.push(ms(c.ttl));
        }
        let rows = match D::complete_many(&self.store.writer, sql, columns).await {
            Ok(rows) => rows,
            Err(e) if rolled_back(&e) => return,
            Err(e) => {
                let e = e.to_string();
                for (i, _) in completions {
                    answers[*i] = Some(Err(unavailable(&e)));
                }
                return;
            }
        };
        let mut done: Vec<Vec<u8>> = rows
            .iter()
            .filter_map(|row| D::bytes(row, 0).ok().flatten())
            .collect();
        done.sort_unstable();
        for (i, id) in completions {
            let Some(Op::Complete(c)) = ops.get(*i) else {
                continue;
            };
            // Not changed by the guarded update: the claim no longer holds the key.
            let outcome = if done.binary_search_by(|d| d.as_slice().cmp(id)).is_ok() {
                SettleOutcome::Settled
            } else {
                self.store
                    .audit_fenced(&c.key, c.owner, c.fence, "complete")
                    .await;
                SettleOutcome::Fenced
            };
            answers[*i] = Some(Ok(Answer::Settle(outcome)));
        }
    }

    /// Each operation alone, in order.
    async fn each_alone(&self, ops: &[Op]) -> Vec<Result<Answer, StoreError>> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(self.store.alone(op).await);
        }
        out
    }

    /// Records the fenced completions of a committed transaction, as a lone one does.
    async fn audit_fenced(&self, ops: &[Op], answers: &[Answer]) {
        for (op, answer) in ops.iter().zip(answers) {
            if let (Op::Complete(c), Answer::Settle(SettleOutcome::Fenced)) = (op, answer) {
                self.store
                    .audit_fenced(&c.key, c.owner, c.fence, "complete")
                    .await;
            }
        }
    }
}

/// How a grouped transaction failed.
enum Failed {
    /// Nothing of it was committed.
    RolledBack,
    /// The commit's answer was lost: it may or may not have committed.
    Unknown(String),
}

/// The claims and the completions of `ops`, each as (index, row id) sorted by id, keeping
/// the first operation on each id of each kind; the others run alone after the batch.
fn distinct(ops: &[Op]) -> (Vec<Placed>, Vec<Placed>) {
    let (mut claims, mut completions) = (Vec::new(), Vec::new());
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Claim(req) => claims.push((i, req.key.digest())),
            Op::Complete(c) => completions.push((i, c.key.digest())),
        }
    }
    for list in [&mut claims, &mut completions] {
        // Stable: the first operation on an id stays, in arrival order.
        list.sort_by_key(|placed| placed.1);
        list.dedup_by(|later, first| later.1 == first.1);
    }
    (claims, completions)
}

/// The database refused the statement, so it changed nothing.
fn rolled_back(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
}

fn unavailable(e: &str) -> StoreError {
    StoreError::unavailable(format!("grouped commit: {e}"))
}

impl<D: Dialect> Batching for Group<D> {
    type Op = Op;
    type Answer = Answer;

    const MAX_OPS: usize = MAX_OPS;
    const MAX_BYTES: usize = MAX_BYTES;
    const FAILED: &'static str = "sql group commit failed";

    fn queue(&self) -> &Queue<Self> {
        &self.queue
    }

    fn size(op: &Op) -> usize {
        match op {
            Op::Claim(req) => req.key.key.as_str().len() + 128,
            Op::Complete(c) => c.response.len() + 96,
        }
    }

    async fn run_alone(&self, op: &Op) -> Result<Answer, StoreError> {
        self.store.alone(op).await
    }

    async fn run_batch(&self, ops: &[Op]) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        Ok(match D::GROUPING {
            Grouping::Transaction => self.in_transaction(ops).await,
            Grouping::Statement | Grouping::Off => self.in_statements(ops).await,
        })
    }

    fn share(e: &StoreError) -> StoreError {
        match e {
            StoreError::Timeout(d) => StoreError::Timeout(*d),
            other => unavailable(&other.to_string()),
        }
    }
}
