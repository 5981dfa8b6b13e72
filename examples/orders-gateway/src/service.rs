//! The orders service the gateway protects: pays an order on PostgreSQL, guarding the effect
//! with the lines of defence that belong to the service itself.
//!
//! `POST /orders/{id}/pay` (headers `Idempotency-Key` and `Idempotency-Fence`, both set by the
//! gateway) runs one transaction:
//!
//! 1. **Fenced write**: the key's row in `<p>_attempts` takes the request's fence only if it is
//!    newer than the one stored; otherwise the request is a stale attempt (one the gateway
//!    gave up on, arriving late) and is refused, `409 stale-fence`.
//! 2. **Unique key**: a payment already made under this key is answered again (`201`), never
//!    made twice (`UNIQUE (idem_key)`).
//! 3. **State machine**: the order moves `pending → paid` once; paying a paid order under
//!    another key is refused, `409 already-paid`.
//!
//! `GET /payments/status?key=…` is the gateway's status webhook: the payment made under the
//! key (`complete`), or `release` when there is none.
//!
//! [`Guards::None`] is the same service without any of the three: what a re-executed request
//! does to a service that trusts the gateway alone.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use sqlx::{PgPool, Row};

/// Which lines of defence the service keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guards {
    /// Fenced write, unique key, state machine.
    All,
    /// None: every request that reaches it pays.
    None,
}

/// What became of one pay request at the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Paid now.
    Paid,
    /// The key had paid already; answered with that payment.
    AlreadyPaidUnderKey,
    /// Refused by the fenced write: an older attempt than one already seen.
    StaleFence,
    /// Refused by the state machine: the order is not pending.
    AlreadyPaid,
}

/// One pay request as the service saw it.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The order.
    pub order: i64,
    /// `Idempotency-Key`.
    pub key: String,
    /// `Idempotency-Fence`.
    pub fence: i64,
    /// What became of it.
    pub verdict: Verdict,
}

/// The service's state: its tables and what it saw.
#[derive(Clone)]
#[allow(missing_debug_implementations)]
pub struct Orders {
    pool: PgPool,
    prefix: String,
    guards: Guards,
    /// Orders whose next pay request is slow (it writes after 1.5 s).
    slow: Arc<Mutex<HashSet<i64>>>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl Orders {
    /// Creates the service's tables, named `<prefix>_…`, with orders `1..=orders` pending.
    ///
    /// # Errors
    /// The database failed.
    pub async fn create(
        pool: PgPool,
        prefix: &str,
        guards: Guards,
        orders: i64,
    ) -> anyhow::Result<Self> {
        let p = prefix;
        let unique = match guards {
            Guards::All => {
                format!("CREATE UNIQUE INDEX {p}_payments_key ON {p}_payments (idem_key);")
            }
            Guards::None => String::new(),
        };
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {p}_orders, {p}_payments, {p}_attempts;
             CREATE TABLE {p}_orders (id BIGINT PRIMARY KEY, state TEXT NOT NULL);
             CREATE TABLE {p}_payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL,
                 idem_key TEXT NOT NULL, fence BIGINT NOT NULL);
             {unique}
             CREATE TABLE {p}_attempts (idem_key TEXT PRIMARY KEY, fence BIGINT NOT NULL);
             INSERT INTO {p}_orders SELECT g, 'pending' FROM generate_series(1, {orders}) g;"
        ))
        .execute(&pool)
        .await?;
        Ok(Self {
            pool,
            prefix: prefix.to_owned(),
            guards,
            slow: Arc::default(),
            attempts: Arc::default(),
        })
    }

    /// Drops the service's tables.
    ///
    /// # Errors
    /// The database failed.
    pub async fn drop_tables(&self) -> anyhow::Result<()> {
        let p = &self.prefix;
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {p}_orders, {p}_payments, {p}_attempts"
        ))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The router: the pay endpoint and the status webhook.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/orders/{id}/pay", post(pay))
            .route("/payments/status", get(status))
            .with_state(self.clone())
    }

    /// Makes the next pay request for `order` slow: it writes 1.5 s after it arrived.
    pub fn slow_next(&self, order: i64) {
        self.slow.lock().expect("lock").insert(order);
    }

    /// Every pay request the service saw, in order.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().expect("lock").clone()
    }

    /// How many payments `order` has.
    ///
    /// # Errors
    /// The database failed.
    pub async fn payments(&self, order: i64) -> anyhow::Result<i64> {
        let n = sqlx::query(&format!(
            "SELECT count(*) FROM {}_payments WHERE order_id = $1",
            self.prefix
        ))
        .bind(order)
        .fetch_one(&self.pool)
        .await?
        .try_get::<i64, _>(0)?;
        Ok(n)
    }

    /// One pay request's effect, in one transaction.
    async fn charge(&self, order: i64, key: &str, fence: i64) -> anyhow::Result<Verdict> {
        let p = &self.prefix;
        let mut tx = self.pool.begin().await?;
        if self.guards == Guards::All {
            // 1. The fenced write: only an attempt newer than any seen for the key goes on.
            let newer = sqlx::query(&format!(
                "INSERT INTO {p}_attempts (idem_key, fence) VALUES ($1, $2)
                 ON CONFLICT (idem_key) DO UPDATE SET fence = excluded.fence
                 WHERE {p}_attempts.fence < excluded.fence"
            ))
            .bind(key)
            .bind(fence)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if newer == 0 {
                return Ok(Verdict::StaleFence);
            }
            // 2. The key's payment, if it was made already.
            let made = sqlx::query(&format!("SELECT 1 FROM {p}_payments WHERE idem_key = $1"))
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
            if made.is_some() {
                tx.commit().await?;
                return Ok(Verdict::AlreadyPaidUnderKey);
            }
            // 3. The state machine: pending → paid, once.
            let moved = sqlx::query(&format!(
                "UPDATE {p}_orders SET state = 'paid' WHERE id = $1 AND state = 'pending'"
            ))
            .bind(order)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if moved == 0 {
                return Ok(Verdict::AlreadyPaid);
            }
        }
        sqlx::query(&format!(
            "INSERT INTO {p}_payments (order_id, idem_key, fence) VALUES ($1, $2, $3)"
        ))
        .bind(order)
        .bind(key)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Verdict::Paid)
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn pay(State(orders): State<Orders>, Path(order): Path<i64>, headers: HeaderMap) -> Response {
    let (Some(key), Some(fence)) = (
        header(&headers, "idempotency-key").map(str::to_owned),
        header(&headers, "idempotency-fence").and_then(|f| f.parse::<i64>().ok()),
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            "Idempotency-Key and Idempotency-Fence are required",
        )
            .into_response();
    };
    let slow = orders.slow.lock().expect("lock").remove(&order);
    // The work is spawned: a request the gateway gave up on (its connection closed) still
    // reaches the database, as it would behind a queue or a slow connection pool.
    let work = {
        let orders = orders.clone();
        let key = key.clone();
        tokio::spawn(async move {
            if slow {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            let verdict = orders.charge(order, &key, fence).await;
            if let Ok(verdict) = &verdict {
                orders.attempts.lock().expect("lock").push(Attempt {
                    order,
                    key,
                    fence,
                    verdict: verdict.clone(),
                });
            }
            verdict
        })
    };
    match work.await {
        Ok(Ok(Verdict::Paid | Verdict::AlreadyPaidUnderKey)) => (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            json!({"order": order, "state": "paid", "key": key}).to_string(),
        )
            .into_response(),
        Ok(Ok(Verdict::StaleFence)) => (
            StatusCode::CONFLICT,
            "stale-fence: a newer attempt of this key ran",
        )
            .into_response(),
        Ok(Ok(Verdict::AlreadyPaid)) => (
            StatusCode::CONFLICT,
            "already-paid: the order is not pending",
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")).into_response(),
    }
}

#[derive(Deserialize)]
struct StatusQuery {
    key: String,
}

/// The status webhook: what became of a key's payment.
async fn status(State(orders): State<Orders>, Query(q): Query<StatusQuery>) -> Response {
    let p = &orders.prefix;
    let found = sqlx::query(&format!(
        "SELECT order_id FROM {p}_payments WHERE idem_key = $1 LIMIT 1"
    ))
    .bind(&q.key)
    .fetch_optional(&orders.pool)
    .await;
    let answer = match found {
        Ok(Some(row)) => {
            let order: i64 = row.try_get(0).unwrap_or_default();
            json!({
                "outcome": "complete",
                "status": 201,
                "headers": {"content-type": "application/json"},
                "body": json!({"order": order, "state": "paid", "key": q.key}).to_string(),
            })
        }
        Ok(None) => json!({"outcome": "release"}),
        Err(_) => json!({"outcome": "unknown"}),
    };
    ([("content-type", "application/json")], answer.to_string()).into_response()
}
