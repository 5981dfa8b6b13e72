//! The bounded CI mode of the fault suite: a fixed seed per case, each a short run against
//! the real `idem` binary (built first if `target/<profile>/idem` is missing) over a private
//! Redis or PostgreSQL, one at a time (the machine has two cores). The gateways run their
//! default configuration unless a case says otherwise; the unguarded variant
//! (`takeover = "reexecute"` in front of an upstream that ignores fences) and three planted
//! bugs (`idem-planted`) are runs of their own, each shown to be caught.
//!
//! A missing server binary fails the test under `CI=true` and is reported loudly otherwise;
//! nothing skips silently.

use std::time::Duration;

use idem_chaos::checker::Kind;
use idem_chaos::config::KeepDir;
use idem_chaos::{FaultKind, PlantedBug, Report, RunConfig, StoreKind, Takeover};

/// Runs take the whole machine: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether `store` can run here; under CI a missing server fails the test.
fn available(store: StoreKind) -> bool {
    match idem_chaos::store::missing(store) {
        None => true,
        Some(what) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI: {what} is missing, the chaos suite cannot run"
            );
            eprintln!("!!! SKIPPING the chaos run on {store}: {what} is missing");
            false
        }
    }
}

/// Whether the local RabbitMQ (5672) and NATS (4222) answer; under CI they must.
fn brokers_up() -> bool {
    for (name, addr) in [("RabbitMQ", "127.0.0.1:5672"), ("NATS", "127.0.0.1:4222")] {
        if std::net::TcpStream::connect(addr).is_err() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI: {name} is not running on {addr}"
            );
            eprintln!("!!! SKIPPING the chaos run with relays: {name} is not running on {addr}");
            return false;
        }
    }
    true
}

fn config(seed: u64, takeover: Takeover, faults: &[FaultKind]) -> RunConfig {
    RunConfig {
        store: StoreKind::Redis,
        gateways: 3,
        relays: 0,
        clients: 16,
        duration: Duration::from_secs(25),
        seed,
        takeover,
        faults: Some(faults.to_vec()),
        settle_bound: Duration::from_secs(30),
        keep_dir: KeepDir::OnAnomaly,
        verbose: true,
        ..RunConfig::default()
    }
}

async fn run(config: RunConfig) -> Report {
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = config.seed;
    let report = idem_chaos::run(config)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: the run could not be carried out: {e:#}"));
    println!("{report}");
    assert!(
        report.findings.executions > 100,
        "seed {seed}: too little ran to judge anything\n{report}"
    );
    report
}

/// The unguarded variant, shown to bite: under `takeover = "reexecute"` with an upstream
/// that does not check fences, gateways SIGKILLed or stopped past the lease mid-request leave
/// claims whose leases run out, and the retry runs the request again. The checker must
/// report those double executions (the defaults, below, must not have them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reexecute_runs_twice_when_gateways_die_mid_request() {
    if !available(StoreKind::Redis) {
        return;
    }
    let mut config = config(
        11,
        Takeover::Reexecute,
        &[FaultKind::KillGateway, FaultKind::PauseGateway],
    );
    config.duration = Duration::from_secs(20);
    // Its anomalies are the point: nothing to keep.
    config.keep_dir = KeepDir::Never;
    let report = run(config).await;
    assert!(
        report.faults_injected() >= 3,
        "seed 11: the nemesis hardly ran\n{report}"
    );
    assert!(
        report.count(Kind::DoubleExecution) > 0,
        "seed 11: reexecute with gateways killed mid-request must show double executions\n{report}"
    );
}

/// The default configuration (`hold`, no status webhook) under the same faults plus store
/// freezes: nothing runs twice and every answer is the first execution's; the keys whose
/// holder died are left unknown and listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_defaults_run_once_and_list_the_keys_left_unknown() {
    if !available(StoreKind::Redis) {
        return;
    }
    let report = run(config(
        12,
        Takeover::Default,
        &[
            FaultKind::KillGateway,
            FaultKind::PauseGateway,
            FaultKind::FreezeStore,
        ],
    ))
    .await;
    assert!(
        report.faults_injected() >= 3,
        "seed 12: the nemesis hardly ran\n{report}"
    );
    assert!(
        report.anomalies().is_empty(),
        "seed 12: the defaults must not run anything twice\n{report}"
    );
    assert!(
        !report.findings.unknown.is_empty(),
        "seed 12: keys whose holder died are left unknown without a status webhook\n{report}"
    );
}

/// The defaults with the upstream's status webhook on the routes (and `[reconcile] every`):
/// a claim that finds a dead holder's expired lease asks the upstream and settles the key,
/// so nothing runs twice and no key is left unknown, with gateways killed and stopped and
/// their store links cut and slowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_defaults_with_a_status_webhook_settle_every_key() {
    if !available(StoreKind::Redis) {
        return;
    }
    let mut config = config(
        13,
        Takeover::Default,
        &[
            FaultKind::KillGateway,
            FaultKind::PauseGateway,
            FaultKind::CutLink,
            FaultKind::SlowLink,
        ],
    );
    config.status_webhook = true;
    let report = run(config).await;
    assert!(
        report.anomalies().is_empty(),
        "seed 13: the defaults with a webhook must not run anything twice\n{report}"
    );
    assert!(
        report.findings.unknown.is_empty(),
        "seed 13: every unknown key is settled from the status webhook\n{report}"
    );
    assert!(
        report.settle.hit > 0 && report.settle.unsettled == 0,
        "seed 13: every key a crash hit is settled\n{report}"
    );
}

/// PostgreSQL with the defaults and two relays consuming RabbitMQ and JetStream (duplicates
/// published with one message id): gateways and relays killed, the store frozen and its
/// links cut and slowed; nothing runs twice, no message is lost or run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_and_relays_under_the_defaults_run_everything_once() {
    if !available(StoreKind::Postgres) || !brokers_up() {
        return;
    }
    let mut config = config(
        14,
        Takeover::Default,
        &[
            FaultKind::KillGateway,
            FaultKind::KillRelay,
            FaultKind::FreezeStore,
            FaultKind::CutLink,
            FaultKind::SlowLink,
        ],
    );
    config.store = StoreKind::Postgres;
    config.relays = 2;
    config.duration = Duration::from_secs(20);
    let report = run(config).await;
    assert!(
        report.anomalies().is_empty(),
        "seed 14: the defaults on PostgreSQL must not run anything twice or lose a message\n{report}"
    );
    assert!(
        report.findings.messages_once > 20,
        "seed 14: the relays executed too few messages to judge\n{report}"
    );
}

/// A short run of `idem-planted` with `bug`, the faults that expose it and the webhook on
/// (short leases, so the run ends sooner); answers the report.
async fn planted(seed: u64, bug: PlantedBug, faults: &[FaultKind]) -> Report {
    let mut config = config(seed, Takeover::Default, faults);
    config.planted = Some(bug);
    config.status_webhook = true;
    config.duration = Duration::from_secs(15);
    // Its anomalies are the point: nothing to keep.
    config.keep_dir = KeepDir::Never;
    run(config).await
}

/// Planted: a claim that finds the key held or unknown runs the handler anyway. Concurrent
/// retries of the hot keys and the keys of killed gateways run twice, under fences no store
/// granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_skips_fencing_is_caught() {
    if !available(StoreKind::Redis) {
        return;
    }
    let report = planted(
        21,
        PlantedBug::ClaimSkipsFencing,
        &[FaultKind::KillGateway, FaultKind::PauseGateway],
    )
    .await;
    assert!(
        report.count(Kind::DoubleExecution) > 0 && report.count(Kind::FenceReused) > 0,
        "seed 21: a claim that skips fencing must show double executions under one fence\n{report}"
    );
}

/// Planted: the completion is written in the background, half a second after the answer.
/// A gateway killed in that half second leaves a key whose client had its answer in flight
/// again (then settled from the webhook).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_before_the_completion_is_durable_is_caught() {
    if !available(StoreKind::Redis) {
        return;
    }
    let report = planted(
        22,
        PlantedBug::AnswerBeforeDurable,
        &[FaultKind::KillGateway],
    )
    .await;
    assert!(
        report.count(Kind::NotDurable) > 0,
        "seed 22: an answer sent before its completion is durable must show as not-durable\n{report}"
    );
}

/// Planted: a claim the store failed (timed out, unreachable) runs the handler anyway.
/// Requests through a gateway whose store link is cut or whose store is frozen reach the
/// upstream without a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_timeout_that_lets_the_request_through_is_caught() {
    if !available(StoreKind::Redis) {
        return;
    }
    let report = planted(
        23,
        PlantedBug::StoreTimeoutRuns,
        &[FaultKind::FreezeStore, FaultKind::CutLink],
    )
    .await;
    assert!(
        report.count(Kind::ExecutedDuringOutage) > 0 && report.count(Kind::NoFence) > 0,
        "seed 23: a store failure that lets requests through must show executions during the outage without a fence\n{report}"
    );
}
