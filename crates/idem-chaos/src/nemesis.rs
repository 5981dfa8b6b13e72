//! The nemesis: a schedule of faults drawn from the run's seed before the run starts (so a
//! seed replays the same faults at the same offsets), and the tasks that inject and heal
//! them.
//!
//! The schedule keeps the system able to make progress: at most all gateways but one are
//! down or stopped at once, one store-wide fault at a time, every fault healed before the run's
//! duration ends, and a stopped gateway stays stopped past the lease, so another gateway's
//! claim finds the lease expired while the stopped one still holds the request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::FaultKind;
use crate::clock::{Clock, ms};
use crate::gateway::Role;
use crate::history::FaultRecord;
use crate::link::Mode;
use crate::world::World;

/// One planned fault.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    /// When it starts (ms since the run started).
    pub at_ms: u64,
    /// What it is.
    pub kind: FaultKind,
    /// Which gateway, relay, link or master it hits.
    pub target: usize,
    /// How long it lasts before it is healed (ms).
    pub length_ms: u64,
    /// A second choice some faults make (a cut's reset or blackhole, a slow link's delay).
    pub variant: u64,
}

/// What the schedule needs to know.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// The kinds to draw from.
    pub kinds: Vec<FaultKind>,
    /// The run's duration.
    pub duration: Duration,
    /// The range of gaps between two faults' starts.
    pub gap: (Duration, Duration),
    /// Gateways in the run.
    pub gateways: usize,
    /// Relay processes in the run.
    pub relays: usize,
    /// The routes' lease.
    pub lease: Duration,
}

/// The schedule for `plan`, in start order.
pub fn schedule(plan: &Plan) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut out = Vec::new();
    if plan.kinds.is_empty() {
        return out;
    }
    let end = ms(plan.duration);
    let (lo, hi) = (ms(plan.gap.0), ms(plan.gap.1).max(ms(plan.gap.0) + 1));
    // Until when each gateway, relay, link and the store are busy.
    let mut gateway_busy = vec![0u64; plan.gateways];
    let mut relay_busy = vec![0u64; plan.relays];
    let mut link_busy = vec![0u64; plan.gateways];
    let mut store_busy = 0u64;
    // One gateway stopped at a time: a stop outlasts the lease, and the rest must carry on.
    let mut pause_busy = 0u64;
    let mut promoted = false;
    let mut at = 2000 + rng.u64(0..1000);
    while at < end.saturating_sub(1000) {
        // The kinds in a random order; the first that fits now is injected.
        let mut order = plan.kinds.clone();
        rng.shuffle(&mut order);
        let mut picked = None;
        for kind in order {
            let (length, variant) = match kind {
                FaultKind::KillGateway | FaultKind::KillRelay => (rng.u64(300..2000), 0),
                FaultKind::PauseGateway => (ms(plan.lease) + rng.u64(1000..4000), 0),
                // Under the 3 s a completion takes to give up (three tries bounded by the 1 s store
                // timeout), so a freeze alone never leaves an answer unrecorded.
                FaultKind::FreezeStore => (rng.u64(500..2500), 0),
                FaultKind::RestartStoreEmpty => (0, 0),
                // The failover itself takes seconds; the store is busy meanwhile.
                FaultKind::KillClusterMaster => (8000, rng.u64(0..3)),
                FaultKind::PromoteStandby => (5000, 0),
                FaultKind::CutLink => (rng.u64(1000..4000), rng.u64(0..2)),
                FaultKind::SlowLink => (rng.u64(2000..5000), rng.u64(20..300)),
            };
            let fits = at + length <= end;
            let down_at = |busy: &[u64]| busy.iter().filter(|&&b| b > at).count();
            let chosen = match kind {
                _ if !fits => None,
                FaultKind::KillGateway | FaultKind::PauseGateway => {
                    let free: Vec<usize> = (0..plan.gateways)
                        .filter(|&g| gateway_busy[g] <= at)
                        .collect();
                    // Keep one gateway answering.
                    let pausing = kind == FaultKind::PauseGateway && pause_busy > at;
                    (!free.is_empty() && !pausing && down_at(&gateway_busy) + 1 < plan.gateways)
                        .then(|| free[rng.usize(..free.len())])
                }
                FaultKind::KillRelay => {
                    let free: Vec<usize> =
                        (0..plan.relays).filter(|&r| relay_busy[r] <= at).collect();
                    (!free.is_empty()).then(|| free[rng.usize(..free.len())])
                }
                FaultKind::CutLink | FaultKind::SlowLink => {
                    let free: Vec<usize> =
                        (0..plan.gateways).filter(|&g| link_busy[g] <= at).collect();
                    (!free.is_empty() && store_busy <= at).then(|| free[rng.usize(..free.len())])
                }
                FaultKind::PromoteStandby if promoted => None,
                _ => (store_busy <= at).then_some(0),
            };
            if let Some(target) = chosen {
                picked = Some((kind, length, variant, target));
                break;
            }
        }
        if let Some((kind, length, variant, target)) = picked {
            let until = at + length;
            match kind {
                FaultKind::KillGateway => gateway_busy[target] = until,
                FaultKind::PauseGateway => {
                    gateway_busy[target] = until;
                    pause_busy = until;
                }
                FaultKind::KillRelay => relay_busy[target] = until,
                FaultKind::CutLink | FaultKind::SlowLink => link_busy[target] = until,
                _ => {
                    store_busy = until.max(at + 1000);
                    promoted |= kind == FaultKind::PromoteStandby;
                }
            }
            out.push(Planned {
                at_ms: at,
                kind,
                target,
                length_ms: length,
                variant,
            });
        }
        at += rng.u64(lo..hi);
    }
    out
}

/// The faults as they happened, shared by the nemesis's tasks.
#[derive(Debug, Default)]
pub struct FaultLog {
    records: Mutex<Vec<FaultRecord>>,
    data_lost: Mutex<Vec<u64>>,
    data_lost_wall: Mutex<Vec<(u64, u64)>>,
}

impl FaultLog {
    fn begin(&self, kind: FaultKind, target: String, start_ms: u64) -> usize {
        let mut r = self.records.lock();
        r.push(FaultRecord {
            kind,
            target,
            start_ms,
            end_ms: start_ms,
            detail: String::new(),
            in_force: None,
        });
        r.len() - 1
    }

    fn in_force(&self, index: usize, from_ms: u64, to_ms: u64) {
        if let Some(r) = self.records.lock().get_mut(index) {
            r.in_force = Some((from_ms, to_ms));
        }
    }

    fn end(&self, index: usize, end_ms: u64, detail: String) {
        if let Some(r) = self.records.lock().get_mut(index) {
            r.end_ms = end_ms;
            r.detail = detail;
        }
    }

    /// The faults injected so far.
    pub fn records(&self) -> Vec<FaultRecord> {
        self.records.lock().clone()
    }

    /// When the store lost its data.
    pub fn data_lost(&self) -> Vec<u64> {
        self.data_lost.lock().clone()
    }

    /// The same losses on the wall clock, in microseconds since the Unix epoch: from just
    /// before the old server was killed to just after the new one answered.
    pub fn data_lost_wall_us(&self) -> Vec<(u64, u64)> {
        self.data_lost_wall.lock().clone()
    }

    /// Faults by kind.
    pub fn counts(&self) -> HashMap<FaultKind, usize> {
        let mut out = HashMap::new();
        for r in self.records.lock().iter() {
            *out.entry(r.kind).or_default() += 1;
        }
        out
    }
}

/// The running nemesis.
#[derive(Debug)]
pub struct Nemesis {
    tasks: Vec<JoinHandle<()>>,
    /// What it did.
    pub log: Arc<FaultLog>,
}

impl Nemesis {
    /// Starts a task per planned fault, each waiting for its time (counted from now).
    pub fn start(world: Arc<World>, clock: Clock, plan: Vec<Planned>, verbose: bool) -> Self {
        let log = Arc::new(FaultLog::default());
        let base = clock.now();
        let tasks = plan
            .into_iter()
            .map(|p| {
                let (world, log) = (Arc::clone(&world), Arc::clone(&log));
                tokio::spawn(async move {
                    let wait = (base + Duration::from_millis(p.at_ms)).saturating_sub(clock.now());
                    tokio::time::sleep(wait).await;
                    inject(&world, &clock, &log, &p, verbose).await;
                })
            })
            .collect();
        Self { tasks, log }
    }

    /// Waits for every fault to be healed, at most `limit`; then stops the rest.
    pub async fn finish(mut self, limit: Duration) -> Arc<FaultLog> {
        let all = futures::future::join_all(self.tasks.iter_mut());
        if tokio::time::timeout(limit, all).await.is_err() {
            for t in &self.tasks {
                t.abort();
            }
        }
        self.log
    }
}

/// Injects one planned fault, waits out its length, heals it and logs what happened.
async fn inject(world: &World, clock: &Clock, log: &FaultLog, p: &Planned, verbose: bool) {
    let length = Duration::from_millis(p.length_ms);
    let target = target_name(world, p);
    let entry = log.begin(p.kind, target.clone(), clock.ms());
    if verbose {
        eprintln!(
            "idem-chaos: {:>7.1}s {} {target}",
            clock.now().as_secs_f64(),
            p.kind
        );
    }
    let detail = match p.kind {
        FaultKind::KillGateway | FaultKind::KillRelay => kill_and_restart(world, p, length).await,
        FaultKind::PauseGateway => {
            // A gateway slot that does not exist leaves its record open.
            let Some(detail) = pause_gateway(world, p, length).await else {
                return;
            };
            detail
        }
        FaultKind::FreezeStore => freeze_store(world, clock, log, entry, length).await,
        FaultKind::RestartStoreEmpty => restart_store_empty(world, clock, log).await,
        FaultKind::KillClusterMaster => match world
            .store
            .kill_master(usize::try_from(p.variant).unwrap_or(0))
            .await
        {
            Ok(d) => d,
            Err(e) => format!("failover failed: {e:#}"),
        },
        FaultKind::PromoteStandby => promote_standby(world).await,
        FaultKind::CutLink | FaultKind::SlowLink => disturb_link(world, p, length).await,
    };
    log.end(entry, clock.ms(), detail);
}

/// The name a fault's record gives its target: the gateway, relay or link it hits, or the
/// store.
fn target_name(world: &World, p: &Planned) -> String {
    let name = |role: Role| {
        world
            .slot(role, p.target)
            .map_or_else(|| format!("{role:?}{}", p.target), |s| s.name.clone())
    };
    match p.kind {
        FaultKind::KillGateway | FaultKind::PauseGateway => name(Role::Serve),
        FaultKind::KillRelay => name(Role::Relay),
        FaultKind::CutLink | FaultKind::SlowLink => format!("link {}", name(Role::Serve)),
        _ => "store".to_owned(),
    }
}

/// Kills a gateway or relay, waits `length`, and starts it again.
async fn kill_and_restart(world: &World, p: &Planned, length: Duration) -> String {
    let role = if p.kind == FaultKind::KillGateway {
        Role::Serve
    } else {
        Role::Relay
    };
    if let Some(slot) = world.slot(role, p.target) {
        slot.kill();
    }
    tokio::time::sleep(length).await;
    match world.start(role, p.target, Duration::from_secs(30)).await {
        Ok(()) => "killed, restarted".to_owned(),
        Err(e) => format!("killed; restart failed: {e:#}"),
    }
}

/// Stops a gateway's process for `length`, then lets it run on; `None` if there is no such
/// gateway.
async fn pause_gateway(world: &World, p: &Planned, length: Duration) -> Option<String> {
    let slot = world.slot(Role::Serve, p.target)?;
    if !slot.pause(true) {
        return Some("not running".into());
    }
    tokio::time::sleep(length).await;
    slot.pause(false);
    Some(format!("stopped {:.1}s", length.as_secs_f64()))
}

/// Freezes the store for `length` and thaws it, logging when the freeze was in force.
async fn freeze_store(
    world: &World,
    clock: &Clock,
    log: &FaultLog,
    entry: usize,
    length: Duration,
) -> String {
    match world.store.freeze(true) {
        Ok(()) => {
            let from = clock.ms();
            tokio::time::sleep(length).await;
            log.in_force(entry, from, clock.ms());
            match world.store.freeze(false) {
                Ok(()) => format!("frozen {:.1}s", length.as_secs_f64()),
                Err(e) => format!("thaw failed: {e:#}"),
            }
        }
        Err(e) => format!("freeze failed: {e:#}"),
    }
}

/// Restarts the store without its data, logging when (on the run's clock and the wall
/// clock) the data was lost.
async fn restart_store_empty(world: &World, clock: &Clock, log: &FaultLog) -> String {
    let lost = clock.ms();
    let lost_wall = wall_us();
    match world.store.restart_empty().await {
        Ok(()) => {
            log.data_lost.lock().push(lost);
            log.data_lost_wall.lock().push((lost_wall, wall_us()));
            "restarted empty: data lost".to_owned()
        }
        Err(e) => format!("restart failed: {e:#}"),
    }
}

/// Promotes the standby and moves every link to the new primary.
async fn promote_standby(world: &World) -> String {
    match world.store.promote_standby().await {
        Ok(d) => {
            // The virtual IP follows the new primary.
            if let Some(primary) = world.store.target() {
                for link in &world.links {
                    link.retarget(primary);
                }
            }
            d
        }
        Err(e) => format!("promotion failed: {e:#}"),
    }
}

/// Cuts (reset or blackhole) or slows a gateway's link to the store for `length`, then
/// lets it pass again.
async fn disturb_link(world: &World, p: &Planned, length: Duration) -> String {
    let Some(link) = world.links.get(p.target) else {
        return "no link".into();
    };
    let (mode, what) = match (p.kind, p.variant) {
        (FaultKind::SlowLink, d) => (
            Mode::Slow(Duration::from_millis(d)),
            format!("slowed by {d}ms"),
        ),
        (_, 0) => (Mode::Cut, "cut (reset)".to_owned()),
        _ => (Mode::Blackhole, "cut (blackhole)".to_owned()),
    };
    link.set(mode);
    tokio::time::sleep(length).await;
    link.set(Mode::Pass);
    format!("{what} {:.1}s", length.as_secs_f64())
}

/// Microseconds since the Unix epoch: the clock Redis's `TIME`, and so its fences, read.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64) -> Plan {
        Plan {
            seed,
            kinds: vec![
                FaultKind::KillGateway,
                FaultKind::PauseGateway,
                FaultKind::FreezeStore,
                FaultKind::CutLink,
            ],
            duration: Duration::from_secs(60),
            gap: (Duration::from_millis(1500), Duration::from_secs(4)),
            gateways: 3,
            relays: 0,
            lease: Duration::from_secs(17),
        }
    }

    #[test]
    fn a_seed_replays_its_schedule() {
        let a = schedule(&plan(42));
        let b = schedule(&plan(42));
        assert!(!a.is_empty());
        assert_eq!(
            a.iter()
                .map(|p| (p.at_ms, p.kind, p.target))
                .collect::<Vec<_>>(),
            b.iter()
                .map(|p| (p.at_ms, p.kind, p.target))
                .collect::<Vec<_>>()
        );
        let c = schedule(&plan(43));
        assert_ne!(
            a.iter().map(|p| p.at_ms).collect::<Vec<_>>(),
            c.iter().map(|p| p.at_ms).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_schedule_keeps_a_gateway_up_and_ends_in_time() {
        for seed in 0..50 {
            let s = schedule(&plan(seed));
            for p in &s {
                assert!(p.at_ms + p.length_ms <= 60_000, "{p:?}");
                if p.kind == FaultKind::PauseGateway {
                    assert!(p.length_ms > 17_000, "a pause outlasts the lease");
                }
                let gateway_faults = |t: u64| {
                    s.iter()
                        .filter(|q| {
                            matches!(q.kind, FaultKind::KillGateway | FaultKind::PauseGateway)
                                && q.at_ms <= t
                                && t < q.at_ms + q.length_ms
                        })
                        .count()
                };
                assert!(gateway_faults(p.at_ms) < 3, "seed {seed}: {p:?}");
            }
        }
    }
}
