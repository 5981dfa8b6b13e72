//! The Redis store's record codec on a stored value, bytes the store reads back from Redis
//! (another writer, an older version or a corrupted key may have put anything there).
//! Decoding never panics, and a value that decodes to a record re-encodes, in the form the
//! Lua scripts write, to a value that decodes to the same record.
#![no_main]

use idem_redis::fuzzing::{decode_record, encode_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(record)) = decode_record(data) else {
        return;
    };
    let stored = encode_record(&record).expect("a decoded record has a stored form");
    assert_eq!(
        decode_record(&stored),
        Ok(Some(record)),
        "round trip through {stored:?}"
    );
});
