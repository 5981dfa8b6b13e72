//! The Redis audit trail: a capped stream per namespace, written by the record scripts in
//! the same script call as the change (see `lua/prelude.lua`), and read back here.
//!
//! A stream's key is `<prefix>audit:<namespace in hex>:{<tag>}`. A script may only touch
//! keys of one cluster slot, so on a cluster the tag is a fixed string that hashes to the
//! slot of the record's key: there is one stream per namespace and slot, and a query merges
//! them. On one node the tag is empty and each namespace has one stream. The namespace is
//! hex-encoded so no character of it can act as a hash tag or a glob.

use std::sync::LazyLock;

use idem_core::audit::{AuditEvent, AuditKind, AuditQuery};
use idem_core::{Key, Scope, ScopedKey, StoreError, Timestamp};
use redis::Value;

use crate::batch::{malformed, redis_err};
use crate::codec::{decode_meta, push_hex_str};
use crate::store::{RedisStore, glob_escape};

/// Cluster slots.
const SLOTS: usize = 16_384;

/// Entries read per `XREVRANGE` page while filtering.
const PAGE: usize = 1_000;

/// CRC16-CCITT (XMODEM), the hash Redis Cluster maps keys to slots with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn slot(tag: &[u8]) -> usize {
    usize::from(crc16(tag)) % SLOTS
}

/// For each slot, the shortest decimal number that hashes to it: the tag of that slot's
/// streams.
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags = vec![String::new(); SLOTS];
    let mut missing = SLOTS;
    let mut n: u64 = 0;
    while missing > 0 {
        let candidate = n.to_string();
        let s = slot(candidate.as_bytes());
        if tags[s].is_empty() {
            tags[s] = candidate;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

fn namespace_hex(namespace: &str) -> String {
    let mut out = String::with_capacity(2 * namespace.len());
    push_hex_str(&mut out, namespace.as_bytes());
    out
}

impl RedisStore {
    /// The audit stream `key`'s events go to.
    pub(crate) fn audit_stream(&self, key: &ScopedKey) -> String {
        let prefix = self.prefix();
        let ns = namespace_hex(key.scope.namespace());
        if self.connection().is_cluster() {
            let mut digest = String::with_capacity(64);
            push_hex_str(&mut digest, &key.digest());
            let tag = &SLOT_TAGS[slot(digest.as_bytes())];
            format!("{prefix}audit:{ns}:{{{tag}}}")
        } else {
            format!("{prefix}audit:{ns}:{{}}")
        }
    }

    /// The streams a query has to read: one when it names the namespace (and, on a
    /// cluster, the whole scoped key); otherwise every matching stream, found by `SCAN`.
    async fn audit_streams(&self, query: &AuditQuery) -> Result<Vec<String>, StoreError> {
        if let Some(ns) = &query.namespace {
            let exact = match (&query.scope, &query.key) {
                (Some(scope), Some(key)) => scoped(ns, scope, key),
                _ => None,
            };
            match exact {
                Some(key) => return Ok(vec![self.audit_stream(&key)]),
                None if !self.connection().is_cluster() => {
                    let ns = namespace_hex(ns);
                    return Ok(vec![format!("{}audit:{ns}:{{}}", self.prefix())]);
                }
                None => {}
            }
        }
        let pattern = match &query.namespace {
            Some(ns) => format!(
                "{}audit:{}:*",
                glob_escape(self.prefix()),
                namespace_hex(ns)
            ),
            None => format!("{}audit:*", glob_escape(self.prefix())),
        };
        let mut streams: Vec<String> = self
            .connection()
            .scan_keys(&pattern, Some("stream"))
            .await
            .map_err(redis_err)?;
        streams.sort();
        streams.dedup();
        Ok(streams)
    }

    /// Reads the matching events of every stream the query needs, newest first.
    pub(crate) async fn read_audit(
        &self,
        query: &AuditQuery,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let limit = query.effective_limit();
        let mut found: Vec<((u64, u64), AuditEvent)> = Vec::new();
        for stream in self.audit_streams(query).await? {
            found.extend(self.read_stream(&stream, query, limit).await?);
        }
        found.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
        found.truncate(limit);
        Ok(found.into_iter().map(|(_, e)| e).collect())
    }

    /// Up to `limit` matching events of one stream, newest first, with their entry ids.
    async fn read_stream(
        &self,
        stream: &str,
        query: &AuditQuery,
        limit: usize,
    ) -> Result<Vec<((u64, u64), AuditEvent)>, StoreError> {
        let mut end = match query.until {
            Some(t) => format!("{}", t.0),
            None => "+".to_owned(),
        };
        let start = match query.since {
            Some(t) => format!("{}", t.0),
            None => "-".to_owned(),
        };
        let mut out = Vec::new();
        loop {
            let mut cmd = redis::cmd("XREVRANGE");
            cmd.arg(stream).arg(&end).arg(&start).arg("COUNT").arg(PAGE);
            let reply = self
                .connection()
                .query_at_key(cmd, stream.as_bytes())
                .await
                .map_err(redis_err)?;
            let Value::Array(entries) = reply else {
                return Err(malformed("unexpected XREVRANGE reply"));
            };
            let mut last = None;
            let page = entries.len();
            for entry in entries {
                let (id, event) = entry_event(entry)?;
                last = Some(id);
                if let Some(event) = event
                    && query.matches(&event)
                {
                    out.push((id, event));
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            match last {
                Some((ms, seq)) if page == PAGE => {
                    // Exclusive end: the next page starts before the last entry read.
                    end = format!("({ms}-{seq}");
                }
                _ => return Ok(out),
            }
        }
    }
}

/// The scoped key a query names, when it names a valid one.
fn scoped(namespace: &str, scope: &str, key: &str) -> Option<ScopedKey> {
    let mut s = Scope::new(namespace).ok()?;
    if !scope.is_empty() {
        s = s.with_principal(scope);
    }
    Some(ScopedKey::new(s, Key::new(key).ok()?))
}

fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn number(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

/// One stream entry: its id, and its event (`None` for an entry that is not one, which a
/// query skips).
fn entry_event(entry: Value) -> Result<((u64, u64), Option<AuditEvent>), StoreError> {
    let Value::Array(parts) = entry else {
        return Err(malformed("unexpected stream entry"));
    };
    let [id, Value::Array(fields)] = parts.as_slice() else {
        return Err(malformed("unexpected stream entry"));
    };
    let id = text(id).ok_or(malformed("unexpected stream entry id"))?;
    let id = std::str::from_utf8(id)
        .ok()
        .and_then(|s| s.split_once('-'))
        .and_then(|(ms, seq)| Some((ms.parse().ok()?, seq.parse().ok()?)))
        .ok_or(malformed("unexpected stream entry id"))?;
    let mut kind = None;
    let mut fence = None;
    let mut meta = None;
    let mut instance = None;
    let mut outcome = None;
    let mut status = None;
    let mut actor = None;
    for pair in fields.chunks(2) {
        let (Some(name), Some(value)) = (pair.first().and_then(text), pair.get(1).and_then(text))
        else {
            continue;
        };
        let utf8 = || String::from_utf8(value.to_vec()).ok();
        match name {
            b"e" => kind = number(value).and_then(|c| AuditKind::from_code(c as i64)),
            b"f" => fence = number(value),
            b"m" => meta = decode_meta(value).ok(),
            b"n" => instance = utf8().filter(|s| !s.is_empty()),
            b"o" => outcome = utf8(),
            b"s" => status = number(value).and_then(|s| u16::try_from(s).ok()),
            b"a" => actor = utf8().filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    let (Some(kind), Some(fence), Some((key, request_id))) = (kind, fence, meta) else {
        return Ok((id, None));
    };
    let mut event = AuditEvent::new(kind, &key, Timestamp(id.0), fence);
    // A fenced entry carries the identity of the record as it stands, whose request id is
    // another holder's.
    if kind != AuditKind::Fenced {
        event.request_id = request_id;
    }
    event.outcome = outcome;
    event.status = status;
    event.instance = instance;
    event.actor = actor;
    Ok((id, Some(event)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec_and_every_slot_has_a_tag() {
        // The check value of CRC16/XMODEM, as in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(SLOT_TAGS.len(), SLOTS);
        for (s, tag) in SLOT_TAGS.iter().enumerate() {
            assert_eq!(slot(tag.as_bytes()), s);
        }
    }
}
