//! The outbox on each real database: enqueue commits and rolls back with its transaction, ids
//! are written once, concurrent claims take disjoint rows, leases run out, failures back off
//! or park, aggregates go out in order, sent rows are purged, and rows written by hand (the
//! table's documented defaults) are published or parked when they cannot be read.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use idem_core::outbox::{Failure, OutboxMessage, OutboxStore};
use idem_core::{Key, OwnerId};
use idem_sql::{OutboxDialect, SqlOutbox};
use sqlx::Pool;

const LEASE: Duration = Duration::from_secs(30);

fn message(id: &str) -> OutboxMessage {
    OutboxMessage::with_id(
        Key::new(id).expect("id"),
        "orders",
        format!("{{\"id\":\"{id}\"}}"),
    )
    .header("content-type", "application/json")
}

/// Enqueues `messages` in one committed transaction; how many were new.
async fn enqueue<D: OutboxDialect>(
    outbox: &SqlOutbox<D>,
    pool: &Pool<D>,
    messages: &[OutboxMessage],
) -> usize {
    let mut tx = pool.begin().await.expect("begin");
    let mut new = 0;
    for m in messages {
        if outbox.enqueue(&mut tx, m).await.expect("enqueue") {
            new += 1;
        }
    }
    tx.commit().await.expect("commit");
    new
}

/// Whether a claim by `owner` finds nothing due.
async fn nothing_due<D: OutboxDialect>(outbox: &SqlOutbox<D>, owner: OwnerId) -> bool {
    outbox
        .claim(owner, 10, LEASE)
        .await
        .expect("claim")
        .pending
        .is_empty()
}

fn ids(claimed: &idem_core::outbox::Claimed) -> Vec<String> {
    claimed
        .pending
        .iter()
        .map(|p| p.message.id.as_str().to_owned())
        .collect()
}

/// Every scenario, on one dialect. `raw_row` inserts a row by hand from the columns a
/// service in another language would write (`message_id`, `destination`, `payload`,
/// `headers`), in the dialect's spelling.
async fn scenarios<D: OutboxDialect>(
    pool: Pool<D>,
    table: &str,
    raw_row: impl Fn(&str, &str) -> String,
) where
    for<'c> &'c mut D::Connection: sqlx::Executor<'c, Database = D>,
{
    let outbox = SqlOutbox::with_table(pool.clone(), table).expect("table");
    outbox.migrate().await.expect("migrate");
    outbox.migrate().await.expect("migrate is idempotent");

    // A rolled-back transaction leaves nothing; a committed one leaves its message once.
    let mut tx = pool.begin().await.expect("begin");
    assert!(
        outbox
            .enqueue(&mut tx, &message("gone"))
            .await
            .expect("enqueue")
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(enqueue(&outbox, &pool, &[message("m-1")]).await, 1);
    assert_eq!(
        enqueue(&outbox, &pool, &[message("m-1")]).await,
        0,
        "same id twice"
    );
    // Ids compare byte for byte: another case is another message.
    assert_eq!(enqueue(&outbox, &pool, &[message("M-1")]).await, 1);
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.parked, stats.sent), (2, 0, 0));

    // A claim hands out each row once while its lease lasts, with its headers.
    let a = OwnerId::random();
    let first = outbox.claim(a, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&first), ["m-1", "M-1"]);
    assert_eq!(first.pending[0].attempts, 1);
    assert_eq!(first.pending[0].message, message("m-1"));
    assert!(nothing_due(&outbox, OwnerId::random()).await);
    // Only the holder marks its rows sent.
    let seqs: Vec<i64> = first.pending.iter().map(|p| p.seq).collect();
    assert_eq!(
        outbox.sent(OwnerId::random(), &seqs).await.expect("sent"),
        0
    );
    assert_eq!(outbox.sent(a, &seqs[..1]).await.expect("sent"), 1);

    // A failure gives the row back after its delay, counting the attempt.
    outbox
        .failed(&Failure {
            owner: a,
            seq: seqs[1],
            delay: Duration::from_millis(300),
            park: false,
            reason: "nacked",
        })
        .await
        .expect("failed");
    assert!(nothing_due(&outbox, a).await, "not yet due");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = outbox.claim(a, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&again), ["M-1"]);
    assert_eq!(again.pending[0].attempts, 2);

    // A lease that runs out hands the row to the next claim; the old holder can no longer
    // mark it.
    outbox
        .failed(&Failure {
            owner: a,
            seq: seqs[1],
            delay: Duration::ZERO,
            park: false,
            reason: "retry",
        })
        .await
        .expect("failed");
    let b = OwnerId::random();
    let short = outbox
        .claim(b, 10, Duration::from_millis(200))
        .await
        .expect("claim");
    assert_eq!(ids(&short), ["M-1"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = OwnerId::random();
    let taken = outbox.claim(c, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&taken), ["M-1"]);
    assert_eq!(outbox.sent(b, &seqs[1..]).await.expect("sent"), 0);
    // Parked: kept for an operator, never handed out.
    outbox
        .failed(&Failure {
            owner: c,
            seq: seqs[1],
            delay: Duration::ZERO,
            park: true,
            reason: "too many attempts",
        })
        .await
        .expect("park");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.parked, stats.sent), (0, 1, 1));
    assert!(nothing_due(&outbox, c).await);

    // Aggregates: one message of each at a time, oldest first; unordered ones go together.
    let batch = [
        message("a-1").aggregate("order-1"),
        message("a-2").aggregate("order-1"),
        message("b-1").aggregate("order-2"),
        message("free-1"),
        message("free-2"),
    ];
    assert_eq!(enqueue(&outbox, &pool, &batch).await, 5);
    let d = OwnerId::random();
    let round = outbox.claim(d, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&round), ["a-1", "b-1", "free-1", "free-2"]);
    let seqs: Vec<i64> = round.pending.iter().map(|p| p.seq).collect();
    assert!(nothing_due(&outbox, d).await, "a-2 waits");
    assert_eq!(outbox.sent(d, &seqs).await.expect("sent"), 4);
    let next = outbox.claim(d, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&next), ["a-2"]);
    outbox.sent(d, &[next.pending[0].seq]).await.expect("sent");

    // A parked message keeps the rest of its aggregate waiting.
    assert_eq!(
        enqueue(
            &outbox,
            &pool,
            &[
                message("p-1").aggregate("order-3"),
                message("p-2").aggregate("order-3")
            ]
        )
        .await,
        2
    );
    let p = outbox.claim(d, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&p), ["p-1"]);
    outbox
        .failed(&Failure {
            owner: d,
            seq: p.pending[0].seq,
            delay: Duration::ZERO,
            park: true,
            reason: "poison",
        })
        .await
        .expect("park");
    assert!(nothing_due(&outbox, d).await, "p-2 waits behind p-1");

    // Rows written by hand: the defaults make them due now; one that cannot be read is parked
    // with the reason, in the claim that met it.
    sqlx::raw_sql(&raw_row("hand-1", "{\"x-source\":\"python\"}"))
        .execute(&pool)
        .await
        .expect("raw");
    sqlx::raw_sql(&raw_row("hand-2", "[\"not\", \"an object\"]"))
        .execute(&pool)
        .await
        .expect("raw");
    let hand = outbox.claim(d, 10, LEASE).await.expect("claim");
    assert_eq!(ids(&hand), ["hand-1"]);
    assert_eq!(
        hand.pending[0].message.headers,
        [("x-source".to_owned(), "python".to_owned())]
    );
    assert_eq!(hand.unreadable.len(), 1);
    assert!(
        hand.unreadable[0].reason.contains("not a JSON object"),
        "{:?}",
        hand.unreadable
    );
    outbox.sent(d, &[hand.pending[0].seq]).await.expect("sent");
    let stats = outbox.stats().await.expect("stats");
    assert_eq!(
        (stats.pending, stats.parked),
        (1, 3),
        "p-2 pending; M-1, p-1, hand-2 parked"
    );

    // Purge: only rows sent longer ago than the retention.
    assert_eq!(
        outbox
            .purge(Duration::from_secs(3600), 100)
            .await
            .expect("purge"),
        0
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        outbox
            .purge(Duration::from_millis(10), 3)
            .await
            .expect("purge"),
        3,
        "limit"
    );
    assert_eq!(
        outbox
            .purge(Duration::from_millis(10), 100)
            .await
            .expect("purge"),
        4
    );
    assert_eq!(outbox.stats().await.expect("stats").sent, 0);

    // Concurrent claims take disjoint rows, and together every row.
    let many: Vec<OutboxMessage> = (0..40).map(|i| message(&format!("c-{i}"))).collect();
    assert_eq!(enqueue(&outbox, &pool, &many).await, 40);
    let claims = futures::future::join_all((0..4).map(|_| {
        let outbox = outbox.clone();
        async move {
            let mut got = Vec::new();
            loop {
                let c = outbox
                    .claim(OwnerId::random(), 7, LEASE)
                    .await
                    .expect("claim");
                if c.pending.is_empty() {
                    return got;
                }
                got.extend(ids(&c));
            }
        }
    }))
    .await;
    let all: Vec<String> = claims.into_iter().flatten().collect();
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 40, "each row handed out once: {all:?}");
    assert_eq!(distinct.len(), 40);

    outbox.drop_table().await.expect("drop");
}

/// The scenarios in a fresh table on `pool`, with hand-written rows whose payload is the
/// dialect's literal `payload`.
async fn in_fresh_table<D: OutboxDialect>(pool: Pool<D>, payload: &'static str)
where
    for<'c> &'c mut D::Connection: sqlx::Executor<'c, Database = D>,
{
    let table = common::unique_table("outbox");
    let t = table.clone();
    scenarios(pool, &table, move |id, headers| {
        format!("INSERT INTO {t} (message_id, destination, payload, headers) VALUES ('{id}', 'orders', {payload}, '{headers}')")
    })
    .await;
}

#[tokio::test]
async fn postgres_outbox() {
    match sqlx::PgPool::connect(&common::pg_url()).await {
        Ok(pool) => in_fresh_table(pool, "'x'::bytea").await,
        Err(e) => common::missing("PostgreSQL", &e),
    }
}

#[tokio::test]
async fn mariadb_outbox() {
    match sqlx::MySqlPool::connect(&common::mysql_url()).await {
        Ok(pool) => in_fresh_table(pool, "'x'").await,
        Err(e) => common::missing("MariaDB", &e),
    }
}

#[tokio::test]
async fn sqlite_outbox() {
    let path = std::env::temp_dir().join(format!("{}.db", common::unique_table("outbox")));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::SqlitePool::connect_with(options)
        .await
        .expect("sqlite");
    let t = "idem_outbox".to_owned();
    scenarios(pool, &t.clone(), move |id, headers| {
        format!("INSERT INTO {t} (message_id, destination, payload, headers) VALUES ('{id}', 'orders', x'78', '{headers}')")
    })
    .await;
    let _ = std::fs::remove_file(&path);
}

type PgTx = sqlx::Transaction<'static, sqlx::Postgres>;
type Work<'c> = futures::future::BoxFuture<'c, Result<((), idem_core::StoredResponse), String>>;

/// Pins a closure to the higher-ranked signature `run_in_tx` wants.
fn work<F>(f: F) -> F
where
    F: for<'c> FnOnce(&'c mut PgTx, idem_core::Lease) -> Work<'c>,
{
    f
}

/// The outbox rides the engine's transaction: a failed run leaves no message, the run that
/// completes leaves its messages once, a replay enqueues nothing, and a rerun of the same
/// key after a rollback enqueues the same ids.
#[tokio::test]
async fn enqueue_commits_with_the_idempotency_record() {
    use idem_core::{Answer, Engine, Fingerprint, Policy, Scope, ScopedKey, StoredResponse};
    let Some(h) = common::PgHarness::connect().await else {
        return;
    };
    let pool = h.store.pool().clone();
    let outbox =
        SqlOutbox::with_table(pool.clone(), &common::unique_table("outbox")).expect("table");
    outbox.migrate().await.expect("migrate");
    let engine = Engine::new(h.store.clone(), Policy::default());
    let key = ScopedKey::new(
        Scope::new("orders.create").expect("ns"),
        Key::new("order-42").expect("key"),
    );
    let fp = Fingerprint::of_bytes(1, b"charge 100");
    let charge = |fail: bool| {
        let (outbox, key) = (outbox.clone(), key.clone());
        work(move |tx, _lease| {
            Box::pin(async move {
                for suffix in ["paid", "receipt"] {
                    let m = OutboxMessage::for_key(&key, suffix, "orders", "{}")
                        .map_err(|e| e.to_string())?;
                    outbox.enqueue(tx, &m).await.map_err(|e| e.to_string())?;
                }
                if fail {
                    return Err("crashed after the enqueue".to_owned());
                }
                Ok(((), StoredResponse::new(201, "charged")))
            })
        })
    };
    let failed = engine
        .run_in_tx(&key, &fp, None, charge(true))
        .await
        .expect("run");
    assert!(matches!(failed, Answer::Executed { output: Err(_), .. }));
    assert_eq!(
        outbox.stats().await.expect("stats").pending,
        0,
        "rolled back with the work"
    );

    let first = engine
        .run_in_tx(&key, &fp, None, charge(false))
        .await
        .expect("run");
    assert!(matches!(first, Answer::Executed { output: Ok(()), .. }));
    let again = engine
        .run_in_tx(&key, &fp, None, charge(false))
        .await
        .expect("run");
    assert!(matches!(again, Answer::Replayed(ref r) if r.body == "charged"));
    let claimed = outbox
        .claim(OwnerId::random(), 10, LEASE)
        .await
        .expect("claim");
    let expected: Vec<String> = ["paid", "receipt"]
        .iter()
        .map(|s| {
            idem_core::outbox::message_id(&key, s)
                .expect("id")
                .as_str()
                .to_owned()
        })
        .collect();
    assert_eq!(ids(&claimed), expected);
    outbox.drop_table().await.expect("drop");
}

/// The claim without its lock, as a hand-written outbox poller often is (read the due rows,
/// then mark them): concurrent pollers hand the same rows out twice, which the locked claim
/// above never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlocked_claim_hands_rows_out_twice() {
    let pool = match sqlx::PgPool::connect(&common::pg_url()).await {
        Ok(p) => p,
        Err(e) => return common::missing("PostgreSQL", &e),
    };
    let outbox =
        SqlOutbox::with_table(pool.clone(), &common::unique_table("outbox")).expect("table");
    outbox.migrate().await.expect("migrate");
    let t = outbox.table().to_owned();
    let mut handed_twice = false;
    for round in 0..5 {
        let many: Vec<OutboxMessage> = (0..40).map(|i| message(&format!("u{round}-{i}"))).collect();
        assert_eq!(enqueue(&outbox, &pool, &many).await, 40);
        let polls = futures::future::join_all((0..4).map(|_| {
            let (pool, t) = (pool.clone(), t.clone());
            async move {
                let mut got = Vec::new();
                loop {
                    let seqs: Vec<i64> = sqlx::query_scalar(&format!(
                        "SELECT seq FROM {t} WHERE sent_at IS NULL AND claimed_by IS NULL ORDER BY seq LIMIT 7"
                    ))
                    .fetch_all(&pool)
                    .await
                    .expect("read");
                    if seqs.is_empty() {
                        return got;
                    }
                    sqlx::query(&format!(
                        "UPDATE {t} SET claimed_by = '\\x01'::bytea WHERE seq = ANY($1)"
                    ))
                    .bind(&seqs)
                    .execute(&pool)
                    .await
                    .expect("mark");
                    got.extend(seqs);
                }
            }
        }))
        .await;
        let all: Vec<i64> = polls.into_iter().flatten().collect();
        let distinct: BTreeSet<i64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), 40, "every row handed out");
        if all.len() > distinct.len() {
            handed_twice = true;
            break;
        }
    }
    outbox.drop_table().await.expect("drop");
    assert!(
        handed_twice,
        "unlocked pollers never overlapped in 5 rounds"
    );
}
