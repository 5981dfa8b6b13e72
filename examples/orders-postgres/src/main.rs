//! An order and payment flow on PostgreSQL showing idem's three lines of defence:
//!
//! 1. **Claim** — `Engine::run` over [`PgStore`]: concurrent duplicates of "create order" run
//!    the handler once; retries replay the stored response.
//! 2. **State machine** — "pay" moves the order `pending → paid` with a guarded `UPDATE`: a
//!    repeated payment (even one that got past the claim, e.g. after a lease takeover) is a
//!    no-op, and paying a cancelled order is refused.
//! 3. **Unique index** — `UNIQUE(user_id, idem_key)` on the orders table: even a writer that
//!    bypasses idem entirely cannot create a second order; the duplicate is recognised
//!    precisely and answered with the existing live row.
//!
//! Then the same-database mode: claim, order row and completion in one transaction.
//!
//! Run: `cargo run -p orders-postgres` (env `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::sync::Arc;

use anyhow::Context as _;
use futures::FutureExt as _;
use idem_core::{
    Answer, ClaimRequest, Engine, Fingerprint, Key, OwnerId, Policy, Scope, ScopedKey, Settlement,
    StoredResponse, TakeoverPolicy,
};
use idem_sql::backstop::{
    Applied, InsertOnce, Liveness, TransitionError, Transitions, insert_once,
};
use idem_sql::{PgStore, TxOutcome};
use sqlx::{PgPool, Row};

/// An order row: id, soft-deleted flag, state.
type Order = (i64, bool, String);

const ORDERS: &str = "demo_orders";

fn machine() -> Transitions {
    Transitions::new()
        .allow("pending", "paid")
        .allow("paid", "shipped")
        .allow("pending", "cancelled")
}

/// Third line: insert the order once per (user, key); a duplicate returns the live row.
async fn create_order(
    pool: &PgPool,
    user: i64,
    key: &str,
    amount: i64,
) -> anyhow::Result<InsertOnce<Order>> {
    let order = insert_once(
        "demo_orders_user_key_uq",
        || async move {
            let row = sqlx::query(
                "INSERT INTO demo_orders (user_id, idem_key, amount) VALUES ($1, $2, $3) RETURNING id, deleted, state",
            )
            .bind(user)
            .bind(key)
            .bind(amount)
            .fetch_one(pool)
            .await?;
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        },
        || async move {
            let row = sqlx::query("SELECT id, deleted, state FROM demo_orders WHERE user_id = $1 AND idem_key = $2")
                .bind(user)
                .bind(key)
                .fetch_optional(pool)
                .await?;
            row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).transpose()
        },
        |(_, deleted, state): &Order| match (deleted, state.as_str()) {
            (true, _) => Liveness::Gone("order was deleted"),
            (_, "cancelled") => Liveness::Gone("order was cancelled"),
            _ => Liveness::Live,
        },
    )
    .await?;
    Ok(order)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = PgStore::connect(&url, 16)
        .await
        .context("connect to PostgreSQL")?;
    store.migrate().await?;
    let pool = store.pool().clone();
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {ORDERS};
         CREATE TABLE {ORDERS} (
             id bigserial PRIMARY KEY,
             user_id bigint NOT NULL,
             idem_key text NOT NULL,
             amount bigint NOT NULL,
             state text NOT NULL DEFAULT 'pending',
             deleted boolean NOT NULL DEFAULT false,
             CONSTRAINT demo_orders_user_key_uq UNIQUE (user_id, idem_key))"
    ))
    .execute(&pool)
    .await?;
    let run = OwnerId::random().to_string();
    let engine = Arc::new(Engine::new(store.clone(), Policy::default()));

    // 1. Five concurrent "create order" requests with one idempotency key.
    println!("== 1. claim: five concurrent duplicates of POST /orders");
    let key = ScopedKey::new(
        Scope::new("orders.create")?.with_principal("user-7"),
        Key::new(format!("create-{run}"))?,
    );
    let fp = Fingerprint::of_bytes(1, b"{\"sku\":\"tea\",\"amount\":1200}");
    let attempts = (0..5).map(|i| {
        let (engine, pool, key, idem) = (
            engine.clone(),
            pool.clone(),
            key.clone(),
            format!("create-{run}"),
        );
        async move {
            let outcome = engine
                .run(&key, &fp, |_lease| async move {
                    match create_order(&pool, 7, &idem, 1200).await {
                        Ok(order) => {
                            let id = order.into_inner().0;
                            Settlement::complete(
                                id,
                                StoredResponse::new(201, format!("{{\"order\":{id}}}")),
                            )
                        }
                        Err(e) => {
                            eprintln!("create failed: {e:#}");
                            Settlement::release(-1, idem_core::ReleaseKind::Retryable)
                        }
                    }
                })
                .await?;
            anyhow::Ok((i, outcome))
        }
    });
    for result in futures::future::join_all(attempts).await {
        let (i, outcome) = result?;
        match outcome {
            Answer::Executed { output, .. } => {
                println!("  request {i}: executed, created order {output}")
            }
            Answer::Replayed(r) => println!(
                "  request {i}: replayed {}",
                String::from_utf8_lossy(&r.body)
            ),
            Answer::InFlight { retry_after } => {
                println!("  request {i}: 409 in flight, retry after {retry_after:?}")
            }
            other => println!("  request {i}: {other:?}"),
        }
    }
    let replay = engine
        .run(&key, &fp, |_| async {
            Settlement::complete(0, StoredResponse::new(500, "must not run"))
        })
        .await?;
    if let Answer::Replayed(r) = replay {
        println!(
            "  a later retry replays: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }

    // 3. A writer that bypasses idem (a batch job, a second service) meets the unique index.
    println!("== 3. unique index: the same order inserted twice without idem");
    let a = create_order(&pool, 7, "bypass", 500).await?;
    let b = create_order(&pool, 7, "bypass", 500).await?;
    println!("  first: {a:?}\n  second: {b:?} (the existing live row, not a second order)");

    // 2. Pay the order twice (as after a lease takeover re-ran the handler), then cancel it.
    println!("== 2. state machine: pay twice, then try to cancel a paid order");
    let order_id = a.into_inner().0;
    let m = machine();
    let mut conn = pool.acquire().await?;
    for attempt in 1..=2 {
        let applied = m
            .apply_pg(&mut conn, ORDERS, "id", "state", order_id, "paid")
            .await?;
        let what = match applied {
            Applied::Moved => "charged: pending -> paid",
            _ => "already paid: no second charge",
        };
        println!("  pay attempt {attempt}: {what}");
    }
    match m
        .apply_pg(&mut conn, ORDERS, "id", "state", order_id, "cancelled")
        .await
    {
        Err(TransitionError::Illegal { from, to }) => {
            println!("  cancel refused: {from} -> {to} is not allowed")
        }
        other => println!("  cancel: {other:?}"),
    }
    drop(conn);

    // Same-database mode: the claim, the order row and the completion commit together.
    println!("== same-database mode: claim + order + completion in one transaction");
    let req = ClaimRequest {
        key: ScopedKey::new(
            Scope::new("orders.create")?.with_principal("user-8"),
            Key::new(format!("tx-{run}"))?,
        ),
        fingerprint: Fingerprint::of_bytes(1, b"{\"sku\":\"cake\"}"),
        owner: OwnerId::random(),
        lease: engine.policy().lease(),
        ttl: engine.policy().record_ttl(),
        takeover: TakeoverPolicy::Reexecute,
        request_id: None,
    };
    for attempt in 1..=2 {
        let req = ClaimRequest {
            owner: OwnerId::random(),
            ..req.clone()
        };
        let outcome = store
            .run_in_tx(&req, |tx| {
                async move {
                    let id: i64 = sqlx::query_scalar(
                        "INSERT INTO demo_orders (user_id, idem_key, amount) VALUES (8, 'cake', 300) RETURNING id",
                    )
                    .fetch_one(&mut *tx)
                    .await?;
                    Ok::<_, sqlx::Error>((id, StoredResponse::new(201, format!("{{\"order\":{id}}}"))))
                }
                .boxed()
            })
            .await?;
        match outcome {
            TxOutcome::Executed(id) => {
                println!("  attempt {attempt}: created order {id} and its record in one commit")
            }
            TxOutcome::Replayed(r) => println!(
                "  attempt {attempt}: replayed {}",
                String::from_utf8_lossy(&r.body)
            ),
            other => println!("  attempt {attempt}: {other:?}"),
        }
    }
    let orders: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ORDERS}"))
        .fetch_one(&pool)
        .await?;
    println!("== {orders} orders in the table (one per logical request)");
    Ok(())
}
