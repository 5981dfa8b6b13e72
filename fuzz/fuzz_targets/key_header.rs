//! One `Idempotency-Key` header value: parsing never panics, an accepted key is 1-255
//! printable ASCII characters, and writing it back as an sf-string parses to the same key.
#![no_main]

use idem_http::key::{parse_key, to_sf_string};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = parse_key(data) {
        let s = key.as_str();
        assert!(!s.is_empty() && s.len() <= 255, "bad length {}", s.len());
        assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)), "non-printable byte in {s:?}");
        let quoted = to_sf_string(&key);
        assert_eq!(parse_key(quoted.as_bytes()).as_ref(), Ok(&key), "sf-string round trip of {s:?}");
        // A bare key without quote, backslash or comma parses to itself too.
        if !s.contains(['"', '\\', ',']) {
            assert_eq!(parse_key(s.as_bytes()).as_ref(), Ok(&key), "bare round trip of {s:?}");
        }
    }
});
