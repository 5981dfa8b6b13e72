//! A request path through the gateway's normaliser: never panics; an accepted path is
//! absolute, has no empty, `.` or `..` segment, no escape of an unreserved character, no `;`,
//! `\` or encoded separator, and is a fixed point; the borrowed fast path agrees with the
//! rewrite.
#![no_main]

use idem_gateway::path::{TrailingSlash, normalize};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    for trailing in [TrailingSlash::Ignore, TrailingSlash::Strict] {
        let Ok(once) = normalize(path, trailing) else {
            continue;
        };
        assert!(once.starts_with('/'), "{path:?} -> {once:?}");
        assert!(!once.contains(['\\', ';']), "{path:?} -> {once:?}");
        let body = &once[1..];
        let segments: Vec<&str> = body.split('/').collect();
        for (i, s) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            assert!(*s != "." && *s != "..", "{path:?} -> {once:?}");
            let empty_ok = last && (once == "/" || trailing == TrailingSlash::Strict);
            assert!(!s.is_empty() || empty_ok, "{path:?} -> {once:?}");
        }
        let bytes = once.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'%' {
                let hex = &bytes[i + 1..i + 3];
                assert!(hex.iter().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)));
                let v = u8::from_str_radix(std::str::from_utf8(hex).unwrap_or("00"), 16).unwrap_or(0);
                assert!(
                    !(v.is_ascii_alphanumeric() || b"-._~/\\\0".contains(&v)),
                    "{path:?} -> {once:?}"
                );
            }
        }
        let twice = normalize(&once, trailing).map(|c| c.into_owned());
        assert_eq!(twice.as_deref(), Ok(&*once), "not a fixed point: {path:?}");
    }
});
