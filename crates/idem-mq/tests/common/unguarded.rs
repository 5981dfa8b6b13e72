//! Consumers without idem's guarantees, which each fault test first shows failing: plain
//! consumers of each broker, and a processor whose store failures are papered over.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::jetstream::consumer::PullConsumer;
use futures::StreamExt;
use idem_core::{Answer, EngineError, StoredResponse};
use idem_mq::{Handled, Message, RunResult};
use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::task::JoinHandle;

use super::{After, BoxHandler};

/// A RabbitMQ consumer without idem: runs `effect` per delivery and acks after it, or before
/// it when `ack_first`.
pub fn rabbit<F, Fut>(
    conn: &Arc<Connection>,
    queue: &str,
    prefetch: u16,
    ack_first: bool,
    effect: F,
) -> JoinHandle<()>
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (conn, queue) = (Arc::clone(conn), queue.to_owned());
    tokio::spawn(async move {
        let (_ch, mut consumer) = rabbit_consumer(&conn, &queue, Some(prefetch)).await;
        while let Some(Ok(d)) = consumer.next().await {
            if ack_first {
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
            effect(d.data.clone()).await;
            if !ack_first {
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
        }
    })
}

/// A RabbitMQ consumer without idem that counts each delivery in `count`.
pub fn rabbit_counting(
    conn: &Arc<Connection>,
    queue: &str,
    prefetch: u16,
    count: &Arc<AtomicU64>,
    pause: std::time::Duration,
) -> JoinHandle<()> {
    let count = Arc::clone(count);
    rabbit(conn, queue, prefetch, false, move |_| {
        let count = Arc::clone(&count);
        async move {
            tokio::time::sleep(pause).await;
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// A JetStream consumer without idem: counts each message in `count`, then acks it.
pub fn nats(pull: PullConsumer, count: &Arc<AtomicU64>) -> JoinHandle<()> {
    let count = Arc::clone(count);
    tokio::spawn(async move {
        let mut messages = pull.messages().await.unwrap();
        while let Some(Ok(m)) = messages.next().await {
            count.fetch_add(1, Ordering::SeqCst);
            m.ack().await.unwrap();
        }
    })
}

/// What a consumer without the fail-closed rule does when its store fails.
#[derive(Clone, Copy, Debug)]
pub enum OnStoreError {
    /// Runs the handler without a claim and acknowledges ("keep the queue moving"): every
    /// copy delivered during the outage takes effect.
    RunAnyway,
    /// Acknowledges without running ("the store will catch up"): the message is gone.
    AckUnrun,
}

/// Papers over the store's failures of the idem handler it follows (in [`Then`](super::Then)) as it
/// says; the processor acknowledges what it answers as a replay.
impl After<Handled<BoxHandler>> for OnStoreError {
    async fn after(
        &self,
        inner: &Handled<BoxHandler>,
        result: RunResult,
        message: &Message,
    ) -> RunResult {
        match result {
            Err(EngineError::Store(_)) => {
                if let OnStoreError::RunAnyway = self {
                    let _ = (inner.0)(message.clone()).await;
                }
                Ok(Answer::Replayed(StoredResponse::new(0, "")))
            }
            other => other,
        }
    }
}

/// A plain consumer of `queue` on a channel of its own, `prefetch` deliveries at a time when
/// given (the broker's default otherwise).
pub async fn rabbit_consumer(
    conn: &Connection,
    queue: &str,
    prefetch: Option<u16>,
) -> (lapin::Channel, lapin::Consumer) {
    let ch = conn.create_channel().await.unwrap();
    if let Some(prefetch) = prefetch {
        ch.basic_qos(prefetch, BasicQosOptions::default())
            .await
            .unwrap();
    }
    let consumer = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (ch, consumer)
}
