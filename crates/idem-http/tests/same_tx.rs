//! The layer in same-transaction mode on PostgreSQL: the handler's writes commit with the
//! key's completion or not at all; a retry of a committed request replays and writes nothing;
//! a rolled-back one runs again.
//!
//! Beside it, the layer in its ordinary mode with a handler that commits its own transaction:
//! the effect and the record commit separately, so a store that fails between them leaves a
//! charge the record does not show, and the retry charges again. It is the reason for the
//! same-transaction mode, kept as a running test.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_core::{Engine, Outcome, Policy, ScopedKey, SharedTx, StoreOp, TakeoverPolicy};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use idem_sql::PgStore;
use idem_testkit::{Fault, FaultyStore};
use sqlx::PgPool;
use tower::ServiceExt as _;

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

struct Db {
    pool: PgPool,
    records: String,
    ledger: String,
}

impl Db {
    async fn connect() -> Option<Arc<Self>> {
        let url = std::env::var("IDEM_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = match PgPool::connect(&url).await {
            Ok(pool) => pool,
            Err(e) => {
                idem_testkit::services::missing("PostgreSQL", &e);
                return None;
            }
        };
        let tag = format!("{:032x}", idem_core::OwnerId::random().0);
        let db = Self {
            pool,
            records: format!("idem_http_tx_{tag}"),
            ledger: format!("idem_http_tx_{tag}_ledger"),
        };
        db.store().migrate().await.expect("migrate");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {} (id bigserial PRIMARY KEY, note text NOT NULL)",
            db.ledger
        ))
        .execute(&db.pool)
        .await
        .expect("ledger");
        Some(Arc::new(db))
    }

    fn store(&self) -> PgStore {
        PgStore::with_table(self.pool.clone(), &self.records).expect("table")
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.ledger))
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    async fn drop_tables(&self) {
        let _ = sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {r}; DROP TABLE IF EXISTS {r}_audit; DROP TABLE IF EXISTS {l}; \
             DROP FUNCTION IF EXISTS {r}_audit_fn()",
            r = self.records,
            l = self.ledger
        ))
        .execute(&self.pool)
        .await;
    }
}

/// Writes one ledger row naming the scoped key on the request's transaction, then answers
/// with the status the request's `x-status` asks for (201 by default), or panics when it
/// asks for `panic`.
async fn write(
    State(db): State<Arc<Db>>,
    Extension(tx): Extension<SharedTx<Tx>>,
    Extension(key): Extension<ScopedKey>,
    req: Request<Body>,
) -> Response {
    let wants = req
        .headers()
        .get("x-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("201")
        .to_owned();
    {
        let Some(mut tx) = tx.lock().await else {
            return StatusCode::GONE.into_response();
        };
        sqlx::query(&format!("INSERT INTO {} (note) VALUES ($1)", db.ledger))
            .bind(key.to_string())
            .execute(&mut **tx)
            .await
            .expect("insert");
    }
    if let Some(ms) = req.headers().get("x-sleep-ms") {
        let ms: u64 = ms.to_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    assert!(wants != "panic", "the handler panics, as asked");
    let status = wants
        .parse()
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    (status, "written\n").into_response()
}

/// Writes, then leaves a task holding the transaction after it answered.
async fn keep(State(db): State<Arc<Db>>, Extension(tx): Extension<SharedTx<Tx>>) -> Response {
    let (locked, wait) = tokio::sync::oneshot::channel();
    tokio::spawn(hold(tx, db.ledger.clone(), locked));
    let _ = wait.await;
    (StatusCode::CREATED, "kept\n").into_response()
}

/// Writes on `tx`, says so, and keeps it locked for half a second.
async fn hold(tx: SharedTx<Tx>, ledger: String, locked: tokio::sync::oneshot::Sender<()>) {
    let Some(mut held) = tx.lock().await else {
        return;
    };
    let _ = sqlx::query(&format!("INSERT INTO {ledger} (note) VALUES ('kept')"))
        .execute(&mut **held)
        .await;
    let _ = locked.send(());
    tokio::time::sleep(Duration::from_millis(500)).await;
}

fn app(db: &Arc<Db>, policy: Policy) -> Router {
    let engine = Engine::new(db.store(), policy);
    let config = IdempotencyConfig::new("tx.http").expect("namespace");
    let layer = IdempotencyLayer::new(&engine, config).in_transaction();
    Router::new()
        .route("/write", post(write))
        .route("/keep", post(keep))
        .layer(layer)
        .with_state(Arc::clone(db))
}

fn post_with(key: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::post("/write").header("idempotency-key", key);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::from("{\"amount\":1}")).expect("request")
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Option<Outcome>, String) {
    let res = app.clone().oneshot(req).await.expect("infallible");
    let status = res.status();
    let outcome = res.extensions().get::<Outcome>().copied();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .expect("body");
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if replayed {
        text.insert_str(0, "replayed:");
    }
    (status, outcome, text)
}

/// Committed once: the write and the record; the retry replays and writes nothing. The
/// handler saw the scoped key (the outbox derives message ids from it).
#[tokio::test]
async fn a_kept_answer_commits_the_writes_once() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let app = app(&db, Policy::default());
    let (status, outcome, body) = send(&app, post_with("k1", &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(outcome, Some(Outcome::Executed(idem_core::Kept::Stored)));
    assert_eq!(body, "written\n");
    let (status, outcome, body) = send(&app, post_with("k1", &[])).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(outcome, Some(Outcome::Replayed));
    assert_eq!(body, "replayed:written\n");
    assert_eq!(db.rows().await, 1, "one write for two requests");
    let note: String = sqlx::query_scalar(&format!("SELECT note FROM {}", db.ledger))
        .fetch_one(&db.pool)
        .await
        .expect("note");
    assert!(
        note.ends_with("k1"),
        "the handler saw the scoped key: {note}"
    );
    db.drop_tables().await;
}

/// A released answer (a 5xx), a panic and a kept transaction roll the write back with the
/// claim: nothing stays, and the retry runs again and commits.
#[tokio::test]
async fn an_answer_that_is_not_kept_rolls_the_writes_back() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let app = app(&db, Policy::default());

    let (status, _, body) = send(&app, post_with("k5", &[("x-status", "503")])).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the handler's answer"
    );
    assert_eq!(body, "written\n");
    assert_eq!(
        db.rows().await,
        0,
        "a 5xx is released: its write rolled back"
    );

    let (status, _, _) = send(&app, post_with("k5", &[("x-status", "panic")])).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(db.rows().await, 0, "a panic rolls back");

    let req = Request::post("/keep")
        .header("idempotency-key", "k5")
        .body(Body::from("{\"amount\":1}"))
        .expect("request");
    let (status, outcome, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        outcome,
        Some(Outcome::Executed(idem_core::Kept::Released(
            idem_core::ReleaseKind::Retryable
        )))
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        db.rows().await,
        0,
        "a transaction kept past the answer never commits"
    );

    let (status, outcome, _) = send(&app, post_with("k5", &[])).await;
    assert_eq!(status, StatusCode::CREATED, "the key was left free");
    assert_eq!(outcome, Some(Outcome::Executed(idem_core::Kept::Stored)));
    assert_eq!(db.rows().await, 1);
    db.drop_tables().await;
}

/// Concurrent duplicates: one runs; the others wait on the claim's row lock and replay its
/// committed answer. One write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_write_once() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let app = app(&db, Policy::default());
    let calls = (0..6).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, post_with("dup", &[("x-sleep-ms", "200")])).await })
    });
    let mut replayed = 0;
    for call in calls {
        let (status, outcome, _) = call.await.expect("task");
        assert_eq!(status, StatusCode::CREATED);
        if outcome == Some(Outcome::Replayed) {
            replayed += 1;
        }
    }
    assert_eq!(replayed, 5, "one ran, five replayed");
    assert_eq!(db.rows().await, 1);
    db.drop_tables().await;
}

/// Dropping the client mid-handler does not cancel the run: it commits in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_still_gets_its_answer_kept() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let app = app(&db, Policy::default());
    let call = app
        .clone()
        .oneshot(post_with("gone", &[("x-sleep-ms", "300")]));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err(),
        "still running when the client gives up"
    );
    let committed = idem_testkit::services::eventually(Duration::from_secs(5), || {
        let db = Arc::clone(&db);
        async move { db.rows().await == 1 }
    })
    .await;
    assert!(
        committed,
        "the run finished and committed after the client left"
    );
    let (_, outcome, _) = send(&app, post_with("gone", &[])).await;
    assert_eq!(outcome, Some(Outcome::Replayed));
    db.drop_tables().await;
}

// ---- The ordinary mode, for contrast.

/// Commits its own write on its own transaction, then answers.
async fn write_alone(State(db): State<Arc<Db>>) -> Response {
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query(&format!(
        "INSERT INTO {} (note) VALUES ('alone')",
        db.ledger
    ))
    .execute(&mut *tx)
    .await
    .expect("insert");
    tx.commit().await.expect("commit");
    (StatusCode::CREATED, "written\n").into_response()
}

/// The ordinary layer in front of a handler that commits on its own, with the completion
/// lost after the handler's commit (every completion fails, as when the process dies at that
/// point), then a retry after the lease: its status, if it answered within 3 s.
async fn lost_completion(db: &Arc<Db>, takeover: TakeoverPolicy) -> Option<StatusCode> {
    let store = FaultyStore::new(db.store()).with(StoreOp::Complete, Fault::Error);
    // `reexecute` wants a lease of the handler timeout and `LEASE_MARGIN`; `hold` may have a
    // short one.
    let lease = match takeover {
        TakeoverPolicy::Reexecute => Duration::from_millis(300) + idem_core::engine::LEASE_MARGIN,
        _ => Duration::from_millis(400),
    };
    let policy = Policy::builder()
        .store_timeout(Duration::from_millis(200))
        .handler_timeout(Duration::from_millis(300))
        .lease(lease)
        .takeover(takeover)
        .build()
        .expect("policy");
    let engine = Engine::new(store, policy);
    let config = IdempotencyConfig::new("tx.http").expect("namespace");
    let app = Router::new()
        .route("/write", post(write_alone))
        .layer(IdempotencyLayer::new(&engine, config))
        .with_state(Arc::clone(db));
    // The engine keeps trying to record the answer for a lease's time before it answers;
    // the client does not wait that long.
    let claimed = tokio::time::Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(2), send(&app, post_with("lost", &[])));
    if let Ok((status, _, _)) = first.await {
        assert_ne!(status, StatusCode::CREATED, "the answer was not recorded");
    }
    assert_eq!(db.rows().await, 1, "but the effect committed");
    tokio::time::sleep_until(claimed + lease + Duration::from_millis(800)).await;
    let retry = tokio::time::timeout(Duration::from_secs(3), send(&app, post_with("lost", &[])));
    retry.await.ok().map(|(status, _, _)| status)
}

/// Unguarded: with the effect committed apart from the record and `takeover = reexecute`
/// (opt-in), the retry after the lost completion charges again.
#[tokio::test]
async fn unguarded_separate_commits_with_reexecute_charge_twice() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let _ = lost_completion(&db, TakeoverPolicy::Reexecute).await;
    assert_eq!(db.rows().await, 2, "charged twice");
    db.drop_tables().await;
}

/// The default (`hold`) never charges twice there, but the key then waits for a person
/// (`409 outcome-unknown`). Same-transaction mode needs neither: a run that did not reach
/// its commit left nothing, so it runs again by default.
#[tokio::test]
async fn separate_commits_hold_the_key_and_same_tx_reruns_cleanly() {
    let Some(db) = Db::connect().await else {
        return;
    };
    let status = lost_completion(&db, TakeoverPolicy::Hold).await;
    assert_eq!(
        status,
        Some(StatusCode::CONFLICT),
        "outcome unknown: a person resolves it"
    );
    assert_eq!(db.rows().await, 1, "held, not run twice");

    // The same request in same-transaction mode, its first run stopped before the commit
    // (a panic stands for the crash: the transaction is never committed).
    let app = app(&db, Policy::default());
    let (status, _, _) = send(&app, post_with("lost-tx", &[("x-status", "panic")])).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, _, _) = send(&app, post_with("lost-tx", &[])).await;
    assert_eq!(status, StatusCode::CREATED, "the retry ran");
    assert_eq!(
        db.rows().await,
        2,
        "one write for the held key, one for this one"
    );
    db.drop_tables().await;
}
