//! The scenarios: a service and a gateway in front of it, and a client that retries as a
//! careful client does (the same key every time; on 409 in flight, 5xx and timeouts).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sqlx::PgPool;

use crate::service::{Guards, Orders};

/// The default database.
pub const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A service, its gateway, and a client.
#[allow(missing_debug_implementations)]
pub struct Rig {
    /// The orders service.
    pub orders: Orders,
    /// The gateway's address.
    pub gateway: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    pool: PgPool,
    table: String,
}

/// One answer the client got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// The body.
    pub body: String,
    /// Whether the gateway replayed it (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

impl Rig {
    /// Starts an orders service with `guards` and `orders` pending orders on `database_url`,
    /// and a gateway in front of it on the same database, with tables and a namespace of
    /// their own.
    ///
    /// # Errors
    /// The database or a listener failed.
    pub async fn start(database_url: &str, guards: Guards, orders: i64) -> anyhow::Result<Self> {
        let pool = PgPool::connect(database_url)
            .await
            .with_context(|| format!("connecting to {database_url}"))?;
        let tag = uuid::Uuid::now_v7().simple().to_string();
        let prefix = format!("demo_{}", &tag[tag.len() - 12..]);
        let orders = Orders::create(pool.clone(), &prefix, guards, orders).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let upstream = listener.local_addr()?;
        let router = orders.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let table = format!("{prefix}_idem");
        let gateway = crate::gateway::start(&crate::gateway::config(
            database_url,
            &table,
            &prefix,
            upstream,
        ))
        .await?;
        Ok(Self {
            orders,
            gateway,
            client: Client::builder(TokioExecutor::new()).build_http(),
            pool,
            table,
        })
    }

    /// One pay request through the gateway.
    ///
    /// # Errors
    /// The gateway could not be reached.
    pub async fn pay_once(&self, order: i64, key: &str) -> anyhow::Result<Reply> {
        let req = http::Request::post(format!("http://{}/orders/{order}/pay", self.gateway))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))?;
        let res = self.client.request(req).await?;
        let status = res.status().as_u16();
        let replayed = res.headers().get("idempotent-replayed").is_some();
        let body = res.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            replayed,
        })
    }

    /// Pays with `key` until the answer is final, retrying 409 in flight, 5xx and 504 with
    /// the same key; every answer seen, the final one last.
    ///
    /// # Errors
    /// The gateway could not be reached, or no final answer came within 30 tries.
    pub async fn pay(&self, order: i64, key: &str) -> anyhow::Result<Vec<Reply>> {
        let mut seen = Vec::new();
        for attempt in 0..30u32 {
            let reply = self.pay_once(order, key).await?;
            let again =
                reply.status >= 500 || (reply.status == 409 && reply.body.contains("in-flight"));
            seen.push(reply);
            if !again {
                return Ok(seen);
            }
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
        }
        anyhow::bail!("no final answer for {key}: {seen:?}")
    }

    /// Drops the service's and the gateway's tables.
    ///
    /// # Errors
    /// The database failed.
    pub async fn clean_up(&self) -> anyhow::Result<()> {
        self.orders.drop_tables().await?;
        let t = &self.table;
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_audit CASCADE"
        ))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// First line, the claim: `n` concurrent duplicates of one payment; every caller's final
/// answer.
///
/// # Errors
/// See [`Rig::pay`].
pub async fn duplicates(rig: &Rig, order: i64, key: &str, n: usize) -> anyhow::Result<Vec<Reply>> {
    let runs = (0..n).map(|_| rig.pay(order, key));
    let mut last = Vec::with_capacity(n);
    for seen in futures::future::join_all(runs).await {
        last.push(seen?.pop().context("an answer")?);
    }
    Ok(last)
}

/// Third line, the fence: the service is slow on the first attempt, the gateway times it out
/// (504) and, under `upstream_failure = "retry"`, lets the client's retry run it again with a
/// higher fence; the first attempt's write lands after that. Every answer the client saw,
/// once the late write has had its chance.
///
/// # Errors
/// See [`Rig::pay`].
pub async fn re_executed(rig: &Rig, order: i64, key: &str) -> anyhow::Result<Vec<Reply>> {
    rig.orders.slow_next(order);
    let seen = rig.pay(order, key).await?;
    // The first attempt writes 1.5 s after it arrived.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    Ok(seen)
}
