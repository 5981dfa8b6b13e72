//! The gateway on a private Redis Cluster (three masters, one replica each) that this test
//! binary starts on spare loopback ports and kills when done: both documented URL forms, one
//! execution for concurrent duplicates across gateways, keys on every master, the admin API
//! listing every master's records, and a master killed (its replica promoted) while requests
//! flow.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{Gateway, Http, Reply, Upstream};
use http::{Method, StatusCode};
use idem_testkit::redis_server::{Cluster, redis_server_available};
use parking_lot::Mutex;

/// One healthy cluster for the tests that do not break it; its servers die with the process.
fn shared() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    redis_server_available().then(|| CLUSTER.get_or_init(Cluster::start_with_replicas))
}

async fn shared_cluster() -> Option<&'static Cluster> {
    tokio::task::spawn_blocking(shared)
        .await
        .expect("start cluster")
}

/// What the cluster tests start from: the shared cluster (`None` when it cannot run), the
/// test upstream and a store prefix of the test's own.
async fn on_cluster() -> Option<(&'static Cluster, Upstream, String)> {
    let cluster = shared_cluster().await?;
    Some((cluster, Upstream::start().await, prefix()))
}

fn prefix() -> String {
    format!("idem-gw-cluster:{}:", uuid::Uuid::now_v7().simple())
}

/// The pay route on `store` under `prefix`, holding (for a minute) what another gateway
/// started, with an admin listener.
fn config(upstream: &str, store: &str, prefix: &str, extra: &str) -> String {
    common::configs::with_admin(
        upstream,
        store,
        &format!("store_prefix = \"{prefix}\"\nstore_timeout = \"1s\"\n{extra}"),
        "namespace = \"cluster\"\nlease = \"60s\"\ntakeover = \"hold\"",
        "[[routes]]\nname = \"pay\"\npath = \"/pay/*\"\n",
    )
}

/// `redis+cluster://` with one seed: the first node only.
fn one_seed(cluster: &Cluster) -> String {
    format!("redis+cluster://{}", cluster.nodes[0].addr())
}

/// Keys under `prefix` on each current master.
/// Record keys under `prefix` on each master; the audit trail's streams (one per namespace
/// and slot, under `{prefix}audit:`) are not records and are left out.
fn keys_per_master(cluster: &Cluster, prefix: &str) -> Vec<(u16, usize)> {
    let pattern = format!("{prefix}*");
    let audit = format!("{prefix}audit:");
    cluster
        .masters()
        .into_iter()
        .map(|m| {
            let n = cluster
                .node(m)
                .and_then(|n| n.cli(&["--scan", "--pattern", &pattern]))
                .map_or(0, |out| {
                    out.lines()
                        .filter(|l| !l.is_empty() && !l.starts_with(&audit))
                        .count()
                });
            (m, n)
        })
        .collect()
}

async fn admin_list(http: &Http, gw: &Gateway) -> Vec<String> {
    let list = http
        .admin(
            Method::GET,
            &gw.admin_url("/admin/records?namespace=cluster&limit=10000"),
            "",
        )
        .await;
    list.assert_status(StatusCode::OK);
    list.json()["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn check_config_accepts_every_cluster_form() {
    for store in [
        "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
        "redis+cluster://127.0.0.1:7101",
        "redis+cluster://user:hunter2@127.0.0.1:7101,127.0.0.1:7102",
    ] {
        let out = common::check_config(&format!(
            "upstream = \"http://127.0.0.1:3000\"\nstore = \"{store}\"\n\
             [defaults]\nprincipal = {{ from = \"none\" }}\n"
        ));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{store}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("Redis Cluster"), "{stdout}");
        assert!(stdout.contains("127.0.0.1:7101"), "{stdout}");
        assert!(!stdout.contains("hunter2"), "{stdout}");
    }
    let out = common::check_config("store = \"redis+cluster://127.0.0.1:1,,127.0.0.1:2\"\n");
    assert!(!out.status.success(), "an empty seed is refused");
}

/// 20 keys, each sent 6 times at once over three gateways (two on the seed list, one on a
/// single seed): each runs once, the records land on every master, and the admin API of
/// either URL form lists all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_over_three_gateways_run_once_and_spread_over_masters() {
    let Some((cluster, up, prefix)) = on_cluster().await else {
        return;
    };
    let gateways = [
        Gateway::start(&config(&up.url(), &cluster.url(), &prefix, ""), &[]),
        Gateway::start(&config(&up.url(), &cluster.url(), &prefix, ""), &[]),
        Gateway::start(&config(&up.url(), &one_seed(cluster), &prefix, ""), &[]),
    ];
    let http = Http::new();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let mut tasks = Vec::new();
    for i in 0..20 {
        for copy in 0..6 {
            let url = gateways[copy % 3].url(&format!("/pay/{i}?delay_ms=200"));
            let (http, key) = (http.clone(), format!("{run}-{i}"));
            tasks.push(tokio::spawn(async move {
                (i, http.post(&url, Some(&key), "{}").await)
            }));
        }
    }
    let mut first: HashMap<usize, bytes::Bytes> = HashMap::new();
    for t in tasks {
        let (i, r) = t.await.expect("join");
        match r.status {
            StatusCode::CREATED => {
                let body = first.entry(i).or_insert_with(|| r.body.clone());
                assert_eq!(*body, r.body, "key {i}: every answer is the one result");
            }
            StatusCode::CONFLICT => assert_eq!(r.problem_type(), "in-flight"),
            other => panic!("key {i}: unexpected {other}: {:?}", r.body),
        }
    }
    for i in 0..20 {
        assert_eq!(up.seen.count(&format!("/pay/{i}")), 1, "key {i} ran once");
    }
    let spread = keys_per_master(cluster, &prefix);
    assert_eq!(spread.len(), 3, "{spread:?}");
    assert!(
        spread.iter().all(|&(_, n)| n > 0),
        "every master holds records: {spread:?}"
    );
    assert_eq!(spread.iter().map(|&(_, n)| n).sum::<usize>(), 20);
    for gw in &gateways {
        let mut keys = admin_list(&http, gw).await;
        keys.sort();
        let mut want: Vec<String> = (0..20).map(|i| format!("{run}-{i}")).collect();
        want.sort();
        assert_eq!(keys, want, "the admin API lists every master's records");
    }
}

/// One seed is enough: fresh keys hashing to every master answer 201, one by one and at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_seed_reaches_every_master() {
    let Some((cluster, up, prefix)) = on_cluster().await else {
        return;
    };
    let gw = Gateway::start(&config(&up.url(), &one_seed(cluster), &prefix, ""), &[]);
    let http = Http::new();
    let run = uuid::Uuid::now_v7().simple().to_string();
    for i in 0..10 {
        let r = http
            .post(
                &gw.url(&format!("/pay/s{i}")),
                Some(&format!("{run}-s{i}")),
                "{}",
            )
            .await;
        r.assert_status(StatusCode::CREATED);
    }
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (http, url, key) = (
            http.clone(),
            gw.url(&format!("/pay/c{i}")),
            format!("{run}-c{i}"),
        );
        tasks.push(tokio::spawn(async move {
            http.post(&url, Some(&key), "{}").await
        }));
    }
    for t in tasks {
        let r = t.await.expect("join");
        r.assert_status(StatusCode::CREATED);
    }
    assert!(
        keys_per_master(cluster, &prefix)
            .iter()
            .all(|&(_, n)| n > 0),
        "the keys hash to every master"
    );
}

/// What each answer of the failover run was, per key.
#[derive(Default)]
struct Answers {
    /// The first 201 body per key; every later 201 must equal it.
    first: HashMap<usize, bytes::Bytes>,
    unavailable: usize,
    in_flight: usize,
    wrong: Vec<String>,
}

impl Answers {
    fn record(&mut self, i: usize, r: Result<Reply, String>) {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.wrong.push(format!("key {i}: connection error {e}"));
                return;
            }
        };
        match r.status {
            StatusCode::CREATED => {
                let first = self.first.entry(i).or_insert_with(|| r.body.clone());
                if *first != r.body {
                    self.wrong.push(format!(
                        "key {i}: answered {:?} after {:?}",
                        String::from_utf8_lossy(&r.body),
                        String::from_utf8_lossy(first)
                    ));
                }
            }
            StatusCode::SERVICE_UNAVAILABLE => self.unavailable += 1,
            StatusCode::CONFLICT if r.problem_type() == "in-flight" => self.in_flight += 1,
            other => self.wrong.push(format!(
                "key {i}: {other} {:?}",
                String::from_utf8_lossy(&r.body)
            )),
        }
    }
}

const KEYS: usize = 60;

/// Sends key `i` (two copies at once, one per gateway) and records both answers.
async fn send_pair(http: &Http, gws: &[String; 2], run: &str, i: usize, answers: &Mutex<Answers>) {
    let key = format!("{run}-{i}");
    let path = format!("/pay/{i}");
    let send = |base: &String| {
        let url = format!("{base}{path}");
        let (http, key) = (http.clone(), key.clone());
        async move {
            http.try_send(
                Method::POST,
                &url,
                &[
                    ("idempotency-key", &key),
                    ("content-type", "application/json"),
                ],
                "{}",
            )
            .await
        }
    };
    let (a, b) = tokio::join!(send(&gws[0]), send(&gws[1]));
    let mut answers = answers.lock();
    answers.record(i, a);
    answers.record(i, b);
}

/// The failover scenario: keys 0..20 while healthy; one master's replica frozen and its
/// replication link cut (replication lags) while keys 20..60 go through; the master SIGKILLed and the replica thawed, which the
/// cluster promotes, and a new replica joined to it, while every key keeps being retried;
/// then every key is retried until it answers 201. Returns the answers and the executions per key.
async fn failover_run(wait_for_replica: bool) -> (Answers, Vec<u64>) {
    let mut cluster = tokio::task::spawn_blocking(Cluster::start_with_replicas)
        .await
        .expect("start cluster");
    let up = Upstream::start().await;
    let prefix = prefix();
    let extra = if wait_for_replica {
        "store_wait_replicas = 1\nstore_wait_timeout = \"100ms\""
    } else {
        ""
    };
    let a = Gateway::start(&config(&up.url(), &cluster.url(), &prefix, extra), &[]);
    let b = Gateway::start(&config(&up.url(), &one_seed(&cluster), &prefix, extra), &[]);
    let gws = [a.url(""), b.url("")];
    let http = Http::new();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let answers = Arc::new(Mutex::new(Answers::default()));

    for i in 0..20 {
        send_pair(&http, &gws, &run, i, &answers).await;
    }

    let victim = cluster.masters()[0];
    let replica = cluster
        .replica_of(victim)
        .expect("the master has a replica");
    // The replica stops and its replication link is cut: what the master accepts from now
    // on reaches no replica (a frozen process's kernel would still buffer the stream).
    cluster.node(replica).expect("replica").freeze();
    let killed = cluster
        .node(victim)
        .and_then(|n| n.cli(&["CLIENT", "KILL", "TYPE", "replica"]));
    assert_eq!(killed.as_deref(), Some("1"), "the replication link was cut");
    for i in 20..KEYS {
        send_pair(&http, &gws, &run, i, &answers).await;
    }

    // Retries flow for the whole failover.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flow = {
        let (http, gws, run, answers, stop) = (
            http.clone(),
            gws.clone(),
            run.clone(),
            Arc::clone(&answers),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for i in 0..KEYS {
                    send_pair(&http, &gws, &run, i, &answers).await;
                }
            }
        })
    };
    cluster.kill(victim);
    cluster.node(replica).expect("replica").resume();
    // The promoted master has no replica left, so with `store_wait_replicas` its slots
    // answer 503 until the operator gives it one, as here.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_promoted(replica, Duration::from_secs(30));
        cluster.add_replica(replica);
        cluster
    })
    .await
    .expect("failover");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    flow.await.expect("flow");

    // Every key until it has its answer (the gateways' cluster clients catch up on the new
    // topology within a few attempts).
    for i in 0..KEYS {
        for _ in 0..100 {
            send_pair(&http, &gws, &run, i, &answers).await;
            if answers.lock().first.contains_key(&i) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let executions = (0..KEYS)
        .map(|i| up.seen.count(&format!("/pay/{i}")))
        .collect();
    drop(cluster);
    let answers = Arc::try_unwrap(answers)
        .ok()
        .expect("one owner")
        .into_inner();
    (answers, executions)
}

/// A master dies with its replica behind; with `store_wait_replicas = 1` no claim the gateway
/// acted on is lost in the failover: every answer is 201 with the one result, 409 in flight
/// or 503, and every key ran exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_never_runs_a_request_twice() {
    if !redis_server_available() {
        return;
    }
    let (answers, executions) = failover_run(true).await;
    assert!(
        answers.wrong.is_empty(),
        "{} wrong answers, first: {:#?}",
        answers.wrong.len(),
        &answers.wrong[..answers.wrong.len().min(3)]
    );
    assert!(
        answers.unavailable > 0,
        "the failover was seen (503 while the master was down or unacknowledged)"
    );
    let twice: Vec<usize> = (0..KEYS).filter(|&i| executions[i] > 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    assert_eq!(
        answers.first.len(),
        KEYS,
        "every key got its answer after the failover"
    );
    assert!(executions.iter().all(|&n| n == 1), "{executions:?}");
}

/// The unguarded variant: the same run without `store_wait_replicas`. Claims acknowledged by
/// the master alone are lost when its lagging replica is promoted, and their keys run again.
/// Ignored by default (it shows the fault the guard prevents); run it with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "demonstrates the failure the guarded test prevents"]
async fn without_waiting_for_replicas_a_failover_runs_requests_twice() {
    if !redis_server_available() {
        return;
    }
    let (answers, executions) = failover_run(false).await;
    let twice: Vec<usize> = (0..KEYS).filter(|&i| executions[i] > 1).collect();
    assert!(
        twice.is_empty() && answers.wrong.is_empty(),
        "ran more than once: {twice:?}; {} wrong answers, first: {:#?}",
        answers.wrong.len(),
        &answers.wrong[..answers.wrong.len().min(3)]
    );
}
