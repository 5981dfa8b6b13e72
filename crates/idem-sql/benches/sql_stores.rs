//! First-request (claim + complete) and replay (claim → Done) throughput of each SQL store at
//! concurrency 1 and 16, against a raw one-statement insert loop on the same database as the
//! baseline. Prints a Markdown table.
//!
//! `cargo bench -p idem-sql --bench sql_stores` (servers: PostgreSQL and MariaDB on their
//! standard local ports; `IDEM_BENCH_SECS` sets the time per cell, default 2).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, OwnerId, Scope, ScopedKey, Store, StoredResponse,
    TakeoverPolicy,
};
use idem_sql::{MySqlStore, PgStore, SqliteStore};

fn req(ns: &str, i: u64) -> ClaimRequest {
    ClaimRequest {
        key: ScopedKey::new(
            Scope::new(ns).expect("ns"),
            Key::new(format!("k{i}")).expect("key"),
        ),
        fingerprint: Fingerprint::of_bytes(1, b"bench"),
        owner: OwnerId::random(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    }
}

/// Runs `op(i)` from `concurrency` tasks for `secs`, with a fresh `i` per call; ops/s.
async fn rate<F, Fut>(concurrency: usize, secs: Duration, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                while start.elapsed() < secs {
                    op(next.fetch_add(1, Ordering::Relaxed)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    next.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn first_request<S: Store + Clone>(
    store: &S,
    ns: &'static str,
    c: usize,
    secs: Duration,
) -> f64 {
    let store = store.clone();
    let response = StoredResponse::new(200, vec![b'x'; 200]);
    rate(c, secs, move |i| {
        let (store, response) = (store.clone(), response.clone());
        async move {
            let r = req(ns, i);
            let ClaimOutcome::Claimed { lease, .. } = store.claim(&r).await.expect("claim") else {
                panic!("fresh key")
            };
            store
                .complete(&r.key, lease.owner, lease.fence, &response, r.ttl)
                .await
                .expect("complete");
        }
    })
    .await
}

async fn replay<S: Store + Clone>(
    store: &S,
    ns: &'static str,
    c: usize,
    secs: Duration,
    keys: u64,
) -> f64 {
    let response = StoredResponse::new(200, vec![b'x'; 200]);
    for i in 0..keys {
        let r = req(ns, i);
        if let ClaimOutcome::Claimed { lease, .. } = store.claim(&r).await.expect("claim") {
            store
                .complete(&r.key, lease.owner, lease.fence, &response, r.ttl)
                .await
                .expect("complete");
        }
    }
    let store = store.clone();
    rate(c, secs, move |i| {
        let store = store.clone();
        async move {
            let r = req(ns, i % keys);
            assert!(matches!(
                store.claim(&r).await.expect("claim"),
                ClaimOutcome::Done { .. }
            ));
        }
    })
    .await
}

struct Row {
    backend: &'static str,
    c: usize,
    baseline: f64,
    first: f64,
    replay: f64,
}

fn table(rows: &[Row]) {
    println!(
        "| store | concurrency | baseline insert ops/s | first request ops/s | replay ops/s | first / baseline | replay / baseline |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
            r.backend,
            r.c,
            r.baseline,
            r.first,
            r.replay,
            r.first / r.baseline,
            r.replay / r.baseline
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --all-targets` this is a quick smoke run.
    let measuring = std::env::args().any(|a| a == "--bench");
    let secs = match std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => Duration::from_secs(s),
        None if measuring => Duration::from_secs(2),
        None => Duration::from_millis(50),
    };
    let keys: u64 = if measuring { 256 } else { 16 };
    let run = format!("{:08x}", OwnerId::random().0 as u32);
    let mut rows = Vec::new();

    // PostgreSQL.
    let pg_url = std::env::var("IDEM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match PgStore::connect(&pg_url, 16).await {
        Ok(base) => {
            let store = PgStore::with_table(base.pool().clone(), &format!("idem_bench_{run}"))
                .expect("table");
            store.migrate().await.expect("migrate");
            let raw = format!("idem_bench_raw_{run}");
            sqlx::raw_sql(&format!("CREATE TABLE {raw} (id bytea PRIMARY KEY)"))
                .execute(store.pool())
                .await
                .expect("raw");
            for c in [1, 16] {
                let (pool, sql) = (
                    store.pool().clone(),
                    format!("INSERT INTO {raw} (id) VALUES ($1) ON CONFLICT DO NOTHING"),
                );
                let baseline = rate(c, secs, move |i| {
                    let (pool, sql) = (pool.clone(), sql.clone());
                    async move {
                        sqlx::query(&sql)
                            .bind(format!("{c}-{i}").into_bytes())
                            .execute(&pool)
                            .await
                            .expect("insert");
                    }
                })
                .await;
                let ns: &'static str = if c == 1 { "pg1" } else { "pg16" };
                let first = first_request(&store, ns, c, secs).await;
                let replay = replay(&store, ns, c, secs, keys).await;
                rows.push(Row {
                    backend: "PostgreSQL",
                    c,
                    baseline,
                    first,
                    replay,
                });
            }
            sqlx::raw_sql(&format!("DROP TABLE {raw}"))
                .execute(store.pool())
                .await
                .expect("drop");
            store.drop_table().await.expect("drop");
        }
        Err(e) => eprintln!("!!! PostgreSQL unreachable, skipped: {e}"),
    }

    // MariaDB.
    let my_url = std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    match MySqlStore::connect(&my_url, 16).await {
        Ok(base) => {
            let store = MySqlStore::with_table(base.pool().clone(), &format!("idem_bench_{run}"))
                .expect("table");
            store.migrate().await.expect("migrate");
            let raw = format!("idem_bench_raw_{run}");
            sqlx::raw_sql(&format!(
                "CREATE TABLE {raw} (id VARBINARY(64) PRIMARY KEY) ENGINE = InnoDB"
            ))
            .execute(store.pool())
            .await
            .expect("raw");
            for c in [1, 16] {
                let (pool, sql) = (
                    store.pool().clone(),
                    format!("INSERT IGNORE INTO {raw} (id) VALUES (?)"),
                );
                let baseline = rate(c, secs, move |i| {
                    let (pool, sql) = (pool.clone(), sql.clone());
                    async move {
                        sqlx::query(&sql)
                            .bind(format!("{c}-{i}").into_bytes())
                            .execute(&pool)
                            .await
                            .expect("insert");
                    }
                })
                .await;
                let ns: &'static str = if c == 1 { "my1" } else { "my16" };
                let first = first_request(&store, ns, c, secs).await;
                let replay = replay(&store, ns, c, secs, keys).await;
                rows.push(Row {
                    backend: "MariaDB",
                    c,
                    baseline,
                    first,
                    replay,
                });
            }
            sqlx::raw_sql(&format!("DROP TABLE {raw}"))
                .execute(store.pool())
                .await
                .expect("drop");
            store.drop_table().await.expect("drop");
        }
        Err(e) => eprintln!("!!! MariaDB unreachable, skipped: {e}"),
    }

    // SQLite (a temporary file; one writer, 16 readers).
    let path = std::env::temp_dir().join(format!("idem_bench_{run}.db"));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let store = SqliteStore::open_with(options, 16).await.expect("sqlite");
    store.migrate().await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE raw (id BLOB PRIMARY KEY)")
        .execute(store.writer())
        .await
        .expect("raw");
    for c in [1, 16] {
        let pool = store.writer().clone();
        let baseline = rate(c, secs, move |i| {
            let pool = pool.clone();
            async move {
                sqlx::query("INSERT INTO raw (id) VALUES (?1) ON CONFLICT DO NOTHING")
                    .bind(format!("{c}-{i}").into_bytes())
                    .execute(&pool)
                    .await
                    .expect("insert");
            }
        })
        .await;
        let ns: &'static str = if c == 1 { "lite1" } else { "lite16" };
        let first = first_request(&store, ns, c, secs).await;
        let replay = replay(&store, ns, c, secs, keys).await;
        rows.push(Row {
            backend: "SQLite (file, WAL)",
            c,
            baseline,
            first,
            replay,
        });
    }
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }

    table(&rows);
}
