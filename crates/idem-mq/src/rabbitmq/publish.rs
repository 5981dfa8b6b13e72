//! Publishing with a stable message id and publisher confirms.

use idem_core::Key;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};

/// Why a publish did not land.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The channel or connection failed; the message may or may not have been routed, so
    /// publish it again with the same key.
    #[error("publish failed")]
    Broker(#[from] lapin::Error),
    /// The broker refused the message (`basic.nack`); publish it again with the same key.
    #[error("the broker did not confirm the message")]
    Nacked,
    /// The message was returned unroutable (no queue bound to the routing key).
    #[error("the message was returned unroutable")]
    Unroutable,
}

/// Publishes with `message-id` = the caller's key, persistent, and waits for the broker's
/// confirm. Publishing the same key again after an error is safe: the consumer runs one.
#[derive(Debug, Clone)]
pub struct RabbitPublisher {
    channel: Channel,
}

impl RabbitPublisher {
    /// A publisher on a new channel of `conn` with publisher confirms on.
    ///
    /// # Errors
    /// The broker's error when the channel could not be opened.
    pub async fn new(conn: &Connection) -> Result<Self, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self { channel })
    }

    /// The channel, for declarations.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `payload` to `exchange` with `routing_key`, message id `key`, and waits for
    /// the confirm. Mandatory: an unroutable message is an error, not a silent drop.
    ///
    /// # Errors
    /// [`PublishError`]; in each case publish again with the same key.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        key: &Key,
        payload: &[u8],
        headers: FieldTable,
    ) -> Result<(), PublishError> {
        let properties = BasicProperties::default()
            .with_message_id(key.as_str().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        self.publish_raw(exchange, routing_key, payload, properties)
            .await
    }

    pub(crate) async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload,
                properties,
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable),
            _ => Err(PublishError::Nacked),
        }
    }
}
