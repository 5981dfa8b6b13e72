//! `idem outbox`: the outbox dispatcher as a service, for applications in any language that
//! write the documented outbox table in their own transactions (`docs/outbox.md`).
//!
//! It reads the `[outbox]` table of its configuration file, opens the database (PostgreSQL,
//! MariaDB/MySQL or SQLite), creates the table if asked, and runs idem-mq's dispatcher to
//! RabbitMQ (publisher confirms, `message-id`) or JetStream (`Nats-Msg-Id`) until SIGINT or
//! SIGTERM. Any number of instances may run against one table.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use figment::Figment;
use figment::providers::{Format as _, Toml};
use idem_core::outbox::OutboxStore;
use idem_mq::outbox::{Dispatcher, DispatcherConfig, NatsOutbox, Publish, RabbitOutbox};
use idem_sql::{OutboxDialect, SqlOutbox};
use serde::Deserialize;

use crate::store::redact;

/// `[outbox]` as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutbox {
    database: String,
    broker: String,
    #[serde(default = "default_table")]
    table: String,
    #[serde(default)]
    exchange: String,
    #[serde(default)]
    migrate: bool,
    batch: Option<u32>,
    lease: Option<String>,
    publish_timeout: Option<String>,
    idle: Option<String>,
    backoff: Option<String>,
    max_backoff: Option<String>,
    max_attempts: Option<u32>,
    retention: Option<String>,
    purge_every: Option<String>,
}

fn default_table() -> String {
    idem_sql::DEFAULT_OUTBOX_TABLE.to_owned()
}

#[derive(Debug, Deserialize)]
struct File {
    outbox: RawOutbox,
}

/// Where the dispatcher publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broker {
    /// RabbitMQ at this `amqp://` URL, through this exchange (`""`: the default exchange).
    Rabbit {
        /// The broker's URL.
        url: String,
        /// The exchange.
        exchange: String,
    },
    /// JetStream at this `nats://` URL; each message's destination is its subject.
    Nats {
        /// The server's URL.
        url: String,
    },
}

/// A compiled `[outbox]`.
#[derive(Clone)]
pub struct OutboxSettings {
    /// `postgres://…`, `mysql://…` or `sqlite:PATH`.
    pub database: String,
    /// The outbox table.
    pub table: String,
    /// Where messages go.
    pub broker: Broker,
    /// Whether to create the table if missing.
    pub migrate: bool,
    /// The dispatcher's knobs.
    pub dispatch: DispatcherConfig,
}

impl fmt::Debug for OutboxSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Prints what the dispatcher will do, with every credential hidden.
impl fmt::Display for OutboxSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.dispatch;
        writeln!(
            f,
            "database:  {} (table {}{})",
            redact(&self.database),
            self.table,
            if self.migrate {
                ", created if missing"
            } else {
                ""
            }
        )?;
        match &self.broker {
            Broker::Rabbit { url, exchange } => writeln!(
                f,
                "broker:    {} (RabbitMQ, exchange {:?}, publisher confirms)",
                redact(url),
                exchange
            )?,
            Broker::Nats { url } => writeln!(f, "broker:    {} (JetStream)", redact(url))?,
        }
        writeln!(
            f,
            "dispatch:  batches of {}, lease {:?}, publish timeout {:?}, idle {:?}",
            d.batch, d.lease, d.publish_timeout, d.idle
        )?;
        writeln!(
            f,
            "retry:     backoff {:?} doubling to {:?}; parked after {} attempts",
            d.backoff, d.max_backoff, d.max_attempts
        )?;
        writeln!(
            f,
            "cleanup:   sent rows kept {:?}, purged every {:?}",
            d.retention, d.purge_every
        )
    }
}

fn duration(field: &str, value: Option<&str>, default: Duration) -> anyhow::Result<Duration> {
    match value {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text)
            .with_context(|| format!("outbox.{field} = {text:?} is not a duration like \"30s\"")),
    }
}

impl OutboxSettings {
    /// Reads the `[outbox]` table of `path`.
    ///
    /// # Errors
    /// The file cannot be read, has no `[outbox]`, or a value is wrong (named in the error).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let file: File = Figment::from(Toml::file_exact(path))
            .extract()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::compile(file.outbox)
    }

    fn compile(raw: RawOutbox) -> anyhow::Result<Self> {
        let base = DispatcherConfig::default();
        let dispatch = DispatcherConfig {
            batch: raw.batch.unwrap_or(base.batch),
            lease: duration("lease", raw.lease.as_deref(), base.lease)?,
            publish_timeout: duration(
                "publish_timeout",
                raw.publish_timeout.as_deref(),
                base.publish_timeout,
            )?,
            idle: duration("idle", raw.idle.as_deref(), base.idle)?,
            backoff: duration("backoff", raw.backoff.as_deref(), base.backoff)?,
            max_backoff: duration("max_backoff", raw.max_backoff.as_deref(), base.max_backoff)?,
            max_attempts: raw.max_attempts.unwrap_or(base.max_attempts),
            retention: duration("retention", raw.retention.as_deref(), base.retention)?,
            purge_every: duration("purge_every", raw.purge_every.as_deref(), base.purge_every)?,
        };
        if dispatch.batch == 0 || dispatch.max_attempts == 0 {
            bail!("outbox.batch and outbox.max_attempts must be at least 1");
        }
        // A lease shorter than a publish may wait would hand a batch to a second dispatcher
        // while the first still publishes it: duplicates the consumer must absorb, every time.
        if dispatch.lease <= dispatch.publish_timeout {
            bail!(
                "outbox.lease ({:?}) must be longer than outbox.publish_timeout ({:?})",
                dispatch.lease,
                dispatch.publish_timeout
            );
        }
        let broker = if raw.broker.starts_with("amqp://") || raw.broker.starts_with("amqps://") {
            Broker::Rabbit {
                url: raw.broker,
                exchange: raw.exchange,
            }
        } else if raw.broker.starts_with("nats://") || raw.broker.starts_with("tls://") {
            if !raw.exchange.is_empty() {
                bail!(
                    "outbox.exchange is for RabbitMQ; JetStream publishes to each message's subject"
                );
            }
            Broker::Nats { url: raw.broker }
        } else {
            bail!(
                "outbox.broker `{}` is neither amqp:// (RabbitMQ) nor nats:// (JetStream)",
                redact(&raw.broker)
            );
        };
        if ![
            "postgres://",
            "postgresql://",
            "mysql://",
            "mariadb://",
            "sqlite:",
        ]
        .iter()
        .any(|s| raw.database.starts_with(s))
        {
            bail!(
                "outbox.database `{}` is not postgres://, mysql:// or sqlite:PATH",
                redact(&raw.database)
            );
        }
        idem_sql::TableName::new(&raw.table).map_err(|e| anyhow::anyhow!("outbox.table: {e}"))?;
        Ok(Self {
            database: raw.database,
            table: raw.table,
            broker,
            migrate: raw.migrate,
            dispatch,
        })
    }
}

/// Runs the dispatcher until SIGINT or SIGTERM (then the round in progress finishes).
///
/// # Errors
/// The database or the broker cannot be reached, or the table cannot be created.
pub async fn run(settings: OutboxSettings) -> anyhow::Result<()> {
    let url = settings.database.clone();
    let hidden = redact(&url);
    if url.starts_with("sqlite:") {
        let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::SqlitePool::connect_with(options)
            .await
            .with_context(|| format!("cannot open {hidden}"))?;
        with_outbox(&settings, pool).await
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let pool = sqlx::MySqlPool::connect(&url)
            .await
            .with_context(|| format!("cannot connect to {hidden}"))?;
        with_outbox(&settings, pool).await
    } else {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .with_context(|| format!("cannot connect to {hidden}"))?;
        with_outbox(&settings, pool).await
    }
}

async fn with_outbox<D: OutboxDialect>(
    settings: &OutboxSettings,
    pool: sqlx::Pool<D>,
) -> anyhow::Result<()> {
    let outbox = SqlOutbox::with_table(pool, &settings.table)?;
    if settings.migrate {
        outbox
            .migrate()
            .await
            .context("cannot create the outbox table")?;
    }
    let dispatch = settings.dispatch.clone();
    match &settings.broker {
        Broker::Rabbit { url, exchange } => {
            let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
                .await
                .with_context(|| format!("cannot connect to {}", redact(url)))?;
            let publisher = idem_mq::rabbitmq::RabbitPublisher::new(&conn).await?;
            drive(Dispatcher::new(
                outbox,
                RabbitOutbox::new(publisher, exchange.clone()),
                dispatch,
            ))
            .await;
        }
        Broker::Nats { url } => {
            let client = async_nats::connect(url)
                .await
                .with_context(|| format!("cannot connect to {}", redact(url)))?;
            let publisher = idem_mq::nats::NatsPublisher::new(async_nats::jetstream::new(client));
            drive(Dispatcher::new(
                outbox,
                NatsOutbox::new(publisher),
                dispatch,
            ))
            .await;
        }
    }
    Ok(())
}

async fn drive<O: OutboxStore, P: Publish>(dispatcher: Dispatcher<O, P>) {
    tracing::info!("outbox dispatcher running");
    dispatcher.run(crate::server::shutdown_signal()).await;
    let stats = dispatcher.stats();
    let get = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        published = get(&stats.published),
        retried = get(&stats.retried),
        parked = get(&stats.parked),
        "outbox dispatcher stopped"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(broker: &str) -> RawOutbox {
        RawOutbox {
            database: "postgres://app:secret@db/orders".into(),
            broker: broker.into(),
            table: default_table(),
            exchange: String::new(),
            migrate: false,
            batch: None,
            lease: None,
            publish_timeout: None,
            idle: None,
            backoff: None,
            max_backoff: None,
            max_attempts: None,
            retention: None,
            purge_every: None,
        }
    }

    #[test]
    fn defaults_compile_and_print_without_credentials() {
        let s = OutboxSettings::compile(raw("amqp://guest:hunter2@mq:5672/%2f")).expect("valid");
        let shown = s.to_string();
        assert!(
            !shown.contains("secret") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(shown.contains("RabbitMQ"), "{shown}");
        assert_eq!(s.dispatch.batch, DispatcherConfig::default().batch);
    }

    #[test]
    fn bad_values_are_named() {
        let mut r = raw("nats://mq:4222");
        r.lease = Some("5s".into());
        let e = OutboxSettings::compile(r).expect_err("lease below publish timeout");
        assert!(e.to_string().contains("outbox.lease"), "{e}");
        let mut r = raw("nats://mq:4222");
        r.idle = Some("soon".into());
        let e = OutboxSettings::compile(r).expect_err("bad duration");
        assert!(e.to_string().contains("outbox.idle"), "{e}");
        let e = OutboxSettings::compile(raw("kafka://x")).expect_err("unknown broker");
        assert!(e.to_string().contains("neither amqp"), "{e}");
        let mut r = raw("nats://mq:4222");
        r.exchange = "orders".into();
        assert!(OutboxSettings::compile(r).is_err(), "exchange on JetStream");
        let mut r = raw("nats://mq:4222");
        r.table = "x; drop".into();
        assert!(OutboxSettings::compile(r).is_err(), "table name");
    }
}
