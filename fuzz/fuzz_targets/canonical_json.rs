//! Canonical JSON: never panics; the canonical form is valid JSON, is a fixed point
//! (canonicalising it again changes nothing) and means the same value as the input; and the
//! one-pass canonicaliser agrees byte for byte with the serde_json-tree reference (both refuse
//! the same inputs, duplicate member names included).
#![no_main]

use idem_core::canonical_json;
use idem_core::fingerprint::canonical_json_tree;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fast = canonical_json(data);
    let tree = canonical_json_tree(data);
    assert_eq!(fast.is_ok(), tree.is_ok(), "the two paths disagree on acceptance");
    let Ok(canon) = fast else { return };
    assert_eq!(Ok(&canon), tree.as_ref(), "the two paths disagree on the canonical form");
    let again = canonical_json(&canon).expect("canonical form must parse");
    assert_eq!(canon, again, "canonical form is not a fixed point");
    // serde_json's tree refuses numbers beyond f64 (1e400), which canonical JSON keeps exactly.
    let Ok(original) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let reparsed: serde_json::Value = serde_json::from_slice(&canon).expect("canonical form parses");
    // Numbers may change spelling (1.0 -> 1); compare structure with numbers as f64.
    assert!(same(&original, &reparsed), "canonical form changed the value");
});

fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x.is_nan() && y.is_nan()),
            _ => x == y,
        },
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
        (Object(x), Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
        _ => a == b,
    }
}
