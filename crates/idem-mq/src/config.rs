//! How a consumer behaves: where keys come from, attempts and delays, prefetch and concurrency.

use std::time::Duration;

use idem_core::key_source::KeySources;

/// Consumer settings shared by both brokers. `docs/consumers.md` has the failure table.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Where the key comes from. `None`: the broker's message id (AMQP `message-id`,
    /// JetStream `Nats-Msg-Id`).
    pub key: Option<KeySources>,
    /// Attempts a message gets before it is dead-lettered (handler failures only; see
    /// `docs/consumers.md` for how each broker counts).
    pub max_attempts: u32,
    /// Delay before the second attempt; doubled per attempt up to `max_backoff`.
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Delay before a message whose key another consumer is processing comes back.
    pub in_flight_delay: Duration,
    /// Delay before a message comes back after the store failed (nothing ran).
    pub store_retry_delay: Duration,
    /// Messages the broker hands over before they are acknowledged (RabbitMQ prefetch,
    /// JetStream `max_ack_pending` when the consumer is created here).
    pub prefetch: u16,
    /// Messages processed at once.
    pub concurrency: usize,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            key: None,
            max_attempts: 5,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            in_flight_delay: Duration::from_secs(1),
            store_retry_delay: Duration::from_secs(1),
            prefetch: 16,
            concurrency: 16,
        }
    }
}

impl ConsumerConfig {
    /// The delay after failed attempt `attempt` (1-based): `backoff · 2^(attempt-1)`, capped.
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        doubling(self.backoff, self.max_backoff, attempt)
    }
}

/// `base · 2^(attempt-1)`, capped at `max` (the consumer's and the outbox dispatcher's
/// backoff).
pub(crate) fn doubling(base: Duration, max: Duration, attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(20);
    base.saturating_mul(1u32 << doublings).min(max)
}
