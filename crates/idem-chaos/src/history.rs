//! What the clients did and saw, and what the nemesis did: the checker's input besides the
//! upstream's [`Ledger`](crate::upstream::Ledger).

use serde::Serialize;

/// One logical operation a client tried to get done: a key, sent as one caller with one body,
/// retried until it settled.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// Its index in [`History::ops`].
    pub id: usize,
    /// The client that ran it (`usize::MAX` for the settle phase's own retries).
    pub client: usize,
    /// The caller it was sent as (its API key is `ak-<caller>`).
    pub caller: String,
    /// The idempotency key.
    pub key: String,
    /// The request body.
    pub body: String,
    /// What it is for.
    pub kind: OpKind,
}

/// Why an operation was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum OpKind {
    /// The key's own request.
    Normal,
    /// The key of a completed operation with another body: must get 422 and never run.
    Mismatch,
}

/// When an attempt was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Phase {
    /// While the nemesis ran.
    Main,
    /// After healing, retrying what was left open.
    Settle,
}

/// One HTTP attempt of an operation.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// The operation.
    pub op: usize,
    /// The gateway it was sent to.
    pub gateway: usize,
    /// When it was sent (ms since the run started).
    pub start_ms: u64,
    /// When its answer or error came.
    pub end_ms: u64,
    /// The phase it belongs to.
    pub phase: Phase,
    /// What came back.
    pub result: AttemptResult,
}

/// What an attempt got.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub enum AttemptResult {
    /// An HTTP answer.
    Answer(Answer),
    /// No answer: the client timed out (the gateway may be stopped).
    Timeout,
    /// The connection was refused: the gateway is down, nothing was sent.
    Refused,
    /// The connection broke after the request was sent.
    Broken(String),
}

/// An HTTP answer as the client read it.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// The upstream's execution id, when the body is the upstream's answer.
    pub exec: Option<String>,
    /// The caller the upstream's answer names.
    pub caller: Option<String>,
    /// The key the upstream's answer names.
    pub key: Option<String>,
    /// The problem slug, when the gateway answered itself (`in-flight`, `key-reused`, …).
    pub problem: Option<String>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
}

impl Answer {
    /// Whether the body is the upstream's answer (stored, replayed or fresh).
    pub fn from_upstream(&self) -> bool {
        self.exec.is_some()
    }
}

impl AttemptResult {
    /// The answer, if there was one.
    pub fn answer(&self) -> Option<&Answer> {
        match self {
            Self::Answer(a) => Some(a),
            _ => None,
        }
    }
}

/// One fault as it was injected.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// Its kind.
    pub kind: crate::FaultKind,
    /// What it hit (`g1`, `store`, `master 40123`, `link g2`).
    pub target: String,
    /// When it began.
    pub start_ms: u64,
    /// When it was healed.
    pub end_ms: u64,
    /// When it was fully in force, where that differs from `start_ms..end_ms` (a PostgreSQL
    /// freeze signals every backend, which takes a while each way): from when the last
    /// process was stopped to when the first was continued.
    pub in_force: Option<(u64, u64)>,
    /// What happened, for the log.
    pub detail: String,
}

impl FaultRecord {
    /// The span in which the fault certainly held.
    pub fn held(&self) -> (u64, u64) {
        self.in_force.unwrap_or((self.start_ms, self.end_ms))
    }
}

/// Everything the clients and the nemesis recorded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// The operations.
    pub ops: Vec<Op>,
    /// Every attempt of every operation.
    pub attempts: Vec<Attempt>,
    /// The faults.
    pub faults: Vec<FaultRecord>,
    /// When the store lost its data (a Redis restarted empty).
    pub data_lost_ms: Vec<u64>,
    /// The same moments on the wall clock (µs since the Unix epoch), to place a claim whose
    /// fence is a Redis server time (µs) before or after a loss.
    pub data_lost_wall_us: Vec<u64>,
    /// What the gateways said at the end about keys still open, by operation.
    pub final_states: Vec<(usize, String)>,
    /// Unknown records the admin API listed at the end, as (namespace, principal, key).
    pub unknown_records: Vec<(String, String, String)>,
}
