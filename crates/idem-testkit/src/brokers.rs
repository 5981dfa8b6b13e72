//! RabbitMQ and NATS JetStream fixtures for consumer tests (feature `brokers`), shared by
//! idem-mq's broker tests and the gateway's `idem relay` tests: names no other test uses,
//! queues that expire unused, JetStream streams with one pull consumer, publishing with a
//! message id, and counting what landed where.
//!
//! They talk to the local servers (RabbitMQ on 5672 as guest, NATS on 4222) and panic on a
//! broker error: they are for tests.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use futures::TryStreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

/// The local RabbitMQ.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The local NATS server (JetStream enabled).
pub const NATS_URL: &str = "127.0.0.1:4222";

/// `<prefix>_<what>_<16 hex digits>`: a queue, stream or table name no other test (or run)
/// uses.
pub fn unique(prefix: &str, what: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{what}_{}", &id[..16])
}

pub use crate::services::eventually;

/// A connection to the local RabbitMQ.
pub async fn amqp() -> Connection {
    Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .unwrap()
}

fn expiring() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    args
}

/// Declares `queue` and `<queue>.dead`; both vanish a minute after their last use.
pub async fn declare_queue(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.to_owned(), format!("{queue}.dead")] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            expiring(),
        )
        .await
        .unwrap();
    }
    let _ = ch.close(200, "declared".into()).await;
}

/// Messages ready (not delivered) in a queue declared by [`declare_queue`].
pub async fn queue_ready(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, expiring())
        .await
        .unwrap();
    let _ = ch.close(200, "counted".into()).await;
    q.message_count()
}

/// Publishes `payload` to `queue` (default exchange) `times` times with AMQP message id `id`,
/// persistent, each confirmed by the broker.
pub async fn publish_with_id(
    conn: &Connection,
    queue: &str,
    id: &str,
    payload: &str,
    times: usize,
) {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for _ in 0..times {
        let props = BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2);
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                payload.as_bytes(),
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(matches!(confirm, Confirmation::Ack(_)), "{confirm:?}");
    }
    let _ = ch.close(200, "published".into()).await;
}

/// A JetStream stream of its own, capturing `<name>.>`, with a durable pull consumer `work`
/// (explicit acks, unlimited deliveries) on `<name>.in`; dead letters go to `<name>.dead`,
/// which the stream keeps too. Delete it with [`JsStream::cleanup`]; messages expire after
/// ten minutes anyway.
#[derive(Debug)]
pub struct JsStream {
    /// The core client.
    pub client: async_nats::Client,
    /// Its JetStream context.
    pub js: Context,
    /// The stream's name.
    pub name: String,
}

impl JsStream {
    /// The name of the durable pull consumer.
    pub const CONSUMER: &'static str = "work";

    /// Creates the stream (`window`: its duplicate window) and its consumer (`ack_wait`: how
    /// long an unacknowledged delivery waits before it is redelivered).
    pub async fn create(what: &str, window: Duration, ack_wait: Duration) -> Self {
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let js = jetstream::new(client.clone());
        let name = unique("js", what);
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            duplicate_window: window,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
        let me = Self { client, js, name };
        me.stream()
            .await
            .create_consumer(pull::Config {
                durable_name: Some(Self::CONSUMER.into()),
                filter_subject: me.subject(),
                ack_policy: AckPolicy::Explicit,
                max_deliver: -1,
                max_ack_pending: 256,
                ack_wait,
                ..Default::default()
            })
            .await
            .unwrap();
        me
    }

    async fn stream(&self) -> stream::Stream {
        self.js.get_stream(&self.name).await.unwrap()
    }

    /// `<name>.in`: where messages are published and consumed from.
    pub fn subject(&self) -> String {
        format!("{}.in", self.name)
    }

    /// `<name>.dead`: where dead letters go.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.name)
    }

    /// The durable pull consumer.
    pub async fn consumer(&self) -> PullConsumer {
        self.stream()
            .await
            .get_consumer(Self::CONSUMER)
            .await
            .unwrap()
    }

    /// Publishes `payload` with `Nats-Msg-Id: id` and waits for the stream's ack; true when
    /// the stream dropped it as a duplicate inside its window.
    pub async fn publish_id(&self, id: &str, payload: &str) -> bool {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", id);
        self.publish_headers(h, payload).await
    }

    /// Publishes `payload` with `header: value` and no message id (so the stream keeps every
    /// copy), and waits for the stream's ack.
    pub async fn publish_header(&self, header: &str, value: &str, payload: &str) {
        let mut h = HeaderMap::new();
        h.insert(header, value);
        self.publish_headers(h, payload).await;
    }

    async fn publish_headers(&self, headers: HeaderMap, payload: &str) -> bool {
        self.js
            .publish_with_headers(self.subject(), headers, Bytes::from(payload.to_owned()))
            .await
            .unwrap()
            .await
            .unwrap()
            .duplicate
    }

    /// Messages the stream holds on `subject` (for instance [`JsStream::dead`]).
    pub async fn count_on(&self, subject: &str) -> usize {
        let mut info = self
            .stream()
            .await
            .info_with_subjects(subject)
            .await
            .unwrap();
        let mut n = 0;
        while let Some((s, count)) = info.try_next().await.unwrap() {
            if s == subject {
                n += count;
            }
        }
        n
    }

    /// The headers of the dead letters kept so far, oldest first.
    pub async fn dead_letters(&self) -> Vec<HeaderMap> {
        let stream = self.stream().await;
        let info = stream.cached_info();
        let mut out = Vec::new();
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await
                && m.subject.as_str() == self.dead()
            {
                out.push(m.headers);
            }
        }
        out
    }

    /// Deletes the stream and its consumer.
    pub async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}
