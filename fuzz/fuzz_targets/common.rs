//! Helpers shared by the fuzz targets: turning fuzz bytes into small JSON values and strings
//! that are often meaningful (a known name) and sometimes arbitrary.
#![allow(dead_code)]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use serde_json::{Map, Value};

/// One of `known`, or (one time in four) an arbitrary string.
pub fn pick_str(u: &mut Unstructured<'_>, known: &[&str]) -> Result<String> {
    if known.is_empty() || u.ratio(1, 4)? {
        return u.arbitrary::<String>();
    }
    Ok((*u.choose(known)?).to_string())
}

/// Keys that the targets' configs and projections talk about, so that generated objects
/// often hit them.
pub const KEYS: &[&str] = &[
    "q", "n", "path", "url", "files", "src", "results", "items", "title", "id", "a", "b", "", "~",
    "/",
];

/// A JSON value of nesting at most `depth`, built from the fuzz bytes.
pub fn json_value(u: &mut Unstructured<'_>, depth: usize) -> Result<Value> {
    let kinds = if depth == 0 { 5 } else { 7 };
    Ok(match u.int_in_range(0..=kinds - 1)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::from(u.arbitrary::<i64>()?),
        3 => serde_json::Number::from_f64(u.arbitrary::<f64>()?).map_or(Value::Null, Value::Number),
        4 => Value::String(pick_str(
            u,
            &["x", "/etc/passwd", "../x", "~/x", "http://a.example.com/"],
        )?),
        5 => {
            let n = u.int_in_range(0..=4)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(json_value(u, depth - 1)?);
            }
            Value::Array(items)
        }
        _ => Value::Object(json_object(u, depth - 1)?),
    })
}

/// A JSON object whose values nest at most `depth`.
pub fn json_object(u: &mut Unstructured<'_>, depth: usize) -> Result<Map<String, Value>> {
    let n = u.int_in_range(0..=4)?;
    let mut map = Map::new();
    for _ in 0..n {
        let key = pick_str(u, KEYS)?;
        map.insert(key, json_value(u, depth)?);
    }
    Ok(map)
}

/// Equal, floats within a relative 1e-12 (serde_json's default float parser may differ from
/// the exact value by an ulp).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, x), (ky, y))| kx == ky && same(x, y))
        }
        _ => a == b,
    }
}
