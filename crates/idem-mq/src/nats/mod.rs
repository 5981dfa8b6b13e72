//! NATS JetStream through `async-nats`: a consumer that runs each message of a pull consumer
//! through a [`Processor`](crate::Processor), and a publisher that sets `Nats-Msg-Id` from the
//! caller's key.
//!
//! How each disposition is carried out:
//!
//! | disposition | on the server |
//! |---|---|
//! | ack | `+ACK` after the completion is durable |
//! | redeliver (in flight elsewhere, store down, handler failed) | `-NAK` with the delay: never acknowledged; the server redelivers after it |
//! | dead-letter | the message published to `<dead-letter subject>` with `x-idem-reason` and `x-idem-outcome` (acknowledged by its stream), then `+TERM` on the original |
//!
//! The attempt number is the server's delivery count, which counts every delivery (in-flight
//! and store-down redeliveries too), so give such consumers a `max_attempts` with room.
//! Create the consumer with `max_deliver = -1` (unlimited) and explicit acks: the processor,
//! not the server, decides when a message is dead-lettered.

mod consume;
mod publish;

pub use consume::NatsConsumer;
pub use publish::{NatsPublisher, PublishError};

/// The header the JetStream message id travels in (the default key source).
pub const MESSAGE_ID: &str = "Nats-Msg-Id";

/// The default key sources on JetStream: the `Nats-Msg-Id` header.
pub fn default_keys() -> idem_core::key_source::KeySources {
    idem_core::key_source::KeySources::new(vec![idem_core::key_source::KeySource::Header(
        MESSAGE_ID.into(),
    )])
    .unwrap_or_default()
}
