//! `json_depth` (the one-pass byte scan run before a body is parsed) against `value_depth`
//! (the walk of the parsed value) and against the depth of the text as the parser reads it.
//!
//! On any bytes it never panics. On a text serde_json parses, it equals the depth the parser
//! sees, every key included, so it never under-counts what `value_depth` finds (which can be
//! less: of duplicate keys the parsed object keeps the last); on the compact text of a parsed
//! value the two agree exactly.
#![no_main]

use std::fmt;

use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use toolgate::body::{json_depth, value_depth};

/// The nesting depth of a JSON text, computed while it is parsed.
struct TextDepth(usize);

impl<'de> Deserialize<'de> for TextDepth {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TextDepth, D::Error> {
        d.deserialize_any(DepthVisitor)
    }
}

struct DepthVisitor;

impl<'de> Visitor<'de> for DepthVisitor {
    type Value = TextDepth;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_i64<E>(self, _: i64) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_u64<E>(self, _: u64) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_f64<E>(self, _: f64) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_str<E>(self, _: &str) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_unit<E>(self) -> Result<TextDepth, E> {
        Ok(TextDepth(0))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextDepth, A::Error> {
        let mut deepest = 0;
        while let Some(TextDepth(d)) = seq.next_element()? {
            deepest = deepest.max(d);
        }
        Ok(TextDepth(deepest + 1))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextDepth, A::Error> {
        let mut deepest = 0;
        while let Some((_, TextDepth(d))) = map.next_entry::<serde::de::IgnoredAny, TextDepth>()? {
            deepest = deepest.max(d);
        }
        Ok(TextDepth(deepest + 1))
    }
}

fuzz_target!(|data: &[u8]| {
    let depth = json_depth(data);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let TextDepth(text) = serde_json::from_slice(data).expect("parses as it did as a Value");
    assert_eq!(depth, text, "json_depth against the parser's depth");
    let parsed = value_depth(&value);
    assert!(
        depth >= parsed,
        "json_depth {depth} under-counts value_depth {parsed}"
    );
    let compact = serde_json::to_vec(&value).expect("serializable");
    assert_eq!(json_depth(&compact), parsed, "on the compact text");
});
