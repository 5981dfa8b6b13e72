//! The bytes on the wire: gRPC's length-prefixed messages, and a protobuf field read by
//! field number without the message's schema (for keys taken from the request).

use std::borrow::Cow;

/// One gRPC message of a request or response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Message<'a> {
    /// The compressed flag of the frame header (`grpc-encoding` says how).
    pub(crate) compressed: bool,
    /// The message bytes, without the 5-byte frame header.
    pub(crate) bytes: &'a [u8],
}

/// A body that is not a whole number of gRPC messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Truncated;

/// Splits a gRPC body into its messages.
pub(crate) fn messages(mut body: &[u8]) -> Result<Vec<Message<'_>>, Truncated> {
    let mut out = Vec::with_capacity(1);
    while !body.is_empty() {
        let Some((head, rest)) = body.split_first_chunk::<5>() else {
            return Err(Truncated);
        };
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if rest.len() < len {
            return Err(Truncated);
        }
        let (bytes, rest) = rest.split_at(len);
        out.push(Message {
            compressed: head[0] & 1 == 1,
            bytes,
        });
        body = rest;
    }
    Ok(out)
}

/// Why a protobuf field could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FieldError {
    /// The field appears more than once on its path.
    Repeated,
    /// A field on the path (not the last) is not a length-delimited message.
    NotMessage,
    /// The bytes are not a protobuf message.
    Malformed(&'static str),
}

/// The scalar at `path` in the protobuf message `msg`, as key text: a length-delimited
/// field's bytes as they are (a string or bytes field), a varint or fixed-width number in
/// unsigned decimal. `Ok(None)` when a field on the path is absent, as proto3 leaves a field
/// holding its default value.
///
/// A field that appears twice is refused rather than merged or "last one wins": which one
/// is the key would be ambiguous.
pub(crate) fn field<'a>(msg: &'a [u8], path: &[u32]) -> Result<Option<Cow<'a, [u8]>>, FieldError> {
    let Some((&last, outer)) = path.split_last() else {
        return Ok(None);
    };
    let mut current = msg;
    for &number in outer {
        match find(current, number)? {
            None => return Ok(None),
            Some(Value::Bytes(inner)) => current = inner,
            Some(_) => return Err(FieldError::NotMessage),
        }
    }
    Ok(find(current, last)?.map(|v| match v {
        Value::Bytes(b) => Cow::Borrowed(b),
        Value::Number(n) => Cow::Owned(n.to_string().into_bytes()),
    }))
}

enum Value<'a> {
    Number(u64),
    Bytes(&'a [u8]),
}

/// The one occurrence of field `number` in `msg`.
fn find(mut msg: &[u8], number: u32) -> Result<Option<Value<'_>>, FieldError> {
    let mut found = None;
    while !msg.is_empty() {
        let tag = varint(&mut msg)?;
        let this = u32::try_from(tag >> 3).map_err(|_| FieldError::Malformed("field number"))?;
        let value = match tag & 7 {
            0 => Value::Number(varint(&mut msg)?),
            1 => Value::Number(u64::from_le_bytes(take::<8>(&mut msg)?)),
            2 => {
                let len = usize::try_from(varint(&mut msg)?)
                    .map_err(|_| FieldError::Malformed("length"))?;
                if msg.len() < len {
                    return Err(FieldError::Malformed("truncated field"));
                }
                let (bytes, rest) = msg.split_at(len);
                msg = rest;
                Value::Bytes(bytes)
            }
            5 => Value::Number(u64::from(u32::from_le_bytes(take::<4>(&mut msg)?))),
            _ => return Err(FieldError::Malformed("unsupported wire type (groups)")),
        };
        if this == number {
            if found.is_some() {
                return Err(FieldError::Repeated);
            }
            found = Some(value);
        }
    }
    Ok(found)
}

fn varint(msg: &mut &[u8]) -> Result<u64, FieldError> {
    let mut value = 0u64;
    for i in 0..10 {
        let Some((&b, rest)) = msg.split_first() else {
            return Err(FieldError::Malformed("truncated varint"));
        };
        *msg = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(FieldError::Malformed("varint longer than 10 bytes"))
}

fn take<const N: usize>(msg: &mut &[u8]) -> Result<[u8; N], FieldError> {
    let Some((head, rest)) = msg.split_first_chunk::<N>() else {
        return Err(FieldError::Malformed("truncated fixed-width field"));
    };
    *msg = rest;
    Ok(*head)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{ 1: { 1: "o-7", 2: 300 }, 2: -5 (int64), 7: fixed32 9 }`
    fn sample() -> Vec<u8> {
        let order = [&[0x0a, 3][..], b"o-7", &[0x10, 0xac, 0x02]].concat();
        let mut m = vec![0x0a, order.len() as u8];
        m.extend_from_slice(&order);
        m.extend_from_slice(&[
            0x10, 0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ]);
        m.extend_from_slice(&[0x3d, 9, 0, 0, 0]);
        m
    }

    #[test]
    fn fields_are_read_by_number_path() {
        let m = sample();
        assert_eq!(field(&m, &[1, 1]), Ok(Some(Cow::Borrowed(&b"o-7"[..]))));
        assert_eq!(
            field(&m, &[1, 2]).expect("ok").as_deref(),
            Some(&b"300"[..])
        );
        assert_eq!(
            field(&m, &[2]).expect("ok").as_deref(),
            Some(&b"18446744073709551611"[..]),
            "an int64 reads as its unsigned two's complement"
        );
        assert_eq!(field(&m, &[7]).expect("ok").as_deref(), Some(&b"9"[..]));
        assert_eq!(field(&m, &[3]), Ok(None));
        assert_eq!(field(&m, &[1, 9]), Ok(None));
        assert_eq!(field(&m, &[2, 1]), Err(FieldError::NotMessage));
        let twice = [m.clone(), m.clone()].concat();
        assert_eq!(field(&twice, &[7]), Err(FieldError::Repeated));
        assert!(matches!(
            field(&m[..m.len() - 1], &[7]),
            Err(FieldError::Malformed(_))
        ));
        assert!(matches!(
            field(&[0x0b], &[1]),
            Err(FieldError::Malformed(_))
        ));
        assert!(matches!(
            field(&[&[0x08][..], &[0xff; 11]].concat(), &[1]),
            Err(FieldError::Malformed(_))
        ));
    }

    #[test]
    fn bodies_split_into_messages() {
        let body = [&[0, 0, 0, 0, 2][..], b"hi", &[1, 0, 0, 0, 0]].concat();
        let got = messages(&body).expect("whole");
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].compressed, got[0].bytes), (false, &b"hi"[..]));
        assert!(got[1].compressed && got[1].bytes.is_empty());
        assert_eq!(messages(&body[..6]), Err(Truncated));
        assert_eq!(messages(&body[..3]), Err(Truncated));
        assert_eq!(messages(&[]), Ok(vec![]));
    }
}
