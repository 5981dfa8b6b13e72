//! One delivery as the consumer sees it, whichever broker it came from.

use std::sync::OnceLock;

use bytes::Bytes;
use idem_core::fingerprint::{FingerprintError, validate_json};
use idem_core::key_source::{KeyInputs, KeySourceError};
use serde_json::Value;

/// A delivered message: its headers (the broker's message id among them), payload and
/// attempt number.
#[derive(Debug, Clone)]
pub struct Message {
    headers: Vec<(String, Bytes)>,
    payload: Bytes,
    attempt: u32,
    json: OnceLock<Option<Value>>,
}

impl Message {
    /// A message with these headers (names compared without regard to case) and payload; the
    /// broker's message id is one of the headers (`message-id` for AMQP, `Nats-Msg-Id` for
    /// JetStream). `attempt` counts from 1.
    pub fn new(headers: Vec<(String, Bytes)>, payload: impl Into<Bytes>, attempt: u32) -> Self {
        Self {
            headers,
            payload: payload.into(),
            attempt: attempt.max(1),
            json: OnceLock::new(),
        }
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, in delivery order.
    pub fn headers(&self) -> &[(String, Bytes)] {
        &self.headers
    }

    /// Which attempt this is, counting from 1 (see `docs/consumers.md` for how each broker
    /// counts).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The object member this payload names twice, if it is JSON that does: serde_json keeps
    /// the last of them and a handler's parser may keep the first, so a key read from such a
    /// payload could name another order than the one the handler acts on. Payloads that are
    /// not JSON, and JSON without duplicates, give `None`.
    pub fn ambiguous_member(&self) -> Option<String> {
        match validate_json(&self.payload) {
            Err(FingerprintError::DuplicateMember(name)) => Some(name),
            _ => None,
        }
    }

    /// The payload as JSON, when it parses (of duplicate members the last; see
    /// [`Message::ambiguous_member`]).
    pub fn json(&self) -> Option<&Value> {
        self.json
            .get_or_init(|| serde_json::from_slice(&self.payload).ok())
            .as_ref()
    }
}

impl KeyInputs for Message {
    fn header(&self, name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        let mut found = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name));
        match (found.next(), found.next()) {
            (None, _) => Ok(None),
            (Some((_, v)), None) => Ok(Some(v)),
            (Some(_), Some(_)) => Err(KeySourceError::Repeated(name.to_owned())),
        }
    }

    fn json(&self) -> Option<&Value> {
        Message::json(self)
    }

    fn json_bytes(&self) -> Option<&[u8]> {
        Message::json(self).map(|_| &self.payload[..])
    }

    fn path_param(&self, _name: &str) -> Option<&str> {
        None
    }

    fn query(&self, _name: &str) -> Result<Option<&str>, KeySourceError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use idem_core::key_source::KeySources;

    use super::*;

    fn key(payload: &'static str) -> Result<Option<String>, KeySourceError> {
        let message = Message::new(Vec::new(), payload, 1);
        KeySources::parse(&["{json.order}:ship"])?
            .resolve(&message)
            .map(|f| f.map(|f| f.key.as_str().to_owned()))
    }

    // Security issue 28: numbers beyond f64 precision shared a key, so the second message
    // was suppressed as a duplicate of the first.
    #[test]
    fn payload_numbers_become_keys_exactly() {
        assert_eq!(
            key(r#"{"order": 10000000000000000000001}"#),
            Ok(Some("1.0000000000000000000001e22:ship".into()))
        );
        assert_eq!(
            key(r#"{"order": 10000000000000000000002}"#),
            Ok(Some("1.0000000000000000000002e22:ship".into()))
        );
        assert_eq!(key(r#"{"order": 12.5}"#), Ok(Some("12.5:ship".into())));
        assert_eq!(key(r#"{"order": 42}"#), Ok(Some("42:ship".into())));
        // The payload names the member twice: nothing is guessed.
        assert_eq!(
            key(r#"{"order": 0.5, "order": 0.25}"#),
            Err(KeySourceError::Repeated("order".into()))
        );
    }

    #[test]
    fn payloads_naming_a_member_twice_are_told_apart() {
        let ambiguous = |p: &'static str| Message::new(Vec::new(), p, 1).ambiguous_member();
        assert_eq!(
            ambiguous(r#"{"order": {"id": 1, "id": 2}}"#),
            Some("id".into())
        );
        assert_eq!(
            ambiguous(r#"{"order": 1, "order": 2}"#),
            Some("order".into())
        );
        assert_eq!(ambiguous(r#"{"order": {"id": 1}, "amount": 2}"#), None);
        assert_eq!(ambiguous("not json"), None);
    }
}
