//! The JetStream consumer loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Context};
use bytes::Bytes;
use idem_core::Store;
use tokio::sync::watch;

use super::publish::publish_with;
use crate::headers;
use crate::message::Message;
use crate::process::{Delivered, Disposition, Processor};
use crate::runner::{Inbound, drive};
use crate::work::Work;

/// Consumes one JetStream pull consumer through a [`Processor`].
#[derive(Debug)]
pub struct NatsConsumer<S, W> {
    processor: Arc<Processor<S, W>>,
    dead_letter_subject: String,
}

impl<S: Store, W: Work<S>> NatsConsumer<S, W> {
    /// A consumer whose dead letters are published to `dead_letter_subject` (a subject some
    /// stream captures, so they are kept).
    pub fn new(processor: Processor<S, W>, dead_letter_subject: impl Into<String>) -> Self {
        Self {
            processor: Arc::new(processor),
            dead_letter_subject: dead_letter_subject.into(),
        }
    }

    /// The processor (its counters among others).
    pub fn processor(&self) -> &Arc<Processor<S, W>> {
        &self.processor
    }

    /// Consumes `consumer` until `shutdown` resolves (or the stream fails), pulling at most
    /// `prefetch` messages per batch, then finishes and settles the messages in progress.
    /// Messages pulled but not started are not acknowledged and come back after the
    /// consumer's `ack_wait`.
    ///
    /// # Errors
    /// The client's error when pulling could not start or failed.
    pub async fn run(
        &self,
        js: &Context,
        consumer: &PullConsumer,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), async_nats::Error> {
        let messages = consumer
            .stream()
            .max_messages_per_batch(usize::from(self.processor.config().prefetch.max(1)))
            // Short pull requests with heartbeats: a request the server dropped is renewed
            // within seconds instead of stalling the consumer until it expires.
            .expires(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(2))
            .messages()
            .await?;
        let ctx = Arc::new(Ctx {
            js: js.clone(),
            dead_letter_subject: self.dead_letter_subject.clone(),
        });
        let deliveries = futures::StreamExt::map(messages, move |m| {
            m.map(|message| NatsDelivery {
                message,
                ctx: Arc::clone(&ctx),
            })
        });
        drive(deliveries, Arc::clone(&self.processor), shutdown)
            .await
            .map_err(Into::into)
    }
}

struct Ctx {
    js: Context,
    dead_letter_subject: String,
}

struct NatsDelivery {
    message: async_nats::jetstream::Message,
    ctx: Arc<Ctx>,
}

impl Inbound for NatsDelivery {
    fn message(&self) -> Message {
        let mut hdrs = Vec::new();
        if let Some(map) = &self.message.headers {
            for (name, values) in map.iter() {
                for v in values {
                    let v: &[u8] = v.as_ref();
                    hdrs.push((name.to_string(), Bytes::copy_from_slice(v)));
                }
            }
        }
        let attempt = self
            .message
            .info()
            .ok()
            .and_then(|i| u32::try_from(i.delivered).ok())
            .unwrap_or(1);
        Message::new(hdrs, self.message.payload.clone(), attempt)
    }

    async fn settle(self, delivered: Delivered, _stopping: watch::Receiver<bool>) {
        let m = &self.message;
        let result = match delivered.disposition {
            Disposition::Ack => m.ack().await,
            Disposition::Redeliver { after, .. } => m.ack_with(AckKind::Nak(Some(after))).await,
            Disposition::DeadLetter(reason) => {
                let mut hdrs = m.headers.clone().unwrap_or_default();
                hdrs.insert(headers::REASON, reason.as_str());
                hdrs.insert(headers::OUTCOME, delivered.outcome.to_string().as_str());
                // The dead letter keeps the original id under another name: a stream with a
                // duplicate window would otherwise drop it as a repeat of the original.
                let copy = rename_id(hdrs);
                match publish_with(
                    &self.ctx.js,
                    &self.ctx.dead_letter_subject,
                    copy,
                    m.payload.clone(),
                )
                .await
                {
                    Ok(_) => m.ack_with(AckKind::Term).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not dead-letter a message; redelivering");
                        m.ack_with(AckKind::Nak(None)).await
                    }
                }
            }
        };
        if let Err(e) = result {
            // Not acknowledged: the server redelivers after `ack_wait`.
            tracing::warn!(error = %e, "could not settle a message");
        }
    }
}

fn rename_id(map: HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in map.iter() {
        let name: &str = name.as_ref();
        let target = if name.eq_ignore_ascii_case(super::MESSAGE_ID) {
            headers::ORIGINAL_ID
        } else {
            name
        };
        for v in values {
            out.append(target, v.as_str());
        }
    }
    out
}
