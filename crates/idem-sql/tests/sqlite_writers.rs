//! SQLite under writers that do not share a pool (as separate processes would): claims still
//! never fail with `SQLITE_BUSY`, and exactly one of 64 racing claims wins.
//!
//! Bug guarded: writers that meet another connection's write lock fail at once with
//! "database is locked". Shown to bite: with the store's busy timeout set to zero this test
//! fails with `SqliteError { code: 5, message: "database is locked" }`.

mod common;

use std::sync::Arc;

use idem_core::{ClaimOutcome, Key, Scope, ScopedKey, Store};
use idem_sql::SqliteStore;
use idem_testkit::requests::claim_request;
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_stores_on_one_file_race_64_claims_one_wins() {
    let h = common::SqliteHarness::new().await;
    let mut stores = vec![h.store.clone()];
    for _ in 0..3 {
        stores.push(SqliteStore::open(&h.path).await.expect("open"));
    }
    let key = ScopedKey::new(
        Scope::new("sqlite.writers").expect("ns"),
        Key::new("k").expect("key"),
    );
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (store, key, barrier) = (stores[i % 4].clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                let req = claim_request(key);
                barrier.wait().await;
                store.claim(&req).await
            })
        })
        .collect();
    let mut claimed = 0;
    for t in tasks {
        match t
            .await
            .expect("task")
            .expect("no SQLITE_BUSY or other store error")
        {
            ClaimOutcome::Claimed { .. } => claimed += 1,
            ClaimOutcome::Busy { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed, 1);
}
