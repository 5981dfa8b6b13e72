//! The checker: reads the clients' [`History`], the upstream's ledger ([`Call`]s) and the
//! fault log, and lists every anomaly per key.
//!
//! A key is a caller and an idempotency key (a relay's principal and a message id for
//! messages). What it checks, and which planted gateway bug each check is there to catch, is
//! in the README; in short:
//!
//! | check | anomaly |
//! |---|---|
//! | at most one execution per key while the store kept its data | [`Kind::DoubleExecution`] |
//! | every upstream answer a client saw is the key's first execution's, in the caller's own scope | [`Kind::NotFirstAnswer`], [`Kind::ForeignAnswer`], [`Kind::PhantomAnswer`] |
//! | a key reused with another body is refused and never runs | [`Kind::MismatchRan`], [`Kind::MismatchAnswered`] |
//! | every execution carries its claim: the key header and, once fences are forwarded, a fence of its own that a store granted (above 0) | [`Kind::NoKey`], [`Kind::NoFence`], [`Kind::FenceReused`], [`Kind::FenceWentBack`] |
//! | nothing runs through a gateway whose store is frozen or cut | [`Kind::ExecutedDuringOutage`] |
//! | an answer once delivered is durable: no later run, no later in-flight or unknown | [`Kind::NotDurable`] |
//! | every answer comes within its bound, unless the gateway was stopped | [`Kind::LateAnswer`] |
//! | no key left processing after leases ran out | [`Kind::Stuck`] |
//! | every message executed once | [`Kind::MessageLost`], [`Kind::MessageTwice`] |
//!
//! A key that runs again after the store lost its data (a Redis restarted empty) is not
//! counted against the store, but listed apart ([`Findings::after_data_loss`]); two runs
//! between the same two losses still are. Answers that met the emptied store are not judged.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

use crate::FaultKind;
use crate::history::{Answer, Attempt, AttemptResult, History, Op, OpKind};
use crate::upstream::{Call, Execution};

/// One kind of anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[non_exhaustive]
pub enum Kind {
    /// A key executed more than once while the store kept its data.
    DoubleExecution,
    /// A client got an upstream answer that is not the key's first execution's.
    NotFirstAnswer,
    /// A client got an answer naming another caller or key.
    ForeignAnswer,
    /// A client got an upstream answer no execution gave.
    PhantomAnswer,
    /// A request reusing a key with another body ran.
    MismatchRan,
    /// A request reusing a key with another body got an answer other than 422 or 503.
    MismatchAnswered,
    /// An answer no rule allows (a 4xx a normal request should never get, a 500 of idem's).
    UnexpectedAnswer,
    /// An execution without an `Idempotency-Key` header.
    NoKey,
    /// An execution without a fence, where the gateway forwards fences.
    NoFence,
    /// Two executions of one key with the same fence.
    FenceReused,
    /// An execution with a lower fence than an earlier execution of the key.
    FenceWentBack,
    /// A request reached the upstream through a gateway whose store was frozen or cut.
    ExecutedDuringOutage,
    /// After an answer was delivered, the key ran again or answered in-flight or unknown.
    NotDurable,
    /// An answer (or the lack of one) past the bound, with the gateway not stopped.
    LateAnswer,
    /// A key still processing after every lease ran out.
    Stuck,
    /// A published message that never executed and was not dead-lettered.
    MessageLost,
    /// A message executed more than once.
    MessageTwice,
}

impl Kind {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DoubleExecution => "double-execution",
            Self::NotFirstAnswer => "not-first-answer",
            Self::ForeignAnswer => "foreign-answer",
            Self::PhantomAnswer => "phantom-answer",
            Self::MismatchRan => "mismatch-ran",
            Self::MismatchAnswered => "mismatch-answered",
            Self::UnexpectedAnswer => "unexpected-answer",
            Self::NoKey => "no-key",
            Self::NoFence => "no-fence",
            Self::FenceReused => "fence-reused",
            Self::FenceWentBack => "fence-went-back",
            Self::ExecutedDuringOutage => "executed-during-outage",
            Self::NotDurable => "not-durable",
            Self::LateAnswer => "late-answer",
            Self::Stuck => "stuck",
            Self::MessageLost => "message-lost",
            Self::MessageTwice => "message-twice",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One anomaly.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    /// Its kind.
    pub kind: Kind,
    /// The key, as `caller/key`.
    pub key: String,
    /// What was seen.
    pub detail: String,
}

/// The messages published for the relays.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Messages {
    /// Every distinct message id, by relay principal (`relay:rabbit`).
    pub published: BTreeMap<String, Vec<String>>,
    /// Publishes in all, duplicates included.
    pub publishes: usize,
    /// Message ids found dead-lettered, by relay principal.
    pub dead: BTreeMap<String, Vec<String>>,
}

/// What the checker needs besides the history and the ledger.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The longest an answer may take (ms).
    pub answer_bound_ms: u64,
    /// How long a request claimed just before an outage may take to reach the upstream (ms).
    pub outage_grace_ms: u64,
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    /// Every anomaly.
    pub anomalies: Vec<Anomaly>,
    /// Keys whose record was left unknown at the end.
    pub unknown: Vec<String>,
    /// Keys that executed again after the store lost its data, with their execution count.
    pub after_data_loss: Vec<(String, usize)>,
    /// Keys that never got an answer and were not left unknown.
    pub unanswered: Vec<String>,
    /// Whether the gateways forwarded fences.
    pub fences_forwarded: bool,
    /// Keys in all.
    pub keys: usize,
    /// Executions in all.
    pub executions: usize,
    /// Messages executed once.
    pub messages_once: usize,
    /// Messages dead-lettered (their keys parked unknown).
    pub messages_dead: usize,
}

/// 2001-09-09 in µs since the Unix epoch: a fence above it is a server time, not a counter.
const MICROS_2001: u64 = 1_000_000_000_000_000;

/// How far from a loss a claim's server time must be to be placed before or after it.
const LOSS_SLACK_US: u64 = 100_000;

fn name(principal: &str, key: &str) -> String {
    format!("{principal}/{key}")
}

/// Whether `t` falls in `[start + grace, end]` of any interval.
fn inside(t: u64, intervals: &[(u64, u64)], grace: u64) -> bool {
    intervals
        .iter()
        .any(|&(s, e)| t >= s.saturating_add(grace) && t <= e)
}

/// Whether `[a, b]` overlaps any interval.
fn overlaps(a: u64, b: u64, intervals: &[(u64, u64)]) -> bool {
    intervals.iter().any(|&(s, e)| a <= e && s <= b)
}

fn is_mismatch_body(body: &str) -> bool {
    body.contains("\"probe\":\"mismatch\"")
}

/// A key: the caller (or relay principal) and the idempotency key (or message id).
type Key = (String, String);

/// A key's executions, with the calls that carried them.
type Runs<'a> = Vec<(&'a Call, &'a Execution)>;

/// Executions by execution id, with the calls that carried them.
type ByExec<'a> = HashMap<&'a str, (&'a Call, &'a Execution)>;

/// The windows the fault log gives: when each via's store was out of reach, when the
/// store itself was frozen, and when each gateway was stopped.
#[derive(Default)]
struct Windows {
    /// Cut links, by via.
    outages: HashMap<String, Vec<(u64, u64)>>,
    /// Store-wide freezes.
    store_down: Vec<(u64, u64)>,
    /// Stopped gateways, by name.
    paused: HashMap<String, Vec<(u64, u64)>>,
}

impl Windows {
    /// Reads the windows off the fault log.
    fn of(history: &History) -> Self {
        let mut w = Self::default();
        for r in &history.faults {
            let span = r.held();
            match r.kind {
                FaultKind::FreezeStore => w.store_down.push(span),
                FaultKind::CutLink => {
                    let via = r.target.trim_start_matches("link ").to_owned();
                    w.outages.entry(via).or_default().push(span);
                }
                FaultKind::PauseGateway => {
                    w.paused.entry(r.target.clone()).or_default().push(span);
                }
                _ => {}
            }
        }
        w
    }
}

/// The run as the passes read it: the history, the limits, the first data loss, the fault
/// windows and the ledger's executions indexed by key and by execution id.
struct View<'a> {
    history: &'a History,
    limits: &'a Limits,
    /// When the store first lost its data, if it did.
    loss: Option<u64>,
    windows: Windows,
    /// Executions by key, in the order they acted.
    by_key: BTreeMap<Key, Runs<'a>>,
    /// Executions by execution id.
    by_exec: ByExec<'a>,
}

impl View<'_> {
    /// Whether `t` comes before the store first lost its data (always, if it never did).
    fn before_loss(&self, t: u64) -> bool {
        self.loss.is_none_or(|l| t < l)
    }
}

impl Findings {
    /// Records one anomaly.
    fn add(&mut self, kind: Kind, key: String, detail: String) {
        self.anomalies.push(Anomaly { kind, key, detail });
    }
}

/// Checks a run.
pub fn check(history: &History, calls: &[Call], messages: &Messages, limits: &Limits) -> Findings {
    let mut f = Findings::default();
    let windows = Windows::of(history);
    f.fences_forwarded = calls.iter().any(|c| c.fence.is_some());
    let (by_key, by_exec) = index_calls(calls, &windows, limits, &mut f);
    let view = View {
        history,
        limits,
        loss: history.data_lost_ms.iter().copied().min(),
        windows,
        by_key,
        by_exec,
    };
    let first = check_keys(&view, &mut f);
    f.keys = view.by_key.len();
    let delivered = check_attempts(&view, &first, &mut f);
    check_durability(&view, &delivered, &mut f);
    record_final_states(history, &mut f);
    check_messages(&view, messages, &mut f);
    f.unknown.sort();
    f.unknown.dedup();
    f
}

/// Indexes the ledger's executions by key (in the order they acted) and by execution id,
/// checking each execution's claim on the way.
fn index_calls<'a>(
    calls: &'a [Call],
    windows: &Windows,
    limits: &Limits,
    f: &mut Findings,
) -> (BTreeMap<Key, Runs<'a>>, ByExec<'a>) {
    let mut by_key: BTreeMap<Key, Runs<'a>> = BTreeMap::new();
    let mut by_exec: ByExec<'a> = HashMap::new();
    for call in calls {
        let Some(e) = call.execution() else { continue };
        f.executions += 1;
        by_exec.insert(e.exec.as_str(), (call, e));
        let key = call.key.clone().unwrap_or_default();
        check_claim(call, e, &key, windows, limits, f);
        by_key
            .entry((call.principal.clone(), key))
            .or_default()
            .push((call, e));
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|(c, e)| (e.at_ms, c.id));
    }
    (by_key, by_exec)
}

/// Checks that one execution carried its claim: the key header, a fence a store granted
/// (once fences are forwarded), and a store within reach when it arrived.
fn check_claim(
    call: &Call,
    e: &Execution,
    key: &str,
    windows: &Windows,
    limits: &Limits,
    f: &mut Findings,
) {
    if call.key.is_none() {
        f.add(
            Kind::NoKey,
            name(&call.principal, "-"),
            format!(
                "{} via {} at {}ms had no Idempotency-Key",
                e.exec, call.via, call.arrived_ms
            ),
        );
    }
    // Every store's fences start at 1: a fence of 0 (or one that is no number) is no
    // store's grant, so the execution ran without a claim.
    let granted = call
        .fence
        .as_deref()
        .and_then(|x| x.trim().parse::<u64>().ok())
        .is_some_and(|x| x > 0);
    if f.fences_forwarded && !granted {
        f.add(
            Kind::NoFence,
            name(&call.principal, key),
            format!(
                "{} via {} at {}ms carried no fence a store granted ({})",
                e.exec,
                call.via,
                call.arrived_ms,
                call.fence.as_deref().unwrap_or("none")
            ),
        );
    }
    let out = windows
        .outages
        .get(&call.via)
        .map_or(&[][..], Vec::as_slice);
    if inside(call.arrived_ms, out, limits.outage_grace_ms)
        || inside(call.arrived_ms, &windows.store_down, limits.outage_grace_ms)
    {
        f.add(
            Kind::ExecutedDuringOutage,
            name(&call.principal, key),
            format!(
                "{} arrived via {} at {}ms while its store was out of reach",
                e.exec, call.via, call.arrived_ms
            ),
        );
    }
}

/// Checks every key's executions (messages are counted in [`check_messages`]); the first
/// proper execution of each key.
fn check_keys<'a>(view: &View<'a>, f: &mut Findings) -> HashMap<Key, &'a Execution> {
    let mut first: HashMap<Key, &Execution> = HashMap::new();
    for ((principal, key), list) in &view.by_key {
        if let Some(e) = check_key(view, principal, key, list, f) {
            first.insert((principal.clone(), key.clone()), e);
        }
    }
    first
}

/// Checks one key's executions: none of a request that reused the key with another body,
/// at most one per store epoch, and fences that are neither reused nor go back within an
/// epoch. Its first proper execution, if any.
fn check_key<'a>(
    view: &View<'a>,
    principal: &str,
    key: &str,
    list: &[(&'a Call, &'a Execution)],
    f: &mut Findings,
) -> Option<&'a Execution> {
    let k = name(principal, key);
    let proper: Vec<&(&Call, &Execution)> = list
        .iter()
        .filter(|(c, _)| !is_mismatch_body(&c.body))
        .collect();
    for (c, e) in list.iter().filter(|(c, _)| is_mismatch_body(&c.body)) {
        if view.before_loss(e.at_ms) {
            f.add(
                Kind::MismatchRan,
                k.clone(),
                format!(
                    "{} via {} ran a request that reused the key with another body",
                    e.exec, c.via
                ),
            );
        }
    }
    let epoch = |c: &Call, e: &Execution| epoch_of(view.history, c, e);
    let mut per_epoch: BTreeMap<usize, usize> = BTreeMap::new();
    for (c, e) in &proper {
        if let Some(at) = epoch(c, e) {
            *per_epoch.entry(at).or_default() += 1;
        }
    }
    let counted = per_epoch.values().copied().max().unwrap_or(0);
    if per_epoch.len() > 1 {
        f.after_data_loss.push((k.clone(), proper.len()));
    }
    if counted > 1 && !principal.starts_with("relay:") {
        f.add(
            Kind::DoubleExecution,
            k.clone(),
            format!(
                "{counted} executions in one store epoch: {}",
                describe_runs(&proper)
            ),
        );
    }
    if f.fences_forwarded {
        check_fences(view.history, &k, &proper, f);
    }
    proper.first().map(|(_, e)| *e)
}

/// The store epoch an execution belongs to (the store lost its data between two epochs),
/// `None` if it cannot be placed.
///
/// An execution belongs to the epoch of its claim, which can be earlier than its arrival
/// (a request claimed just before the loss reaches the upstream after it): a Redis fence is
/// the server's time in µs when the claim was granted, which places it; otherwise the
/// arrival does. A claim within the loss itself (between the old server's last grant and
/// the new one's first, give or take the clocks' resolution) cannot be placed, and is not
/// counted.
fn epoch_of(history: &History, c: &Call, e: &Execution) -> Option<usize> {
    let claimed_us = c
        .fence
        .as_deref()
        .and_then(|x| x.trim().parse::<u64>().ok())
        .filter(|&us| us > MICROS_2001 && !history.data_lost_wall_us.is_empty());
    match claimed_us {
        Some(us) => {
            let unsure = history
                .data_lost_wall_us
                .iter()
                .any(|&(from, to)| us + LOSS_SLACK_US >= from && us <= to + LOSS_SLACK_US);
            (!unsure).then(|| {
                history
                    .data_lost_wall_us
                    .iter()
                    .filter(|&&(from, _)| from <= us)
                    .count()
            })
        }
        None => Some(
            history
                .data_lost_ms
                .iter()
                .filter(|&&l| l <= e.at_ms)
                .count(),
        ),
    }
}

/// A key's executions, one `exec via gateway at ms fence f` each, for a report's detail.
fn describe_runs(list: &[&(&Call, &Execution)]) -> String {
    list.iter()
        .map(|(c, e)| {
            format!(
                "{} via {} at {}ms fence {}",
                e.exec,
                c.via,
                e.at_ms,
                c.fence.as_deref().unwrap_or("-")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks a key's fences within each epoch (a store that lost its data starts a key's
/// fences afresh): no fence used twice, none lower than an earlier execution's.
fn check_fences(history: &History, k: &str, proper: &[&(&Call, &Execution)], f: &mut Findings) {
    let fences: Vec<(u64, &str, usize)> = proper
        .iter()
        .filter_map(|(c, e)| {
            c.fence
                .as_deref()
                .and_then(|x| x.trim().parse::<u64>().ok())
                .and_then(|x| epoch_of(history, c, e).map(|at| (x, e.exec.as_str(), at)))
        })
        .collect();
    for (i, (fence, exec, at)) in fences.iter().enumerate() {
        let earlier = || fences[..i].iter().filter(|(_, _, e)| e == at);
        if let Some((_, other, _)) = earlier().find(|(x, _, _)| x == fence) {
            f.add(
                Kind::FenceReused,
                k.to_owned(),
                format!("{other} and {exec} both ran under fence {fence}"),
            );
        }
        if let Some((higher, other, _)) = earlier().find(|(x, _, _)| x > fence) {
            f.add(
                Kind::FenceWentBack,
                k.to_owned(),
                format!("{exec} ran under fence {fence} after {other} ran under {higher}"),
            );
        }
    }
}

/// Checks every answer the clients got; when each key's first upstream answer was
/// delivered.
fn check_attempts(
    view: &View<'_>,
    first: &HashMap<Key, &Execution>,
    f: &mut Findings,
) -> HashMap<Key, u64> {
    let mut delivered: HashMap<Key, u64> = HashMap::new();
    for a in &view.history.attempts {
        let Some(op) = view.history.ops.get(a.op) else {
            continue;
        };
        let k = name(&op.caller, &op.key);
        let gateway = format!("g{}", a.gateway);
        check_late(view, a, &gateway, &k, f);
        let Some(ans) = a.result.answer() else {
            continue;
        };
        // An attempt that ended after the store lost its data may have met the empty store.
        let after_loss = !view.before_loss(a.end_ms);
        let seen = Seen {
            op,
            ans,
            k: &k,
            gateway: &gateway,
            after_loss,
        };
        if ans.from_upstream() {
            check_upstream_answer(view, first, &seen, a.end_ms, &mut delivered, f);
        } else {
            check_problem_answer(&seen, f);
        }
    }
    delivered
}

/// One answer a client got, as the answer checks read it.
struct Seen<'s> {
    /// The operation it answered.
    op: &'s Op,
    /// The answer.
    ans: &'s Answer,
    /// The key, as `caller/key`.
    k: &'s str,
    /// The gateway that answered, as `gN`.
    gateway: &'s str,
    /// Whether the attempt ended after the store lost its data.
    after_loss: bool,
}

/// Checks that an attempt was answered (or timed out) within the bound, unless its gateway
/// was stopped meanwhile.
fn check_late(view: &View<'_>, a: &Attempt, gateway: &str, k: &str, f: &mut Findings) {
    let stopped = view
        .windows
        .paused
        .get(gateway)
        .is_some_and(|p| overlaps(a.start_ms, a.end_ms, p));
    let took = a.end_ms.saturating_sub(a.start_ms);
    let late = match &a.result {
        AttemptResult::Answer(_) | AttemptResult::Timeout => took > view.limits.answer_bound_ms,
        _ => false,
    };
    if late && !stopped {
        f.add(
            Kind::LateAnswer,
            k.to_owned(),
            format!(
                "{gateway} took {took}ms (bound {}ms) from {}ms: {}",
                view.limits.answer_bound_ms,
                a.start_ms,
                match &a.result {
                    AttemptResult::Answer(ans) => format!("answered {}", ans.status),
                    _ => "no answer".to_owned(),
                }
            ),
        );
    }
}

/// Checks an upstream answer: in the caller's own scope, given by an execution with the
/// status it gave, the key's first execution's, and never to a request with another body;
/// notes when a proper one was delivered (`end_ms`).
fn check_upstream_answer(
    view: &View<'_>,
    first: &HashMap<Key, &Execution>,
    seen: &Seen<'_>,
    end_ms: u64,
    delivered: &mut HashMap<Key, u64>,
    f: &mut Findings,
) {
    let Seen {
        op,
        ans,
        k,
        gateway,
        after_loss,
    } = *seen;
    let exec = ans.exec.as_deref().unwrap_or_default();
    if ans.caller.as_deref() != Some(op.caller.as_str())
        || ans.key.as_deref() != Some(op.key.as_str())
    {
        f.add(
            Kind::ForeignAnswer,
            k.to_owned(),
            format!(
                "{gateway} answered {exec} of {}/{}",
                ans.caller.as_deref().unwrap_or("?"),
                ans.key.as_deref().unwrap_or("?")
            ),
        );
    }
    let Some((_, e)) = view.by_exec.get(exec) else {
        f.add(
            Kind::PhantomAnswer,
            k.to_owned(),
            format!("{gateway} answered {exec}, which never ran"),
        );
        return;
    };
    let after_loss = after_loss || !view.before_loss(e.at_ms);
    if op.kind == OpKind::Mismatch {
        if !after_loss {
            f.add(
                Kind::MismatchAnswered,
                k.to_owned(),
                format!("a request with another body got {exec} from {gateway}"),
            );
        }
        return;
    }
    if ans.status != e.status {
        f.add(
            Kind::PhantomAnswer,
            k.to_owned(),
            format!(
                "{gateway} answered {exec} with {}, it gave {}",
                ans.status, e.status
            ),
        );
    }
    let key = (op.caller.clone(), op.key.clone());
    if let Some(first) = first.get(&key)
        && first.exec != e.exec
        && !after_loss
    {
        f.add(
            Kind::NotFirstAnswer,
            k.to_owned(),
            format!(
                "{gateway} answered {exec} ({}), the first execution was {}",
                if ans.replayed { "replayed" } else { "fresh" },
                first.exec
            ),
        );
    }
    let t = delivered.entry(key).or_insert(end_ms);
    *t = (*t).min(end_ms);
}

/// Checks an answer of idem's own (a problem): one the rules allow for the operation's
/// kind, unless the store lost its data meanwhile.
fn check_problem_answer(seen: &Seen<'_>, f: &mut Findings) {
    let Seen {
        op,
        ans,
        k,
        gateway,
        after_loss,
    } = *seen;
    let problem = ans.problem.as_deref().unwrap_or("");
    let allowed = match op.kind {
        OpKind::Mismatch => matches!(ans.status, 422 | 503),
        _ => matches!(ans.status, 409 | 502 | 503 | 504),
    };
    if !allowed && !after_loss {
        let kind = if op.kind == OpKind::Mismatch {
            Kind::MismatchAnswered
        } else {
            Kind::UnexpectedAnswer
        };
        f.add(
            kind,
            k.to_owned(),
            format!("{gateway} answered {} {problem}", ans.status),
        );
    }
}

/// Durability: after the first delivered answer, nothing runs again and no attempt that
/// starts later hears in-flight or unknown.
fn check_durability(view: &View<'_>, delivered: &HashMap<Key, u64>, f: &mut Findings) {
    let history = view.history;
    // The attempts of each key's normal operations, indexed once: a long run has hundreds
    // of thousands of both keys and attempts.
    let mut attempts_of: HashMap<(&str, &str), Vec<&Attempt>> = HashMap::new();
    for a in &history.attempts {
        if let Some(op) = history.ops.get(a.op)
            && op.kind == OpKind::Normal
        {
            attempts_of
                .entry((op.caller.as_str(), op.key.as_str()))
                .or_default()
                .push(a);
        }
    }
    for ((caller, key), &t) in delivered {
        let k = name(caller, key);
        if let Some(list) = view.by_key.get(&(caller.clone(), key.clone())) {
            for (c, e) in list {
                if c.arrived_ms > t && view.before_loss(c.arrived_ms) && !is_mismatch_body(&c.body)
                {
                    f.add(
                        Kind::NotDurable,
                        k.clone(),
                        format!(
                            "{} via {} ran at {}ms, after an answer was delivered at {t}ms",
                            e.exec, c.via, c.arrived_ms
                        ),
                    );
                }
            }
        }
        let of_key = attempts_of.get(&(caller.as_str(), key.as_str()));
        for a in of_key.into_iter().flatten() {
            if a.start_ms <= t || !view.before_loss(a.end_ms) {
                continue;
            }
            if let Some(ans) = a.result.answer()
                && ans.status == 409
            {
                f.add(
                    Kind::NotDurable,
                    k.clone(),
                    format!(
                        "g{} answered 409 {} at {}ms, after an answer was delivered at {t}ms",
                        a.gateway,
                        ans.problem.as_deref().unwrap_or(""),
                        a.start_ms
                    ),
                );
            }
        }
    }
}

/// Records what the gateways said of the open keys at the end (unknown, still processing,
/// or something else), and the message keys the relays parked unknown (a dead letter after
/// a timeout or a kill).
fn record_final_states(history: &History, f: &mut Findings) {
    for (op, state) in &history.final_states {
        let Some(op) = history.ops.get(*op) else {
            continue;
        };
        let k = name(&op.caller, &op.key);
        match state.as_str() {
            "unknown" => f.unknown.push(k),
            "processing" => f.add(
                Kind::Stuck,
                k,
                "still processing after the settle phase".into(),
            ),
            _ => f.unanswered.push(format!("{k} ({state})")),
        }
    }
    for (namespace, _, key) in &history.unknown_records {
        if namespace == "messages" {
            f.unknown.push(format!("message/{key}"));
        }
    }
}

/// Checks that every published message executed once, or was dead-lettered.
fn check_messages(view: &View<'_>, messages: &Messages, f: &mut Findings) {
    for (principal, ids) in &messages.published {
        let dead = messages.dead.get(principal);
        for id in ids {
            let k = name(principal, id);
            let list = view.by_key.get(&(principal.clone(), id.clone()));
            let counted = list.map_or(0, |l| {
                l.iter().filter(|(_, e)| view.before_loss(e.at_ms)).count()
            });
            let was_dead = dead.is_some_and(|d| d.contains(id));
            if was_dead {
                f.messages_dead += 1;
            }
            match counted {
                0 if list.is_some_and(|l| !l.is_empty()) => {}
                0 if !was_dead => f.add(
                    Kind::MessageLost,
                    k,
                    "never executed, not dead-lettered".into(),
                ),
                0 => {}
                1 => f.messages_once += 1,
                n => f.add(
                    Kind::MessageTwice,
                    k,
                    format!(
                        "{n} executions via {}",
                        list.map(|l| l
                            .iter()
                            .map(|(c, _)| c.via.as_str())
                            .collect::<Vec<_>>()
                            .join(","))
                            .unwrap_or_default()
                    ),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{FaultRecord, Phase};
    use crate::upstream::CallOutcome;

    fn call(id: usize, via: &str, key: &str, fence: Option<&str>, at: u64, exec: &str) -> Call {
        Call {
            id,
            via: via.into(),
            principal: "alice".into(),
            key: Some(key.into()),
            fence: fence.map(str::to_owned),
            arrived_ms: at,
            body: r#"{"amount":1}"#.into(),
            outcome: CallOutcome::Executed(Execution {
                exec: exec.into(),
                at_ms: at,
                status: 201,
                body: String::new(),
                dropped: false,
            }),
        }
    }

    fn answer(exec: &str, replayed: bool) -> AttemptResult {
        AttemptResult::Answer(Answer {
            status: 201,
            replayed,
            exec: Some(exec.into()),
            caller: Some("alice".into()),
            key: Some("k".into()),
            problem: None,
            retry_after: None,
        })
    }

    fn problem(status: u16, slug: &str) -> AttemptResult {
        AttemptResult::Answer(Answer {
            status,
            replayed: false,
            exec: None,
            caller: None,
            key: Some("k".into()),
            problem: Some(slug.into()),
            retry_after: Some(1),
        })
    }

    fn history(attempts: Vec<(u64, u64, AttemptResult)>) -> History {
        History {
            ops: vec![Op {
                id: 0,
                client: 0,
                caller: "alice".into(),
                key: "k".into(),
                body: r#"{"amount":1}"#.into(),
                kind: OpKind::Normal,
            }],
            attempts: attempts
                .into_iter()
                .map(|(s, e, result)| Attempt {
                    op: 0,
                    gateway: 0,
                    start_ms: s,
                    end_ms: e,
                    phase: Phase::Main,
                    result,
                })
                .collect(),
            ..History::default()
        }
    }

    const LIMITS: Limits = Limits {
        answer_bound_ms: 8000,
        outage_grace_ms: 500,
    };

    fn kinds(f: &Findings) -> Vec<Kind> {
        let mut k: Vec<Kind> = f.anomalies.iter().map(|a| a.kind).collect();
        k.sort();
        k.dedup();
        k
    }

    #[test]
    fn one_execution_replayed_is_clean() {
        let calls = [call(0, "g0", "k", None, 10, "e-1")];
        let h = history(vec![
            (0, 20, answer("e-1", false)),
            (30, 35, answer("e-1", true)),
        ]);
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert!(f.anomalies.is_empty(), "{:?}", f.anomalies);
        assert_eq!((f.keys, f.executions), (1, 1));
    }

    /// A gateway killed mid-request under `reexecute`: the key runs twice and the second
    /// answer reaches the client.
    #[test]
    fn a_second_execution_is_reported() {
        let calls = [
            call(0, "g0", "k", None, 10, "e-1"),
            call(1, "g1", "k", None, 20_000, "e-2"),
        ];
        let h = history(vec![
            (0, 50, AttemptResult::Broken("reset".into())),
            (100, 110, problem(409, "in-flight")),
            (19_990, 20_030, answer("e-2", false)),
        ]);
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert_eq!(kinds(&f), [Kind::DoubleExecution, Kind::NotFirstAnswer]);
    }

    /// The planted bug "answer sent before the completion is durable": a later attempt
    /// hears in-flight, and the key runs again.
    #[test]
    fn an_answer_that_was_not_durable_is_reported() {
        let calls = [
            call(0, "g0", "k", None, 10, "e-1"),
            call(1, "g1", "k", None, 30_000, "e-2"),
        ];
        let h = history(vec![
            (0, 20, answer("e-1", false)),
            (100, 110, problem(409, "in-flight")),
        ]);
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert!(kinds(&f).contains(&Kind::NotDurable), "{:?}", f.anomalies);
    }

    /// The planted bug "a claim that skips fencing": two executions under one fence, and a
    /// forwarded request without one.
    #[test]
    fn fences_reused_or_missing_are_reported() {
        let calls = [
            call(0, "g0", "k", Some("7"), 10, "e-1"),
            call(1, "g1", "k", Some("7"), 20_000, "e-2"),
            call(2, "g1", "j", None, 20_000, "e-3"),
        ];
        let f = check(&History::default(), &calls, &Messages::default(), &LIMITS);
        let k = kinds(&f);
        assert!(
            k.contains(&Kind::FenceReused) && k.contains(&Kind::NoFence),
            "{k:?}"
        );
    }

    /// The planted bug "a store timeout that lets the request through": a request reaches
    /// the upstream through a gateway whose link to the store is cut.
    #[test]
    fn executions_during_an_outage_are_reported() {
        let calls = [call(0, "g2", "k", None, 5_000, "e-1")];
        let h = History {
            faults: vec![FaultRecord {
                kind: FaultKind::CutLink,
                target: "link g2".into(),
                start_ms: 3_000,
                end_ms: 7_000,
                detail: String::new(),
                in_force: None,
            }],
            ..History::default()
        };
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert_eq!(kinds(&f), [Kind::ExecutedDuringOutage]);
    }

    #[test]
    fn runs_after_data_loss_are_listed_apart() {
        let calls = [
            call(0, "g0", "k", None, 10, "e-1"),
            call(1, "g1", "k", None, 9_000, "e-2"),
        ];
        let mut h = history(vec![(8_990, 9_030, answer("e-2", false))]);
        h.data_lost_ms = vec![5_000];
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert!(f.anomalies.is_empty(), "{:?}", f.anomalies);
        assert_eq!(f.after_data_loss, [("alice/k".to_owned(), 2)]);
    }

    #[test]
    fn an_execution_belongs_to_the_epoch_of_its_claim() {
        // The store lost its data at 5 000 ms, 1 796 000 000.5 s on the wall clock. e-1 was
        // claimed before (its Redis fence is the server time then) and reached the upstream
        // after e-2, which was claimed after the loss: one execution per epoch, and e-1's
        // lower fence, arriving later, is no fence going back (another epoch).
        let before = "1796000000300000";
        let after = "1796000000900000";
        let mut h = history(vec![]);
        h.data_lost_ms = vec![5_000];
        h.data_lost_wall_us = vec![(1_796_000_000_500_000, 1_796_000_000_550_000)];
        let calls = [
            call(0, "g0", "k", Some(after), 5_100, "e-2"),
            call(1, "g1", "k", Some(before), 5_300, "e-1"),
        ];
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert!(f.anomalies.is_empty(), "{:?}", f.anomalies);
        // Two claims after the loss are one epoch: a double execution.
        let calls = [
            call(0, "g0", "k", Some(after), 5_100, "e-2"),
            call(1, "g1", "k", Some("1796000000950000"), 5_300, "e-3"),
        ];
        let f = check(&h, &calls, &Messages::default(), &LIMITS);
        assert_eq!(kinds(&f), [Kind::DoubleExecution]);
    }

    #[test]
    fn late_answers_count_unless_the_gateway_was_stopped() {
        let h = history(vec![(0, 9_000, problem(503, "store-unavailable"))]);
        let f = check(&h, &[], &Messages::default(), &LIMITS);
        assert_eq!(kinds(&f), [Kind::LateAnswer]);
        let mut h = h;
        h.faults.push(FaultRecord {
            kind: FaultKind::PauseGateway,
            target: "g0".into(),
            start_ms: 100,
            end_ms: 20_000,
            detail: String::new(),
            in_force: None,
        });
        assert!(
            check(&h, &[], &Messages::default(), &LIMITS)
                .anomalies
                .is_empty()
        );
    }
}
