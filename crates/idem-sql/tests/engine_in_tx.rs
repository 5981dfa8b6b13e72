//! `Engine::run_in_tx` over PostgreSQL: the engine's same-transaction entry point (the one
//! state machine, through `TxStore`), as consumers use it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Answer, Engine, Fingerprint, Key, Outcome, Policy, Scope, ScopedKey, Settled, StoredResponse,
};

async fn setup() -> Option<(common::PgHarness, String)> {
    let h = common::PgHarness::connect().await?;
    let ledger = format!("{}_ledger", h.store.table());
    sqlx::raw_sql(&format!(
        "CREATE TABLE {ledger} (id bigserial PRIMARY KEY, note text NOT NULL)"
    ))
    .execute(h.store.pool())
    .await
    .expect("schema");
    Some((h, ledger))
}

async fn rows(h: &common::PgHarness, ledger: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {ledger}"))
        .fetch_one(h.store.pool())
        .await
        .expect("count")
}

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
type Work<'c> = futures::future::BoxFuture<'c, Result<((), StoredResponse), String>>;

/// Pins a closure to the higher-ranked signature `run_in_tx` wants.
fn work<F>(f: F) -> F
where
    F: for<'c> FnOnce(&'c mut Tx, idem_core::Lease) -> Work<'c>,
{
    f
}

/// The effect under test: one row written into `ledger` on the transaction.
async fn write_note(tx: &mut Tx, ledger: &str) -> Result<(), String> {
    sqlx::query(&format!("INSERT INTO {ledger} (note) VALUES ('x')"))
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn key(k: &str) -> ScopedKey {
    ScopedKey::new(
        Scope::new("tx.engine").expect("ns"),
        Key::new(k).expect("key"),
    )
}

/// The writes and the completion commit together; a second run replays and writes nothing;
/// a failed run rolls back its write and leaves the key free; another payload is a mismatch.
#[tokio::test]
async fn run_in_tx_commits_once_and_rolls_back_failures() {
    let Some((h, ledger)) = setup().await else {
        return;
    };
    let engine = Engine::new(h.store.clone(), Policy::default());
    let fp = Fingerprint::of_bytes(1, b"credit 100");
    let write = |l: String, fail: bool| {
        work(move |tx, _lease| {
            Box::pin(async move {
                write_note(tx, &l).await?;
                if fail {
                    return Err("after the write".to_owned());
                }
                Ok(((), StoredResponse::new(0, "credited")))
            })
        })
    };

    let failed = engine
        .run_in_tx(&key("k1"), &fp, None, write(ledger.clone(), true))
        .await
        .expect("run");
    assert!(matches!(
        failed,
        Answer::Executed {
            output: Err(_),
            settled: Settled::Released(_),
            ..
        }
    ));
    assert_eq!(
        rows(&h, &ledger).await,
        0,
        "the failed run's write rolled back"
    );

    let first = engine
        .run_in_tx(&key("k1"), &fp, None, write(ledger.clone(), false))
        .await
        .expect("run");
    assert_eq!(first.outcome(), Outcome::Executed(idem_core::Kept::Stored));
    let again = engine
        .run_in_tx(&key("k1"), &fp, None, write(ledger.clone(), false))
        .await
        .expect("run");
    assert!(matches!(again, Answer::Replayed(ref r) if r.body == "credited"));
    assert_eq!(rows(&h, &ledger).await, 1);

    let other = Fingerprint::of_bytes(1, b"credit 200");
    let mismatch = engine
        .run_in_tx(&key("k1"), &other, None, write(ledger.clone(), false))
        .await
        .expect("run");
    assert_eq!(mismatch.outcome(), Outcome::Mismatch);
    assert_eq!(rows(&h, &ledger).await, 1);
}

/// Eight concurrent runs of one key: one writes, the others wait on its row lock and replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_in_tx_concurrent_duplicates_write_once() {
    let Some((h, ledger)) = setup().await else {
        return;
    };
    let engine = Arc::new(Engine::new(h.store.clone(), Policy::default()));
    let fp = Fingerprint::of_bytes(1, b"credit 100");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (engine, l) = (Arc::clone(&engine), ledger.clone());
        tasks.push(tokio::spawn(async move {
            engine
                .run_in_tx(
                    &key("race"),
                    &fp,
                    None,
                    work(move |tx, _lease| {
                        Box::pin(async move {
                            write_note(tx, &l).await?;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok(((), StoredResponse::new(0, "credited")))
                        })
                    }),
                )
                .await
                .expect("run")
                .outcome()
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("task"));
    }
    assert_eq!(
        outcomes.iter().filter(|o| o.ran()).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Replayed).count(),
        7
    );
    assert_eq!(rows(&h, &ledger).await, 1);
}
