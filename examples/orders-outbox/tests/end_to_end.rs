//! The whole path with real processes, PostgreSQL and RabbitMQ: the service is SIGKILLed
//! between its commit and its answer, a dispatcher between its publish and its mark, and a
//! consumer between its commit and its ack. Every order is charged once and shipped once,
//! and no event is lost. The same path with a consumer that has no inbox ships some orders
//! twice (the dispatcher's republished copies), and a service that publishes after its commit
//! instead of using the outbox loses the event of the order it died on.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_orders-outbox");
const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const WAIT: Duration = Duration::from_secs(40);
const ORDERS: usize = 10;

/// A running role of the example; SIGKILLed when dropped.
struct Proc {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Proc {
    fn start(role: &str, prefix: &str, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.arg(role)
            .env("PREFIX", prefix)
            .env("DATABASE_URL", PG)
            .env("LISTEN", "127.0.0.1:0")
            .env("LEASE_MS", "1000")
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The first line of output starting with `prefix`.
    async fn line(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(WAIT, async {
            while let Some(line) = self.lines.recv().await {
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("no `{prefix}` line from the child"),
        }
    }

    /// SIGKILL: no clean shutdown.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    async fn address(&mut self) -> String {
        let line = self.line("listening on ").await;
        line.trim_start_matches("listening on ").to_owned()
    }
}

async fn pay(http: &reqwest::Client, base: &str, order: &str, key: &str) -> reqwest::Response {
    http.post(format!("{base}/orders/{order}/pay"))
        .header("idempotency-key", key)
        .body("{\"amount\": 100}")
        .send()
        .await
        .unwrap()
}

async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// What the tables hold after the run.
#[derive(Debug, PartialEq, Eq)]
struct Tally {
    charges: i64,
    shipments: i64,
    orders_shipped: i64,
}

/// Runs the path under the three crashes, the consumer with (`plain` false) or without its
/// inbox, and waits until every order is shipped and the outbox is drained.
async fn run(prefix: &str, plain: bool) -> Tally {
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();

    // The service dies after committing the first order's charge, message and key.
    let mut dying = Proc::start("service", prefix, &[("KILL_AT", "service:after-commit")]);
    let base = dying.address().await;
    let pending = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/orders/o-0/pay"))
                .header("idempotency-key", "k-0")
                .body("{\"amount\": 100}")
                .send()
                .await
        })
    };
    dying.line("KILL-POINT").await;
    dying.kill().await;
    assert!(
        pending.await.unwrap().is_err(),
        "the first caller never heard back"
    );

    let mut service = Proc::start("service", prefix, &[]);
    let base = service.address().await;
    let retry = pay(&http, &base, "o-0", "k-0").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "true",
        "the retry is a replay"
    );
    for i in 1..ORDERS {
        assert_eq!(
            pay(&http, &base, &format!("o-{i}"), &format!("k-{i}"))
                .await
                .status(),
            201
        );
    }
    let again = pay(&http, &base, "o-1", "k-1").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let charges = format!("SELECT count(*) FROM {prefix}_charges");
    assert_eq!(
        count(&pool, &charges).await,
        ORDERS as i64,
        "each order charged once"
    );

    // A dispatcher dies after a publish, before marking anything sent.
    let mut dying = Proc::start(
        "dispatch",
        prefix,
        &[("KILL_AT", "dispatcher:after-publish")],
    );
    dying.line("KILL-POINT").await;
    dying.kill().await;
    let dispatchers = [
        Proc::start("dispatch", prefix, &[]),
        Proc::start("dispatch", prefix, &[]),
    ];

    // A consumer dies after committing shipments, before acknowledging them.
    let consumer = if plain {
        Proc::start("consume", prefix, &[("PLAIN", "1")])
    } else {
        let mut dying = Proc::start("consume", prefix, &[("KILL_AT", "consumer:after-commit")]);
        dying.line("KILL-POINT").await;
        dying.kill().await;
        Proc::start("consume", prefix, &[])
    };

    let unsent = format!("SELECT count(*) FROM {prefix}_outbox WHERE sent_at IS NULL");
    let shipped = format!("SELECT count(DISTINCT order_id) FROM {prefix}_shipments");
    let started = Instant::now();
    while count(&pool, &unsent).await > 0 || count(&pool, &shipped).await < ORDERS as i64 {
        assert!(started.elapsed() < WAIT, "not every order was shipped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for any duplicate still in the queue to be consumed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tally = Tally {
        charges: count(&pool, &charges).await,
        shipments: count(&pool, &format!("SELECT count(*) FROM {prefix}_shipments")).await,
        orders_shipped: count(&pool, &shipped).await,
    };
    drop((service, dispatchers, consumer));
    cleanup(&pool, prefix).await;
    tally
}

async fn cleanup(pool: &sqlx::PgPool, prefix: &str) {
    for t in ["records", "inbox", "outbox", "charges", "shipments"] {
        let _ = sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {prefix}_{t}; DROP TABLE IF EXISTS {prefix}_{t}_audit"
        ))
        .execute(pool)
        .await;
    }
    if let Ok(conn) = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
        && let Ok(ch) = conn.create_channel().await
    {
        for q in [format!("{prefix}.paid"), format!("{prefix}.paid.dead")] {
            let _ = ch
                .queue_delete(
                    q.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        }
    }
}

fn prefix(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("ob_{what}_{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_crashes_each_order_charged_and_shipped_once() {
    let tally = run(&prefix("idem"), false).await;
    assert_eq!(
        tally,
        Tally {
            charges: ORDERS as i64,
            shipments: ORDERS as i64,
            orders_shipped: ORDERS as i64
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_inbox_a_republished_order_ships_twice() {
    let tally = run(&prefix("plain"), true).await;
    assert_eq!(tally.charges, ORDERS as i64);
    assert_eq!(tally.orders_shipped, ORDERS as i64, "no event lost");
    assert!(
        tally.shipments > ORDERS as i64,
        "the dispatcher's republished copies ship again without the inbox: {tally:?}"
    );
}

/// Without the outbox (the service publishes after its commit) the same crash of the service
/// between its commit and the publish loses that order's event: charged, never shipped. The
/// retry is a replay, which publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_outbox_a_crash_after_the_commit_loses_the_event() {
    let prefix = prefix("direct");
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let direct = [("DIRECT", "1")];
    let mut dying = Proc::start(
        "service",
        &prefix,
        &[("DIRECT", "1"), ("KILL_AT", "service:after-commit")],
    );
    let base = dying.address().await;
    let pending = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move { pay(&http, &base, "o-0", "k-0").await })
    };
    dying.line("KILL-POINT").await;
    dying.kill().await;
    let _ = pending.await;

    let consumer = Proc::start("consume", &prefix, &[]);
    let mut service = Proc::start("service", &prefix, &direct);
    let base = service.address().await;
    let retry = pay(&http, &base, "o-0", "k-0").await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    for i in 1..ORDERS {
        let res = pay(&http, &base, &format!("o-{i}"), &format!("k-{i}")).await;
        assert_eq!(res.status(), 201);
    }
    let shipped = format!("SELECT count(DISTINCT order_id) FROM {prefix}_shipments");
    let started = Instant::now();
    while count(&pool, &shipped).await < ORDERS as i64 - 1 {
        assert!(
            started.elapsed() < WAIT,
            "the published orders were not shipped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a late copy of the lost event, were there one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let charges = count(&pool, &format!("SELECT count(*) FROM {prefix}_charges")).await;
    let lost = count(
        &pool,
        &format!("SELECT count(*) FROM {prefix}_shipments WHERE order_id = 'o-0'"),
    )
    .await;
    let orders_shipped = count(&pool, &shipped).await;
    drop((service, consumer));
    cleanup(&pool, &prefix).await;
    assert_eq!(charges, ORDERS as i64, "each order charged once");
    assert_eq!(lost, 0, "o-0 was charged and its event lost");
    assert_eq!(orders_shipped, ORDERS as i64 - 1);
}
