//! One key from the HTTP request to the message consumer.
//!
//! ```text
//! orders-outbox service    # POST /orders/{id}/pay with Idempotency-Key: charge + enqueue, one transaction
//! orders-outbox dispatch   # publish the outbox to RabbitMQ (any number of instances)
//! orders-outbox consume    # ship each paid order once (inbox in the same transaction)
//! orders-outbox report     # what each table holds
//! ```
//!
//! - **service**: axum with idem-http's layer in same-transaction mode
//!   (`IdempotencyLayer::in_transaction`): the layer claims the key in a PostgreSQL
//!   transaction, the handler inserts the charge and enqueues an `order-paid` message whose
//!   id is derived from the key on that transaction, and the layer completes the key in it
//!   and commits. A crash before the commit leaves nothing; after it, the retry is a replay
//!   and the message is already in the outbox.
//! - **dispatch**: idem-mq's dispatcher claims pending rows under a lease, publishes them
//!   with publisher confirms and `message-id`, and marks them sent. Killed between the
//!   publish and the mark, its rows go out again after the lease, under the same ids.
//! - **consume**: an idem-mq consumer whose inbox record and shipment row commit together;
//!   the message is acknowledged after the commit, and a redelivery is skipped.
//!
//! Settings come from the environment: `DATABASE_URL`, `AMQP_URL`, `PREFIX` (names the
//! tables and the queue, default `orders`), `LISTEN` (default `127.0.0.1:3400`), `LEASE_MS`
//! (the dispatcher's lease, default 30000). For the crash tests, `KILL_AT` names a point
//! (`service:after-commit`, `dispatcher:after-publish`, `consumer:after-commit`) where the
//! process prints `KILL-POINT` and stops making progress until it is killed, `PLAIN=1`
//! runs the consumer without its inbox, to show what the inbox prevents, and `DIRECT=1` runs
//! the service without the outbox (it publishes after its commit), to show what the outbox
//! prevents.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::extract::{Extension, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use idem_core::outbox::OutboxMessage;
use idem_core::{Engine, Kept, Key, Outcome, Policy, Scope, ScopedKey, SharedTx};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use idem_mq::outbox::{Dispatcher, DispatcherConfig, Publish, RabbitOutbox};
use idem_mq::rabbitmq::{RabbitConsumer, RabbitPublisher};
use idem_mq::{ConsumerConfig, HandlerError, InTx, Job, Message, Processor, RunResult, Work};
use idem_sql::{PgStore, SqlOutbox};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sqlx::{PgPool, Postgres, Transaction};

/// The line a process prints at its `KILL_AT` point.
const KILL_POINT: &str = "KILL-POINT";

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// Whether `KILL_AT` names `point`.
fn kill_at(point: &str) -> bool {
    std::env::var("KILL_AT").is_ok_and(|p| p == point)
}

/// Reports the kill point and never returns.
async fn hang_here<T>() -> T {
    println!("{KILL_POINT}");
    futures::future::pending().await
}

/// The tables and the queue of one deployment.
#[derive(Debug, Clone)]
struct Names {
    prefix: String,
}

impl Names {
    fn table(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix)
    }
    fn queue(&self) -> String {
        format!("{}.paid", self.prefix)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(env("RUST_LOG", "warn,lapin=off"))
        .init();
    let role = std::env::args().nth(1).unwrap_or_default();
    let names = Names {
        prefix: env("PREFIX", "orders"),
    };
    let pool = PgPool::connect(&env(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ))
    .await
    .context("cannot connect to PostgreSQL")?;
    migrate(&pool, &names).await?;
    match role.as_str() {
        "service" => service(pool, names).await,
        "dispatch" => dispatch(pool, names).await,
        "consume" => consume(pool, names).await,
        "report" => report(&pool, &names).await,
        _ => bail!("usage: orders-outbox service | dispatch | consume | report"),
    }
}

async fn migrate(pool: &PgPool, names: &Names) -> anyhow::Result<()> {
    PgStore::with_table(pool.clone(), &names.table("records"))?
        .migrate()
        .await?;
    PgStore::with_table(pool.clone(), &names.table("inbox"))?
        .migrate()
        .await?;
    SqlOutbox::with_table(pool.clone(), &names.table("outbox"))?
        .migrate()
        .await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {c} (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, amount BIGINT NOT NULL);
         CREATE TABLE IF NOT EXISTS {s} (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, message_id TEXT NOT NULL)",
        c = names.table("charges"),
        s = names.table("shipments"),
    ))
    .execute(pool)
    .await?;
    Ok(())
}

async fn amqp() -> anyhow::Result<Connection> {
    Connection::connect(
        &env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        ConnectionProperties::default(),
    )
    .await
    .context("cannot connect to RabbitMQ")
}

// ---- The HTTP service.

struct App {
    outbox: SqlOutbox<Postgres>,
    names: Names,
    /// `DIRECT=1`: no outbox; the service publishes the event itself after the commit.
    direct: Option<RabbitPublisher>,
}

/// The event of a payment that committed, for the service that publishes it itself.
#[derive(Clone)]
struct Paid {
    order: String,
    event: String,
}

type Tx = Transaction<'static, Postgres>;

async fn service(pool: PgPool, names: Names) -> anyhow::Result<()> {
    let engine = Engine::new(
        PgStore::with_table(pool.clone(), &names.table("records"))?,
        Policy::default(),
    );
    // Same-transaction mode: the layer claims the key in a transaction, the handler charges
    // and enqueues on it, and the layer completes the key in it and commits.
    let idempotency =
        IdempotencyLayer::new(&engine, IdempotencyConfig::new("orders.pay")?).in_transaction();
    let direct = match std::env::var_os("DIRECT") {
        Some(_) => {
            let publisher = RabbitPublisher::new(&amqp().await?).await?;
            declare(&publisher, &names).await?;
            Some(publisher)
        }
        None => None,
    };
    let app = Arc::new(App {
        outbox: SqlOutbox::with_table(pool, &names.table("outbox"))?,
        names,
        direct,
    });
    let router = axum::Router::new()
        .route(
            "/orders/{id}/pay",
            axum::routing::post(pay).layer(idempotency),
        )
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            after_commit,
        ))
        .with_state(app);
    let listen = env("LISTEN", "127.0.0.1:3400");
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

/// Runs once a payment has committed (the layer commits before it answers): at the kill
/// point `service:after-commit` the process stops there, so the client never hears back;
/// under `DIRECT=1` the service publishes the event itself now, which such a stop loses.
async fn after_commit(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let committed = res.extensions().get::<Outcome>() == Some(&Outcome::Executed(Kept::Stored));
    if !committed {
        return res;
    }
    if kill_at("service:after-commit") {
        return hang_here().await;
    }
    if let (Some(publisher), Some(paid)) = (&app.direct, res.extensions().get::<Paid>()) {
        let id = Key::new(format!("{}:paid", paid.order));
        let sent = match id {
            Ok(id) => publisher
                .publish(
                    "",
                    &app.names.queue(),
                    &id,
                    paid.event.as_bytes(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            // Committed but not published: without an outbox, nothing sends it later.
            eprintln!("order {}: event not published: {e}", paid.order);
        }
    }
    res
}

/// Charges `order` and enqueues its `order-paid` message on the transaction the layer
/// claimed the key in: both commit with the key's completion, or neither does.
async fn pay(
    State(app): State<Arc<App>>,
    Path(order): Path<String>,
    Extension(tx): Extension<SharedTx<Tx>>,
    Extension(key): Extension<ScopedKey>,
    body: Bytes,
) -> Response {
    let amount = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["amount"].as_i64());
    let Some(amount) = amount else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "body must be {\"amount\": N}\n",
        )
            .into_response();
    };
    let Some(mut tx) = tx.lock().await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "transaction ended\n").into_response();
    };
    match charge(&app, &mut tx, &key, &order, amount).await {
        Ok(event) => {
            let mut res = (
                StatusCode::CREATED,
                format!("{{\"order\":\"{order}\",\"paid\":{amount}}}\n"),
            )
                .into_response();
            res.extensions_mut().insert(Paid { order, event });
            res
        }
        // A 5xx is not kept: the layer rolls the charge back with the claim.
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

async fn charge(
    app: &App,
    tx: &mut Tx,
    key: &ScopedKey,
    order: &str,
    amount: i64,
) -> anyhow::Result<String> {
    sqlx::query(&format!(
        "INSERT INTO {} (order_id, amount) VALUES ($1, $2)",
        app.names.table("charges")
    ))
    .bind(order)
    .bind(amount)
    .execute(&mut **tx)
    .await?;
    let event =
        serde_json::json!({"type": "order-paid", "order_id": order, "amount": amount}).to_string();
    if app.direct.is_none() {
        let message = OutboxMessage::for_key(key, "paid", app.names.queue(), event.clone())?
            .aggregate(order)
            .header("content-type", "application/json");
        app.outbox.enqueue(tx, &message).await?;
    }
    Ok(event)
}

// ---- The dispatcher.

/// Publishes, then (at the kill point) stops before the dispatcher can mark anything sent.
struct KillAfterPublish<P>(P);

impl<P: Publish> Publish for KillAfterPublish<P> {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), String> {
        self.0.publish(message).await?;
        hang_here().await
    }
}

async fn declare(publisher: &RabbitPublisher, names: &Names) -> anyhow::Result<()> {
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for q in [names.queue(), format!("{}.dead", names.queue())] {
        publisher
            .channel()
            .queue_declare(q.as_str().into(), durable, FieldTable::default())
            .await?;
    }
    Ok(())
}

async fn dispatch(pool: PgPool, names: Names) -> anyhow::Result<()> {
    let outbox = SqlOutbox::with_table(pool, &names.table("outbox"))?;
    let conn = amqp().await?;
    let publisher = RabbitPublisher::new(&conn).await?;
    declare(&publisher, &names).await?;
    let lease_ms: u64 = env("LEASE_MS", "30000").parse().context("LEASE_MS")?;
    let config = DispatcherConfig {
        lease: Duration::from_millis(lease_ms),
        publish_timeout: Duration::from_millis(lease_ms / 2),
        idle: Duration::from_millis(100),
        ..DispatcherConfig::default()
    };
    let rabbit = RabbitOutbox::new(publisher, "");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    println!("dispatching to {}", names.queue());
    if kill_at("dispatcher:after-publish") {
        Dispatcher::new(outbox, KillAfterPublish(rabbit), config)
            .run(shutdown)
            .await;
    } else {
        Dispatcher::new(outbox, rabbit, config).run(shutdown).await;
    }
    Ok(())
}

// ---- The consumer.

/// Ships the order on the inbox's transaction.
fn ship<'c>(
    table: &'c str,
    tx: &'c mut Tx,
    message: &'c Message,
) -> BoxFuture<'c, Result<(), HandlerError>> {
    Box::pin(async move {
        let event = message
            .json()
            .ok_or_else(|| HandlerError::Permanent("payload is not JSON".into()))?;
        let order = event["order_id"]
            .as_str()
            .ok_or_else(|| HandlerError::Permanent("no order_id".into()))?
            .to_owned();
        let id = message
            .headers()
            .iter()
            .find(|(name, _)| name == "message-id")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        sqlx::query(&format!(
            "INSERT INTO {table} (order_id, message_id) VALUES ($1, $2)"
        ))
        .bind(order)
        .bind(id)
        .execute(&mut **tx)
        .await
        .map_err(|e| HandlerError::Retry(e.to_string()))?;
        Ok(())
    })
}

/// Runs the inner work (the shipment and its commit), then stops before the ack.
struct KillAfterCommit<W>(W);

impl<W: Work<PgStore>> Work<PgStore> for KillAfterCommit<W> {
    async fn run(&self, engine: &Engine<PgStore>, job: &Job<'_>) -> RunResult {
        let _ = self.0.run(engine, job).await;
        hang_here().await
    }
}

async fn consume(pool: PgPool, names: Names) -> anyhow::Result<()> {
    let conn = amqp().await?;
    declare(&RabbitPublisher::new(&conn).await?, &names).await?;
    let engine = Engine::new(
        PgStore::with_table(pool.clone(), &names.table("inbox"))?,
        Policy::default(),
    );
    let shipments: Arc<str> = names.table("shipments").into();
    let in_tx = {
        let shipments = Arc::clone(&shipments);
        InTx::new(
            move |tx: &mut Tx, m: &Message| -> BoxFuture<'_, Result<(), HandlerError>> {
                let shipments = Arc::clone(&shipments);
                Box::pin(async move { ship(&shipments, tx, m).await })
            },
        )
    };
    let scope = Scope::new("orders.ship")?;
    let keys = idem_mq::rabbitmq::default_keys();
    let config = ConsumerConfig::default();
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    println!("consuming {}", names.queue());
    if std::env::var_os("PLAIN").is_some() {
        return consume_plain(&conn, &pool, &names, &shipments).await;
    }
    if kill_at("consumer:after-commit") {
        let processor = Processor::new(engine, scope, keys, config, KillAfterCommit(in_tx));
        RabbitConsumer::new(processor, names.queue())
            .run(&conn, shutdown)
            .await?;
    } else {
        let processor = Processor::new(engine, scope, keys, config, in_tx);
        RabbitConsumer::new(processor, names.queue())
            .run(&conn, shutdown)
            .await?;
    }
    Ok(())
}

/// Without the inbox: every delivery ships, then is acknowledged (what idem's consumer
/// prevents: a redelivery or a republished copy ships again).
async fn consume_plain(
    conn: &Connection,
    pool: &PgPool,
    names: &Names,
    shipments: &str,
) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    let channel = conn.create_channel().await?;
    let mut deliveries = channel
        .basic_consume(
            names.queue().as_str().into(),
            "plain".into(),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default();
        let message = Message::new(
            vec![("message-id".to_owned(), Bytes::from(id))],
            delivery.data.clone(),
            1,
        );
        let mut tx = pool.begin().await?;
        ship(shipments, &mut tx, &message)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tx.commit().await?;
        delivery
            .ack(lapin::options::BasicAckOptions::default())
            .await?;
    }
    Ok(())
}

// ---- Reporting.

async fn report(pool: &PgPool, names: &Names) -> anyhow::Result<()> {
    let count = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&pool)
                .await
                .context("count")
        }
    };
    let charges = count(format!("SELECT count(*) FROM {}", names.table("charges"))).await?;
    let shipments = count(format!("SELECT count(*) FROM {}", names.table("shipments"))).await?;
    let shipped = count(format!(
        "SELECT count(DISTINCT order_id) FROM {}",
        names.table("shipments")
    ))
    .await?;
    let unsent = count(format!(
        "SELECT count(*) FROM {} WHERE sent_at IS NULL",
        names.table("outbox")
    ))
    .await?;
    println!(
        "{}",
        serde_json::json!({"charges": charges, "shipments": shipments, "orders_shipped": shipped, "unsent": unsent})
    );
    Ok(())
}
