//! Message consumers that take effect once per message: RabbitMQ (feature `rabbitmq`) and NATS
//! JetStream (feature `nats`) deliveries run through the same [`idem_core::Engine`] as HTTP
//! requests, and publishers that give each message a stable id.
//!
//! Queues deliver at least once; a consumer wrapped here makes the *effect* happen once:
//!
//! - the key is the broker's message id, or what a [`KeySources`](idem_core::key_source::KeySources)
//!   list takes from headers or the JSON payload; a message with no key is dead-lettered,
//!   never run;
//! - the fingerprint is the payload: the same id with another payload is a mismatch,
//!   dead-lettered and counted;
//! - the message is acknowledged only after the completion is durable; a completed key is
//!   acknowledged without running; a key another consumer holds comes back later; a retryable
//!   failure comes back with backoff and after `max_attempts` is dead-lettered with the record
//!   left unknown for an operator; a failing store means nothing runs and nothing is
//!   acknowledged;
//! - [`InTx`] runs the handler inside the inbox's database transaction (idem-sql's
//!   [`TxStore`](idem_core::TxStore)), the strongest form.
//!
//! Every delivery ends as a [`Delivered`]: the engine's typed [`idem_core::Outcome`] and the
//! [`Disposition`] the adapter carried out. `docs/consumers.md` is the guide.
//!
//! ```
//! use idem_core::{Engine, MemoryStore, Scope};
//! use idem_core::key_source::KeySources;
//! use idem_mq::{ConsumerConfig, Disposition, Handled, Message, Processor};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new(1_000), Default::default());
//! let processor = Processor::new(
//!     engine,
//!     Scope::new("orders.paid")?,
//!     KeySources::parse(&["header:message-id"])?,
//!     ConsumerConfig::default(),
//!     Handled(|_message: Message| async { Ok(()) }),
//! );
//! let message = Message::new(vec![("message-id".into(), "m-1".into())], "{}", 1);
//! assert_eq!(processor.process(&message).await.disposition, Disposition::Ack);
//! let again = processor.process(&message).await;
//! assert_eq!(again.outcome, idem_core::Outcome::Replayed);
//! # Ok(()) }
//! ```

mod config;
mod message;
pub mod outbox;
mod process;
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
mod runner;
mod work;

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

pub use config::ConsumerConfig;
pub use message::Message;
pub use process::{DeadReason, Delivered, Disposition, Observer, Processor, Stats};
pub use work::{Handled, HandlerError, InTx, Job, RunResult, TxHandler, Work, settle};

/// Headers the consumer adds to a message it sends back or dead-letters (idem's wire
/// contract, [`idem_wire::message`]).
pub mod headers {
    pub use idem_wire::message::{ATTEMPTS, ORIGINAL_ID, OUTCOME, REASON};
}
