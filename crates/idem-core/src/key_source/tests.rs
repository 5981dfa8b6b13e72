//! Unit tests of key sources.

use std::collections::HashMap;

use serde_json::json;

use super::*;

#[derive(Default)]
struct Req {
    headers: HashMap<String, Vec<Vec<u8>>>,
    body: Option<Value>,
    raw: Option<Vec<u8>>,
    params: HashMap<String, String>,
    query: HashMap<String, Vec<String>>,
}

impl KeyInputs for Req {
    fn header(&self, name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        match self.headers.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([one]) => Ok(Some(one)),
            Some(_) => Err(KeySourceError::Repeated(name.into())),
        }
    }
    fn json(&self) -> Option<&Value> {
        self.body.as_ref()
    }
    fn json_bytes(&self) -> Option<&[u8]> {
        self.raw.as_deref()
    }
    fn path_param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
    fn query(&self, name: &str) -> Result<Option<&str>, KeySourceError> {
        match self.query.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([one]) => Ok(Some(one)),
            Some(_) => Err(KeySourceError::Repeated(name.into())),
        }
    }
}

fn key(sources: &[&str], req: &Req) -> Result<Option<String>, KeySourceError> {
    KeySources::parse(sources)?
        .resolve(req)
        .map(|f| f.map(|f| f.key.as_str().to_owned()))
}

#[test]
fn sources_are_tried_in_order() {
    let mut req = Req {
        body: Some(json!({"order": {"id": "o-42"}})),
        ..Req::default()
    };
    let sources = ["header:idempotency-key", "json:order.id"];
    assert_eq!(key(&sources, &req), Ok(Some("o-42".into())));
    req.headers
        .insert("idempotency-key".into(), vec![b"client-key".to_vec()]);
    assert_eq!(key(&sources, &req), Ok(Some("client-key".into())));
    assert_eq!(key(&["json:missing"], &Req::default()), Ok(None));
}

#[test]
fn templates_join_fields_with_the_operation() {
    let req = Req {
        body: Some(json!({"order": {"id": 42, "paid": true}})),
        params: HashMap::from([("id".into(), "A-7".into())]),
        query: HashMap::from([("v".into(), vec!["2".into()])]),
        ..Req::default()
    };
    assert_eq!(key(&["{path.id}:pay"], &req), Ok(Some("A-7:pay".into())));
    assert_eq!(
        key(&["{json.order.id}-{json.order.paid}/{query.v}"], &req),
        Ok(Some("42-true/2".into()))
    );
    assert_eq!(key(&["{{{path.id}}}"], &req), Ok(Some("{A-7}".into())));
    // A missing field makes the whole template absent.
    assert_eq!(key(&["{path.nope}:pay"], &req), Ok(None));
}

#[test]
fn values_cannot_imitate_the_literal_text() {
    let req = |id: &str, op: &str| Req {
        params: HashMap::from([("a".into(), id.into()), ("b".into(), op.into())]),
        ..Req::default()
    };
    let a = key(&["{path.a}:{path.b}"], &req("x:y", "z"));
    let b = key(&["{path.a}:{path.b}"], &req("x", "y:z"));
    assert_ne!(a, b);
    assert_eq!(a, Ok(Some("x%3Ay:z".into())));
    assert_eq!(
        key(&["path:a"], &req("order 42 é%", "")),
        Ok(Some("order%2042%20%C3%A9%25".into()))
    );
}

#[test]
fn bad_fields_are_named() {
    let req = Req {
        body: Some(json!({"order": {"id": {"nested": 1}, "blank": "", "long": "x".repeat(300)}})),
        query: HashMap::from([("k".into(), vec!["1".into(), "2".into()])]),
        headers: HashMap::from([("idempotency-key".into(), vec![b"a".to_vec(), b"b".to_vec()])]),
        ..Req::default()
    };
    assert_eq!(
        key(&["json:order.id"], &req),
        Err(KeySourceError::NotScalar("order.id".into()))
    );
    assert!(matches!(
        key(&["json:order.blank"], &req),
        Err(KeySourceError::Empty(_))
    ));
    assert!(matches!(
        key(&["json:order.long"], &req),
        Err(KeySourceError::TooLong { len: 300, .. })
    ));
    assert_eq!(
        key(&["query:k"], &req),
        Err(KeySourceError::Repeated("k".into()))
    );
    assert!(
        matches!(
            key(&["header:idempotency-key", "json:order.blank"], &req),
            Err(KeySourceError::Repeated(_))
        ),
        "a bad first source is not replaced by a later one"
    );
}

#[test]
fn source_texts_parse_or_say_why() {
    for bad in [
        "",
        "json:",
        "json:a..b",
        "cookie:x",
        "{nope}",
        "{path.id",
        "x}",
        "plain",
    ] {
        assert!(KeySource::parse(bad).is_err(), "{bad:?}");
    }
    let t = KeySource::parse("{path.id}:{json.a.b}").expect("template");
    assert!(t.needs_body());
    assert_eq!(t.path_params(), vec!["id"]);
    assert!(
        !KeySource::parse("header:X-Key")
            .expect("header")
            .needs_body()
    );
    assert_eq!(
        KeySources::parse(&["header:idempotency-key", "json:order.id"])
            .expect("sources")
            .to_string(),
        "header idempotency-key, else JSON field order.id"
    );
}

/// A request that holds only protobuf fields, by path.
struct Proto(HashMap<Vec<u32>, Vec<u8>>);

impl KeyInputs for Proto {
    fn header(&self, _name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        Ok(None)
    }
    fn json(&self) -> Option<&Value> {
        None
    }
    fn path_param(&self, _name: &str) -> Option<&str> {
        None
    }
    fn query(&self, _name: &str) -> Result<Option<&str>, KeySourceError> {
        Ok(None)
    }
    fn proto_field(&self, path: &FieldNumbers) -> Result<Option<Cow<'_, [u8]>>, KeySourceError> {
        Ok(self.0.get(path.numbers()).map(|v| Cow::Borrowed(&v[..])))
    }
}

#[test]
fn protobuf_fields_by_number_path() {
    let req = Proto(HashMap::from([(vec![1, 1], b"order 7".to_vec())]));
    let k = |s: &[&str]| {
        KeySources::parse(s)
            .and_then(|s| s.resolve(&req))
            .map(|f| f.map(|f| f.key.as_str().to_owned()))
    };
    assert_eq!(k(&["proto:1.1"]), Ok(Some("order%207".into())));
    assert_eq!(k(&["{proto.1.1}:pay"]), Ok(Some("order%207:pay".into())));
    assert_eq!(k(&["proto:2"]), Ok(None));
    assert!(KeySource::parse("proto:1.2").is_ok_and(|s| s.needs_body()));
    assert!(Template::parse("{proto.1}").is_ok_and(|t| t.needs_body()));
    for bad in [
        "proto:",
        "proto:0",
        "proto:1..2",
        "proto:x",
        "proto:536870912",
    ] {
        assert!(
            matches!(KeySource::parse(bad), Err(KeySourceError::BadSource(..))),
            "{bad}"
        );
    }
    // Carriers without protobuf messages find nothing there.
    assert_eq!(key(&["proto:1"], &Req::default()), Ok(None));
}

/// A request whose JSON body is `text`.
fn json_req(text: &str) -> Req {
    Req {
        body: Some(serde_json::from_str(text).expect("JSON")),
        raw: Some(text.as_bytes().to_vec()),
        ..Req::default()
    }
}

// Security issue 28: numbers serde_json holds as f64 (fractions, exponents, integers beyond
// u64/i64) gave one key to different values, so the second request got 422 instead of running.
#[test]
fn json_numbers_become_keys_exactly() {
    let k = |source: &str, body: &str| key(&[source], &json_req(body));
    for (a, b) in [
        ("10000000000000000000001", "10000000000000000000002"),
        ("0.1", "0.1000000000000000000001"),
        ("-18446744073709551616", "-18446744073709551617"),
        ("9007199254740993.0", "9007199254740992.0"),
    ] {
        let (ka, kb) = (
            k("json:n", &format!(r#"{{"n": {a}}}"#)),
            k("json:n", &format!(r#"{{"n": {b}}}"#)),
        );
        assert!(ka.is_ok() && kb.is_ok(), "{a}: {ka:?}, {b}: {kb:?}");
        assert_ne!(ka, kb, "{a} and {b} are different values");
        let (ta, tb) = (
            k("{json.n}:pay", &format!(r#"{{"n": {a}}}"#)),
            k("{json.n}:pay", &format!(r#"{{"n": {b}}}"#)),
        );
        assert_ne!(ta, tb, "{a} and {b} in a template");
    }
    // What f64 holds exactly keeps the text it always had; integers are plain digits.
    for (body, want) in [
        (r#"{"n": 42}"#, "42"),
        (r#"{"n": -7}"#, "-7"),
        (r#"{"n": 18446744073709551615}"#, "18446744073709551615"),
        (r#"{"n": -9223372036854775808}"#, "-9223372036854775808"),
        (r#"{"n": 12.5}"#, "12.5"),
        (r#"{"n": 0.1}"#, "0.1"),
        (r#"{"n": -2.5e-8}"#, "-2.5e-8"),
        (r#"{"n": 1e2}"#, "100.0"),
        (r#"{"n": 1.0}"#, "1.0"),
        (r#"{"n": 10000000000000000000000}"#, "1e+22"),
    ] {
        assert_eq!(k("json:n", body), Ok(Some(want.into())), "{body}");
    }
    // What it does not: the exact canonical decimal, from the digits as written.
    for (source, body, want) in [
        (
            "json:n",
            r#"{"n": 10000000000000000000001}"#,
            "1.0000000000000000000001e22",
        ),
        (
            "json:n",
            r#"{"n": 0.1000000000000000000001}"#,
            "1.000000000000000000001e-1",
        ),
        // An integer within u64 that was written as a fraction: its plain digits.
        ("json:n", r#"{"n": 9007199254740993.0}"#, "9007199254740993"),
        // Member names compare decoded; the text is the number alone, without spaces.
        (
            "json:o.order",
            r#"{"o": {"ord\u0065r" : 1.00000000000000000001 }}"#,
            "1.00000000000000000001e0",
        ),
    ] {
        assert_eq!(k(source, body), Ok(Some(want.into())), "{body}");
    }
}

#[test]
fn numbers_that_cannot_be_checked_are_refused() {
    let inexact = || Err(KeySourceError::InexactNumber("n".into()));
    // Without the bytes, an f64 cannot be checked; an integer needs none.
    let bare = |text: &str| Req {
        body: Some(serde_json::from_str(text).expect("JSON")),
        ..Req::default()
    };
    assert_eq!(key(&["json:n"], &bare(r#"{"n": 12.5}"#)), inexact());
    assert_eq!(key(&["{json.n}:pay"], &bare(r#"{"n": 1e2}"#)), inexact());
    assert_eq!(
        key(&["json:n"], &bare(r#"{"n": 42}"#)),
        Ok(Some("42".into()))
    );
    // Bytes that are not the document the number came from.
    let mismatched = |raw: &str| Req {
        raw: Some(raw.as_bytes().to_vec()),
        ..bare(r#"{"n": 0.5}"#)
    };
    for raw in [
        r#"{"n": 0.25}"#,
        r#"{"n": "0.5"}"#,
        r#"{"m": 0.5}"#,
        r#"[0.5]"#,
        r#"{"n": 0.5"#,
        "",
    ] {
        assert_eq!(key(&["json:n"], &mismatched(raw)), inexact(), "{raw:?}");
    }
    // A member named twice: which one the document kept is not known, so nothing is guessed.
    assert_eq!(
        key(&["json:o.n"], &json_req(r#"{"o": {"n": 0.5, "n": 0.5}}"#)),
        Err(KeySourceError::Repeated("o.n".into()))
    );
    assert_eq!(
        key(
            &["json:o.n"],
            &json_req(r#"{"o": {"n": 0.5}, "o": {"n": 0.5}}"#)
        ),
        Err(KeySourceError::Repeated("o.n".into()))
    );
    // Other members, repeated or deep, are skipped unread.
    assert_eq!(
        key(
            &["json:o.n"],
            &json_req(r#"{"x": 1, "x": [{"y": {}}], "o": {"m": 1, "m": 2, "n": 0.5}}"#)
        ),
        Ok(Some("0.5".into()))
    );
}
