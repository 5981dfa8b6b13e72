//! RabbitMQ through `lapin`: a consumer that runs each delivery through a [`Processor`] and a
//! publisher that sets the message id from the caller's key and waits for publisher confirms.
//!
//! How each disposition is carried out on a queue:
//!
//! | disposition | on the broker |
//! |---|---|
//! | ack | `basic.ack` after the completion is durable |
//! | redeliver, not counted (key in flight elsewhere, store down, result not yet durable) | held for the delay, then `basic.nack` with requeue: never acknowledged |
//! | redeliver, counted (handler failed) | held for the backoff, a copy with `x-idem-attempts` + 1 published to the queue (confirmed), then the original acknowledged |
//! | dead-letter | a copy with `x-idem-reason` and `x-idem-outcome` published to the dead-letter exchange and routing key (confirmed), then the original acknowledged |
//!
//! A copy sent back and its original are one message id: if the process dies between the
//! copy's confirm and the original's ack, both are delivered and the engine runs one.

mod consume;
mod publish;

pub use consume::{DeadLetterTarget, RabbitConsumer};
pub use publish::{PublishError, RabbitPublisher};

/// The pseudo-header the AMQP `message-id` property appears under (the default key source).
pub const MESSAGE_ID: &str = "message-id";

/// The default key sources on RabbitMQ: the `message-id` property.
pub fn default_keys() -> idem_core::key_source::KeySources {
    idem_core::key_source::KeySources::new(vec![idem_core::key_source::KeySource::Header(
        MESSAGE_ID.into(),
    )])
    .unwrap_or_default()
}
