//! First-request (claim + complete) and replay (claim → Done) throughput of each SQL store at
//! several concurrencies, with group commit on (the default) and off, against a raw
//! one-statement insert loop on the same database as the baseline. Prints a Markdown table of
//! medians over rounds, each ratio the median of the rounds' own ratios with their range.
//!
//! `cargo bench -p idem-sql --bench sql_stores` (servers: PostgreSQL and MariaDB on their
//! standard local ports). Knobs: `IDEM_BENCH_SECS` (time per cell, default 2),
//! `IDEM_BENCH_ROUNDS` (default 3), `IDEM_BENCH_TASKS` (default "1 16 64"),
//! `IDEM_BENCH_STORES` (default "postgres mariadb sqlite"). Every store has a pool of 16
//! connections (SQLite: one writer, 16 readers).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::store::{Completion, Hold};
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

async fn first_request<S: Store + Clone>(store: &S, ns: Arc<str>, c: usize, secs: Duration) -> f64 {
    let store = store.clone();
    let response = StoredResponse::new(200, vec![b'x'; 200]);
    rate(c, secs, move |i| {
        let (store, response, ns) = (store.clone(), response.clone(), ns.clone());
        async move {
            let r = req(&ns, i);
            let ClaimOutcome::Claimed { lease, .. } = store.claim(&r).await.expect("claim") else {
                panic!("fresh key")
            };
            store
                .complete(&Completion::new(Hold::of(&r.key, &lease), &response, r.ttl))
                .await
                .expect("complete");
        }
    })
    .await
}

async fn replay<S: Store + Clone>(
    store: &S,
    ns: Arc<str>,
    c: usize,
    secs: Duration,
    keys: u64,
) -> f64 {
    let response = StoredResponse::new(200, vec![b'x'; 200]);
    for i in 0..keys {
        let r = req(&ns, i);
        if let ClaimOutcome::Claimed { lease, .. } = store.claim(&r).await.expect("claim") {
            store
                .complete(&Completion::new(Hold::of(&r.key, &lease), &response, r.ttl))
                .await
                .expect("complete");
        }
    }
    let store = store.clone();
    rate(c, secs, move |i| {
        let (store, ns) = (store.clone(), ns.clone());
        async move {
            let r = req(&ns, i % keys);
            assert!(matches!(
                store.claim(&r).await.expect("claim"),
                ClaimOutcome::Done { .. }
            ));
        }
    })
    .await
}

/// A baseline insert of key `i`, on the store's own pool.
type Baseline = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A [`Baseline`] that runs the insert `$sql` (one blob parameter: a counter, so every key is
/// new) on `$pool`. A macro because the dialects' pools are different types.
macro_rules! insert_baseline {
    ($pool:expr, $sql:expr) => {{
        let (pool, sql) = ($pool.clone(), Arc::new($sql));
        let counter = Arc::new(AtomicU64::new(0));
        let baseline: Baseline = Arc::new(move |_| {
            let (pool, sql) = (pool.clone(), sql.clone());
            let n = counter.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                sqlx::query(&sql)
                    .bind(n.to_be_bytes().to_vec())
                    .execute(&pool)
                    .await
                    .expect("insert");
            })
        });
        baseline
    }};
}

/// One round's figures for one store at one concurrency (ops/s).
#[derive(Clone, Copy)]
struct Cell {
    baseline: f64,
    first: f64,
    first_alone: f64,
    replay: f64,
    replay_alone: f64,
}

/// Measures one round of `grouped` and `alone` (the same store with group commit off) at `c`.
async fn round<S: Store + Clone>(
    grouped: &S,
    alone: &S,
    baseline: &Baseline,
    tag: &str,
    c: usize,
    knobs: &Knobs,
) -> Cell {
    let b = baseline.clone();
    let base = rate(c, knobs.secs, move |i| b(i)).await;
    let ns = |what: &str| -> Arc<str> { format!("{tag}-{what}-{c}").into() };
    Cell {
        baseline: base,
        first: first_request(grouped, ns("first"), c, knobs.secs).await,
        first_alone: first_request(alone, ns("first-alone"), c, knobs.secs).await,
        replay: replay(grouped, ns("replay"), c, knobs.secs, knobs.keys).await,
        replay_alone: replay(alone, ns("replay-alone"), c, knobs.secs, knobs.keys).await,
    }
}

/// What a run measures.
struct Knobs {
    secs: Duration,
    rounds: usize,
    tasks: Vec<usize>,
    keys: u64,
}

/// Every round of one store, one row per concurrency.
async fn rows_of<S: Store + Clone>(
    name: &'static str,
    grouped: &S,
    alone: &S,
    baseline: &Baseline,
    run: &str,
    knobs: &Knobs,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for &c in &knobs.tasks {
        let mut cells = Vec::new();
        for r in 0..knobs.rounds {
            let slug = name.split(' ').next().unwrap_or(name).to_lowercase();
            let tag = format!("{run}-{slug}-r{r}");
            eprintln!("{name} c={c} round {}", r + 1);
            cells.push(round(grouped, alone, baseline, &tag, c, knobs).await);
        }
        rows.push(Row { name, c, cells });
    }
    rows
}

struct Row {
    name: &'static str,
    c: usize,
    cells: Vec<Cell>,
}

/// The median of `xs` and its range.
fn median(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    let m = if xs.len().is_multiple_of(2) && mid > 0 {
        (xs[mid - 1] + xs[mid]) / 2.0
    } else {
        xs[mid]
    };
    (m, xs[0], xs[xs.len() - 1])
}

fn table(rows: &[Row]) {
    println!(
        "| store | c | baseline insert ops/s | first request ops/s | first / baseline | first, group commit off / baseline | first: on / off | replay / baseline | replay, off / baseline |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ratio = |cells: &[Cell], f: fn(&Cell) -> f64| {
        let (m, lo, hi) = median(cells.iter().map(f).collect());
        format!("{m:.2} [{lo:.2}–{hi:.2}]")
    };
    for r in rows {
        let (base, _, _) = median(r.cells.iter().map(|c| c.baseline).collect());
        let (first, _, _) = median(r.cells.iter().map(|c| c.first).collect());
        println!(
            "| {} | {} | {base:.0} | {first:.0} | {} | {} | {} | {} | {} |",
            r.name,
            r.c,
            ratio(&r.cells, |c| c.first / c.baseline),
            ratio(&r.cells, |c| c.first_alone / c.baseline),
            ratio(&r.cells, |c| c.first / c.first_alone),
            ratio(&r.cells, |c| c.replay / c.baseline),
            ratio(&r.cells, |c| c.replay_alone / c.baseline),
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --all-targets` this is a quick smoke run.
    let measuring = std::env::args().any(|a| a == "--bench");
    let knobs = Knobs {
        secs: match std::env::var("IDEM_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
        {
            Some(s) => Duration::from_secs(s),
            None if measuring => Duration::from_secs(2),
            None => Duration::from_millis(50),
        },
        rounds: if measuring {
            env_or("IDEM_BENCH_ROUNDS", 3)
        } else {
            1
        },
        tasks: std::env::var("IDEM_BENCH_TASKS")
            .unwrap_or_else(|_| {
                if measuring {
                    "1 16 64".into()
                } else {
                    "1 16".into()
                }
            })
            .split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect(),
        keys: if measuring { 256 } else { 16 },
    };
    let stores =
        std::env::var("IDEM_BENCH_STORES").unwrap_or_else(|_| "postgres mariadb sqlite".into());
    let run = format!("{:08x}", (OwnerId::random().0 >> 96) as u32);
    let mut rows = Vec::new();

    if stores.contains("postgres") {
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
                let baseline = insert_baseline!(
                    store.pool(),
                    format!("INSERT INTO {raw} (id) VALUES ($1) ON CONFLICT DO NOTHING")
                );
                let alone = store.clone().with_group_commit(false);
                rows.extend(rows_of("PostgreSQL", &store, &alone, &baseline, &run, &knobs).await);
                sqlx::raw_sql(&format!("DROP TABLE {raw}"))
                    .execute(store.pool())
                    .await
                    .expect("drop");
                store.drop_table().await.expect("drop");
            }
            Err(e) => eprintln!("!!! PostgreSQL unreachable, skipped: {e}"),
        }
    }

    if stores.contains("mariadb") {
        let my_url = std::env::var("IDEM_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        match MySqlStore::connect(&my_url, 16).await {
            Ok(base) => {
                let store =
                    MySqlStore::with_table(base.pool().clone(), &format!("idem_bench_{run}"))
                        .expect("table");
                store.migrate().await.expect("migrate");
                let raw = format!("idem_bench_raw_{run}");
                sqlx::raw_sql(&format!(
                    "CREATE TABLE {raw} (id VARBINARY(64) PRIMARY KEY) ENGINE = InnoDB"
                ))
                .execute(store.pool())
                .await
                .expect("raw");
                let baseline = insert_baseline!(
                    store.pool(),
                    format!("INSERT IGNORE INTO {raw} (id) VALUES (?)")
                );
                let alone = store.clone().with_group_commit(false);
                rows.extend(rows_of("MariaDB", &store, &alone, &baseline, &run, &knobs).await);
                sqlx::raw_sql(&format!("DROP TABLE {raw}"))
                    .execute(store.pool())
                    .await
                    .expect("drop");
                store.drop_table().await.expect("drop");
            }
            Err(e) => eprintln!("!!! MariaDB unreachable, skipped: {e}"),
        }
    }

    if stores.contains("sqlite") {
        // A temporary file; one writer, 16 readers.
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
        let baseline = insert_baseline!(
            store.writer(),
            "INSERT INTO raw (id) VALUES (?1) ON CONFLICT DO NOTHING".to_owned()
        );
        let alone = store.clone().with_group_commit(false);
        rows.extend(
            rows_of(
                "SQLite (file, WAL)",
                &store,
                &alone,
                &baseline,
                &run,
                &knobs,
            )
            .await,
        );
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }

    table(&rows);
}
