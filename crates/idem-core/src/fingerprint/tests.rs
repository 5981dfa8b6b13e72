//! Unit tests of fingerprints and canonical JSON.

use super::*;

fn canon(s: &str) -> String {
    String::from_utf8(canonical_json(s.as_bytes()).expect("json")).expect("utf8")
}

#[test]
fn key_order_and_whitespace_do_not_matter() {
    assert_eq!(
        canon(r#"{"b":1,"a":[1, 2,{"d":1,"c":2}]}"#),
        r#"{"a":[1,2,{"c":2,"d":1}],"b":1}"#
    );
    assert_eq!(canon(" {\n\"a\" : 1.0 } "), r#"{"a":1}"#);
    assert_eq!(canon(r#"{"a":1.5}"#), canon(r#"{"a":15e-1}"#));
    assert_ne!(canon(r#"{"a":"1"}"#), canon(r#"{"a":1}"#));
}

/// Regression: numbers went through f64, so distinct values beyond its precision had one
/// canonical form; and of duplicate members the last silently won.
#[test]
fn numbers_are_exact_and_duplicates_are_refused() {
    assert_ne!(
        canon("10000000000000000000001"),
        canon("10000000000000000000002")
    );
    assert_eq!(canon("9007199254740993"), canon("9007199254740993.0"));
    assert_ne!(canon("0.30000000000000001"), canon("0.3"));
    for body in [r#"{"amount":1,"amount":9}"#, r#"{"a":{"b":1,"\u0062":2}}"#] {
        for got in [
            canonical_json(body.as_bytes()),
            canonical_json_tree(body.as_bytes()),
            canonical_json_filtered(body.as_bytes(), &JsonFields::all().exclude(["x"])),
        ] {
            assert!(
                matches!(&got, Err(FingerprintError::DuplicateMember(_))),
                "{body}: {got:?}"
            );
        }
    }
}

#[test]
fn invalid_json_is_an_error() {
    assert!(matches!(
        canonical_json(b"{"),
        Err(FingerprintError::Json(_))
    ));
}

#[test]
fn include_and_exclude() {
    let body = br#"{"amount":10,"meta":{"ts":1,"id":2},"note":"x"}"#;
    let only = JsonFields::all().include(["amount", "meta.id"]);
    let got = canonical_json_filtered(body, &only).expect("json");
    assert_eq!(got, br#"{"amount":10,"meta":{"id":2}}"#);
    let without = JsonFields::all().exclude(["meta.ts", "note"]);
    let got = canonical_json_filtered(body, &without).expect("json");
    assert_eq!(got, br#"{"amount":10,"meta":{"id":2}}"#);
}

#[test]
fn fingerprints_round_trip_and_separate_parts() {
    let a = Fingerprint::http_raw(1, "POST", "/a", b"xy");
    let b = Fingerprint::http_raw(1, "POST", "/ax", b"y");
    assert_ne!(a, b);
    assert_ne!(a, Fingerprint::http_raw(2, "POST", "/a", b"xy"));
    assert_eq!(Fingerprint::from_bytes(&a.to_bytes()), Ok(a));
    assert_eq!(a.to_string().parse::<Fingerprint>(), Ok(a));
    assert!("v1:zz".parse::<Fingerprint>().is_err());
}

/// The one-pass path and the tree path agree: both refuse, or both write the same bytes.
fn same_as_tree(body: &[u8]) {
    let fast = canonical_json(body);
    let tree = canonical_json_tree(body);
    match (&fast, &tree) {
        (Ok(a), Ok(b)) => assert_eq!(
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b),
            "input {:?}",
            String::from_utf8_lossy(body)
        ),
        (Err(_), Err(_)) => {}
        _ => panic!(
            "paths disagree on {:?}: one-pass {fast:?}, tree {tree:?}",
            String::from_utf8_lossy(body)
        ),
    }
}

/// Texts on the edges of the JSON grammar: empty, truncated, trailing commas, literals,
/// numbers at the limits of i64/u64/f64, escapes and surrogates, duplicate members.
const EDGE_CASES: &[&str] = &[
    "",
    " ",
    "{",
    "}",
    "[",
    "]",
    "[,]",
    "[1,]",
    "{\"a\":1,}",
    "{,}",
    "{\"a\"}",
    "{\"a\":}",
    "{1:2}",
    "nul",
    "nulls",
    "truex",
    "false",
    "null",
    " true ",
    "\u{feff}{}",
    "0",
    "-0",
    "-0.0",
    "00",
    "01",
    "-",
    "-a",
    "1.",
    ".5",
    "1e",
    "1e+",
    "1E-2",
    "1.5e3",
    "1e400",
    "-1e400",
    "1e-400",
    "123456789012345678",
    "1234567890123456789",
    "-123456789012345678",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    "4.0",
    "4.5",
    "0.1",
    "1e2",
    "9007199254740993",
    "9007199254740993.0",
    "2.5e-8",
    r#""a""#,
    r#""\u0061""#,
    r#""\/""#,
    r#""\ud83d\ude00""#,
    r#""\ud800""#,
    r#""\udc00x""#,
    r#""\x""#,
    r#""\"#,
    "\"a\u{1}\"",
    "\"tab\there\"",
    "\"\u{7f}\"",
    r#""\u0000""#,
    r#""é""#,
    r#""\u00e9""#,
    r#"{"b":1,"a":2}"#,
    r#"{"a":1,"a":2}"#,
    r#"{"a":1,"\u0061":2}"#,
    r#"{"b":{"d":[3,{"z":0,"y":1}],"c":null},"a":[true,false]}"#,
    r#"{"a":1,"b":2,"a":3,"c":{"x":1,"x":{"q":2}}}"#,
    r#"{"é":1,"e":2,"f":3}"#,
    "[1, 2 ,3\n,\t4\r]",
    "{ \"k\" : [ ] , \"j\" : { } }",
    "[1 2]",
    "[\"a\" \"b\"]",
    "{\"a\":1 \"b\":2}",
    "[1]x",
    "[1] [2]",
];

#[test]
fn one_pass_matches_the_tree_on_edge_cases() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let deep_obj = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    let cases: Vec<Vec<u8>> = EDGE_CASES
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([
            deep(126).into_bytes(),
            deep(127).into_bytes(),
            deep(128).into_bytes(),
            deep_obj(127).into_bytes(),
            deep_obj(128).into_bytes(),
            b"\"\xff\"".to_vec(),
            b"{\"\xc3\":1}".to_vec(),
            b"[\"ok\",\xe2\x82]".to_vec(),
        ])
        .collect();
    for case in &cases {
        same_as_tree(case);
    }
    for twice in [r#"{"a":1,"\u0061":2}"#, r#"{"b":1,"a":2,"b":3}"#] {
        assert_eq!(
            canonical_json(twice.as_bytes()),
            Err(FingerprintError::DuplicateMember(
                if twice.contains('b') { "b" } else { "a" }.to_owned()
            ))
        );
    }
    assert!(canonical_json(deep(127).as_bytes()).is_ok());
    assert!(canonical_json(deep(128).as_bytes()).is_err());
}

#[test]
fn the_builder_hashes_what_it_always_hashed() {
    // The digest is blake3 over: tag, version, then each part as (len, name, len, value).
    let big = vec![7u8; 10_000];
    for value in [&b"small"[..], &big[..]] {
        let mut h = blake3::Hasher::new();
        h.update(b"idem.fingerprint");
        h.update(&3u16.to_le_bytes());
        for piece in [&b"first"[..], b"x", b"second", value] {
            h.update(&(piece.len() as u64).to_le_bytes());
            h.update(piece);
        }
        let fp = Fingerprint::builder(3)
            .part("first", b"x")
            .part("second", value)
            .finish();
        assert_eq!(fp.digest(), h.finalize().as_bytes());
    }
    // The one-pass JSON part is the same part the tree path would add.
    let body = br#"{"z": [1, 2.50], "a": "x"}"#;
    let tree = canonical_json_tree(body).expect("json");
    let expected = Fingerprint::builder(1)
        .part("method", b"POST")
        .part("route", b"/r")
        .part("json", &tree)
        .finish();
    let got = Fingerprint::http_json(1, "POST", "/r", body, &JsonFields::all()).expect("json");
    assert_eq!(got, expected);
}

mod differential {
    use proptest::prelude::*;
    use serde_json::Value;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
            "[a-c\"\\\\\u{1}\u{e9}]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-d]{0,2}", inner), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes `v` with random whitespace, member order, number spellings (`1.0`, `10e-1`)
    /// that mean the same, and sometimes a duplicated member (`dup` is then set).
    fn spell(v: &Value, noise: &mut impl Iterator<Item = u8>, out: &mut String, dup: &mut bool) {
        let ws = |out: &mut String, n: &mut dyn Iterator<Item = u8>| match n.next().unwrap_or(0) % 6
        {
            0 => out.push(' '),
            1 => out.push_str("\n\t"),
            _ => {}
        };
        match v {
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(out, noise);
                    spell(item, noise, out, dup);
                    ws(out, noise);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut members: Vec<_> = map.iter().collect();
                if noise.next().unwrap_or(0).is_multiple_of(2) {
                    members.reverse();
                }
                out.push('{');
                let mut first = true;
                for (name, item) in members {
                    // Sometimes an earlier duplicate, which makes the document ambiguous.
                    let twice = noise.next().unwrap_or(0).is_multiple_of(5);
                    *dup |= twice;
                    for value in [twice.then_some(&Value::Null), Some(item)]
                        .into_iter()
                        .flatten()
                    {
                        if !first {
                            out.push(',');
                        }
                        first = false;
                        ws(out, noise);
                        out.push_str(&serde_json::to_string(name).unwrap_or_default());
                        ws(out, noise);
                        out.push(':');
                        spell(value, noise, out, dup);
                    }
                }
                out.push('}');
            }
            Value::Number(n) if n.as_i64().is_some_and(|i| i.abs() < 1000) => {
                let i = n.as_i64().unwrap_or(0);
                match noise.next().unwrap_or(0) % 3 {
                    0 => out.push_str(&format!("{i}.0")),
                    1 => out.push_str(&format!("{}e-1", i * 10)),
                    _ => out.push_str(&i.to_string()),
                }
            }
            other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn respelled_documents_agree(v in json(), noise in prop::collection::vec(any::<u8>(), 64)) {
            let (mut text, mut dup) = (String::new(), false);
            spell(&v, &mut noise.iter().copied().cycle(), &mut text, &mut dup);
            super::same_as_tree(text.as_bytes());
            let got = super::canonical_json(text.as_bytes());
            if dup {
                // A member given twice is refused, never resolved one way or the other.
                prop_assert!(matches!(got, Err(super::FingerprintError::DuplicateMember(_))));
            } else {
                // Every spelling of the same document has the same canonical form.
                let plain = serde_json::to_vec(&v).unwrap_or_default();
                prop_assert_eq!(got.ok(), super::canonical_json(&plain).ok());
            }
        }

        #[test]
        fn damaged_documents_agree(
            v in json(),
            cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
            for (at, byte) in cuts {
                if bytes.is_empty() { break; }
                let i = at.index(bytes.len());
                match byte % 3 {
                    0 => bytes[i] = byte,
                    1 => { bytes.truncate(i); }
                    _ => bytes.insert(i, b"{}[],:\"\\-.eE0 "[usize::from(byte) % 14]),
                }
            }
            super::same_as_tree(&bytes);
        }
    }
}
