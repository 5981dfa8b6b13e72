//! Publishing with `Nats-Msg-Id`, so the stream drops a duplicate inside its window.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use bytes::Bytes;
use idem_core::Key;

use super::MESSAGE_ID;

/// Why a publish did not land.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The publish or its acknowledgement failed; publish again with the same key.
    #[error("publish failed: {0}")]
    Broker(String),
}

/// Publishes with `Nats-Msg-Id` = the caller's key and waits for the stream's
/// acknowledgement. Inside the stream's duplicate window the server drops a repeat of the
/// key; outside it, the consumer's engine does.
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    js: Context,
}

impl NatsPublisher {
    /// A publisher on a JetStream context.
    pub fn new(js: Context) -> Self {
        Self { js }
    }

    /// Publishes `payload` to `subject` with message id `key` and extra `headers`. Returns
    /// whether the stream took it as a duplicate of an earlier publish.
    ///
    /// # Errors
    /// [`PublishError`]; publish again with the same key.
    pub async fn publish(
        &self,
        subject: &str,
        key: &Key,
        payload: Bytes,
        mut headers: HeaderMap,
    ) -> Result<bool, PublishError> {
        headers.insert(MESSAGE_ID, key.as_str());
        publish_with(&self.js, subject, headers, payload).await
    }
}

pub(crate) async fn publish_with(
    js: &Context,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<bool, PublishError> {
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, payload)
        .await
        .map_err(|e| PublishError::Broker(e.to_string()))?
        .await
        .map_err(|e| PublishError::Broker(e.to_string()))?;
    Ok(ack.duplicate)
}
