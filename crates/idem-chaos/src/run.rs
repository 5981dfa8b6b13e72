//! One run from start to report: set up, load and faults, heal, settle, check.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::brokers::{DeadLetters, NATS, RABBIT, Sources};
use crate::checker::{self, Limits, Messages};
use crate::clients::{self, Clients};
use crate::clock::{Clock, ms};
use crate::config::KeepDir;
use crate::gateway::{Role, Routes, Slot};
use crate::history::{AttemptResult, History, Phase};
use crate::link::Link;
use crate::nemesis::{self, FaultLog, Nemesis, Plan};
use crate::report::Report;
use crate::store::Store;
use crate::upstream::{Call, CallOutcome, Ledger, Principals, Profile, Upstream};
use crate::world::World;
use crate::{FaultKind, RunConfig};

/// Hot keys shared by every caller and client.
const HOT_KEYS: usize = 12;

/// Runs `config` and checks what happened.
///
/// # Errors
/// The run could not be set up (a missing binary or server, a process that never started);
/// anomalies are not errors, they are in the report.
pub async fn run(config: RunConfig) -> anyhow::Result<Report> {
    let started = Instant::now();
    let clock = Clock::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let run_id = format!("{}_{}", config.seed, &id[..8]);
    let dir = std::env::temp_dir().join(format!("idem-chaos-{run_id}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Removes the directory however the run ends, unless it is to be kept.
    let mut guard = DirGuard {
        dir: dir.clone(),
        keep: config.keep_dir == KeepDir::Always,
    };
    let say = |msg: String| {
        if config.verbose {
            eprintln!("idem-chaos: {:>7.1}s {msg}", clock.now().as_secs_f64());
        }
    };
    let idem = match config.planted {
        None => crate::binary::locate(config.idem.as_deref())?,
        Some(_) => crate::binary::locate_planted()?,
    };
    let kinds = config.fault_kinds();
    say(announcement(&config, &kinds, &dir));
    let setup = set_up(&config, clock, &dir, &run_id, &idem, &say).await?;
    let outcome = exercise(&config, clock, setup, kinds, &say).await?;
    let findings = checker::check(
        &outcome.history,
        &outcome.calls,
        &outcome.messages,
        &Limits {
            answer_bound_ms: ms(config.answer_bound()),
            outage_grace_ms: 500,
        },
    );
    let Outcome {
        history,
        calls,
        plan,
        faults,
        notes,
        ..
    } = outcome;
    let (statuses, replays) = tally_answers(&history);
    let keep = match config.keep_dir {
        KeepDir::Always => true,
        KeepDir::OnAnomaly => !findings.anomalies.is_empty(),
        KeepDir::Never => false,
    };
    let mut report = Report {
        seed: config.seed,
        setup: setup_line(&config),
        operations: history.ops.len(),
        attempts: history.attempts.len(),
        statuses,
        replays,
        faults,
        findings,
        settle: crate::settle::measure(&history),
        elapsed: started.elapsed(),
        notes,
        dir: keep.then(|| dir.display().to_string()),
    };
    if keep {
        save(&dir, &history, &calls, &plan, &report);
        report.dir = Some(dir.display().to_string());
    }
    guard.keep = keep;
    Ok(report)
}

/// What a run left to judge: the clients' history (with the fault log's records and data
/// losses), the upstream's ledger, the messages, the nemesis's schedule, the faults injected
/// by kind, and the notes.
struct Outcome {
    history: History,
    calls: Vec<Call>,
    messages: Messages,
    plan: Vec<nemesis::Planned>,
    faults: BTreeMap<FaultKind, usize>,
    notes: Vec<String>,
}

/// Puts the load and the faults on what [`set_up`] started, heals, settles, collects what
/// the gateways and brokers say at the end, and stops everything.
async fn exercise(
    config: &RunConfig,
    clock: Clock,
    setup: Setup,
    kinds: Vec<FaultKind>,
    say: &dyn Fn(String),
) -> anyhow::Result<Outcome> {
    let Setup {
        world,
        upstream,
        sources,
        mut notes,
    } = setup;
    let Load {
        clients,
        published,
        log,
        plan,
        ticker,
    } = load(config, clock, &world, &upstream, sources.as_ref(), kinds).await?;
    heal(config, clock, &world, &log, say).await;

    // Settle: every key that never got an answer is retried until it does or the bound
    // passes; messages until the brokers are drained.
    let mut dead = DeadLetters::default();
    let left = settle(
        config,
        &clients,
        &upstream,
        sources.as_ref(),
        published.as_ref(),
        &mut dead,
        say,
    )
    .await;
    if let Some(note) = drained_note(left) {
        notes.push(note);
    }
    record_final(&clients, &world).await;
    let messages = messages_of(sources.as_ref(), published, dead).await;
    ticker.abort();

    // Stop everything, then hand over what is to be judged.
    drop(world);
    if let Some(s) = &sources {
        s.cleanup().await;
    }
    let calls = upstream.ledger().calls();
    drop(upstream);
    let mut history: History = clients.history();
    history.faults = log.records();
    history.data_lost_ms = log.data_lost();
    history.data_lost_wall_us = log.data_lost_wall_us();
    notes.extend(fault_and_message_notes(&history, &messages));
    let mut faults: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for (k, n) in log.counts() {
        faults.insert(k, n);
    }
    Ok(Outcome {
        history,
        calls,
        messages,
        plan,
        faults,
        notes,
    })
}

/// The progress line that opens a verbose run: its settings and its directory.
fn announcement(config: &RunConfig, kinds: &[FaultKind], dir: &Path) -> String {
    format!(
        "seed {} store {} gateways {} relays {} clients {} duration {:?} takeover {} webhook {} faults [{}] in {}",
        config.seed,
        config.store,
        config.gateways,
        config.relays,
        config.clients,
        config.duration,
        config.takeover.as_str(),
        if config.status_webhook { "on" } else { "off" },
        kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(","),
        dir.display()
    )
}

/// What [`set_up`] started: the world the nemesis acts on, the upstream, the brokers'
/// sources (when there are relays), and the notes so far.
struct Setup {
    world: Arc<World>,
    upstream: Upstream,
    sources: Option<Sources>,
    notes: Vec<String>,
}

/// Starts the store, the upstream, the links to the store, the brokers' sources, and
/// every gateway and relay.
async fn set_up(
    config: &RunConfig,
    clock: Clock,
    dir: &Path,
    run_id: &str,
    idem: &Path,
    say: &dyn Fn(String),
) -> anyhow::Result<Setup> {
    let store = Store::start(config.store, dir).await?;
    say(format!("store {} up", config.store));
    let vias: Vec<String> = (0..config.gateways)
        .map(|i| format!("g{i}"))
        .chain((0..config.relays).map(|i| format!("r{i}")))
        .collect();
    let relay_names: Vec<String> = if config.relays > 0 {
        vec![RABBIT.to_owned(), NATS.to_owned()]
    } else {
        Vec::new()
    };
    let upstream = Upstream::start(
        &vias,
        Profile::new(config.route_timeout),
        config.seed,
        clock,
        Principals::new(&clients::callers(), &relay_names),
    )
    .await?;
    let mut notes = Vec::new();
    let direct =
        takes_multi_host_url(config, &store, &upstream, run_id, idem, dir, &mut notes).await?;
    let mut links = Vec::new();
    if config.store.linked()
        && !direct
        && let Some(target) = store.target()
    {
        for _ in &vias {
            links.push(Link::start(target).await?);
        }
    }
    let gateways = (0..config.gateways)
        .map(|i| Slot::new(&format!("g{i}"), Role::Serve, dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let relays = (0..config.relays)
        .map(|i| Slot::new(&format!("r{i}"), Role::Relay, dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sources = if config.relays > 0 {
        Some(Sources::create(run_id, config.broker_keep()).await?)
    } else {
        None
    };
    let relay_tables = (0..config.relays)
        .map(|i| {
            sources
                .as_ref()
                .map(|s| s.relay_tables(&upstream.url(config.gateways + i)))
                .unwrap_or_default()
        })
        .collect();
    let upstreams = (0..vias.len()).map(|i| upstream.url(i)).collect();
    let world = Arc::new(World {
        idem: idem.to_owned(),
        run: run_id.to_owned(),
        gateways,
        relays,
        store,
        links,
        routes: Routes::of(config),
        upstreams,
        relay_tables,
    });
    start_processes(config, &world).await?;
    say(format!(
        "{} gateways and {} relays up",
        config.gateways, config.relays
    ));
    Ok(Setup {
        world,
        upstream,
        sources,
        notes,
    })
}

/// Whether the gateways take the store's URL as is. A primary with a standby: the gateways
/// take the multi-host URL if they can; otherwise they reach the primary through links that
/// move to the standby when it is promoted. Notes which it is.
async fn takes_multi_host_url(
    config: &RunConfig,
    store: &Store,
    upstream: &Upstream,
    run_id: &str,
    idem: &Path,
    dir: &Path,
    notes: &mut Vec<String>,
) -> anyhow::Result<bool> {
    if config.store != crate::StoreKind::PostgresStandby {
        return Ok(false);
    }
    let url = store.url(None);
    let probe = Routes::of(config).serve(
        crate::proc::spare_port()?,
        crate::proc::spare_port()?,
        &upstream.url(0),
        &url,
        &store.options(run_id),
    );
    match probe_config(idem, dir, &probe).await {
        Ok(()) => {
            notes.push(format!("the gateways take the multi-host URL `{url}`"));
            Ok(true)
        }
        Err(why) => {
            notes.push(format!(
                "the gateway refuses the multi-host URL `{url}`: {why}; the gateways reach the primary through a link each, which the nemesis moves to the standby it promotes (a virtual IP)"
            ));
            Ok(false)
        }
    }
}

/// Starts every gateway, then every relay.
async fn start_processes(config: &RunConfig, world: &World) -> anyhow::Result<()> {
    for role in [Role::Serve, Role::Relay] {
        let n = if role == Role::Serve {
            config.gateways
        } else {
            config.relays
        };
        for i in 0..n {
            world
                .start(role, i, Duration::from_secs(60))
                .await
                .with_context(|| format!("starting {role:?} {i}"))?;
        }
    }
    Ok(())
}

/// The message ids published by relay principal, and the publishes made.
type Published = (BTreeMap<String, Vec<String>>, usize);

/// What [`load`] leaves: the clients, what was published, the nemesis's log and schedule,
/// and the progress ticker (still running).
struct Load {
    clients: Arc<Clients>,
    published: Option<Published>,
    log: Arc<FaultLog>,
    plan: Vec<nemesis::Planned>,
    ticker: JoinHandle<()>,
}

/// Runs the clients, the publishers and the nemesis for the run's duration, then stops the
/// clients and waits for every fault to be healed.
async fn load(
    config: &RunConfig,
    clock: Clock,
    world: &Arc<World>,
    upstream: &Upstream,
    sources: Option<&Sources>,
    kinds: Vec<FaultKind>,
) -> anyhow::Result<Load> {
    let attempt_timeout = config.answer_bound() + Duration::from_secs(2);
    let clients = Arc::new(Clients::new(
        clock,
        world.gateways.iter().map(Slot::url).collect(),
        attempt_timeout,
        config.seed,
    ));
    let client_tasks: Vec<_> = (0..config.clients)
        .map(|i| tokio::spawn(Arc::clone(&clients).client(i, HOT_KEYS)))
        .collect();
    let publisher = sources.map(|s| {
        let count = usize::try_from(config.duration.as_secs()).unwrap_or(60) * 4;
        s.publish(count, config.duration.mul_f64(0.8), config.seed)
    });
    let plan = nemesis::schedule(&Plan {
        seed: config.seed,
        kinds,
        duration: config.duration,
        gap: config.fault_gap,
        gateways: config.gateways,
        relays: config.relays,
        lease: config.lease(),
    });
    let nemesis = Nemesis::start(Arc::clone(world), clock, plan.clone(), config.verbose);
    let ticker = spawn_ticker(
        Arc::clone(&clients),
        upstream.ledger(),
        clock,
        config.verbose,
    );
    let published = match publisher {
        Some(p) => {
            let (r, ()) = tokio::join!(p, tokio::time::sleep(config.duration));
            Some(r.context("publishing")?)
        }
        None => {
            tokio::time::sleep(config.duration).await;
            None
        }
    };
    clients.stop();
    for t in client_tasks {
        let _ = t.await;
    }
    let log = nemesis.finish(Duration::from_secs(60)).await;
    Ok(Load {
        clients,
        published,
        log,
        plan,
        ticker,
    })
}

/// A task that prints the operations, attempts and executions so far every 5 s, when the
/// run is verbose.
fn spawn_ticker(
    clients: Arc<Clients>,
    ledger: Arc<Ledger>,
    clock: Clock,
    verbose: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if verbose {
                let (ops, attempts) = clients.counts();
                eprintln!(
                    "idem-chaos: {:>7.1}s {ops} operations, {attempts} attempts, {} executions",
                    clock.now().as_secs_f64(),
                    ledger.executions()
                );
            }
        }
    })
}

/// Heals everything the nemesis left, then waits until the last fault's leases have run
/// out.
async fn heal(
    config: &RunConfig,
    clock: Clock,
    world: &World,
    log: &FaultLog,
    say: &dyn Fn(String),
) {
    let restarted = world.heal().await;
    say(format!(
        "healed{}; letting leases run out",
        if restarted.is_empty() {
            String::new()
        } else {
            format!(" (restarted {})", restarted.join(", "))
        }
    ));
    let last_fault = log.records().iter().map(|r| r.end_ms).max().unwrap_or(0);
    let leases_out = Duration::from_millis(last_fault) + config.lease() + Duration::from_secs(1);
    tokio::time::sleep(leases_out.saturating_sub(clock.now())).await;
}

/// Retries every open key until it is answered or the settle bound passes, and waits
/// meanwhile for the brokers to drain (reading the dead letters into `dead`); the messages
/// left unaccounted for at the bound (`usize::MAX`: the brokers still held some).
async fn settle(
    config: &RunConfig,
    clients: &Arc<Clients>,
    upstream: &Upstream,
    sources: Option<&Sources>,
    published: Option<&Published>,
    dead: &mut DeadLetters,
    say: &dyn Fn(String),
) -> usize {
    let open = clients.open_ops();
    say(format!("settling {} open keys", open.len()));
    let deadline = Instant::now() + config.settle_bound;
    let (seed, wait) = (config.seed, config.status_webhook);
    let settle = futures::future::join_all(open.iter().copied().map(|op| {
        let clients = Arc::clone(clients);
        async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (op as u64) << 20);
            clients
                .run_op(op, Phase::Settle, deadline, &mut rng, wait)
                .await
        }
    }));
    // A message on its way back (nacked with a delay, or held unacknowledged by a relay that
    // waits before requeueing it) is in neither broker's count, so the brokers look drained
    // only once every published message has run or been dead-lettered too.
    let drained = async {
        let (Some(s), Some((ids, _))) = (sources, published) else {
            return 0;
        };
        loop {
            let mut left = usize::MAX;
            if s.waiting().await.is_ok_and(|n| n == 0)
                && upstream.ledger().pending() == 0
                && s.read_dead_letters(dead).await.is_ok()
            {
                left = unaccounted(ids, &upstream.ledger().calls(), dead);
                if left == 0 {
                    return 0;
                }
            }
            if Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (_, left) = tokio::join!(settle, drained);
    left
}

/// The note on messages still unaccounted for at the settle bound, if any.
fn drained_note(left: usize) -> Option<String> {
    match left {
        0 => None,
        usize::MAX => Some("the brokers still held messages at the settle bound".into()),
        n => Some(format!(
            "{n} messages had neither run nor been dead-lettered at the settle bound"
        )),
    }
}

/// Asks the first gateway for the state of every key still open and for the records left
/// unknown, and hands both to the clients' history.
async fn record_final(clients: &Clients, world: &World) {
    let still_open = clients.open_ops();
    let mut states = Vec::new();
    let gateway = world.gateways.first().map(Slot::url).unwrap_or_default();
    for &op in &still_open {
        states.push((op, clients.status_of(&gateway, op).await));
    }
    let admin = world
        .gateways
        .first()
        .map(Slot::admin_url)
        .unwrap_or_default();
    let unknown = clients.unknown_records(&admin).await;
    clients.set_final(states, unknown);
}

/// The messages published and those found dead-lettered (read once more first).
async fn messages_of(
    sources: Option<&Sources>,
    published: Option<Published>,
    mut dead: DeadLetters,
) -> Messages {
    let mut messages = Messages::default();
    if let (Some(s), Some((ids, publishes))) = (sources, published) {
        messages.published = ids;
        messages.publishes = publishes;
        let _ = s.read_dead_letters(&mut dead).await;
        messages.dead = dead
            .ids
            .into_iter()
            .map(|(p, ids)| (p, ids.into_iter().collect()))
            .collect();
    }
    messages
}

/// Notes on the faults that failed to be injected or healed, and on the messages published.
fn fault_and_message_notes(history: &History, messages: &Messages) -> Vec<String> {
    let mut notes = Vec::new();
    for r in &history.faults {
        if r.detail.contains("failed") {
            notes.push(format!(
                "{} {} at {}ms: {}",
                r.kind, r.target, r.start_ms, r.detail
            ));
        }
    }
    if !messages.published.is_empty() {
        notes.push(format!(
            "{} messages published ({} publishes with duplicates)",
            messages.published.values().map(Vec::len).sum::<usize>(),
            messages.publishes
        ));
    }
    notes
}

/// The attempts by answer status (`0`: no answer), and the replayed answers.
fn tally_answers(history: &History) -> (BTreeMap<u16, usize>, usize) {
    let mut statuses = BTreeMap::new();
    let mut replays = 0;
    for a in &history.attempts {
        let status = match &a.result {
            AttemptResult::Answer(ans) => {
                replays += usize::from(ans.replayed);
                ans.status
            }
            _ => 0,
        };
        *statuses.entry(status).or_default() += 1;
    }
    (statuses, replays)
}

/// The report's line describing the run's setup.
fn setup_line(config: &RunConfig) -> String {
    format!(
        "store {}, {} gateways, {} relays, {} clients, {:?}, takeover {}, lease {:?}{}, status webhook {}{}",
        config.store,
        config.gateways,
        config.relays,
        config.clients,
        config.duration,
        config.takeover.as_str(),
        config.lease(),
        if config.lease.is_some() {
            ""
        } else {
            " (default)"
        },
        if config.status_webhook { "on" } else { "off" },
        config
            .planted
            .map_or_else(String::new, |b| format!(", PLANTED BUG {}", b.as_str()))
    )
}

/// Starts one gateway on `config` and stops it; the line of its log that says why it did
/// not start, if it did not.
async fn probe_config(idem: &Path, dir: &Path, config: &str) -> Result<(), String> {
    let slot = Slot::new("probe", Role::Serve, dir).map_err(|e| e.to_string())?;
    let started = slot
        .start(idem, config, None, Duration::from_secs(15))
        .await;
    slot.kill();
    started.map_err(|e| {
        let text = format!("{e:#}");
        text.lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or(text.as_str())
            .trim()
            .to_owned()
    })
}

fn save(
    dir: &Path,
    history: &History,
    calls: &[crate::upstream::Call],
    plan: &[nemesis::Planned],
    report: &Report,
) {
    let write = |name: &str, value: &dyn erased::Json| {
        let _ = std::fs::write(dir.join(name), value.json());
    };
    write("history.json", history);
    write("ledger.json", &calls);
    write("schedule.json", &plan);
    write("findings.json", &report.findings);
    let _ = std::fs::write(dir.join("report.txt"), report.to_string());
}

mod erased {
    /// Serializes anything serde can, for [`super::save`].
    pub(super) trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string_pretty(self).unwrap_or_default()
        }
    }
}

/// Removes the run's directory when dropped, unless it is to be kept.
struct DirGuard {
    dir: PathBuf,
    keep: bool,
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Published messages that have neither reached the upstream nor been dead-lettered.
fn unaccounted(
    published: &BTreeMap<String, Vec<String>>,
    calls: &[Call],
    dead: &DeadLetters,
) -> usize {
    let ran: HashSet<(&str, &str)> = calls
        .iter()
        .filter(|c| matches!(c.outcome, CallOutcome::Executed(_)))
        .filter_map(|c| Some((c.principal.as_str(), c.key.as_deref()?)))
        .collect();
    published
        .iter()
        .flat_map(|(p, ids)| ids.iter().map(move |id| (p.as_str(), id.as_str())))
        .filter(|&(p, id)| !ran.contains(&(p, id)) && !dead.contains(p, id))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Execution;

    fn call(principal: &str, key: &str, outcome: CallOutcome) -> Call {
        Call {
            id: 0,
            via: "r0".into(),
            principal: principal.into(),
            key: Some(key.into()),
            fence: None,
            arrived_ms: 0,
            body: String::new(),
            outcome,
        }
    }

    #[test]
    fn a_message_counts_as_settled_once_it_ran_or_was_dead_lettered() {
        let published = BTreeMap::from([
            (
                "relay:rabbit".to_owned(),
                vec!["m-1".to_owned(), "m-2".to_owned()],
            ),
            (
                "relay:nats".to_owned(),
                vec!["m-1".to_owned(), "m-3".to_owned()],
            ),
        ]);
        let ran = CallOutcome::Executed(Execution {
            exec: "e-1".into(),
            at_ms: 1,
            status: 200,
            body: String::new(),
            dropped: false,
        });
        let calls = vec![
            call("relay:rabbit", "m-1", ran),
            // Refused without acting, and the same id run by the other relay: neither settles.
            call("relay:rabbit", "m-2", CallOutcome::Refused),
            call("relay:nats", "m-2", CallOutcome::Refused),
        ];
        let mut dead = DeadLetters::default();
        assert_eq!(unaccounted(&published, &calls, &dead), 3);
        dead.ids
            .entry("relay:nats".into())
            .or_default()
            .insert("m-3".into());
        assert_eq!(unaccounted(&published, &calls, &dead), 2);
        dead.ids
            .entry("relay:rabbit".into())
            .or_default()
            .insert("m-2".into());
        dead.ids
            .entry("relay:rabbit".into())
            .or_default()
            .insert("m-1-elsewhere".into());
        // relay:nats m-1 still has neither.
        assert_eq!(unaccounted(&published, &calls, &dead), 1);
    }
}
