//! The relays' sources: a RabbitMQ queue and a JetStream stream of the run's own on the
//! shared local brokers (unique names, removed afterwards), publishers that put messages on
//! them with duplicates sharing a message id, and the dead letters read back at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// The local RabbitMQ.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The local NATS server.
pub const NATS_URL: &str = "nats://127.0.0.1:4222";

/// The relay principal of the RabbitMQ relay.
pub const RABBIT: &str = "rabbit";
/// The relay principal of the JetStream relay.
pub const NATS: &str = "nats";

/// The message ids found dead-lettered so far, by relay principal.
#[derive(Debug, Default)]
pub struct DeadLetters {
    /// Message ids by relay principal (`relay:rabbit`).
    pub ids: BTreeMap<String, BTreeSet<String>>,
    /// The first stream sequence not read yet.
    next_seq: u64,
}

impl DeadLetters {
    /// Whether `id` was dead-lettered by `principal`'s relay.
    pub fn contains(&self, principal: &str, id: &str) -> bool {
        self.ids.get(principal).is_some_and(|d| d.contains(id))
    }
}

/// The sources of one run.
#[derive(Debug)]
pub struct Sources {
    /// The RabbitMQ queue.
    pub queue: String,
    /// The JetStream stream.
    pub stream: String,
    amqp: Connection,
    js: jetstream::Context,
}

impl Sources {
    /// Declares the queue (and its dead-letter queue) and creates the stream, with names no
    /// other run uses, kept for `keep`: the queues expire that long after their last use and
    /// the stream drops messages that old. `keep` must outlast the run with its settle phase,
    /// or dead letters and redelivered messages vanish before they are counted (the dead-letter
    /// queue has no consumer, so publishing to it does not count as use).
    ///
    /// # Errors
    /// A broker is not reachable or refuses.
    pub async fn create(run: &str, keep: Duration) -> anyhow::Result<Self> {
        let amqp = Connection::connect(AMQP_URL, ConnectionProperties::default())
            .await
            .context("connecting to RabbitMQ on 5672")?;
        let queue = format!("chaos_{run}");
        let ch = amqp.create_channel().await?;
        let mut args = FieldTable::default();
        // Gone `keep` after the run if the cleanup never happens.
        let keep_ms = i32::try_from(keep.as_millis()).unwrap_or(i32::MAX);
        args.insert("x-expires".into(), AMQPValue::LongInt(keep_ms));
        for q in [queue.clone(), format!("{queue}.dead")] {
            ch.queue_declare(
                q.as_str().into(),
                QueueDeclareOptions::default(),
                args.clone(),
            )
            .await
            .with_context(|| format!("declaring {q}"))?;
        }
        let _ = ch.close(200, "declared".into()).await;
        let client = async_nats::connect(NATS_URL)
            .await
            .context("connecting to NATS on 4222")?;
        let js = jetstream::new(client);
        let stream = format!("CHAOS_{run}");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            duplicate_window: Duration::from_secs(120),
            max_age: keep,
            ..Default::default()
        })
        .await
        .context("creating the JetStream stream")?;
        js.get_stream(&stream)
            .await?
            .create_consumer(consumer::pull::Config {
                durable_name: Some("relay".into()),
                filter_subject: format!("{stream}.in"),
                ack_policy: consumer::AckPolicy::Explicit,
                max_deliver: -1,
                max_ack_pending: 256,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .context("creating the JetStream consumer")?;
        Ok(Self {
            queue,
            stream,
            amqp,
            js,
        })
    }

    /// The `[[relay]]` tables of a relay process posting to `upstream`.
    pub fn relay_tables(&self, upstream: &str) -> String {
        format!(
            r#"[[relay]]
name = "{RABBIT}"
broker = "{AMQP_URL}"
queue = "{queue}"
post = "{upstream}/relay/{RABBIT}"
route = "messages"
max_attempts = 20
backoff = "100ms"
prefetch = 16
concurrency = 8

[[relay]]
name = "{NATS}"
broker = "{NATS_URL}"
stream = "{stream}"
consumer = "relay"
dead_letter = "{stream}.dead"
post = "{upstream}/relay/{NATS}"
route = "messages"
max_attempts = 40
backoff = "100ms"
prefetch = 16
concurrency = 8
"#,
            queue = self.queue,
            stream = self.stream,
        )
    }

    /// Publishes `count` messages to each source, every tenth one two or three times with the
    /// same id, spread over `over`; answers the ids by relay principal and the publishes made.
    ///
    /// # Errors
    /// A publish was refused (publishes are confirmed by the broker).
    pub async fn publish(
        &self,
        count: usize,
        over: Duration,
        seed: u64,
    ) -> anyhow::Result<(BTreeMap<String, Vec<String>>, usize)> {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
        let ch = self.amqp.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let subject = format!("{}.in", self.stream);
        let mut ids: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut publishes = 0;
        let pause = over / u32::try_from(count.max(1)).unwrap_or(u32::MAX);
        for n in 0..count {
            let times = if rng.usize(..10) == 0 {
                rng.usize(2..4)
            } else {
                1
            };
            for source in [RABBIT, NATS] {
                let id = format!("m-{source}-{n}");
                let payload = format!(r#"{{"message":"{id}","amount":{}}}"#, n % 97);
                for _ in 0..times {
                    if source == RABBIT {
                        let props = BasicProperties::default()
                            .with_message_id(id.as_str().into())
                            .with_delivery_mode(2);
                        ch.basic_publish(
                            "".into(),
                            self.queue.as_str().into(),
                            BasicPublishOptions::default(),
                            payload.as_bytes(),
                            props,
                        )
                        .await?
                        .await
                        .context("the RabbitMQ publish was not confirmed")?;
                    } else {
                        let mut h = async_nats::HeaderMap::new();
                        h.insert("Nats-Msg-Id", id.as_str());
                        self.js
                            .publish_with_headers(subject.clone(), h, payload.clone().into())
                            .await?
                            .await
                            .context("the JetStream publish was not acknowledged")?;
                    }
                    publishes += 1;
                }
                ids.entry(format!("relay:{source}")).or_default().push(id);
            }
            tokio::time::sleep(pause).await;
        }
        let _ = ch.close(200, "published".into()).await;
        Ok((ids, publishes))
    }

    /// Messages still waiting (RabbitMQ ready, JetStream unacknowledged or pending).
    ///
    /// # Errors
    /// A broker did not answer.
    pub async fn waiting(&self) -> anyhow::Result<u64> {
        let ch = self.amqp.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let q = ch
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await?;
        let _ = ch.close(200, "counted".into()).await;
        let mut c: consumer::PullConsumer = self
            .js
            .get_stream(&self.stream)
            .await?
            .get_consumer("relay")
            .await
            .map_err(|e| anyhow::anyhow!("the JetStream consumer: {e}"))?;
        let info = c.info().await?;
        Ok(u64::from(q.message_count()) + info.num_pending + info.num_ack_pending as u64)
    }

    /// Reads the dead letters that arrived since the last read into `into`: RabbitMQ's are
    /// taken off their queue, JetStream's read from the stream past the last sequence seen.
    ///
    /// # Errors
    /// A broker did not answer.
    pub async fn read_dead_letters(&self, into: &mut DeadLetters) -> anyhow::Result<()> {
        let ch = self.amqp.create_channel().await?;
        let dead = format!("{}.dead", self.queue);
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await?
        {
            if let Some(id) = m.delivery.properties.message_id() {
                into.ids
                    .entry(format!("relay:{RABBIT}"))
                    .or_default()
                    .insert(id.to_string());
            }
        }
        let _ = ch.close(200, "read".into()).await;
        let stream = self.js.get_stream(&self.stream).await?;
        let info = stream.cached_info().clone();
        let subject = format!("{}.dead", self.stream);
        let from = info.state.first_sequence.max(into.next_seq);
        for seq in from..=info.state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await
                && m.subject.as_str() == subject
                && let Some(id) = m.headers.get("x-idem-original-id")
            {
                into.ids
                    .entry(format!("relay:{NATS}"))
                    .or_default()
                    .insert(id.to_string());
            }
        }
        into.next_seq = into
            .next_seq
            .max(info.state.last_sequence.saturating_add(1));
        Ok(())
    }

    /// Deletes the queues and the stream.
    pub async fn cleanup(&self) {
        if let Ok(ch) = self.amqp.create_channel().await {
            for q in [self.queue.clone(), format!("{}.dead", self.queue)] {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = ch.close(200, "cleaned".into()).await;
        }
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self.amqp.close(200, "done".into()).await;
    }
}
