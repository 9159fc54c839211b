//! Capped body reads, for both directions: what a client sends a listener and what a tool sends
//! back. Reading stops as soon as the cap is passed, so memory stays bounded by the cap plus one
//! frame whatever the peer sends.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Why a capped body read stopped.
#[derive(Debug)]
pub enum ReadError {
    TooLarge,
    Body(String),
}

/// Reads a body into memory, failing as soon as it exceeds `limit` bytes.
pub async fn read_capped<B>(mut body: B, limit: u64) -> Result<Bytes, ReadError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Body(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > limit {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// How deeply arrays and objects nest in a JSON text, found in one pass over the bytes with no
/// recursion (brackets inside strings do not count). A text that is not JSON gives some number;
/// the parser judges it afterwards.
pub fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The same measure of a parsed value, walked with an explicit stack.
pub fn value_depth(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(items) => {
                deepest = deepest.max(d);
                stack.extend(items.iter().map(|i| (i, d + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(d);
                stack.extend(map.values().map(|i| (i, d + 1)));
            }
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_nesting_outside_strings() {
        for (text, want) in [
            ("1", 0),
            ("{}", 1),
            ("[[1],[[2]]]", 3),
            (r#"{"a":"[[[[","b":{"c":[]}}"#, 3),
            (r#"["\"[[[", {"x": "\\"}]"#, 2),
        ] {
            assert_eq!(json_depth(text.as_bytes()), want, "{text}");
            let parsed: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(value_depth(&parsed), want, "{text}");
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(json_depth(deep.as_bytes()), 100_000);
    }
}
