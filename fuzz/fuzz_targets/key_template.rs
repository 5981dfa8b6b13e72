//! A key template and the values of its fields: parsing and rendering never panic; a rendered
//! key is 1-255 printable ASCII; two values that differ render two different keys (the
//! escaping leaves no way for a value to imitate the template's literal text).
#![no_main]

use idem_core::key_source::{KeyInputs, KeySourceError, KeySources};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Every field looks up the same value.
struct Same<'a>(&'a str, Value);

impl KeyInputs for Same<'_> {
    fn header(&self, _name: &str) -> Result<Option<&[u8]>, KeySourceError> {
        Ok(Some(self.0.as_bytes()))
    }
    fn json(&self) -> Option<&Value> {
        Some(&self.1)
    }
    fn path_param(&self, _name: &str) -> Option<&str> {
        Some(self.0)
    }
    fn query(&self, _name: &str) -> Result<Option<&str>, KeySourceError> {
        Ok(Some(self.0))
    }
}

fn render(sources: &KeySources, value: &str) -> Option<String> {
    let doc = serde_json::json!({ "a": value, "b": { "c": value } });
    match sources.resolve(&Same(value, doc)) {
        Ok(Some(found)) => {
            let k = found.key.as_str();
            assert!(!k.is_empty() && k.len() <= 255, "bad length {}", k.len());
            assert!(k.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{k:?}");
            Some(k.to_owned())
        }
        Ok(None) | Err(_) => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, '\n');
    let (Some(template), Some(v1), Some(v2)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let Ok(sources) = KeySources::parse(&[template]) else {
        return;
    };
    if let (Some(k1), Some(k2)) = (render(&sources, v1), render(&sources, v2)) {
        if v1 != v2 {
            assert_ne!(k1, k2, "{template:?}: {v1:?} and {v2:?} rendered alike");
        }
    }
});
