//! The RabbitMQ consumer loop.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use idem_core::Store;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};
use tokio::sync::watch;

use super::MESSAGE_ID;
use super::publish::RabbitPublisher;
use crate::headers;
use crate::message::Message;
use crate::process::{Delivered, Disposition, Processor};
use crate::runner::{Inbound, delay, drive};
use crate::work::Work;

/// Where dead letters go: an exchange and a routing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    /// The exchange (`""`: the default exchange, routing straight to a queue).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
}

impl DeadLetterTarget {
    /// The queue `<queue>.dead` through the default exchange.
    pub fn beside(queue: &str) -> Self {
        Self {
            exchange: String::new(),
            routing_key: format!("{queue}.dead"),
        }
    }
}

/// Consumes one queue through a [`Processor`].
#[derive(Debug)]
pub struct RabbitConsumer<S, W> {
    processor: Arc<Processor<S, W>>,
    queue: String,
    dead_letter: DeadLetterTarget,
    tag: String,
}

impl<S: Store, W: Work<S>> RabbitConsumer<S, W> {
    /// A consumer of `queue`; dead letters go to `<queue>.dead` unless
    /// [`RabbitConsumer::dead_letter`] says otherwise.
    pub fn new(processor: Processor<S, W>, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            processor: Arc::new(processor),
            dead_letter: DeadLetterTarget::beside(&queue),
            tag: format!("idem-{}", uuid_like()),
            queue,
        }
    }

    /// Sends dead letters to `target`.
    #[must_use]
    pub fn dead_letter(mut self, target: DeadLetterTarget) -> Self {
        self.dead_letter = target;
        self
    }

    /// The processor (its counters among others).
    pub fn processor(&self) -> &Arc<Processor<S, W>> {
        &self.processor
    }

    /// Declares the queue and, when dead letters go through the default exchange, the
    /// dead-letter queue, both durable.
    ///
    /// # Errors
    /// The broker's error.
    pub async fn declare(&self, conn: &Connection) -> Result<(), lapin::Error> {
        let channel = conn.create_channel().await?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(self.queue.as_str().into(), durable, FieldTable::default())
            .await?;
        if self.dead_letter.exchange.is_empty() {
            channel
                .queue_declare(
                    self.dead_letter.routing_key.as_str().into(),
                    durable,
                    FieldTable::default(),
                )
                .await?;
        }
        channel.close(200, "declared".into()).await
    }

    /// Consumes until `shutdown` resolves (or the connection fails), then stops taking
    /// messages, finishes the ones in progress and settles them (acknowledging what
    /// committed), and closes its channels; deliveries not yet started go back to the queue.
    ///
    /// # Errors
    /// The broker's error when consuming could not start or the connection failed.
    pub async fn run(
        &self,
        conn: &Connection,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), lapin::Error> {
        let publisher = RabbitPublisher::new(conn).await?;
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(
                self.processor.config().prefetch.max(1),
                BasicQosOptions::default(),
            )
            .await?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                self.tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let ctx = Arc::new(Ctx {
            publisher,
            queue: self.queue.clone(),
            dead_letter: self.dead_letter.clone(),
        });
        let deliveries = futures::StreamExt::map(consumer, move |d| {
            d.map(|delivery| RabbitDelivery {
                delivery,
                ctx: Arc::clone(&ctx),
            })
        });
        let result = drive(deliveries, Arc::clone(&self.processor), shutdown).await;
        let _ = channel
            .basic_cancel(self.tag.as_str().into(), BasicCancelOptions::default())
            .await;
        // Closing the channel hands prefetched, unstarted deliveries back to the queue.
        let _ = channel.close(200, "consumer stopped".into()).await;
        result
    }
}

fn uuid_like() -> String {
    format!("{:032x}", idem_core::OwnerId::random().0)
}

struct Ctx {
    publisher: RabbitPublisher,
    queue: String,
    dead_letter: DeadLetterTarget,
}

struct RabbitDelivery {
    delivery: Delivery,
    ctx: Arc<Ctx>,
}

fn value_bytes(v: &AMQPValue) -> Option<Bytes> {
    Some(match v {
        AMQPValue::LongString(s) => Bytes::copy_from_slice(s.as_bytes()),
        AMQPValue::ShortString(s) => Bytes::copy_from_slice(s.as_str().as_bytes()),
        AMQPValue::ShortShortInt(n) => n.to_string().into(),
        AMQPValue::ShortShortUInt(n) => n.to_string().into(),
        AMQPValue::ShortInt(n) => n.to_string().into(),
        AMQPValue::ShortUInt(n) => n.to_string().into(),
        AMQPValue::LongInt(n) => n.to_string().into(),
        AMQPValue::LongUInt(n) => n.to_string().into(),
        AMQPValue::LongLongInt(n) => n.to_string().into(),
        AMQPValue::Boolean(b) => b.to_string().into(),
        _ => return None,
    })
}

/// Failed attempts recorded on a copy sent back by this consumer.
fn failed_attempts(properties: &BasicProperties) -> u32 {
    properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(headers::ATTEMPTS))
        .and_then(value_bytes)
        .and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok())
        .unwrap_or(0)
}

impl Inbound for RabbitDelivery {
    fn message(&self) -> Message {
        let props = &self.delivery.properties;
        let mut hdrs = Vec::new();
        if let Some(id) = props.message_id() {
            hdrs.push((
                MESSAGE_ID.to_owned(),
                Bytes::copy_from_slice(id.as_str().as_bytes()),
            ));
        }
        if let Some(table) = props.headers() {
            for (name, value) in table.inner() {
                if let Some(v) = value_bytes(value) {
                    hdrs.push((name.as_str().to_owned(), v));
                }
            }
        }
        let attempt = failed_attempts(props).saturating_add(1);
        Message::new(hdrs, Bytes::copy_from_slice(&self.delivery.data), attempt)
    }

    async fn settle(self, delivered: Delivered, stopping: watch::Receiver<bool>) {
        let acker = &self.delivery.acker;
        let result = match delivered.disposition {
            Disposition::Ack => acker.ack(BasicAckOptions::default()).await.map(drop),
            Disposition::Redeliver {
                after,
                counted: false,
            } => {
                delay(after, stopping).await;
                requeue(&self.delivery).await
            }
            Disposition::Redeliver { after, .. } => {
                delay(after, stopping).await;
                let attempts = failed_attempts(&self.delivery.properties).saturating_add(1);
                let props = with_header(
                    self.delivery.properties.clone(),
                    headers::ATTEMPTS,
                    attempts.to_string(),
                );
                self.forward("", &self.ctx.queue, props).await
            }
            Disposition::DeadLetter(reason) => {
                let props = with_header(
                    self.delivery.properties.clone(),
                    headers::REASON,
                    reason.as_str().to_owned(),
                );
                let props = with_header(props, headers::OUTCOME, delivered.outcome.to_string());
                let target = &self.ctx.dead_letter;
                self.forward(&target.exchange, &target.routing_key, props)
                    .await
            }
        };
        if let Err(e) = result {
            // The delivery stays unacknowledged: the broker redelivers it when the channel
            // closes.
            tracing::warn!(error = %e, "could not settle a delivery");
        }
    }
}

impl RabbitDelivery {
    /// Publishes a copy (confirmed), then acknowledges the original; on a failed publish the
    /// original goes back to the queue instead.
    async fn forward(
        &self,
        exchange: &str,
        routing_key: &str,
        props: BasicProperties,
    ) -> Result<(), lapin::Error> {
        match self
            .ctx
            .publisher
            .publish_raw(exchange, routing_key, &self.delivery.data, props)
            .await
        {
            Ok(()) => self
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map(drop),
            Err(e) => {
                tracing::warn!(error = %e, exchange, routing_key, "could not forward a message; requeued");
                requeue(&self.delivery).await
            }
        }
    }
}

async fn requeue(delivery: &Delivery) -> Result<(), lapin::Error> {
    delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .map(drop)
}

fn with_header(props: BasicProperties, name: &str, value: String) -> BasicProperties {
    let mut table = props.headers().clone().unwrap_or_default();
    table.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
    props.with_headers(table)
}
