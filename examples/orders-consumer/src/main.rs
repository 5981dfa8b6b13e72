//! An `order-paid` message credits a PostgreSQL ledger once.
//!
//! ```text
//! cargo run -p orders-consumer -- publish order-42 100 --times 3   # the same message 3 times
//! cargo run -p orders-consumer -- consume                           # credits once, skips 2
//! cargo run -p orders-consumer -- ledger
//! ```
//!
//! Same-transaction mode: the inbox record (idem's claim and completion) and the ledger row
//! commit in one PostgreSQL transaction, and the message is acknowledged after the commit. A
//! crash before the commit leaves neither; after it, the redelivery is skipped.

use anyhow::{Context as _, bail};
use futures::future::BoxFuture;
use idem_core::key_source::KeySources;
use idem_core::{Engine, Key, Policy, Scope};
use idem_mq::rabbitmq::{RabbitConsumer, RabbitPublisher};
use idem_mq::{ConsumerConfig, HandlerError, InTx, Message, Processor, Stats};
use idem_sql::PgStore;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sqlx::{PgPool, Postgres, Transaction};

const QUEUE: &str = "orders.paid";

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(env("RUST_LOG", "warn,lapin=off"))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let amqp = env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let pg = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    let conn = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .context("cannot connect to RabbitMQ")?;
    let pool = PgPool::connect(&pg)
        .await
        .context("cannot connect to PostgreSQL")?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders_ledger (
             id BIGSERIAL PRIMARY KEY,
             order_id TEXT NOT NULL,
             amount BIGINT NOT NULL,
             credited_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&pool)
    .await?;
    let store = PgStore::with_table(pool.clone(), "orders_inbox")?;
    store.migrate().await?;

    match args.first().map(String::as_str) {
        Some("publish") => {
            let (Some(order), Some(amount)) = (args.get(1), args.get(2)) else {
                bail!("usage: publish ORDER_ID AMOUNT [--times N]");
            };
            let amount: i64 = amount.parse().context("AMOUNT must be a whole number")?;
            let times: usize = match args.get(3).map(String::as_str) {
                Some("--times") => args.get(4).context("--times N")?.parse()?,
                _ => 1,
            };
            let publisher = RabbitPublisher::new(&conn).await?;
            declare(&publisher).await?;
            let payload =
                serde_json::json!({"type": "order-paid", "order_id": order, "amount": amount});
            // One key per logical event, reused on every publish of it.
            let key = Key::new(format!("order-paid:{order}"))?;
            for _ in 0..times {
                publisher
                    .publish(
                        "",
                        QUEUE,
                        &key,
                        payload.to_string().as_bytes(),
                        FieldTable::default(),
                    )
                    .await?;
            }
            println!(
                "published {times} x {payload} with message id {}",
                key.as_str()
            );
        }
        Some("consume") => {
            let publisher = RabbitPublisher::new(&conn).await?;
            declare(&publisher).await?;
            let engine = Engine::new(store, Policy::default());
            let processor = Processor::new(
                engine,
                Scope::new("orders.order-paid")?,
                KeySources::parse(&["header:message-id"])?,
                ConsumerConfig::default(),
                InTx::new(credit),
            );
            let consumer = RabbitConsumer::new(processor, QUEUE);
            let stats = std::sync::Arc::clone(consumer.processor().stats());
            println!("consuming {QUEUE}; Ctrl-C to stop");
            consumer
                .run(&conn, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
            println!(
                "credited {}, skipped as duplicates {}, dead-lettered {}",
                Stats::get(&stats.executed),
                Stats::get(&stats.replayed),
                Stats::get(&stats.dead_lettered)
            );
        }
        Some("ledger") => {
            let rows: Vec<(String, i64)> =
                sqlx::query_as("SELECT order_id, amount FROM orders_ledger ORDER BY id")
                    .fetch_all(&pool)
                    .await?;
            for (order, amount) in &rows {
                println!("{order}\t{amount}");
            }
            println!("{} rows", rows.len());
        }
        _ => bail!("usage: orders-consumer publish ORDER_ID AMOUNT [--times N] | consume | ledger"),
    }
    Ok(())
}

async fn declare(publisher: &RabbitPublisher) -> anyhow::Result<()> {
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for q in [QUEUE, "orders.paid.dead"] {
        publisher
            .channel()
            .queue_declare(q.into(), durable, FieldTable::default())
            .await?;
    }
    Ok(())
}

/// Credits the ledger on the inbox's transaction: it commits with the inbox record or not at
/// all.
fn credit<'c>(
    tx: &'c mut Transaction<'static, Postgres>,
    message: &'c Message,
) -> BoxFuture<'c, Result<(), HandlerError>> {
    Box::pin(async move {
        let event = message
            .json()
            .ok_or_else(|| HandlerError::Permanent("payload is not JSON".into()))?;
        let order = event["order_id"]
            .as_str()
            .ok_or_else(|| HandlerError::Permanent("no order_id".into()))?;
        let amount = event["amount"]
            .as_i64()
            .ok_or_else(|| HandlerError::Permanent("no whole amount".into()))?;
        sqlx::query("INSERT INTO orders_ledger (order_id, amount) VALUES ($1, $2)")
            .bind(order)
            .bind(amount)
            .execute(&mut **tx)
            .await
            .map_err(|e| HandlerError::Retry(e.to_string()))?;
        println!("credited {order} with {amount}");
        Ok(())
    })
}
