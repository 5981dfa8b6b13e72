//! The outbox dispatcher: publishes the messages a service enqueued in its transactions
//! ([`idem_core::outbox`]), with their message ids, and marks them sent.
//!
//! Each round claims a batch under a lease (rows other dispatchers hold are skipped), publishes
//! the batch at once and waits for every broker confirmation, marks the confirmed rows sent,
//! and gives the others back with backoff, parking a row after `max_attempts`. Between the
//! publish and the mark a crash leaves the row claimed; after the lease another dispatcher
//! publishes it again under the same id, which the broker (JetStream's duplicate window) or
//! the consumer's engine drops. So delivery is at least once and the effect, behind an idem
//! consumer, once.
//!
//! A batch holds at most one message per aggregate (the claim's rule), so publishing a batch
//! concurrently keeps each aggregate in order.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::OwnerId;
use idem_core::outbox::{Failure, OutboxMessage, OutboxStore, Pending};

/// A broker the dispatcher publishes to. Implemented for RabbitMQ (publisher confirms,
/// `message-id`) and JetStream (`Nats-Msg-Id`) behind their features.
pub trait Publish: Send + Sync + 'static {
    /// Publishes `message` under its id and returns once the broker confirmed it.
    ///
    /// # Errors
    /// Why it did not land, for the row's `last_error`; the dispatcher publishes it again
    /// later under the same id.
    fn publish(&self, message: &OutboxMessage) -> impl Future<Output = Result<(), String>> + Send;
}

/// How a dispatcher claims, publishes, retries and cleans up.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Messages claimed per round.
    pub batch: u32,
    /// How long a claimed batch is held. After it, another dispatcher may publish the rows
    /// again: keep it well above `publish_timeout`.
    pub lease: Duration,
    /// How long one publish may wait for the broker's confirmation.
    pub publish_timeout: Duration,
    /// Wait before the next claim when nothing was due.
    pub idle: Duration,
    /// Delay before a failed message is due again; doubled per attempt up to `max_backoff`.
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Attempts before a message is parked for an operator.
    pub max_attempts: u32,
    /// How long sent rows are kept before they are purged.
    pub retention: Duration,
    /// Time between purges.
    pub purge_every: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            batch: 100,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            idle: Duration::from_millis(200),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            max_attempts: 20,
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_every: Duration::from_secs(60),
        }
    }
}

impl DispatcherConfig {
    /// The delay after failed attempt `attempt` (1-based): `backoff · 2^(attempt-1)`, capped.
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        crate::config::doubling(self.backoff, self.max_backoff, attempt)
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Messages the broker confirmed.
    pub published: u64,
    /// Of those, marked sent (a row whose lease ran out and that another dispatcher claimed
    /// is not).
    pub marked: u64,
    /// Messages given back for a later attempt.
    pub retried: u64,
    /// Messages parked for an operator (too many attempts, or unreadable).
    pub parked: u64,
}

impl Round {
    /// Whether the round claimed anything.
    pub fn is_idle(&self) -> bool {
        self.published + self.retried + self.parked == 0
    }
}

/// Totals since the dispatcher started.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// Messages the broker confirmed.
    pub published: AtomicU64,
    /// Messages given back for a later attempt.
    pub retried: AtomicU64,
    /// Messages parked.
    pub parked: AtomicU64,
    /// Rounds that failed because the database did.
    pub store_errors: AtomicU64,
    /// Sent rows purged.
    pub purged: AtomicU64,
}

/// Publishes an outbox's pending messages; run as many as you like against one outbox.
#[derive(Debug)]
pub struct Dispatcher<O, P> {
    outbox: O,
    publisher: P,
    config: DispatcherConfig,
    stats: Arc<DispatchStats>,
}

impl<O: OutboxStore, P: Publish> Dispatcher<O, P> {
    /// A dispatcher from `outbox` to `publisher`.
    pub fn new(outbox: O, publisher: P, config: DispatcherConfig) -> Self {
        Self {
            outbox,
            publisher,
            config,
            stats: Arc::default(),
        }
    }

    /// The running totals (shared: read them while [`Dispatcher::run`] runs).
    pub fn stats(&self) -> Arc<DispatchStats> {
        Arc::clone(&self.stats)
    }

    /// Claims one batch, publishes it and reports back to the outbox.
    ///
    /// # Errors
    /// The database's error when the claim failed (nothing was published). A failure to
    /// mark rows after their publish is logged, not returned: the rows are published again
    /// after the lease, under the same ids.
    pub async fn round(&self) -> Result<Round, idem_core::StoreError> {
        let owner = OwnerId::random();
        let claimed = self
            .outbox
            .claim(owner, self.config.batch, self.config.lease)
            .await?;
        let mut round = Round {
            parked: claimed.unreadable.len() as u64,
            ..Round::default()
        };
        for bad in &claimed.unreadable {
            tracing::warn!(seq = bad.seq, reason = %bad.reason, "outbox row parked: unreadable");
        }
        let results = futures::future::join_all(
            claimed
                .pending
                .iter()
                .map(|pending| self.publish_one(pending)),
        )
        .await;
        let mut sent = Vec::with_capacity(results.len());
        for (pending, result) in claimed.pending.iter().zip(results) {
            match result {
                Ok(()) => sent.push(pending.seq),
                Err(reason) => {
                    let park = pending.attempts >= self.config.max_attempts;
                    let delay = self.config.backoff_after(pending.attempts);
                    tracing::warn!(
                        id = %pending.message.id, attempts = pending.attempts, park, %reason,
                        "outbox publish failed"
                    );
                    let failure = Failure {
                        owner,
                        seq: pending.seq,
                        delay,
                        park,
                        reason: &reason,
                    };
                    if let Err(e) = self.outbox.failed(&failure).await {
                        // The row is due again when its lease ends.
                        tracing::warn!(id = %pending.message.id, error = %e, "outbox give-back failed");
                    }
                    if park {
                        round.parked += 1;
                    } else {
                        round.retried += 1;
                    }
                }
            }
        }
        round.published = sent.len() as u64;
        match self.outbox.sent(owner, &sent).await {
            Ok(marked) => round.marked = marked,
            Err(e) => {
                tracing::warn!(rows = sent.len(), error = %e, "outbox rows published but not marked; they go out again under the same ids after the lease");
            }
        }
        self.stats
            .published
            .fetch_add(round.published, Ordering::Relaxed);
        self.stats
            .retried
            .fetch_add(round.retried, Ordering::Relaxed);
        self.stats.parked.fetch_add(round.parked, Ordering::Relaxed);
        Ok(round)
    }

    async fn publish_one(&self, pending: &Pending) -> Result<(), String> {
        match tokio::time::timeout(
            self.config.publish_timeout,
            self.publisher.publish(&pending.message),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no confirmation within {:?}",
                self.config.publish_timeout
            )),
        }
    }

    /// Deletes rows sent longer ago than the retention, a batch at a time.
    ///
    /// # Errors
    /// The database's error.
    pub async fn purge(&self) -> Result<u64, idem_core::StoreError> {
        let mut total = 0;
        loop {
            let n = self
                .outbox
                .purge(self.config.retention, self.config.batch.max(1000))
                .await?;
            total += n;
            if n < u64::from(self.config.batch.max(1000)) {
                break;
            }
        }
        self.stats.purged.fetch_add(total, Ordering::Relaxed);
        Ok(total)
    }

    /// Runs rounds until `shutdown` resolves: back to back while messages are due, every
    /// `idle` otherwise, purging every `purge_every`. A failing database is retried after
    /// `backoff`; the round in progress finishes before it stops.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut last_purge = tokio::time::Instant::now();
        loop {
            let wait = match self.round().await {
                Ok(round) if round.is_idle() => self.config.idle,
                Ok(_) => Duration::ZERO,
                Err(e) => {
                    self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "outbox claim failed");
                    self.config.backoff
                }
            };
            if last_purge.elapsed() >= self.config.purge_every {
                last_purge = tokio::time::Instant::now();
                if let Err(e) = self.purge().await {
                    tracing::warn!(error = %e, "outbox purge failed");
                }
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(feature = "rabbitmq")]
mod rabbitmq {
    use idem_core::outbox::OutboxMessage;
    use lapin::types::{AMQPValue, FieldTable, ShortString};

    use super::Publish;
    use crate::rabbitmq::RabbitPublisher;

    /// Publishes to one RabbitMQ exchange with the message's destination as routing key,
    /// `message-id` = the outbox id, persistent, mandatory, and waits for the confirm.
    #[derive(Debug, Clone)]
    pub struct RabbitOutbox {
        publisher: RabbitPublisher,
        exchange: String,
    }

    impl RabbitOutbox {
        /// Publishes through `publisher` (confirms on) to `exchange` (`""`: the default
        /// exchange, where the routing key is the queue's name).
        pub fn new(publisher: RabbitPublisher, exchange: impl Into<String>) -> Self {
            Self {
                publisher,
                exchange: exchange.into(),
            }
        }
    }

    impl Publish for RabbitOutbox {
        async fn publish(&self, message: &OutboxMessage) -> Result<(), String> {
            let mut headers = FieldTable::default();
            for (name, value) in &message.headers {
                headers.insert(
                    ShortString::from(name.as_str()),
                    AMQPValue::LongString(value.as_str().into()),
                );
            }
            self.publisher
                .publish(
                    &self.exchange,
                    &message.destination,
                    &message.id,
                    &message.payload,
                    headers,
                )
                .await
                .map_err(|e| e.to_string())
        }
    }
}

#[cfg(feature = "rabbitmq")]
pub use rabbitmq::RabbitOutbox;

#[cfg(feature = "nats")]
mod nats {
    use async_nats::HeaderMap;
    use idem_core::outbox::OutboxMessage;

    use super::Publish;
    use crate::nats::NatsPublisher;

    /// Publishes to JetStream with the destination as subject and `Nats-Msg-Id` = the outbox
    /// id, and waits for the stream's acknowledgement (a duplicate inside the stream's window
    /// is acknowledged as one and counts as published).
    #[derive(Debug, Clone)]
    pub struct NatsOutbox {
        publisher: NatsPublisher,
    }

    impl NatsOutbox {
        /// Publishes through `publisher`.
        pub fn new(publisher: NatsPublisher) -> Self {
            Self { publisher }
        }
    }

    impl Publish for NatsOutbox {
        async fn publish(&self, message: &OutboxMessage) -> Result<(), String> {
            let mut headers = HeaderMap::new();
            for (name, value) in &message.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            self.publisher
                .publish(
                    &message.destination,
                    &message.id,
                    message.payload.clone(),
                    headers,
                )
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    }
}

#[cfg(feature = "nats")]
pub use nats::NatsOutbox;
