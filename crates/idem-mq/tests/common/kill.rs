//! Kill tests: the consumer runs in a child process (this test binary again, running only its
//! ignored `child_consumer` test) that prints a marker at the chosen point and hangs there;
//! the parent SIGKILLs it on the marker: no clean shutdown, no ack, the broker connection just
//! drops.

use std::time::Duration;

use idem_core::key_source::KeySources;
use idem_core::{Engine, Policy};
use idem_mq::{InTx, Message, Processor, RunResult, Work};
use idem_sql::PgStore;
use tokio::io::AsyncBufReadExt;

use super::{After, Ledger, Then, WAIT, credit, fast, processor, tx_handler};

const MODE: &str = "IDEM_MQ_CHILD";
const SOURCE: &str = "IDEM_MQ_SOURCE";
const LEDGER: &str = "IDEM_MQ_LEDGER";
const RECORDS: &str = "IDEM_MQ_RECORDS";
const POINT: &str = "IDEM-MQ-POINT";

/// What the child was started for.
pub struct ChildArgs {
    /// Which scenario to run.
    pub mode: String,
    /// The queue or stream to consume.
    pub source: String,
    pub ledger: String,
    pub records: String,
}

impl ChildArgs {
    /// Read from the environment the parent set.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).unwrap();
        Self {
            mode: var(MODE),
            source: var(SOURCE),
            ledger: var(LEDGER),
            records: var(RECORDS),
        }
    }
}

impl ChildArgs {
    /// The child's idem processor: same transaction, records in `records`, one message at a
    /// time.
    pub fn processor<W: Work<PgStore>>(
        &self,
        pool: &sqlx::PgPool,
        keys: KeySources,
        work: W,
    ) -> Processor<PgStore, W> {
        let store = PgStore::with_table(pool.clone(), &self.records).unwrap();
        processor(
            Engine::new(store, Policy::default()),
            keys,
            fast(1, 1),
            work,
        )
    }

    /// Credits the ledger in the inbox's transaction, then (the commit done) hangs before
    /// the ack.
    pub fn after_commit(&self) -> Then<InTx<PgStore>, Hang> {
        let l = self.ledger.clone();
        Then(
            InTx::new(tx_handler(move |tx, m| {
                let l = l.clone();
                Box::pin(async move { credit(tx, &l, m).await })
            })),
            Hang,
        )
    }

    /// Credits the ledger in the inbox's transaction and hangs before the commit.
    pub fn before_commit(&self) -> InTx<PgStore> {
        let l = self.ledger.clone();
        InTx::new(tx_handler(move |tx, m| {
            let l = l.clone();
            Box::pin(async move {
                credit(tx, &l, m).await?;
                hang_here().await
            })
        }))
    }

    /// Without idem: credits `payload` on `pool`, as a consumer without an inbox does.
    pub async fn credit_plain(&self, pool: &sqlx::PgPool, payload: &[u8]) {
        sqlx::query(&format!(
            "INSERT INTO {} (order_id, amount) VALUES ($1, 100)",
            self.ledger
        ))
        .bind(String::from_utf8_lossy(payload).into_owned())
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Tells the parent the kill point is reached, then never returns.
pub async fn hang_here<T>() -> T {
    println!("{POINT}");
    futures::future::pending().await
}

/// After the inner work (the effect and, for idem, its commit): reports the kill point and
/// never returns, so the delivery is never acknowledged.
pub struct Hang;

impl<W: Send + Sync> After<W> for Hang {
    async fn after(&self, _: &W, _: RunResult, _: &Message) -> RunResult {
        hang_here().await
    }
}

/// Starts the child in `mode` on `source`, waits until it reports the kill point, and
/// SIGKILLs it.
pub async fn run_child_until_point(mode: &str, source: &str, ledger: &Ledger) {
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_consumer", "--exact", "--ignored", "--nocapture"])
        .arg("--test-threads=1")
        .env(MODE, mode)
        .env(SOURCE, source)
        .env(LEDGER, &ledger.ledger)
        .env(RECORDS, &ledger.records)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let reached = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(POINT) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    child.start_kill().unwrap(); // SIGKILL
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    assert!(reached, "child {mode} did not reach its kill point");
}

/// Asserts that the ledger holds `n` effects (`why` says why so many).
pub async fn assert_effects(ledger: &Ledger, n: i64, why: &str) {
    assert_eq!(ledger.rows().await, n, "{why}");
}

/// With `running` (the idem consumer started after the kill) taking the redelivery: it is
/// acknowledged, the `counted` statistic is 1 (`why` says which), and the ledger holds one
/// effect. Then stops `running` and drops the ledger's tables.
pub async fn assert_redelivery_settled(
    running: super::Running,
    ledger: &Ledger,
    counted: fn(&idem_mq::Stats) -> &std::sync::atomic::AtomicU64,
    why: &str,
) {
    assert!(
        super::eventually(WAIT, || async {
            idem_mq::Stats::get(&running.stats().acked) == 1
        })
        .await
    );
    assert_eq!(idem_mq::Stats::get(counted(running.stats())), 1, "{why}");
    assert_eq!(ledger.rows().await, 1);
    running.stop().await;
    ledger.drop_all().await;
}

/// [`assert_redelivery_settled`] for a kill after the commit: the redelivery is skipped.
pub async fn assert_redelivery_skipped(running: super::Running, ledger: &Ledger) {
    assert_redelivery_settled(
        running,
        ledger,
        |s| &s.replayed,
        "the redelivery was skipped",
    )
    .await;
}

/// [`assert_redelivery_settled`] for a kill before the commit: the redelivery runs.
pub async fn assert_redelivery_ran(running: super::Running, ledger: &Ledger) {
    assert_redelivery_settled(running, ledger, |s| &s.executed, "the redelivery ran").await;
}
