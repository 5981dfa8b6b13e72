//! `idem outbox` as a service in front of a table another program writes: rows inserted by
//! hand with only the documented columns (as a Python or Node service would, in its own
//! transaction) reach RabbitMQ with their message id and headers, and are marked sent;
//! `--check` prints the settings without credentials; a bad file is refused with the field
//! named.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");
const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("idem_outbox_{what}_{}_{nanos}", std::process::id())
}

fn config(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{}.toml", unique("cfg")));
    std::fs::write(&path, body).unwrap();
    path
}

/// Waits until `done()` holds, failing with `what` after 20 s.
async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `unsent()` (the count of rows not yet sent) is 0.
async fn drained<F, Fut>(mut unsent: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    until("not every row was sent", || {
        let count = unsent();
        async move { count.await == 0 }
    })
    .await;
}

/// `idem outbox --check` on the configuration file `file`.
fn check(file: &std::path::Path) -> std::process::Output {
    Command::new(IDEM)
        .args(["outbox", "--check", "--config"])
        .arg(file)
        .output()
        .expect("run idem outbox --check")
}

/// SIGKILLs the child when dropped.
struct Running(std::process::Child);

impl Running {
    /// `idem outbox` dispatching by the configuration file `file`.
    fn outbox(file: &std::path::Path) -> Self {
        Self(
            Command::new(IDEM)
                .args(["outbox", "--config"])
                .arg(file)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn idem outbox"),
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_written_by_another_program_are_published_once_and_marked() {
    let table = unique("t");
    let queue = unique("q");
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let conn = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let dir = std::env::temp_dir();
    let file = config(
        &dir,
        &format!(
            "[outbox]\ndatabase = \"{PG}\"\ntable = \"{table}\"\nbroker = \"{AMQP}\"\n\
             migrate = true\nlease = \"2s\"\npublish_timeout = \"1s\"\nidle = \"50ms\"\n"
        ),
    );
    let _dispatcher = Running::outbox(&file);
    // The dispatcher creates the table; then another program writes rows by hand.
    let probe = format!("SELECT 1 FROM {table} LIMIT 1");
    until("no table", || async {
        sqlx::query(&probe).fetch_optional(&pool).await.is_ok()
    })
    .await;
    for i in 0..3 {
        sqlx::query(&format!(
            "INSERT INTO {table} (message_id, destination, payload, headers) VALUES ($1, $2, $3, $4)"
        ))
        .bind(format!("order-{i}:paid"))
        .bind(&queue)
        .bind(format!("{{\"order\":{i}}}").into_bytes())
        .bind("{\"x-source\":\"python\"}")
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut got = Vec::new();
    let started = Instant::now();
    while got.len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "got only {got:?}"
        );
        match channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            Some(m) => {
                let id = m.delivery.properties.message_id().clone().unwrap();
                let headers = m.delivery.properties.headers().clone().unwrap();
                let source = headers.inner().get("x-source").cloned();
                assert!(
                    matches!(source, Some(AMQPValue::LongString(ref s)) if s.to_string() == "python"),
                    "{source:?}"
                );
                got.push((id.to_string(), String::from_utf8(m.delivery.data).unwrap()));
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    got.sort();
    assert_eq!(
        got,
        (0..3)
            .map(|i| (format!("order-{i}:paid"), format!("{{\"order\":{i}}}")))
            .collect::<Vec<_>>()
    );
    let unsent = format!("SELECT count(*) FROM {table} WHERE sent_at IS NULL");
    drained(|| async { sqlx::query_scalar(&unsent).fetch_one(&pool).await.unwrap() }).await;
    // Marked sent: nothing is published again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap();
    assert!(again.is_none(), "a sent row was published again");
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await;
    let _ = std::fs::remove_file(file);
}

#[test]
fn check_hides_credentials_and_bad_files_name_the_field() {
    let dir = std::env::temp_dir();
    let good = config(
        &dir,
        "[outbox]\ndatabase = \"postgres://app:s3cret@db/orders\"\n\
         broker = \"amqp://guest:hunter2@mq:5672/%2f\"\n",
    );
    let out = check(&good);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok: outbox configuration is valid"), "{text}");
    assert!(
        !text.contains("s3cret") && !text.contains("hunter2"),
        "{text}"
    );

    for (body, named) in [
        (
            "[outbox]\ndatabase = \"postgres://db/x\"\nbroker = \"kafka://x\"\n",
            "outbox.broker",
        ),
        (
            "[outbox]\ndatabase = \"postgres://db/x\"\nbroker = \"nats://x:4222\"\nlease = \"later\"\n",
            "outbox.lease",
        ),
        (
            "[outbox]\ndatabase = \"postgres://db/x\"\nbroker = \"nats://x:4222\"\nbatchsize = 3\n",
            "batchsize",
        ),
        ("[serve]\n", "outbox"),
    ] {
        let bad = config(&dir, body);
        let out = check(&bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(named), "{body}: {err}");
        let _ = std::fs::remove_file(bad);
    }
    let _ = std::fs::remove_file(good);
}

/// The same service on SQLite to JetStream: the rows reach the stream with `Nats-Msg-Id`, and
/// a row the service writes twice (the same id) goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rows_reach_jetstream_with_their_ids() {
    use async_nats::jetstream;
    let name = unique("js");
    let client = async_nats::connect("nats://127.0.0.1:4222").await.unwrap();
    let js = jetstream::new(client);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            duplicate_window: Duration::from_secs(60),
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    let db = std::env::temp_dir().join(format!("{}.db", unique("sqlite")));
    let dir = std::env::temp_dir();
    let file = config(
        &dir,
        &format!(
            "[outbox]\ndatabase = \"sqlite:{}\"\nbroker = \"nats://127.0.0.1:4222\"\n\
             migrate = true\nlease = \"2s\"\npublish_timeout = \"1s\"\nidle = \"50ms\"\n",
            db.display()
        ),
    );
    let _dispatcher = Running::outbox(&file);
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .create_if_missing(true)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    until("no table", || async {
        sqlx::query("SELECT 1 FROM idem_outbox LIMIT 1")
            .fetch_optional(&pool)
            .await
            .is_ok()
    })
    .await;
    for i in [0, 1, 1] {
        sqlx::query(
            "INSERT INTO idem_outbox (message_id, destination, payload) VALUES (?1, ?2, ?3) \
             ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(format!("order-{i}:paid"))
        .bind(format!("{name}.paid"))
        .bind(format!("{{\"order\":{i}}}").into_bytes())
        .execute(&pool)
        .await
        .unwrap();
    }
    let unsent = "SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL";
    drained(|| async { sqlx::query_scalar(unsent).fetch_one(&pool).await.unwrap() }).await;
    let mut stream = stream;
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 2, "one message per id");
    for seq in 1..=2 {
        let m = stream.get_raw_message(seq).await.unwrap();
        let id = m.headers.get("Nats-Msg-Id").unwrap().to_string();
        assert_eq!(id, format!("order-{}:paid", seq - 1));
    }
    let _ = js.delete_stream(&name).await;
    let _ = std::fs::remove_file(&db);
    let _ = std::fs::remove_file(file);
}
