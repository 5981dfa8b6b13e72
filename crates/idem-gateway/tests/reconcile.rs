//! Reconciliation end to end: the real `idem` binary in front of an upstream that sometimes
//! acts before the gateway times out and sometimes does not, with a status webhook that says
//! which. `idem reconcile` (one-shot, with `--dry-run`) and the loop in `idem serve`.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::get;
use common::{Gateway, Http, TempDir, bin};
use http::{Method, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// The payment service behind the gateway. The key's prefix says how a charge goes:
/// `acted-…` charges at once and then stalls past the gateway's timeout; `never-…` stalls
/// and fails without charging on the first attempt, and charges at once on the next;
/// `unsure-…` stalls and its status is never known.
#[derive(Default)]
struct Payments {
    charged: Mutex<HashMap<String, u32>>,
    attempts: Mutex<HashMap<String, u32>>,
}

impl Payments {
    fn charges(&self, key: &str) -> u32 {
        self.charged.lock().get(key).copied().unwrap_or(0)
    }
}

async fn charge(State(p): State<Arc<Payments>>, headers: HeaderMap) -> (AxumStatus, String) {
    let key = common::idempotency_key(&headers);
    let attempt = {
        let mut a = p.attempts.lock();
        let n = a.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let stall = Duration::from_millis(2500);
    if key.starts_with("acted-") {
        *p.charged.lock().entry(key.clone()).or_default() += 1;
        tokio::time::sleep(stall).await;
    } else if (key.starts_with("never-") && attempt == 1) || key.starts_with("unsure-") {
        tokio::time::sleep(stall).await;
        return (AxumStatus::INTERNAL_SERVER_ERROR, "crashed".into());
    } else {
        *p.charged.lock().entry(key.clone()).or_default() += 1;
    }
    (AxumStatus::CREATED, json!({ "charge": key }).to_string())
}

async fn status(
    State(p): State<Arc<Payments>>,
    Query(q): Query<HashMap<String, String>>,
) -> ([(&'static str, &'static str); 1], String) {
    let key = q.get("idempotency_key").cloned().unwrap_or_default();
    let answer = if key.starts_with("unsure-") {
        json!({ "outcome": "unknown" })
    } else if p.charges(&key) > 0 {
        json!({
            "outcome": "complete",
            "status": 201,
            "headers": { "content-type": "application/json" },
            "body": json!({ "charge": key, "reconciled": true }).to_string(),
        })
    } else {
        json!({ "outcome": "release" })
    };
    ([("content-type", "application/json")], answer.to_string())
}

/// A gateway on a SQLite store in a fresh directory (`tag`) in front of the payments
/// service, reconciling every `interval` when given: the directory (kept for as long as the
/// gateway runs), the service's ledger, the gateway and a client.
async fn start(tag: &str, interval: Option<&str>) -> (TempDir, Arc<Payments>, Gateway, Http) {
    let dir = TempDir::new(tag);
    let (upstream, payments) = start_payments().await;
    let gw = Gateway::start(&config(upstream, &dir.0.join("idem.db"), interval), &[]);
    (dir, payments, gw, Http::new())
}

async fn start_payments() -> (SocketAddr, Arc<Payments>) {
    let payments = Arc::new(Payments::default());
    let app = Router::new()
        .route("/charges", get(status).post(charge))
        .with_state(Arc::clone(&payments));
    (common::serve_router(app).await, payments)
}

fn config(upstream: SocketAddr, db: &std::path::Path, every: Option<&str>) -> String {
    let reconcile = match every {
        Some(e) => format!("[reconcile]\nevery = \"{e}\"\nafter = \"1h\"\n"),
        None => String::new(),
    };
    common::configs::with_admin(
        &format!("http://{upstream}"),
        &format!("sqlite:{}", db.display()),
        "",
        r#"namespace = "payments""#,
        &format!(
            r#"
{reconcile}
[[routes]]
name = "charge"
method = "POST"
path = "/charges"
timeout = "1s"
upstream_failure = "hold"
status_url = "/charges?idempotency_key={{key}}"
"#
        ),
    )
}

async fn pay(http: &Http, gw: &Gateway, key: &str) -> common::Reply {
    http.post(&gw.url("/charges"), Some(key), r#"{"amount":100}"#)
        .await
}

async fn record_state(http: &Http, gw: &Gateway, key: &str) -> String {
    let r = http
        .admin(
            Method::GET,
            &gw.admin_url(&format!("/admin/record?namespace=payments&key={key}")),
            "",
        )
        .await;
    match r.status {
        StatusCode::NOT_FOUND => "absent".into(),
        _ => r.json()["state"].as_str().unwrap_or("?").to_owned(),
    }
}

fn reconcile(gw: &Gateway, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .arg("reconcile")
        .arg("--config")
        .arg(gw.config_path())
        .args(args)
        .output()
        .expect("run idem reconcile");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.code().is_some(),
        "reconcile died: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_reconcile_settles_from_the_upstreams_answer() {
    let (_dir, payments, gw, http) = start("reconcile", None).await;
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (acted, never, unsure) = (
        format!("acted-{id}"),
        format!("never-{id}"),
        format!("unsure-{id}"),
    );
    for k in [&acted, &never, &unsure] {
        let r = pay(&http, &gw, k).await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{k}");
        assert_eq!(record_state(&http, &gw, k).await, "unknown");
    }

    // The plan: asks the webhook, changes nothing.
    let (code, plan) = reconcile(&gw, &["--dry-run"]);
    assert_eq!(code, 3, "one record stays unknown: {plan}");
    assert!(plan.contains("dry run"), "{plan}");
    let line = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("no line for {key} in {text}"))
            .to_owned()
    };
    assert!(
        line(&plan, &acted).contains("would complete (201)"),
        "{plan}"
    );
    assert!(line(&plan, &never).contains("would release"), "{plan}");
    assert!(
        line(&plan, &unsure).contains("left: the upstream does not know yet"),
        "{plan}"
    );
    for k in [&acted, &never, &unsure] {
        assert_eq!(
            record_state(&http, &gw, k).await,
            "unknown",
            "dry run changed {k}"
        );
    }

    // The pass itself, for scripts.
    let (code, out) = reconcile(&gw, &["--json"]);
    assert_eq!(code, 3, "{out}");
    let items: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let item = |key: &str| {
        items
            .iter()
            .find(|i| i["key"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("no item for {key}: {out}"))
    };
    assert_eq!(
        (
            item(&acted)["action"].clone(),
            item(&acted)["applied"].clone()
        ),
        (json!("complete"), json!(true))
    );
    assert_eq!(item(&acted)["status"], 201);
    assert_eq!(
        (
            item(&never)["action"].clone(),
            item(&never)["applied"].clone()
        ),
        (json!("release"), json!(true))
    );
    assert_eq!(
        (
            item(&unsure)["action"].clone(),
            item(&unsure)["applied"].clone()
        ),
        (json!("leave"), json!(false))
    );

    // The charge that went through is replayed, never made twice.
    let replay = pay(&http, &gw, &acted).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.json()["reconciled"], true);
    assert_eq!(payments.charges(&acted), 1);
    // The one that did not is free to run again, and runs once.
    let retried = pay(&http, &gw, &never).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(payments.charges(&never), 1);
    // The unknown one still refuses retries: while its attempt may still be acting (the
    // route's timeout plus the handler backstop since its claim) and the webhook cannot say,
    // it is in flight; after that, unknown. Either way nothing runs.
    let before = payments.charges(&unsure);
    let early = pay(&http, &gw, &unsure).await.problem_type();
    assert!(
        early == "in-flight" || early == "outcome-unknown",
        "{early}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        pay(&http, &gw, &unsure).await.problem_type(),
        "outcome-unknown"
    );
    assert_eq!(payments.charges(&unsure), before, "nothing ran");

    // Every settlement is in the audit trail with its actor.
    for (k, outcome) in [(&acted, "complete"), (&never, "release")] {
        let trail = http
            .admin(
                Method::GET,
                &gw.admin_url(&format!(
                    "/admin/audit?namespace=payments&key={k}&state=resolved"
                )),
                "",
            )
            .await
            .json();
        let events = trail["events"].as_array().cloned().unwrap_or_default();
        assert_eq!(events.len(), 1, "{trail}");
        assert_eq!(events[0]["actor"], "reconcile:cli");
        assert_eq!(events[0]["outcome"], outcome);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_in_serve_settles_unknown_records() {
    let (_dir, payments, gw, http) = start("reconcile-loop", Some("200ms")).await;
    let acted = format!("acted-{}", uuid::Uuid::now_v7().simple());
    assert_eq!(
        pay(&http, &gw, &acted).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    let mut state = String::new();
    for _ in 0..100 {
        state = record_state(&http, &gw, &acted).await;
        if state == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "completed", "{}", gw.logs());
    let replay = pay(&http, &gw, &acted).await;
    assert!(replay.replayed());
    assert_eq!(replay.json()["reconciled"], true);
    assert_eq!(payments.charges(&acted), 1);
}

// Bug guarded: settling unknown records without asking the upstream. The unguarded variant
// (here, in the test: release every unknown record, as a blind cleanup job would) lets the
// retry of a charge that went through run again: the customer pays twice. The same retry
// after `idem reconcile` is a replay (see the first test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unguarded_blind_release_charges_twice() {
    let (_dir, payments, gw, http) = start("reconcile-blind", None).await;
    let acted = format!("acted-{}", uuid::Uuid::now_v7().simple());
    assert_eq!(
        pay(&http, &gw, &acted).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    let released = http
        .admin(
            Method::POST,
            &gw.admin_url(&format!(
                "/admin/record/resolve?namespace=payments&key={acted}"
            )),
            r#"{"outcome":"release"}"#,
        )
        .await;
    assert_eq!(released.status, StatusCode::OK);
    // The retry runs again; the upstream acts at once, then stalls past the timeout again.
    let _ = pay(&http, &gw, &acted).await;
    assert_eq!(
        payments.charges(&acted),
        2,
        "the unguarded variant charges twice"
    );
}
