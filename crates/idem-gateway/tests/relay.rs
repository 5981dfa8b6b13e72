//! `idem relay` end to end: the real binary consumes a RabbitMQ queue (its own, expiring
//! unused) and POSTs to a test upstream that counts executions, with a Redis store under a
//! key prefix of its own.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{TempDir, Upstream, bin};
use idem_core::Key;
use idem_mq::rabbitmq::RabbitPublisher;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn unique(what: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("relay_{what}_{}", &id[..16])
}

struct Relay {
    child: Child,
    _dir: TempDir,
    stderr: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Relay {
    fn start(config: &str) -> Self {
        let dir = TempDir::new("relay");
        let path = dir.0.join("idem.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(bin())
            .arg("relay")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let lines = std::sync::Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().push(l);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("idem relay exited:\n{}", stderr.lock().join("\n"));
            }
            if line.contains("idem relay running") {
                break;
            }
        }
        std::thread::spawn(move || for _ in out.lines() {});
        Self {
            child,
            _dir: dir,
            stderr,
        }
    }

    fn logged(&self, needle: &str) -> usize {
        self.stderr
            .lock()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

fn config(queue: &str, upstream: &str, path: &str, failure: &str) -> String {
    format!(
        r#"
store = "redis://127.0.0.1:6379"
store_prefix = "{queue}:"
upstream = "{upstream}"

[[routes]]
name = "charge"
method = "POST"
path = "/charge"
timeout = "1s"
upstream_failure = "{failure}"
principal = {{ from = "none" }}

[[relay]]
name = "orders"
broker = "{AMQP}"
queue = "{queue}"
post = "{upstream}{path}"
max_attempts = 3
backoff = "50ms"
prefetch = 4
concurrency = 4
"#
    )
}

async fn declare(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    for q in [queue.to_owned(), format!("{queue}.dead")] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            args.clone(),
        )
        .await
        .unwrap();
    }
}

async fn ready(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .unwrap();
    q.message_count()
}

async fn publish(conn: &Connection, queue: &str, key: &str, times: usize) {
    let p = RabbitPublisher::new(conn).await.unwrap();
    for _ in 0..times {
        p.publish(
            "",
            queue,
            &Key::new(key).unwrap(),
            format!(r#"{{"order":"{key}"}}"#).as_bytes(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
}

async fn eventually<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(mut f: F) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Five copies of one message and one other: the upstream runs twice, with the keys; the
/// duplicates are acknowledged from the stored result, one access-log line per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_posts_each_message_once() {
    let upstream = Upstream::start().await;
    let conn = Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .unwrap();
    let q = unique("once");
    declare(&conn, &q).await;
    publish(&conn, &q, "order-1", 5).await;
    publish(&conn, &q, "order-2", 1).await;
    let relay = Relay::start(&config(&q, &upstream.url(), "/charge", "hold"));
    assert!(
        eventually(|| async { relay.logged("replayed") >= 4 && ready(&conn, &q).await == 0 }).await
    );
    assert_eq!(upstream.seen.count("/charge"), 2);
    let keys: Vec<String> = upstream
        .seen
        .headers
        .lock()
        .iter()
        .filter_map(|h| {
            h.get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .collect();
    assert!(keys.contains(&"order-1".to_owned()) && keys.contains(&"order-2".to_owned()));
    // One access-log line per message: two executions, four replays.
    assert_eq!(
        relay.logged("replayed"),
        4,
        "{}",
        relay.stderr.lock().join("\n")
    );
    assert_eq!(relay.logged("executed"), 2);
}

/// An upstream that acts and then answers too late. Under `upstream_failure = "retry"` the
/// redelivery calls it again (2 executions: what hold prevents); under `hold` the key becomes
/// unknown, the message is dead-lettered and a redelivery does not call it again (1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_upstream_times_out_after_acting() {
    let conn = Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .unwrap();

    let upstream = Upstream::start().await;
    let q = unique("timeout_retry");
    declare(&conn, &q).await;
    let relay = Relay::start(&config(
        &q,
        &upstream.url(),
        "/charge?delay_ms=1500",
        "retry",
    ));
    publish(&conn, &q, "order-3", 1).await;
    assert!(
        eventually(|| async { upstream.seen.total() >= 2 }).await,
        "retry: the upstream ran again\n{}",
        relay.stderr.lock().join("\n")
    );
    drop(relay);

    let upstream = Upstream::start().await;
    let q = unique("timeout_hold");
    declare(&conn, &q).await;
    let relay = Relay::start(&config(
        &q,
        &upstream.url(),
        "/charge?delay_ms=1500",
        "hold",
    ));
    publish(&conn, &q, "order-3", 1).await;
    let dead = format!("{q}.dead");
    assert!(eventually(|| async { ready(&conn, &dead).await == 1 }).await);
    publish(&conn, &q, "order-3", 1).await;
    assert!(eventually(|| async { ready(&conn, &dead).await == 2 }).await);
    assert_eq!(upstream.seen.total(), 1, "hold: the upstream acted once");
    drop(relay);
}

/// A 4xx other than 408/409/429 dead-letters at once; a 503 is retried up to `max_attempts`
/// and then dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_client_errors_dead_letter_and_server_errors_retry() {
    let conn = Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .unwrap();
    let upstream = Upstream::start().await;
    let q = unique("status");
    declare(&conn, &q).await;
    let relay = Relay::start(&config(&q, &upstream.url(), "/charge/status/422", "hold"));
    publish(&conn, &q, "order-4", 1).await;
    let dead = format!("{q}.dead");
    assert!(eventually(|| async { ready(&conn, &dead).await == 1 }).await);
    assert_eq!(upstream.seen.total(), 1);
    drop(relay);

    let upstream = Upstream::start().await;
    let q = unique("status503");
    declare(&conn, &q).await;
    let relay = Relay::start(&config(&q, &upstream.url(), "/charge/status/503", "hold"));
    publish(&conn, &q, "order-5", 1).await;
    let dead = format!("{q}.dead");
    assert!(eventually(|| async { ready(&conn, &dead).await == 1 }).await);
    assert_eq!(upstream.seen.total(), 3, "max_attempts = 3");
    drop(relay);
}

/// `check-config` shows each relay; an incomplete one is refused, naming the field.
#[test]
fn check_config_shows_relays() {
    let dir = TempDir::new("relaycfg");
    let path = dir.0.join("idem.toml");
    std::fs::write(
        &path,
        config("orders_q", "http://127.0.0.1:9", "/charge", "hold"),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("orders: RabbitMQ queue `orders_q` -> POST http://127.0.0.1:9/charge"),
        "{text}"
    );
    assert!(
        text.contains("key: the message id; route `charge`"),
        "{text}"
    );

    let broken = config("orders_q", "http://127.0.0.1:9", "/charge", "hold")
        .replace("queue = \"orders_q\"\n", "");
    std::fs::write(&path, broken).unwrap();
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`queue` is required"));
}
