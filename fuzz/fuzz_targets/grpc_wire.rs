//! The gRPC wire readers idem-grpc runs on request bytes: the body's message framing and the
//! protobuf field reader that takes a key from a message. Neither panics; accepted frames
//! tile the body exactly; a field found is a slice of the message (or a number's decimal);
//! and any bytes written as a field at a path read back unchanged, while the same field
//! twice is refused as ambiguous.
#![no_main]

use std::borrow::Cow;

use idem_grpc::fuzzing::{field, messages};
use libfuzzer_sys::fuzz_target;

/// Appends `n` as a protobuf varint.
fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// `value` as a length-delimited field at `path`, each outer number wrapping the next.
fn at_path(path: &[u32], value: &[u8]) -> Vec<u8> {
    let mut inner = value.to_vec();
    for &number in path.iter().rev() {
        let mut out = Vec::with_capacity(inner.len() + 12);
        varint(&mut out, (u64::from(number) << 3) | 2);
        varint(&mut out, inner.len() as u64);
        out.extend_from_slice(&inner);
        inner = out;
    }
    inner
}

/// Whether `part` lies inside `whole` (a borrowed answer points into the message).
fn within(whole: &[u8], part: &[u8]) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

fuzz_target!(|data: &[u8]| {
    // Framing: the accepted messages, each a 5-byte header and its bytes, are the body.
    if let Some(split) = messages(data) {
        let mut at = 0;
        for (compressed, bytes) in split {
            let head = &data[at..at + 5];
            assert_eq!(compressed, head[0] & 1 == 1);
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            assert_eq!(len, bytes.len());
            assert_eq!(&data[at + 5..at + 5 + len], bytes);
            at += 5 + len;
        }
        assert_eq!(at, data.len(), "frames do not cover the body");
    }

    // The field reader: the first byte picks a path of 1-3 field numbers (1-4 each).
    let Some((&select, msg)) = data.split_first() else {
        return;
    };
    let depth = usize::from(select & 3) % 3 + 1;
    let path: Vec<u32> = (0..depth)
        .map(|i| u32::from((select >> (2 + 2 * i)) & 3) + 1)
        .collect();
    match field(msg, &path) {
        Ok(Some(Cow::Borrowed(b))) => assert!(within(msg, b), "answer outside the message"),
        Ok(Some(Cow::Owned(n))) => {
            let text = std::str::from_utf8(&n).expect("a number is ASCII");
            assert!(text.parse::<u64>().is_ok(), "not a decimal: {text:?}");
        }
        Ok(None) | Err(_) => {}
    }

    // Round trip: the rest of the input written at the path reads back as itself.
    let encoded = at_path(&path, msg);
    match field(&encoded, &path) {
        Ok(Some(got)) => assert_eq!(&*got, msg, "round trip at {path:?}"),
        other => panic!("written at {path:?}, read {other:?}"),
    }
    // Twice at the path: which one is the key would be ambiguous, so it is refused.
    let twice = [encoded.as_slice(), encoded.as_slice()].concat();
    assert!(
        field(&twice, &path).is_err(),
        "a repeated field was accepted at {path:?}"
    );
});
