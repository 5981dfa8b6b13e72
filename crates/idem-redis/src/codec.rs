//! The stored form of a record: a fixed-width text header the Lua scripts read and splice by
//! position (see `lua/prelude.lua` for the offsets), then the record's identity (binary,
//! opaque to Lua), then the response in idem-core's compact binary encoding
//! ([`StoredResponse::encode`]).
//!
//! ```text
//! "1 <state> <owner:32 hex> <fence:20> <fp:68 hex> <lease_until:13> <created:13> <expires:13> <since:13> <meta_len:10>\n" <meta> <response>
//! ```
//!
//! `state` is `p` (processing), `c` (completed), `u` (unknown) or `t` (tombstone: absent to
//! every reader, kept only so the fence never goes backwards). Times are milliseconds on the
//! Redis server's clock, zero-padded. `created` dates the current attempt (the first claim or
//! the latest takeover). An unknown record's owner is its holder's when a claim under `hold`
//! marked it on an expired lease (that holder may still complete or release it), and all
//! zeros ([`OwnerId`] `0`, read as nobody) when its holder released it as unknown.

use idem_core::fingerprint::FINGERPRINT_LEN;
use idem_core::record::CodecError;
use idem_core::{
    Fingerprint, Key, OwnerId, Record, RecordState, Scope, ScopedKey, StoredResponse, Timestamp,
};

/// The parsed header of a stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) state: u8,
    pub(crate) fence: u64,
    pub(crate) lease_until: u64,
    pub(crate) created: u64,
    pub(crate) expires: u64,
    pub(crate) since: u64,
    pub(crate) owner: u128,
    pub(crate) fingerprint: Option<Fingerprint>,
    /// Byte range of the meta section within the value.
    pub(crate) meta: std::ops::Range<usize>,
}

const BAD: CodecError = CodecError("malformed redis record");

/// Lower-case hex of `bytes`.
#[cfg(test)]
pub(crate) fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Appends the lower-case hex of `bytes` to `out`, without an intermediate string.
pub(crate) fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + bytes.len() * 2, 0);
    // The slice is exactly twice as long as `bytes`, the only length `encode_to_slice` needs.
    let _ = hex::encode_to_slice(bytes, &mut out[start..]);
}

/// Appends the lower-case hex of `bytes` to `out`.
pub(crate) fn push_hex_str(out: &mut String, bytes: &[u8]) {
    out.push_str(&hex::encode(bytes));
}

/// Appends `n` in decimal, at least `width` digits (zero-padded).
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let (mut rest, mut used) = (n, 0);
    for d in digits.iter_mut().rev() {
        *d = b'0' + (rest % 10) as u8;
        rest /= 10;
        used += 1;
        if rest == 0 && used >= width {
            break;
        }
    }
    out.extend_from_slice(&digits[digits.len() - used..]);
}

/// Decodes exactly `N` bytes of lower-case hex, without allocating.
fn unhex<const N: usize>(s: &[u8]) -> Result<[u8; N], CodecError> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|_| BAD)?;
    Ok(out)
}

/// The owner id as the scripts store it.
#[cfg(test)]
pub(crate) fn owner_hex(owner: OwnerId) -> String {
    hex(&owner.to_bytes())
}

/// What settling scripts compare against the record: `p <owner> <fence>`, fixed width.
pub(crate) fn holder_token(owner: OwnerId, fence: u64) -> String {
    let mut out = Vec::with_capacity(HOLDER_TOKEN_LEN);
    push_holder_token(&mut out, owner, fence);
    // The token is ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// Length of a holder token.
pub(crate) const HOLDER_TOKEN_LEN: usize = 2 + 32 + 1 + 20;

/// Appends the holder token `p <owner> <fence>` to `out`.
pub(crate) fn push_holder_token(out: &mut Vec<u8>, owner: OwnerId, fence: u64) {
    out.extend_from_slice(b"p ");
    push_hex(out, &owner.to_bytes());
    out.push(b' ');
    push_decimal(out, fence, 20);
}

/// The fingerprint as the scripts store it.
#[cfg(test)]
pub(crate) fn fingerprint_hex(fp: &Fingerprint) -> String {
    hex(&fp.to_bytes())
}

/// A non-empty run of ASCII digits that fits a `u64`.
fn number(raw: &[u8]) -> Result<u64, CodecError> {
    if raw.is_empty() {
        return Err(BAD);
    }
    raw.iter().try_fold(0u64, |n, &c| {
        if !c.is_ascii_digit() {
            return Err(BAD);
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(c - b'0')))
            .ok_or(BAD)
    })
}

impl Header {
    /// Parses the header of a stored value.
    pub(crate) fn parse(value: &[u8]) -> Result<Self, CodecError> {
        let end = value.iter().position(|&b| b == b'\n').ok_or(BAD)?;
        let mut fields = value[..end].split(|&b| b == b' ');
        let mut next = || fields.next().ok_or(BAD);
        if next()? != b"1" {
            return Err(CodecError("unknown redis record version"));
        }
        let state = match next()? {
            [s @ (b'p' | b'c' | b'u' | b't')] => *s,
            _ => return Err(BAD),
        };
        let owner_raw = next()?;
        let fence = number(next()?)?;
        let fp_raw = next()?;
        let lease_until = number(next()?)?;
        let created = number(next()?)?;
        let expires = number(next()?)?;
        let since = number(next()?)?;
        let meta_len = usize::try_from(number(next()?)?).map_err(|_| BAD)?;
        let start = end + 1;
        // A tombstone keeps only its fence and times: its owner, fingerprint and metadata
        // fields are not read.
        let (owner, fingerprint, meta) = if state == b't' {
            (0, None, start..start)
        } else {
            let owner_bytes: [u8; 16] = unhex(owner_raw)?;
            let fingerprint =
                Fingerprint::from_bytes(&unhex::<FINGERPRINT_LEN>(fp_raw)?).map_err(|_| BAD)?;
            let stop = start
                .checked_add(meta_len)
                .filter(|&s| s <= value.len())
                .ok_or(BAD)?;
            (
                u128::from_be_bytes(owner_bytes),
                Some(fingerprint),
                start..stop,
            )
        };
        Ok(Self {
            state,
            fence,
            lease_until,
            created,
            expires,
            since,
            owner,
            fingerprint,
            meta,
        })
    }

    /// True for a tombstone, which readers treat as absent.
    pub(crate) fn is_tombstone(&self) -> bool {
        self.state == b't'
    }
}

/// The identity part kept on every record: namespace, principal, key, request id.
#[cfg(test)]
pub(crate) fn encode_meta(key: &ScopedKey, request_id: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    write_meta(&mut out, key, request_id);
    out
}

/// The claim script's last argument: `<meta_len:10>\n<meta>`, the header's end and the
/// identity part, in one buffer.
#[cfg(test)]
pub(crate) fn encode_meta_tail(key: &ScopedKey, request_id: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    push_meta_tail(&mut out, key, request_id);
    out
}

/// Bytes [`push_meta_tail`] appends, at most.
pub(crate) fn meta_tail_len(key: &ScopedKey, request_id: Option<&str>) -> usize {
    10 + 17
        + key.key.as_str().len()
        + key.scope.namespace().len()
        + key.scope.principal().map_or(0, str::len)
        + request_id.map_or(0, str::len)
}

/// Appends the claim script's last argument (see `encode_meta_tail`) to `out`.
pub(crate) fn push_meta_tail(out: &mut Vec<u8>, key: &ScopedKey, request_id: Option<&str>) {
    const WIDTH: usize = 10;
    out.reserve(meta_tail_len(key, request_id));
    let start = out.len();
    out.extend_from_slice(b"0000000000\n");
    write_meta(out, key, request_id);
    let mut len = out.len() - start - (WIDTH + 1);
    for digit in out[start..start + WIDTH].iter_mut().rev() {
        *digit = b'0' + (len % 10) as u8;
        len /= 10;
    }
}

fn write_meta(out: &mut Vec<u8>, key: &ScopedKey, request_id: Option<&str>) {
    for part in [
        Some(key.scope.namespace()),
        key.scope.principal(),
        Some(key.key.as_str()),
        request_id,
    ] {
        match part {
            Some(p) => {
                let len = u32::try_from(p.len())
                    .unwrap_or(u32::MAX - 1)
                    .min(u32::MAX - 1);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&p.as_bytes()[..len as usize]);
            }
            None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
        }
    }
}

pub(crate) fn decode_meta(raw: &[u8]) -> Result<(ScopedKey, Option<String>), CodecError> {
    let mut at = 0;
    let mut part = || -> Result<Option<String>, CodecError> {
        let len_bytes: [u8; 4] = raw
            .get(at..at + 4)
            .ok_or(BAD)?
            .try_into()
            .map_err(|_| BAD)?;
        at += 4;
        let len = u32::from_be_bytes(len_bytes);
        if len == u32::MAX {
            return Ok(None);
        }
        let end = at
            .checked_add(len as usize)
            .filter(|&e| e <= raw.len())
            .ok_or(BAD)?;
        let s = String::from_utf8(raw[at..end].to_vec()).map_err(|_| BAD)?;
        at = end;
        Ok(Some(s))
    };
    let namespace = part()?.ok_or(BAD)?;
    let principal = part()?;
    let key = part()?.ok_or(BAD)?;
    let request_id = part()?;
    let mut scope = Scope::new(namespace).map_err(|_| BAD)?;
    if let Some(p) = principal {
        scope = scope.with_principal(p);
    }
    Ok((
        ScopedKey::new(scope, Key::new(key).map_err(|_| BAD)?),
        request_id,
    ))
}

/// The holder an unknown record names: the stored owner, or nobody for the all-zero owner a
/// release as unknown writes.
fn holder(owner: u128) -> Option<OwnerId> {
    (owner != 0).then_some(OwnerId(owner))
}

/// A fence as a script answers it: the record's 20-digit field.
pub(crate) fn parse_fence(raw: &[u8]) -> Result<u64, CodecError> {
    if raw.len() != 20 {
        return Err(BAD);
    }
    number(raw)
}

/// Decodes a stored value into a record, or `None` for a tombstone.
pub(crate) fn decode_record(value: &[u8]) -> Result<Option<Record>, CodecError> {
    let h = Header::parse(value)?;
    if h.is_tombstone() {
        return Ok(None);
    }
    let (key, request_id) = decode_meta(&value[h.meta.clone()])?;
    let state = match h.state {
        b'p' => RecordState::Processing {
            owner: OwnerId(h.owner),
            lease_until: Timestamp(h.lease_until),
        },
        b'c' => RecordState::Completed {
            response: StoredResponse::decode(&value[h.meta.end..])?,
            completed_at: Timestamp(h.since),
        },
        _ => RecordState::Unknown {
            since: Timestamp(h.since),
            owner: holder(h.owner),
        },
    };
    Ok(Some(Record {
        key,
        fingerprint: h.fingerprint.ok_or(BAD)?,
        fence: h.fence,
        request_id,
        created_at: Timestamp(h.created),
        expires_at: Timestamp(h.expires),
        state,
    }))
}

/// The stored form of `record`, as the Lua scripts write it: the inverse of
/// [`decode_record`] on what that returns; `None` for a state this form has no letter for.
/// For the tests and the fuzz targets; the store itself only writes through its scripts.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode_record(record: &Record) -> Option<Vec<u8>> {
    let (state, owner, lease_until, since, response) = match &record.state {
        RecordState::Processing { owner, lease_until } => (b'p', owner.0, lease_until.0, 0, None),
        RecordState::Completed {
            response,
            completed_at,
        } => (b'c', 0, 0, completed_at.0, Some(response)),
        RecordState::Unknown { since, owner } => (b'u', owner.map_or(0, |o| o.0), 0, since.0, None),
        _ => return None,
    };
    let mut out = vec![b'1', b' ', state, b' '];
    push_hex(&mut out, &owner.to_be_bytes());
    out.push(b' ');
    push_decimal(&mut out, record.fence, 20);
    out.push(b' ');
    push_hex(&mut out, &record.fingerprint.to_bytes());
    for n in [lease_until, record.created_at.0, record.expires_at.0, since] {
        out.push(b' ');
        push_decimal(&mut out, n, 13);
    }
    out.push(b' ');
    push_meta_tail(&mut out, &record.key, record.request_id.as_deref());
    if let Some(response) = response {
        out.extend_from_slice(&response.encode());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ScopedKey {
        ScopedKey::new(
            Scope::new("pay").expect("ns").with_principal("u 1"),
            Key::new("k-1").expect("key"),
        )
    }

    fn stored(state: char, tail: &[u8], meta: &[u8]) -> Vec<u8> {
        let fp = Fingerprint::of_bytes(3, b"x");
        let mut v = format!(
            "1 {state} {} 00001700000000000123 {} 0000000005000 0000000001000 0000000090000 0000000003000 {:010}\n",
            owner_hex(OwnerId(7)),
            fingerprint_hex(&fp),
            meta.len()
        )
        .into_bytes();
        v.extend_from_slice(meta);
        v.extend_from_slice(tail);
        v
    }

    #[test]
    fn records_round_trip_through_the_stored_form() {
        let meta = encode_meta(&key(), Some("req-9"));
        let response = StoredResponse::new(201, "made").with_header("x", "y");
        let done = decode_record(&stored('c', &response.encode(), &meta))
            .expect("decodes")
            .expect("live");
        assert_eq!(done.key, key());
        assert_eq!(done.request_id.as_deref(), Some("req-9"));
        assert_eq!(done.fence, 1_700_000_000_000_123);
        assert_eq!(done.expires_at, Timestamp(90_000));
        assert_eq!(
            done.state,
            RecordState::Completed {
                response,
                completed_at: Timestamp(3000)
            }
        );
        let busy = decode_record(&stored('p', b"", &encode_meta(&key(), None)))
            .expect("decodes")
            .expect("live");
        assert_eq!(
            busy.state,
            RecordState::Processing {
                owner: OwnerId(7),
                lease_until: Timestamp(5000)
            }
        );
        assert_eq!(busy.request_id, None);
    }

    #[test]
    fn encoded_records_decode_to_themselves() {
        let meta = encode_meta(&key(), Some("req-9"));
        let response = StoredResponse::new(201, "made").with_header("x", "y");
        for value in [
            stored('c', &response.encode(), &meta),
            stored('p', b"", &meta),
            stored('u', b"", &meta),
        ] {
            let record = decode_record(&value).expect("decodes").expect("live");
            let again = encode_record(&record).expect("a stored state");
            assert_eq!(decode_record(&again), Ok(Some(record)));
        }
    }

    #[test]
    fn unknown_records_name_their_holder_or_nobody() {
        let meta = encode_meta(&key(), None);
        // Marked on an expired lease: the holder's owner stays in the header.
        let held = decode_record(&stored('u', b"", &meta))
            .expect("decodes")
            .expect("live");
        assert_eq!(
            held.state,
            RecordState::Unknown {
                since: Timestamp(3000),
                owner: Some(OwnerId(7))
            }
        );
        assert_eq!(held.created_at, Timestamp(1000));
        // What `held` (lua/prelude.lua) compares at pos 5: the token without its state.
        let raw = stored('u', b"", &meta);
        assert_eq!(
            holder_token(OwnerId(7), held.fence).as_bytes()[2..],
            raw[4..57]
        );
        // Released as unknown: the all-zero owner names nobody.
        let mut given_up = stored('u', b"", &meta);
        given_up[4..36].copy_from_slice(&[b'0'; 32]);
        let given_up = decode_record(&given_up).expect("decodes").expect("live");
        assert_eq!(
            given_up.state,
            RecordState::Unknown {
                since: Timestamp(3000),
                owner: None
            }
        );
        assert_eq!(given_up.fence, held.fence);
        // A processing record's owner is its owner, whatever its bits.
        let mut zero = stored('p', b"", &meta);
        zero[4..36].copy_from_slice(&[b'0'; 32]);
        assert!(matches!(
            decode_record(&zero).expect("decodes").expect("live").state,
            RecordState::Processing {
                owner: OwnerId(0),
                ..
            }
        ));
    }

    #[test]
    fn fences_in_replies_are_the_records_twenty_digits() {
        assert_eq!(
            parse_fence(b"00001700000000000123"),
            Ok(1_700_000_000_000_123)
        );
        assert_eq!(parse_fence(b"18446744073709551615"), Ok(u64::MAX));
        let v = stored('u', b"", &encode_meta(&key(), None));
        assert_eq!(
            parse_fence(&v[37..57]),
            Ok(Header::parse(&v).expect("parses").fence),
            "the bytes the scripts cut (pos 38..57)"
        );
        for bad in [
            &b""[..],
            b"123",
            b"0000170000000000012x",
            b"000017000000000001234",
        ] {
            assert_eq!(parse_fence(bad), Err(BAD), "{bad:?}");
        }
    }

    #[test]
    fn holder_token_is_state_owner_and_padded_fence() {
        let owner = OwnerId::random();
        for fence in [0, 7, 1_764_000_000_000_000, u64::MAX] {
            assert_eq!(
                holder_token(owner, fence),
                format!("p {} {fence:020}", owner_hex(owner))
            );
        }
    }

    #[test]
    fn numbers_are_plain_digits() {
        assert_eq!(number(b"0001764000000000"), Ok(1_764_000_000_000));
        assert_eq!(number(b"18446744073709551615"), Ok(u64::MAX));
        for bad in [&b""[..], b"18446744073709551616", b"+1", b"1 ", b"-1"] {
            assert_eq!(number(bad), Err(BAD), "{bad:?}");
        }
    }

    #[test]
    fn decimals_are_padded_to_their_width_only() {
        let text = |n: u64, width: usize| {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n, width);
            String::from_utf8(out).expect("ascii")
        };
        assert_eq!(text(0, 1), "x0");
        assert_eq!(text(30_000, 1), "x30000");
        assert_eq!(text(7, 20), format!("x{:020}", 7));
        assert_eq!(text(u64::MAX, 20), format!("x{}", u64::MAX));
        assert_eq!(text(u64::MAX, 1), format!("x{}", u64::MAX));
        let mut tail = b"ab".to_vec();
        push_meta_tail(&mut tail, &key(), Some("req-9"));
        assert_eq!(&tail[2..], &encode_meta_tail(&key(), Some("req-9"))[..]);
    }

    #[test]
    fn meta_tail_is_the_padded_length_then_the_meta() {
        let meta = encode_meta(&key(), Some("req-9"));
        let tail = encode_meta_tail(&key(), Some("req-9"));
        let mut expected = format!("{:010}\n", meta.len()).into_bytes();
        expected.extend_from_slice(&meta);
        assert_eq!(tail, expected);
    }

    #[test]
    fn tombstones_read_as_absent_and_garbage_is_refused() {
        let tomb = format!(
            "1 t {} {:020} {} 0000000000000 0000000000000 0000000000000 0000000000000 0000000000\n",
            "0".repeat(32),
            42,
            "0".repeat(68)
        );
        assert_eq!(tomb.len(), 194, "the header width the scripts expect");
        assert_eq!(decode_record(tomb.as_bytes()), Ok(None));
        assert_eq!(Header::parse(tomb.as_bytes()).map(|h| h.fence), Ok(42));
        assert!(decode_record(b"").is_err());
        assert!(decode_record(tomb.replacen('1', "2", 1).as_bytes()).is_err());
        let meta = encode_meta(&key(), None);
        assert_eq!(
            stored('p', b"", &meta).iter().position(|&b| b == b'\n'),
            Some(193)
        );
        assert_eq!(holder_token(OwnerId(7), 5).len(), 55);
        let mut truncated = stored('p', b"", &meta);
        truncated.truncate(truncated.len() - 1);
        assert!(decode_record(&truncated).is_err());
        assert!(decode_record(&stored('c', b"\x09", &meta)).is_err());
    }
}
