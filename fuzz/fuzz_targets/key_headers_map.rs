//! Whole header maps through `HeaderKey` (with both aliases): never panics, and a key is
//! only ever found when exactly one key header instance was sent.
#![no_main]

use idem_http::policy::{ExtractKey, HeaderKey, X_IDEMPOTENCY_KEY, X_REQUEST_ID};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 4] = ["idempotency-key", "x-idempotency-key", "x-request-id", "content-type"];

fuzz_target!(|data: &[u8]| {
    // Input: records of [name selector byte, len byte, value bytes...].
    let mut req = http::Request::builder().method("POST").uri("/");
    let mut key_headers = 0;
    let mut rest = data;
    while let [sel, len, tail @ ..] = rest {
        let n = (*len as usize).min(tail.len());
        let (value, next) = tail.split_at(n);
        rest = next;
        let Ok(value) = http::HeaderValue::from_bytes(value) else { continue };
        let name = NAMES[*sel as usize % NAMES.len()];
        if name != "content-type" {
            key_headers += 1;
        }
        req = req.header(name, value);
    }
    let Ok(req) = req.body(()) else { return };
    let (parts, ()) = req.into_parts();
    let extract = HeaderKey::new().with_alias(X_IDEMPOTENCY_KEY).with_alias(X_REQUEST_ID);
    match extract.extract(&parts) {
        Ok(Some(found)) => {
            assert_eq!(key_headers, 1);
            assert!(!found.key.as_str().is_empty());
        }
        Ok(None) => assert_eq!(key_headers, 0),
        Err(_) => assert!(key_headers >= 1),
    }
});
