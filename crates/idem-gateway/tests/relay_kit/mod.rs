//! Shared by the `idem relay` tests: the real binary running a configuration, and an orders
//! service that counts what it executed per idempotency key and answers the reconciler's
//! status webhook.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use parking_lot::Mutex;
use serde_json::json;

use crate::common::{TempDir, bin};

/// How long a test waits for what it expects.
pub const WAIT: Duration = Duration::from_secs(20);

/// A name no other test (or run) uses.
pub fn unique(what: &str) -> String {
    idem_testkit::brokers::unique("relay", what)
}

/// `idem relay` on `config` (written to a fresh directory, which the caller keeps for as long
/// as the process runs) with `args` after it, its output piped.
fn command(config: &str, args: &[&str]) -> (TempDir, Command) {
    let (dir, mut cmd) = crate::common::command("relay", config);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    (dir, cmd)
}

/// `idem relay` running `config`, its log (stderr) collected; killed on drop.
pub struct Relay {
    child: Child,
    dir: TempDir,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Relay {
    /// Starts it and waits until it says it runs.
    pub fn start(config: &str) -> Self {
        Self::start_with(config, &[]).0
    }

    /// Starts it with `args` after the configuration and waits until it says it runs;
    /// answers the address of its metrics listener too, when it printed one.
    pub fn start_with(config: &str, args: &[&str]) -> (Self, Option<SocketAddr>) {
        let (dir, mut cmd) = command(config, args);
        let mut child = cmd
            .env("RUST_LOG", "info")
            .spawn()
            .expect("spawn idem relay");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().push(l);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut metrics = None;
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("idem relay exited:\n{}", stderr.lock().join("\n"));
            }
            if let Some(addr) = line.trim().strip_prefix("relay metrics on http://") {
                metrics = Some(addr.parse().unwrap());
            }
            if line.contains("idem relay running") {
                break;
            }
        }
        std::thread::spawn(move || for _ in out.lines() {});
        (Self { child, dir, stderr }, metrics)
    }

    /// Runs `idem relay` on `config` with `args`, expecting it to exit within 10 s (it is
    /// killed otherwise); answers its exit code (`None` when it had to be killed) and its
    /// output.
    pub fn refused(config: &str, args: &[&str]) -> (Option<i32>, String) {
        let (_dir, mut cmd) = command(config, args);
        let mut child = cmd.spawn().expect("spawn idem relay");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let code = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (code, text)
    }

    /// Waits (at most [`WAIT`]) until `done` holds; fails naming `what`, with the relay's log.
    pub async fn until<F, Fut>(&self, what: &str, done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        assert!(
            idem_testkit::brokers::eventually(WAIT, done).await,
            "not within {WAIT:?}: {what}\n{}",
            self.log()
        );
    }

    /// Log lines containing `needle`.
    pub fn logged(&self, needle: &str) -> usize {
        self.stderr
            .lock()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// The whole log, for failure messages.
    pub fn log(&self) -> String {
        self.stderr.lock().join("\n")
    }

    /// Runs `idem reconcile` once on the same configuration; answers its exit code and
    /// output.
    pub fn reconcile(&self) -> (i32, String) {
        self.reconcile_on(&self.dir.0.join("idem.toml"))
    }

    /// Runs `idem reconcile` once on `config` (the relay's store and route, with the status
    /// webhook the relay itself runs without); answers its exit code and output.
    pub fn reconcile_with(&self, config: &str) -> (i32, String) {
        let path = self.dir.0.join("reconcile.toml");
        std::fs::write(&path, config).unwrap();
        self.reconcile_on(&path)
    }

    fn reconcile_on(&self, path: &std::path::Path) -> (i32, String) {
        let out = Command::new(bin())
            .arg("reconcile")
            .arg("--config")
            .arg(path)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }
}

/// `config` without the route's status webhook: an ambiguous message is then dead-lettered
/// and its key waits for an operator (or `idem reconcile` with the webhook).
pub fn without_webhook(config: &str) -> String {
    config
        .lines()
        .filter(|l| !l.starts_with("status_url"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The configuration of one relay: the shared Redis under a prefix of its own, route
/// `orders` (timeout 1 s, `failure` = `hold` or `retry`, the orders service's status
/// webhook), and `source`, the broker lines of `[[relay]]`.
pub fn config(prefix: &str, upstream: &str, path: &str, failure: &str, source: &str) -> String {
    format!(
        r#"
store = "redis://127.0.0.1:6379"
store_prefix = "{prefix}:"
upstream = "{upstream}"

[[routes]]
name = "orders"
method = "POST"
path = "/orders"
namespace = "orders"
timeout = "1s"
upstream_failure = "{failure}"
status_url = "/orders?idempotency_key={{key}}"
principal = {{ from = "none" }}

[[relay]]
name = "orders"
{source}
post = "{upstream}{path}"
max_attempts = 3
backoff = "50ms"
prefetch = 4
concurrency = 4
"#
    )
}

/// An orders service. The key's prefix says how an order goes: `slow-…` is executed at once
/// and then answers after 1.5 s (past the relay's 1 s timeout); `flaky-…` answers 503
/// without executing on its first call and executes on the next; `down-…` always answers 503
/// without executing; `reject-…` answers 422
/// without executing; any other key executes and answers 201. `GET /orders?idempotency_key=K`
/// is the reconciler's status webhook: complete when K was executed, release otherwise.
#[derive(Default)]
pub struct Orders {
    executed: Mutex<HashMap<String, u32>>,
    calls: Mutex<HashMap<String, u32>>,
}

impl Orders {
    /// Starts it on a loopback port.
    pub async fn start() -> (String, Arc<Orders>) {
        let orders = Arc::new(Orders::default());
        let app = Router::new()
            .route("/orders", post(create).get(status))
            .with_state(Arc::clone(&orders));
        let addr = crate::common::serve_router(app).await;
        (format!("http://{addr}"), orders)
    }

    /// How often `key` was executed.
    pub fn executed(&self, key: &str) -> u32 {
        self.executed.lock().get(key).copied().unwrap_or(0)
    }

    /// Executions of every key.
    pub fn total(&self) -> u32 {
        self.executed.lock().values().sum()
    }

    /// How often `key` was posted, executed or not.
    pub fn calls(&self, key: &str) -> u32 {
        self.calls.lock().get(key).copied().unwrap_or(0)
    }
}

async fn create(State(o): State<Arc<Orders>>, headers: HeaderMap) -> (StatusCode, String) {
    let key = crate::common::idempotency_key(&headers);
    let call = {
        let mut calls = o.calls.lock();
        let n = calls.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let execute = || *o.executed.lock().entry(key.clone()).or_default() += 1;
    if key.starts_with("reject-") {
        return (StatusCode::UNPROCESSABLE_ENTITY, "bad order".into());
    }
    if key.starts_with("down-") || (key.starts_with("flaky-") && call == 1) {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later".into());
    }
    execute();
    if key.starts_with("slow-") {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    (StatusCode::CREATED, json!({ "order": key }).to_string())
}

async fn status(
    State(o): State<Arc<Orders>>,
    Query(q): Query<HashMap<String, String>>,
) -> ([(&'static str, &'static str); 1], String) {
    let key = q.get("idempotency_key").cloned().unwrap_or_default();
    let answer = if o.executed(&key) > 0 {
        json!({ "outcome": "complete", "status": 201, "body": json!({ "order": key }).to_string() })
    } else {
        json!({ "outcome": "release" })
    };
    ([("content-type", "application/json")], answer.to_string())
}
