//! The reference model and the model-based property test.
//!
//! The model is written from `DESIGN.md` §2–3, independently of `idem_core::decide`: a map of
//! plain records and a step counter for time. The property test generates random operation
//! sequences (claims on a few keys with a few fingerprints under both takeover policies,
//! renew, complete, release of both kinds, resolve, delete, get, list, and time steps), runs
//! each against a store and the model, and demands they agree on every outcome and on the
//! final state.
//!
//! Fences cannot be predicted (a store may derive a floor from its clock), so the test checks
//! relations instead: every new fence of a key is strictly above every earlier one, and later
//! operations use the fences the store handed out. Timestamps are checked against the model's
//! time, anchored at the first lease the store reports.
//!
//! Every lease, TTL and time step is a small multiple of [`Harness::model_step`]. On a
//! manual clock the model is exact; on a real server's clock each case must finish its round
//! trips within well under one step of latency, and harnesses that cannot time-travel get
//! shorter cases with fewer, smaller steps.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Key, ListFilter, OwnerId, Record, RecordState, ReleaseKind,
    RenewOutcome, Resolution, ResolveOutcome, Scope, ScopedKey, SettleOutcome, StateKind, Store,
    StoredResponse, TakeoverPolicy,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use crate::ctx::{fp, rich_response, unique_namespace};
use crate::harness::Harness;

/// Cases the model test runs when the caller names no count.
pub const DEFAULT_CASES: u32 = 256;

/// Environment variable that overrides the case count everywhere.
pub const CASES_ENV: &str = "IDEM_PROPTEST_CASES";

/// The case count: [`CASES_ENV`] if set to a number, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var(CASES_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

const KEYS: u8 = 3;
const RESPONSES: u8 = 4;

/// How an operation names its holder: the real one, or a forgery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forge {
    /// The holder's own owner and fence.
    Genuine,
    /// Another owner with the holder's fence.
    OtherOwner,
    /// The holder's owner with the next fence.
    FenceUp,
    /// The holder's owner with the previous fence.
    FenceDown,
}

/// One generated operation. Durations are in model steps; `holder` picks one of the leases the
/// store granted so far in the case (0 is the latest), stale ones included.
#[derive(Clone, Debug)]
pub enum Op {
    /// Claim key `key` with fingerprint `fp`.
    Claim {
        /// Which key.
        key: u8,
        /// Which fingerprint.
        fp: u8,
        /// Takeover policy hold (else reexecute).
        hold: bool,
        /// Lease, in steps.
        lease: u8,
        /// Record TTL, in steps.
        ttl: u8,
        /// Whether to send a request id.
        request_id: bool,
    },
    /// Renew a holder's lease.
    Renew {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// New lease, in steps.
        lease: u8,
    },
    /// Complete as a holder.
    Complete {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// Which response.
        response: u8,
        /// Record TTL, in steps.
        ttl: u8,
    },
    /// Release as a holder.
    Release {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// Unknown (else retryable).
        unknown: bool,
    },
    /// Resolve a key: with a response and TTL, or by releasing it.
    Resolve {
        /// Which key.
        key: u8,
        /// `Some((response, ttl))` completes; `None` releases.
        complete: Option<(u8, u8)>,
    },
    /// Delete a key.
    Delete {
        /// Which key.
        key: u8,
    },
    /// Read a key and compare it with the model.
    Get {
        /// Which key.
        key: u8,
    },
    /// List the case's namespace, optionally by state, optionally limited.
    List {
        /// State filter.
        state: Option<StateKind>,
        /// The filter's limit (0: the default).
        limit: u8,
    },
    /// Let time pass.
    Advance {
        /// Steps.
        steps: u8,
    },
}

fn forge() -> impl Strategy<Value = Forge> {
    prop_oneof![
        6 => Just(Forge::Genuine),
        1 => Just(Forge::OtherOwner),
        1 => Just(Forge::FenceUp),
        1 => Just(Forge::FenceDown),
    ]
}

fn holder() -> impl Strategy<Value = u8> {
    prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => 2u8..6]
}

/// The operation strategy. `time_travel` allows more and longer time steps.
pub fn op(time_travel: bool) -> impl Strategy<Value = Op> {
    let max_steps: u8 = if time_travel { 5 } else { 2 };
    let advance_weight = if time_travel { 4 } else { 1 };
    let ttl = prop_oneof![Just(1u8), Just(3u8), Just(8u8), Just(40u8)];
    prop_oneof![
        8 => (0..KEYS, prop_oneof![4 => Just(0u8), 1 => Just(1u8)], any::<bool>(), 1u8..=4, ttl.clone(), any::<bool>())
            .prop_map(|(key, fp, hold, lease, ttl, request_id)| Op::Claim { key, fp, hold, lease, ttl, request_id }),
        2 => (holder(), forge(), 1u8..=4).prop_map(|(holder, forge, lease)| Op::Renew { holder, forge, lease }),
        4 => (holder(), forge(), 0..RESPONSES, ttl.clone())
            .prop_map(|(holder, forge, response, ttl)| Op::Complete { holder, forge, response, ttl }),
        3 => (holder(), forge(), any::<bool>()).prop_map(|(holder, forge, unknown)| Op::Release { holder, forge, unknown }),
        2 => (0..KEYS, proptest::option::of((0..RESPONSES, ttl))).prop_map(|(key, complete)| Op::Resolve { key, complete }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        2 => (0..KEYS).prop_map(|key| Op::Get { key }),
        2 => (
            proptest::option::of(prop_oneof![
                Just(StateKind::Processing),
                Just(StateKind::Completed),
                Just(StateKind::Unknown)
            ]),
            prop_oneof![2 => Just(0u8), 1 => 1u8..=2],
        )
            .prop_map(|(state, limit)| Op::List { state, limit }),
        advance_weight => (1..=max_steps).prop_map(|steps| Op::Advance { steps }),
    ]
}

/// A whole case: a sequence of operations.
pub fn ops(time_travel: bool) -> impl Strategy<Value = Vec<Op>> {
    let max_len = if time_travel { 40 } else { 14 };
    proptest::collection::vec(op(time_travel), 1..max_len)
}

/// The response the model test stores for index `i`.
pub fn response(i: u8) -> StoredResponse {
    match i % RESPONSES {
        0 => StoredResponse::new(200, "ok"),
        1 => StoredResponse::new(201, "{\"id\":1}")
            .with_header("content-type", "application/json")
            .with_header("x-a", "1"),
        2 => StoredResponse {
            status: 200,
            headers: vec![],
            body: bytes::Bytes::new(),
            body_omitted: true,
        },
        _ => rich_response(),
    }
}

/// A model record. Times are in model steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRecord {
    /// Fingerprint index.
    pub fp: u8,
    /// The fence the store granted for the claim that wrote this record.
    pub fence: u64,
    /// Request id of the latest claim.
    pub request_id: Option<String>,
    /// When first claimed.
    pub created: u64,
    /// When it goes away.
    pub expires: u64,
    /// Its state.
    pub state: ModelState,
}

/// A model record's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Held by `owner` until `lease_until`.
    Processing {
        /// Holder.
        owner: OwnerId,
        /// Lease end.
        lease_until: u64,
    },
    /// Completed with response index `response` at `at`.
    Completed {
        /// Response index.
        response: u8,
        /// When.
        at: u64,
    },
    /// Outcome unknown since `since`.
    Unknown {
        /// When.
        since: u64,
    },
}

impl ModelState {
    fn kind(&self) -> StateKind {
        match self {
            Self::Processing { .. } => StateKind::Processing,
            Self::Completed { .. } => StateKind::Completed,
            Self::Unknown { .. } => StateKind::Unknown,
        }
    }
}

/// What the model expects a claim to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelClaim {
    /// A new lease (the store picks the fence).
    Claimed {
        /// Whether an expired lease was taken over.
        takeover: bool,
    },
    /// Busy for this many steps.
    Busy {
        /// Steps until the lease ends.
        steps: u64,
    },
    /// Replay of response index.
    Done {
        /// Response index.
        response: u8,
    },
    /// Outcome unknown.
    Unknown,
    /// Another fingerprint is stored.
    Mismatch {
        /// Stored fingerprint index.
        stored: u8,
    },
}

/// The reference model: records by key index, and the time in steps.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Time, in steps.
    pub now: u64,
    /// Live (or not yet noticed expired) records by key index.
    pub records: BTreeMap<u8, ModelRecord>,
}

impl Model {
    /// The live record of `key`; an expired one is dropped first.
    pub fn live(&mut self, key: u8) -> Option<&mut ModelRecord> {
        if self
            .records
            .get(&key)
            .is_some_and(|r| r.expires <= self.now)
        {
            self.records.remove(&key);
        }
        self.records.get_mut(&key)
    }

    /// A claim. A `Claimed` answer leaves a processing record whose fence is 0 until
    /// [`Model::granted`] records the store's fence.
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        key: u8,
        fp: u8,
        owner: OwnerId,
        hold: bool,
        lease: u64,
        ttl: u64,
        request_id: Option<String>,
    ) -> ModelClaim {
        let now = self.now;
        let fresh = |created: u64| ModelRecord {
            fp,
            fence: 0,
            request_id: request_id.clone(),
            created,
            expires: (now + ttl).max(now + lease),
            state: ModelState::Processing {
                owner,
                lease_until: now + lease,
            },
        };
        let Some(rec) = self.live(key) else {
            self.records.insert(key, fresh(now));
            return ModelClaim::Claimed { takeover: false };
        };
        if rec.fp != fp {
            return ModelClaim::Mismatch { stored: rec.fp };
        }
        match rec.state {
            ModelState::Completed { response, .. } => ModelClaim::Done { response },
            ModelState::Unknown { .. } => ModelClaim::Unknown,
            ModelState::Processing { lease_until, .. } if lease_until > now => ModelClaim::Busy {
                steps: lease_until - now,
            },
            ModelState::Processing { .. } if hold => {
                rec.state = ModelState::Unknown { since: now };
                ModelClaim::Unknown
            }
            ModelState::Processing { .. } => {
                let created = rec.created;
                *rec = fresh(created);
                ModelClaim::Claimed { takeover: true }
            }
        }
    }

    /// Records the fence the store granted to the claim just made on `key`.
    pub fn granted(&mut self, key: u8, fence: u64) {
        if let Some(r) = self.records.get_mut(&key) {
            r.fence = fence;
        }
    }

    fn held(&mut self, key: u8, owner: OwnerId, fence: u64) -> Option<&mut ModelRecord> {
        self.live(key).filter(|r| {
            r.fence == fence
                && matches!(r.state, ModelState::Processing { owner: o, .. } if o == owner)
        })
    }

    /// A renewal; true when renewed.
    pub fn renew(&mut self, key: u8, owner: OwnerId, fence: u64, lease: u64) -> bool {
        let now = self.now;
        let Some(r) = self.held(key, owner, fence) else {
            return false;
        };
        r.state = ModelState::Processing {
            owner,
            lease_until: now + lease,
        };
        r.expires = r.expires.max(now + lease);
        true
    }

    /// A completion; true when settled.
    pub fn complete(
        &mut self,
        key: u8,
        owner: OwnerId,
        fence: u64,
        response: u8,
        ttl: u64,
    ) -> bool {
        let now = self.now;
        let Some(r) = self.held(key, owner, fence) else {
            return false;
        };
        r.state = ModelState::Completed { response, at: now };
        r.expires = now + ttl;
        true
    }

    /// A release; true when settled.
    pub fn release(&mut self, key: u8, owner: OwnerId, fence: u64, unknown: bool) -> bool {
        let now = self.now;
        let Some(r) = self.held(key, owner, fence) else {
            return false;
        };
        if unknown {
            r.state = ModelState::Unknown { since: now };
        } else {
            self.records.remove(&key);
        }
        true
    }

    /// An operator's resolve.
    pub fn resolve(&mut self, key: u8, complete: Option<(u8, u64)>) -> ResolveOutcome {
        let now = self.now;
        let Some(r) = self.live(key) else {
            return ResolveOutcome::NotFound;
        };
        let resolvable = match r.state {
            ModelState::Unknown { .. } => true,
            ModelState::Processing { lease_until, .. } => lease_until <= now,
            ModelState::Completed { .. } => false,
        };
        if !resolvable {
            return ResolveOutcome::NotResolvable {
                state: r.state.kind(),
            };
        }
        match complete {
            Some((response, ttl)) => {
                r.state = ModelState::Completed { response, at: now };
                r.expires = now + ttl;
            }
            None => {
                self.records.remove(&key);
            }
        }
        ResolveOutcome::Resolved
    }

    /// A delete; true when a live record existed.
    pub fn delete(&mut self, key: u8) -> bool {
        let existed = self.live(key).is_some();
        self.records.remove(&key);
        existed
    }

    /// Keys of live records in the given state (any state if `None`).
    pub fn list(&mut self, state: Option<StateKind>) -> BTreeSet<u8> {
        (0..KEYS)
            .filter(|&k| {
                self.live(k)
                    .is_some_and(|r| state.is_none_or(|s| r.state.kind() == s))
            })
            .collect()
    }
}

/// A lease the store granted during a case.
#[derive(Clone, Copy, Debug)]
struct Held {
    key: u8,
    owner: OwnerId,
    fence: u64,
}

/// One case in progress: the store, the model, and what is needed to relate them.
struct Case<'h, H: Harness> {
    h: &'h H,
    store: H::Store,
    model: Model,
    keys: Vec<ScopedKey>,
    ns: String,
    step_ms: u64,
    /// Store-clock milliseconds at model time 0, learned from the first lease.
    origin: Option<i128>,
    /// How far store timestamps may run ahead of the model's (real-server latency).
    slack_ms: i128,
    /// When the case started: a real-clock case whose latency outgrows the slack is
    /// inconclusive rather than failed.
    started: std::time::Instant,
    holders: Vec<Held>,
    /// Highest fence the store ever granted per key.
    high_fence: BTreeMap<u8, u64>,
    log: String,
    /// How often each branch of the contract was exercised.
    hits: BTreeMap<&'static str, u64>,
}

type Checked = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl<'h, H: Harness> Case<'h, H> {
    fn steps(&self, n: u64) -> Duration {
        Duration::from_millis(self.step_ms * n)
    }

    fn fail<T>(&self, e: impl std::fmt::Display) -> Result<T, String> {
        Err(format!("store error: {e}"))
    }

    /// Checks a store timestamp against model time `at` (in steps), learning the origin from
    /// the first one.
    fn time(&mut self, what: &str, got: idem_core::Timestamp, at: u64) -> Checked {
        let predicted_offset = i128::from(at) * i128::from(self.step_ms);
        let got = i128::from(got.as_millis());
        let origin = *self.origin.get_or_insert(got - predicted_offset);
        let drift = got - (origin + predicted_offset);
        ensure!(
            (0..=self.slack_ms).contains(&drift),
            "{what}: store time is {drift} ms off the model's (model step {at}, allowed 0..={} ms)",
            self.slack_ms
        );
        Ok(())
    }

    /// Whether real time has run ahead of model time by more than the slack: then store
    /// timestamps, and outcomes near a deadline, may no longer match the model.
    fn too_slow(&self) -> bool {
        if self.h.time_travel() {
            return false;
        }
        let model_ms = u128::from(self.step_ms) * u128::from(self.model.now);
        let lag = self.started.elapsed().as_millis().saturating_sub(model_ms);
        lag > u128::try_from(self.slack_ms).unwrap_or(0)
    }

    fn hit(&mut self, branch: &'static str) {
        *self.hits.entry(branch).or_default() += 1;
    }

    /// The model's record of `key` as stored, expired or not.
    fn snapshot(&self, key: u8) -> Option<ModelRecord> {
        self.model.records.get(&key).cloned()
    }

    fn settle_branches(
        &mut self,
        forge: Forge,
        pre: Option<&ModelRecord>,
        settled: bool,
        branch: &'static str,
    ) {
        self.hit(branch);
        if forge != Forge::Genuine {
            self.hit("forged holder");
        }
        let lease_over = pre.is_some_and(
            |r| matches!(r.state, ModelState::Processing { lease_until, .. } if lease_until <= self.model.now),
        );
        if settled && lease_over {
            self.hit("late holder settles");
        }
    }

    fn holder(&self, index: u8, forge: Forge) -> Held {
        let Some(held) = self
            .holders
            .len()
            .checked_sub(1 + usize::from(index) % self.holders.len().max(1))
            .map(|i| self.holders[i])
        else {
            return Held {
                key: 0,
                owner: OwnerId::random(),
                fence: 1,
            };
        };
        match forge {
            Forge::Genuine => held,
            Forge::OtherOwner => Held {
                owner: OwnerId::random(),
                ..held
            },
            Forge::FenceUp => Held {
                fence: held.fence + 1,
                ..held
            },
            Forge::FenceDown => Held {
                fence: held.fence.saturating_sub(1),
                ..held
            },
        }
    }

    async fn apply(&mut self, op: &Op) -> Checked {
        match *op {
            Op::Claim {
                key,
                fp: f,
                hold,
                lease,
                ttl,
                request_id,
            } => {
                let owner = OwnerId::random();
                let request_id = request_id.then(|| format!("req-{}", self.holders.len()));
                let req = ClaimRequest {
                    key: self.keys[usize::from(key)].clone(),
                    fingerprint: fp(f),
                    owner,
                    lease: self.steps(lease.into()),
                    ttl: self.steps(ttl.into()),
                    takeover: if hold {
                        TakeoverPolicy::Hold
                    } else {
                        TakeoverPolicy::Reexecute
                    },
                    request_id: request_id.clone(),
                };
                let got = match self.store.claim(&req).await {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let pre = self.snapshot(key);
                let want =
                    self.model
                        .claim(key, f, owner, hold, lease.into(), ttl.into(), request_id);
                self.hit(claim_branch(&want, pre.as_ref(), self.model.now));
                let _ = write!(self.log, " => {got:?}");
                match (&want, &got) {
                    (
                        ModelClaim::Claimed { takeover: w },
                        ClaimOutcome::Claimed {
                            lease: l,
                            takeover: g,
                        },
                    ) => {
                        ensure!(w == g, "claim: takeover flag {g}, model says {w}");
                        ensure!(l.owner == owner, "claim: lease names another owner");
                        let high = self.high_fence.get(&key).copied().unwrap_or(0);
                        ensure!(
                            l.fence > high,
                            "claim: fence {} is not above the key's earlier fence {high}",
                            l.fence
                        );
                        self.high_fence.insert(key, l.fence);
                        self.model.granted(key, l.fence);
                        self.holders.push(Held {
                            key,
                            owner,
                            fence: l.fence,
                        });
                        self.time(
                            "claim: lease deadline",
                            l.deadline,
                            self.model.now + u64::from(lease),
                        )?;
                    }
                    (ModelClaim::Busy { steps }, ClaimOutcome::Busy { retry_after }) => {
                        let want_ms = i128::from(self.step_ms * steps);
                        let got_ms = i128::try_from(retry_after.as_millis()).unwrap_or(i128::MAX);
                        ensure!(
                            got_ms <= want_ms && got_ms >= want_ms - self.slack_ms && got_ms > 0,
                            "busy: retry_after {got_ms} ms, model says {want_ms} ms"
                        );
                    }
                    (ModelClaim::Done { response: r }, ClaimOutcome::Done { response: got_r }) => {
                        ensure!(
                            *got_r == response(*r),
                            "done: replayed response differs from response #{r}"
                        );
                    }
                    (ModelClaim::Unknown, ClaimOutcome::Unknown) => {}
                    (ModelClaim::Mismatch { stored }, ClaimOutcome::Mismatch { stored: s }) => {
                        ensure!(
                            *s == fp(*stored),
                            "mismatch: reports another stored fingerprint"
                        );
                    }
                    _ => {
                        return Err(format!(
                            "claim: store answered {got:?}, model says {want:?}"
                        ));
                    }
                }
            }
            Op::Renew {
                holder,
                forge,
                lease,
            } => {
                let held = self.holder(holder, forge);
                let key = &self.keys[usize::from(held.key)];
                let got = match self
                    .store
                    .renew(key, held.owner, held.fence, self.steps(lease.into()))
                    .await
                {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let _ = write!(self.log, " [{held:?}] => {got:?}");
                let pre = self.snapshot(held.key);
                let want = self
                    .model
                    .renew(held.key, held.owner, held.fence, lease.into());
                self.settle_branches(
                    forge,
                    pre.as_ref(),
                    want,
                    if want {
                        "renew: renewed"
                    } else {
                        "renew: lost"
                    },
                );
                match got {
                    RenewOutcome::Renewed { deadline } if want => {
                        self.time(
                            "renew: deadline",
                            deadline,
                            self.model.now + u64::from(lease),
                        )?;
                    }
                    RenewOutcome::Lost if !want => {}
                    _ => {
                        return Err(format!(
                            "renew: store answered {got:?}, model says renewed={want}"
                        ));
                    }
                }
            }
            Op::Complete {
                holder,
                forge,
                response: r,
                ttl,
            } => {
                let held = self.holder(holder, forge);
                let key = &self.keys[usize::from(held.key)];
                let got = match self
                    .store
                    .complete(
                        key,
                        held.owner,
                        held.fence,
                        &response(r),
                        self.steps(ttl.into()),
                    )
                    .await
                {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let _ = write!(self.log, " [{held:?}] => {got:?}");
                let pre = self.snapshot(held.key);
                let want = self
                    .model
                    .complete(held.key, held.owner, held.fence, r, ttl.into());
                self.settle_branches(
                    forge,
                    pre.as_ref(),
                    want,
                    if want {
                        "complete: settled"
                    } else {
                        "complete: fenced"
                    },
                );
                ensure!(
                    (got == SettleOutcome::Settled) == want,
                    "complete: store answered {got:?}, model says settled={want}"
                );
            }
            Op::Release {
                holder,
                forge,
                unknown,
            } => {
                let held = self.holder(holder, forge);
                let key = &self.keys[usize::from(held.key)];
                let kind = if unknown {
                    ReleaseKind::Unknown
                } else {
                    ReleaseKind::Retryable
                };
                let got = match self.store.release(key, held.owner, held.fence, kind).await {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let _ = write!(self.log, " [{held:?}] => {got:?}");
                let pre = self.snapshot(held.key);
                let want = self
                    .model
                    .release(held.key, held.owner, held.fence, unknown);
                let branch = match (want, unknown) {
                    (false, _) => "release: fenced",
                    (true, false) => "release: retryable",
                    (true, true) => "release: unknown",
                };
                self.settle_branches(forge, pre.as_ref(), want, branch);
                ensure!(
                    (got == SettleOutcome::Settled) == want,
                    "release: store answered {got:?}, model says settled={want}"
                );
            }
            Op::Resolve { key, complete } => {
                let resolution = match complete {
                    Some((r, ttl)) => Resolution::Complete {
                        response: response(r),
                        ttl: self.steps(ttl.into()),
                    },
                    None => Resolution::Release,
                };
                let got = match self
                    .store
                    .resolve(&self.keys[usize::from(key)], &resolution)
                    .await
                {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let _ = write!(self.log, " => {got:?}");
                let pre = self.snapshot(key);
                let want = self
                    .model
                    .resolve(key, complete.map(|(r, ttl)| (r, u64::from(ttl))));
                self.hit(match (want, complete.is_some()) {
                    (ResolveOutcome::Resolved, _)
                        if matches!(pre.map(|r| r.state), Some(ModelState::Processing { .. })) =>
                    {
                        "resolve: expired lease"
                    }
                    (ResolveOutcome::Resolved, true) => "resolve: unknown completed",
                    (ResolveOutcome::Resolved, false) => "resolve: unknown released",
                    (ResolveOutcome::NotFound, _) => "resolve: not found",
                    _ => "resolve: not resolvable",
                });
                ensure!(
                    got == want,
                    "resolve: store answered {got:?}, model says {want:?}"
                );
            }
            Op::Delete { key } => {
                let got = match self.store.delete(&self.keys[usize::from(key)]).await {
                    Ok(o) => o,
                    Err(e) => return self.fail(e),
                };
                let _ = write!(self.log, " => {got:?}");
                let want = self.model.delete(key);
                self.hit(if want {
                    "delete: existed"
                } else {
                    "delete: absent"
                });
                ensure!(
                    got == want,
                    "delete: store answered {got}, model says {want}"
                );
            }
            Op::Get { key } => {
                self.hit("get");
                self.compare(key).await?;
            }
            Op::List { state, limit } => {
                self.hit(if limit == 0 { "list" } else { "list: limited" });
                self.compare_list(state, limit).await?;
            }
            Op::Advance { steps } => {
                self.h.advance(self.steps(steps.into())).await;
                self.model.now += u64::from(steps);
            }
        }
        Ok(())
    }

    async fn compare(&mut self, key: u8) -> Checked {
        let got = match self.store.get(&self.keys[usize::from(key)]).await {
            Ok(o) => o,
            Err(e) => return self.fail(e),
        };
        let want = self.model.live(key).cloned();
        match (got, want) {
            (None, None) => Ok(()),
            (Some(g), Some(w)) => self.compare_record(key, &g, &w),
            (g, w) => Err(format!("get k{key}: store has {g:?}, model has {w:?}")),
        }
    }

    fn compare_record(&mut self, key: u8, g: &Record, w: &ModelRecord) -> Checked {
        ensure!(
            g.key == self.keys[usize::from(key)],
            "k{key}: record names key {}",
            g.key
        );
        ensure!(
            g.fingerprint == fp(w.fp),
            "k{key}: fingerprint differs (model: #{})",
            w.fp
        );
        ensure!(
            g.fence == w.fence,
            "k{key}: fence {} but the latest grant was {}",
            g.fence,
            w.fence
        );
        ensure!(
            g.request_id == w.request_id,
            "k{key}: request id {:?}, model {:?}",
            g.request_id,
            w.request_id
        );
        self.time(&format!("k{key}: created_at"), g.created_at, w.created)?;
        self.time(&format!("k{key}: expires_at"), g.expires_at, w.expires)?;
        match (&g.state, &w.state) {
            (
                RecordState::Processing { owner, lease_until },
                ModelState::Processing {
                    owner: o,
                    lease_until: l,
                },
            ) => {
                ensure!(owner == o, "k{key}: processing owner differs");
                self.time(&format!("k{key}: lease_until"), *lease_until, *l)?;
            }
            (
                RecordState::Completed {
                    response: r,
                    completed_at,
                },
                ModelState::Completed { response: i, at },
            ) => {
                ensure!(
                    *r == response(*i),
                    "k{key}: stored response differs from #{i}"
                );
                self.time(&format!("k{key}: completed_at"), *completed_at, *at)?;
            }
            (RecordState::Unknown { since }, ModelState::Unknown { since: s }) => {
                self.time(&format!("k{key}: unknown since"), *since, *s)?;
            }
            (g, w) => return Err(format!("k{key}: store state {g:?}, model state {w:?}")),
        }
        Ok(())
    }

    async fn compare_list(&mut self, state: Option<StateKind>, limit: u8) -> Checked {
        let filter = ListFilter {
            namespace: Some(self.ns.clone()),
            state,
            limit: usize::from(limit),
            ..ListFilter::default()
        };
        let got = match self.store.list(&filter).await {
            Ok(o) => o,
            Err(e) => return self.fail(e),
        };
        ensure!(
            got.windows(2).all(|w| w[0].created_at <= w[1].created_at),
            "list: not ordered oldest first"
        );
        let want = self.model.list(state);
        let mut seen = BTreeSet::new();
        for rec in &got {
            let Some(k) = self.keys.iter().position(|k| *k == rec.key) else {
                return Err(format!("list: foreign record {}", rec.key));
            };
            let k = u8::try_from(k).unwrap_or(u8::MAX);
            ensure!(seen.insert(k), "list: k{k} listed twice");
            let Some(w) = self.model.live(k).cloned() else {
                return Err(format!(
                    "list {state:?}: store lists k{k}, model has no record"
                ));
            };
            self.compare_record(k, rec, &w)?;
        }
        if limit == 0 || want.len() <= usize::from(limit) {
            ensure!(
                seen == want,
                "list {state:?}: store lists {seen:?}, model {want:?}"
            );
            return Ok(());
        }
        // Limited: the `limit` oldest (ties in model time may go either way).
        ensure!(
            seen.len() == usize::from(limit),
            "list {state:?} limit {limit}: store lists {seen:?} of {want:?}"
        );
        let created = |m: &mut Model, k: u8| m.live(k).map_or(0, |r| r.created);
        let newest_listed = seen.iter().map(|&k| created(&mut self.model, k)).max();
        let oldest_left = want
            .difference(&seen)
            .map(|&k| created(&mut self.model, k))
            .min();
        ensure!(
            newest_listed <= oldest_left,
            "list {state:?} limit {limit}: store lists {seen:?}, not the oldest of {want:?}"
        );
        Ok(())
    }
}

/// Runs one case against a fresh namespace of the harness's store.
///
/// On a real clock, a case that ran so slowly that store time may have drifted past the
/// model's slack is inconclusive: it says so on stderr and counts as passed (the property
/// test rejects it instead, which draws another case).
///
/// # Errors
/// A description of the first disagreement, with the operations so far.
pub async fn run_case<H: Harness>(h: &H, ops: &[Op]) -> Result<(), String> {
    run_counting(h, ops, &mut BTreeMap::new()).await
}

async fn run_counting<H: Harness>(
    h: &H,
    ops: &[Op],
    hits: &mut BTreeMap<&'static str, u64>,
) -> Result<(), String> {
    match run_judged(h, ops, hits).await {
        Ok(()) => Ok(()),
        Err(CaseError::Disagree(e)) => Err(e),
        Err(CaseError::TooSlow(e)) => {
            eprintln!("idem-testkit: model case inconclusive (too slow for the model step): {e}");
            Ok(())
        }
    }
}

/// Why a case did not pass.
enum CaseError {
    /// Store and model disagree.
    Disagree(String),
    /// A real-clock case ran so slowly that store time may have drifted past the model's
    /// slack; its verdict would be noise.
    TooSlow(String),
}

async fn run_judged<H: Harness>(
    h: &H,
    ops: &[Op],
    hits: &mut BTreeMap<&'static str, u64>,
) -> Result<(), CaseError> {
    let ns = unique_namespace("model");
    let scope = Scope::new(ns.clone()).map_err(|e| CaseError::Disagree(e.to_string()))?;
    let keys = (0..KEYS)
        .map(|i| ScopedKey::new(scope.clone(), Key::new(format!("k{i}")).expect("key")))
        .collect();
    let step_ms = idem_core::record::duration_ms(h.model_step()).max(1);
    let mut case = Case {
        h,
        store: h.store().await,
        model: Model::default(),
        keys,
        ns,
        step_ms,
        origin: None,
        slack_ms: if h.time_travel() {
            0
        } else {
            i128::from(step_ms) / 2
        },
        holders: Vec::new(),
        high_fence: BTreeMap::new(),
        log: String::new(),
        hits: BTreeMap::new(),
        started: std::time::Instant::now(),
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        let _ = write!(case.log, "\n  #{i} t={} {op:?}", case.model.now);
        result = case.apply(op).await;
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        // The final state: every key and the namespace listing.
        let _ = write!(case.log, "\n  final check t={}", case.model.now);
        for key in 0..KEYS {
            result = case.compare(key).await;
            if result.is_err() {
                break;
            }
        }
    }
    if result.is_ok() {
        result = case.compare_list(None, 0).await;
    }
    let result = result.map_err(|e| {
        let e = format!("{e}\noperations:{}", case.log);
        if case.too_slow() {
            CaseError::TooSlow(e)
        } else {
            CaseError::Disagree(e)
        }
    });
    for (branch, n) in case.hits {
        *hits.entry(branch).or_default() += n;
    }
    result
}

/// The branches of the contract the model test counts (see [`coverage`]).
pub const BRANCHES: &[&str] = &[
    "claim: absent key",
    "claim: after expiry",
    "claim: takeover",
    "claim: busy",
    "claim: replay",
    "claim: unknown record",
    "claim: hold marks unknown",
    "claim: mismatch",
    "renew: renewed",
    "renew: lost",
    "complete: settled",
    "complete: fenced",
    "release: retryable",
    "release: unknown",
    "release: fenced",
    "late holder settles",
    "forged holder",
    "resolve: unknown completed",
    "resolve: unknown released",
    "resolve: expired lease",
    "resolve: not resolvable",
    "resolve: not found",
    "delete: existed",
    "delete: absent",
    "get",
    "list",
    "list: limited",
];

fn claim_branch(want: &ModelClaim, pre: Option<&ModelRecord>, now: u64) -> &'static str {
    let expired = pre.is_some_and(|r| r.expires <= now);
    match want {
        ModelClaim::Claimed { takeover: true } => "claim: takeover",
        ModelClaim::Claimed { .. } if expired => "claim: after expiry",
        ModelClaim::Claimed { .. } => "claim: absent key",
        ModelClaim::Busy { .. } => "claim: busy",
        ModelClaim::Done { .. } => "claim: replay",
        ModelClaim::Unknown
            if matches!(pre.map(|r| &r.state), Some(ModelState::Processing { .. })) =>
        {
            "claim: hold marks unknown"
        }
        ModelClaim::Unknown => "claim: unknown record",
        ModelClaim::Mismatch { .. } => "claim: mismatch",
    }
}

/// Runs `cases` cases drawn deterministically from the generator (no shrinking) and counts
/// how often each of [`BRANCHES`] was exercised: evidence that the generated sequences reach
/// every corner of the contract.
///
/// # Panics
/// When the store disagrees with the model.
pub async fn coverage<H: Harness>(h: &H, cases: u32) -> BTreeMap<&'static str, u64> {
    let strategy = ops(h.time_travel());
    let mut runner = TestRunner::deterministic();
    let mut hits = BTreeMap::new();
    for _ in 0..cases {
        let case = strategy
            .new_tree(&mut runner)
            .expect("generate a case")
            .current();
        if let Err(e) = run_counting(h, &case, &mut hits).await {
            panic!("store disagrees with the reference model: {e}");
        }
    }
    hits
}

/// Runs `cases` generated cases against the harness and panics with a shrunk counterexample if
/// store and model ever disagree. `source_file` (the caller's `file!()`) turns on proptest's
/// regression file next to it.
///
/// Needs a multi-threaded tokio runtime (it blocks in place while proptest drives the cases).
pub async fn check<H: Harness>(h: &H, cases: u32, source_file: Option<&'static str>) {
    let failure_persistence: Option<Box<dyn proptest::test_runner::FailurePersistence>> =
        source_file
            .map(|_| Box::new(FileFailurePersistence::WithSource("proptest-regressions")) as _);
    let config = Config {
        cases,
        source_file,
        failure_persistence,
        max_shrink_iters: 4096,
        max_shrink_time: if h.time_travel() { 0 } else { 120_000 },
        ..Config::default()
    };
    let strategy = ops(h.time_travel());
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        let mut runner = TestRunner::new(config);
        runner.run(&strategy, |ops| {
            handle
                .block_on(run_judged(h, &ops, &mut BTreeMap::new()))
                .map_err(|e| match e {
                    CaseError::Disagree(e) => TestCaseError::fail(e),
                    CaseError::TooSlow(e) => TestCaseError::reject(e),
                })
        })
    });
    if let Err(e) = result {
        panic!("store disagrees with the reference model: {e}");
    }
}
