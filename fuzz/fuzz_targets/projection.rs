//! The declarative projection (`select`, `max_items`, `fields`) on arbitrary raw JSON, then
//! `check` and the compact JSON the agent would be sent: never panics, never an ERROR
//! evidence, and the result has the documented shape; cut out of the compact text, and through
//! the call path's one entry (`project_json`), it is the same result.
#![no_main]

mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolgate::body::value_depth;
use toolgate::call::projection::{Projector, check};
use toolgate::config::{MAX_JSON_DEPTH, Projection};
use toolgate::store::Evidence;

const POINTERS: &[&str] = &[
    "",
    "/",
    "/results",
    "/results/0",
    "/a/b",
    "/items/1/title",
    "/~0",
    "/~1",
];
const FIELDS: &[&str] = &["title", "url", "id", "", "a", "results"];

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let select = common::pick_str(&mut u, POINTERS)?;
    let max_items = if u.arbitrary()? {
        Some(u.int_in_range(0..=8)?)
    } else {
        None
    };
    let fields = if u.arbitrary()? {
        let n = u.int_in_range(0..=4)?;
        let mut f = Vec::with_capacity(n);
        for _ in 0..n {
            f.push(common::pick_str(&mut u, FIELDS)?);
        }
        Some(f)
    } else {
        None
    };
    // The rest is the raw document: JSON text, or (when it is not JSON) a generated value.
    let rest = u.take_rest();
    let raw: Value = match serde_json::from_slice(rest) {
        Ok(v) => v,
        Err(_) => {
            let mut u = Unstructured::new(rest);
            common::json_value(&mut u, 6)?
        }
    };
    let projection = Projection {
        select,
        max_items,
        fields,
    };
    let input = json!({"q": "x"});
    let projected = match projection.project("t", &input, &raw) {
        Ok(p) => p,
        Err(_) => {
            assert!(
                raw.pointer(&projection.select).is_none(),
                "an error for a pointer that resolves"
            );
            return Ok(());
        }
    };
    let selected = raw.pointer(&projection.select).expect("resolved");
    let projected = check(projected).expect("a declarative projection is never an ERROR");
    let obj = projected
        .result
        .as_object()
        .expect("the result is an object");
    match projected.evidence {
        Evidence::None => {
            assert!(selected.is_null() || selected.as_array().is_some_and(Vec::is_empty));
            assert_eq!(
                projected.result,
                json!({"scope": {"tool": "t", "input": input}})
            );
        }
        Evidence::Found => match selected {
            Value::Array(items) => {
                let kept = obj["items"].as_array().expect("items");
                assert_eq!(obj["total_items"], Value::from(items.len()));
                assert!(kept.len() <= items.len());
                if let Some(max) = projection.max_items {
                    assert!(kept.len() <= max);
                }
            }
            _ => assert!(obj.contains_key("item")),
        },
        Evidence::Error => unreachable!("checked above"),
    }
    // The kept fields are a subset of the configured ones.
    if let Some(fields) = &projection.fields {
        let kept = obj
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| obj.get("item").into_iter().cloned().collect());
        for v in kept.iter().filter_map(Value::as_object) {
            assert!(
                v.keys().all(|k| fields.contains(k)),
                "a field outside {fields:?}"
            );
        }
    }
    let json = serde_json::to_vec(&projected.result).expect("the result serializes");
    // A raw response passes the depth limit (at most MAX_JSON_DEPTH) before it is projected;
    // within it, what the agent is sent parses back (serde_json reads 128 levels).
    if value_depth(&raw) as u64 <= MAX_JSON_DEPTH {
        let back: Value = serde_json::from_slice(&json).expect("the result parses back");
        assert!(
            common::same(&back, &projected.result),
            "the result changed on the way"
        );
    }
    // The projection cut out of the compact text, searched for or found by the compacting
    // pass, is those same bytes.
    let raw_text = serde_json::to_vec(&raw).expect("the raw value serializes");
    let plan = projection.plan().expect("the pointers are pointers");
    if let Some(c) = toolgate::compact::compact_selecting(&raw_text, Some(&plan)) {
        let searched = projection.project_text(&c.json);
        let found = c
            .selected
            .as_ref()
            .and_then(|s| projection.project_selected(&c.json, s));
        assert_eq!(searched, found, "the pass and the search disagree");
        if let Some(text) = searched {
            assert_eq!(projected.evidence, Evidence::Found);
            assert_eq!(text.as_bytes(), json, "the text projection differs");
        }
        // The call path's one entry, given the pass's selection, agrees with the tree.
        let one = projection
            .project_json("t", &input, &c.json, c.selected.as_ref())
            .expect("the compact text projects");
        assert_eq!(one.evidence, projected.evidence);
        if value_depth(&raw) as u64 <= MAX_JSON_DEPTH {
            let back: Value = serde_json::from_str(&one.json).expect("the entry's result parses");
            assert!(
                common::same(&back, &projected.result),
                "the entry's result differs"
            );
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
