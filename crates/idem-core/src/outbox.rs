//! The transactional outbox's vocabulary: a message written in the same transaction as the
//! effect and the idempotency record, and the store a dispatcher claims pending messages from.
//!
//! A service enqueues its messages inside the transaction that charges the card and completes
//! the key (for example `Engine::run_in_tx` on a SQL store): they commit or roll back with the
//! effect. A dispatcher then claims pending rows under a lease, publishes them with their
//! message id and marks them sent. Publishing is at least once (a dispatcher killed between
//! the publish and the mark publishes again after the lease); the message id makes the
//! repeat harmless, because the broker (`Nats-Msg-Id`) or the consumer's engine drops it.
//!
//! A message id is derived from the idempotency key and a per-message suffix
//! ([`message_id`]), so a request that runs again after a crash (its transaction rolled back)
//! enqueues the same ids, and an enqueue of an id already present writes nothing.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::key::{Key, KeyError, MAX_KEY_LEN, ScopedKey};
use crate::record::OwnerId;
use crate::store::StoreError;

/// The longest suffix [`message_id`] accepts, in bytes.
pub const MAX_SUFFIX_LEN: usize = 64;

/// The message id for the message `suffix` of the request `key`: `<scope>:<key>:<suffix>`,
/// where `<scope>` is 16 hex digits of the scope's digest, so two callers who use the same
/// key in different scopes (another principal or namespace) never share a message id. Where
/// that would pass [`MAX_KEY_LEN`], the key is replaced by its whole scoped digest
/// (`<64 hex>:<suffix>`), still unique and stable.
///
/// # Errors
/// [`KeyError`] when `suffix` is empty, longer than [`MAX_SUFFIX_LEN`], or holds a space or a
/// byte outside printable ASCII.
pub fn message_id(key: &ScopedKey, suffix: &str) -> Result<Key, KeyError> {
    if suffix.is_empty() {
        return Err(KeyError::Empty);
    }
    if suffix.len() > MAX_SUFFIX_LEN {
        return Err(KeyError::TooLong { len: suffix.len() });
    }
    if let Some((at, &byte)) = suffix
        .as_bytes()
        .iter()
        .enumerate()
        .find(|(_, b)| !b.is_ascii_graphic())
    {
        return Err(KeyError::NotPrintable { byte, at });
    }
    let digest = key.digest_hex();
    let readable = 16 + 1 + key.key.as_str().len() + 1 + suffix.len();
    if readable <= MAX_KEY_LEN {
        Key::new(format!("{}:{}:{suffix}", &digest[..16], key.key))
    } else {
        Key::new(format!("{digest}:{suffix}"))
    }
}

/// A message to publish once its transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The message id the broker and the consumer deduplicate on.
    pub id: Key,
    /// Where it goes: the routing key (RabbitMQ) or the subject (JetStream).
    pub destination: String,
    /// Messages with the same aggregate are published one at a time, in the order they were
    /// enqueued; `None` publishes in any order.
    pub aggregate: Option<String>,
    /// The body.
    pub payload: Bytes,
    /// Headers sent with the message.
    pub headers: Vec<(String, String)>,
}

impl OutboxMessage {
    /// The message `suffix` of the request `key` (see [`message_id`]) to `destination`.
    ///
    /// # Errors
    /// [`KeyError`] when the suffix is not a valid one.
    pub fn for_key(
        key: &ScopedKey,
        suffix: &str,
        destination: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Result<Self, KeyError> {
        Ok(Self::with_id(
            message_id(key, suffix)?,
            destination,
            payload,
        ))
    }

    /// A message with an id of the caller's choosing.
    pub fn with_id(id: Key, destination: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            id,
            destination: destination.into(),
            aggregate: None,
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    /// Keeps this message in order behind earlier messages of `aggregate`.
    #[must_use]
    pub fn aggregate(mut self, aggregate: impl Into<String>) -> Self {
        self.aggregate = Some(aggregate.into());
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The headers as the JSON object the outbox table stores (`None` when there are none).
    pub fn headers_json(&self) -> Option<String> {
        if self.headers.is_empty() {
            return None;
        }
        let map: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        Some(serde_json::Value::Object(map).to_string())
    }

    /// Headers read back from the table's JSON object.
    ///
    /// # Errors
    /// A message naming what is wrong when `json` is not an object of strings (a row written
    /// by hand may hold anything).
    pub fn headers_from_json(json: &str) -> Result<Vec<(String, String)>, String> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("headers are not JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err("headers are not a JSON object".into());
        };
        map.into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => Ok((k, s)),
                other => Err(format!("header `{k}` is {other}, not a string")),
            })
            .collect()
    }
}

/// A message a dispatcher claimed: it holds the row until `lease` ends or it reports back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The row's position in the outbox (enqueue order).
    pub seq: i64,
    /// The message.
    pub message: OutboxMessage,
    /// Publish attempts so far, this one included.
    pub attempts: u32,
}

/// A row that cannot be published as written (a bad id or headers in a row written by hand):
/// the store parks it with this reason instead of handing it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The row.
    pub seq: i64,
    /// What is wrong with it.
    pub reason: String,
}

/// What a claim handed out.
#[derive(Debug, Default)]
pub struct Claimed {
    /// Messages to publish, in enqueue order.
    pub pending: Vec<Pending>,
    /// Rows parked because they could not be read.
    pub unreadable: Vec<Unreadable>,
}

/// How many rows wait, and how many are parked for an operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Not yet sent and not parked.
    pub pending: u64,
    /// Parked after too many attempts, or unreadable.
    pub parked: u64,
    /// Sent and kept until the retention ends.
    pub sent: u64,
}

/// A failed publish of one claimed row: the row is due again after `delay`, or parked for an
/// operator when `park`, with `reason` kept.
#[derive(Clone, Copy, Debug)]
pub struct Failure<'a> {
    /// The dispatcher that holds the row; a row it no longer holds is left alone.
    pub owner: OwnerId,
    /// The row.
    pub seq: i64,
    /// How long until it is due again.
    pub delay: Duration,
    /// Whether to park it instead.
    pub park: bool,
    /// Why the publish failed.
    pub reason: &'a str,
}

/// Where a dispatcher finds pending messages. Every method is one short transaction on the
/// database clock; any number of dispatchers may share one outbox.
pub trait OutboxStore: Send + Sync + 'static {
    /// Claims up to `limit` pending messages for `owner` until `lease` from now: unsent, not
    /// parked, due (`available_at` passed), not held under a live lease by another claim,
    /// and, for a message with an aggregate, the oldest unsent one of that aggregate. Rows
    /// another dispatcher is claiming at the same moment are skipped, not waited for.
    ///
    /// # Errors
    /// [`StoreError`] when the database failed; nothing was claimed.
    fn claim(
        &self,
        owner: OwnerId,
        limit: u32,
        lease: Duration,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// Marks the rows `seqs` sent, where `owner` still holds them. Returns how many it
    /// marked (a row whose lease ran out and that another dispatcher claimed is not; that one
    /// publishes it again under the same id).
    ///
    /// # Errors
    /// [`StoreError`] when the database failed; the rows are published again after the lease.
    fn sent(
        &self,
        owner: OwnerId,
        seqs: &[i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Gives a row back after a failed publish, as `failure` says.
    ///
    /// # Errors
    /// [`StoreError`] when the database failed; the row is due again after its lease.
    fn failed(&self, failure: &Failure<'_>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes up to `limit` rows sent more than `retention` ago; returns how many.
    ///
    /// # Errors
    /// [`StoreError`] when the database failed.
    fn purge(
        &self,
        retention: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts the rows by state.
    ///
    /// # Errors
    /// [`StoreError`] when the database failed.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Scope;

    fn scoped(principal: Option<&str>, key: &str) -> ScopedKey {
        let mut scope = Scope::new("orders.create").expect("namespace");
        if let Some(p) = principal {
            scope = scope.with_principal(p);
        }
        ScopedKey::new(scope, Key::new(key).expect("key"))
    }

    #[test]
    fn ids_are_stable_and_name_the_key_and_suffix() {
        let k = scoped(None, "order-42");
        let id = message_id(&k, "paid").expect("id");
        assert_eq!(id, message_id(&k, "paid").expect("id"));
        assert!(id.as_str().ends_with(":order-42:paid"), "{id}");
        assert_ne!(id, message_id(&k, "shipped").expect("id"));
    }

    #[test]
    fn the_same_key_in_another_scope_is_another_id() {
        let a = message_id(&scoped(Some("alice"), "order-42"), "paid").expect("id");
        let b = message_id(&scoped(Some("bob"), "order-42"), "paid").expect("id");
        assert_ne!(a, b);
    }

    #[test]
    fn a_long_key_falls_back_to_its_digest() {
        let k = scoped(None, &"k".repeat(250));
        let id = message_id(&k, "paid").expect("id");
        assert_eq!(id.as_str(), format!("{}:paid", k.digest_hex()));
    }

    #[test]
    fn bad_suffixes_are_refused() {
        let k = scoped(None, "order-42");
        assert_eq!(message_id(&k, ""), Err(KeyError::Empty));
        assert!(matches!(
            message_id(&k, "a b"),
            Err(KeyError::NotPrintable { at: 1, .. })
        ));
        assert!(matches!(
            message_id(&k, &"s".repeat(65)),
            Err(KeyError::TooLong { len: 65 })
        ));
    }

    #[test]
    fn headers_round_trip_through_json() {
        let m = OutboxMessage::with_id(Key::new("m").expect("key"), "q", "{}")
            .header("content-type", "application/json")
            .header("x-tenant", "7");
        let json = m.headers_json().expect("some headers");
        assert_eq!(
            OutboxMessage::headers_from_json(&json).expect("parses"),
            m.headers
        );
        assert!(OutboxMessage::headers_from_json("[1]").is_err());
        assert!(OutboxMessage::headers_from_json("{\"a\":1}").is_err());
        assert!(OutboxMessage::headers_from_json("{").is_err());
    }
}
