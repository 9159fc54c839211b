//! Projection: a READY answer is a bounded projection of the tool's result (selected, cut to
//! max_items, fields kept), and every size limit (raw, agent, record, the run's record budget)
//! counted in UTF-8 bytes fails as RESULT_TOO_LARGE, keeping in the record only what fits.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::boundary::{Env, assert_error, assert_error_record, assert_ready, on_both_stores};
use crate::support::Deadline;
use crate::support::fake_tool::RAW_MARKER;
use crate::support::sidecar::metric;

on_both_stores!(
    ready_results_are_bounded_projections,
    result_too_large_at_every_stage,
    run_record_bytes_budget,
    projection_failed,
    endless_body_stops_reading,
    utf8_limits_count_bytes,
);

/// READY answers: arrays cut to max_items with total_items and fields, NO_EVIDENCE with its
/// scope for empty and null, objects and scalars as an item; the record holds the same result.
async fn ready_results_are_bounded_projections(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    let result = assert_ready(
        &env.call(&run, "s1", "search", json!({"q": "redis"})).await,
        "s1",
        "EVIDENCE_FOUND",
    );
    let items = result["items"].as_array().expect("items");
    assert_eq!(items.len(), 5, "max_items");
    assert_eq!(
        result["total_items"], 7,
        "total_items counts before max_items"
    );
    for (i, item) in items.iter().enumerate() {
        assert_eq!(
            item,
            &json!({"title": format!("t{i}"), "url": format!("https://e.x/{i}"), "snippet": "s"})
        );
    }
    assert_eq!(result.as_object().map(|o| o.len()), Some(2));
    let rec = env.record_ok(&run.id, "s1").await;
    assert_eq!(rec["agent_result"], result);
    assert_eq!(rec["evidence_status"], "EVIDENCE_FOUND");
    assert_eq!(
        rec["raw_response"]["results"].as_array().map(Vec::len),
        Some(7)
    );
    assert_eq!(rec["raw_response"]["results"][6]["extra"], RAW_MARKER);

    for tool in ["empty", "null"] {
        let input = json!({"q": "nothing here", "n": 1});
        let id = format!("{tool}-1");
        let result = assert_ready(
            &env.call(&run, &id, tool, input.clone()).await,
            &id,
            "NO_EVIDENCE",
        );
        assert_eq!(result, json!({"scope": {"tool": tool, "input": input}}));
        let rec = env.record_ok(&run.id, &id).await;
        assert_eq!(
            (rec["status"].as_str(), rec["evidence_status"].as_str()),
            (Some("READY"), Some("NO_EVIDENCE"))
        );
        assert_eq!(rec["agent_result"], result);
    }
    // Intercept gives the same scope.
    let reply = env
        .intercept(&run, "empty-2", "empty", r#"{"q":"x"}"#)
        .await;
    let result = assert_ready(&reply, "empty-2", "NO_EVIDENCE");
    assert_eq!(
        result,
        json!({"scope": {"tool": "empty", "input": {"q": "x"}}})
    );

    let result = assert_ready(
        &env.call(&run, "o1", "object", json!({})).await,
        "o1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(
        result,
        json!({"item": {"title": "t0", "url": "https://e.x/0"}})
    );
    let result = assert_ready(
        &env.call(&run, "n1", "scalar", json!({})).await,
        "n1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(result, json!({"item": 42}));
    let input = json!({"k": "v"});
    let result = assert_ready(
        &env.call(&run, "e1", "echo", input.clone()).await,
        "e1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(result, json!({"item": {"input": input}}));
}

/// RESULT_TOO_LARGE at the raw, agent and record stages. The record keeps what fits: nothing
/// of a raw body over raw_bytes, the raw but no agent result when the projection is over
/// agent_bytes, neither when the whole record is over record_bytes.
async fn result_too_large_at_every_stage(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    // raw: the 2 MiB body is over raw_bytes (1 MiB); nothing of it is kept.
    let reply = env.call(&run, "raw", "big", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("raw"));
    let rec = env.record_ok(&run.id, "raw").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);

    // agent: the projection is over agent_bytes; the raw is kept, no agent result.
    let reply = env.call(&run, "agent", "wide", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("agent"));
    let rec = env.record_ok(&run.id, "agent").await;
    assert_eq!(rec["status"], "ERROR");
    assert_eq!(rec["error_code"], "RESULT_TOO_LARGE");
    assert_eq!(
        rec["raw_response"]["results"].as_array().map(Vec::len),
        Some(200)
    );
    assert_eq!(rec["agent_result"], Value::Null);

    // record: the whole record is over record_bytes; neither raw nor result is kept.
    let reply = env
        .call(&run, "record", "tinyrecord", json!({"q": "x"}))
        .await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("record"));
    let rec = env.record_ok(&run.id, "record").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
    assert_eq!(rec["request"], json!({"q": "x"}));

    let m = env.sc.metrics().await;
    for (tool, stage) in [("big", "raw"), ("wide", "agent"), ("tinyrecord", "record")] {
        assert_eq!(
            metric(
                &m,
                "toolgate_result_too_large_total",
                &[("tool", tool), ("stage", stage)]
            ),
            Some(1.0),
            "{tool}/{stage}"
        );
    }
    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(3))
    );
}

/// The run's max_record_bytes: a record that would take the run's total past it fails as
/// RESULT_TOO_LARGE and the total never goes past the max.
async fn run_record_bytes_budget(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let probe = env.run(json!({})).await;
    assert_ready(
        &env.call(&probe, "call-1", "search", json!({"q": "redis"}))
            .await,
        "call-1",
        "EVIDENCE_FOUND",
    );
    let one = env.view(&probe.id).await["record_bytes_used"]
        .as_u64()
        .expect("bytes");
    assert!(one > 500, "a search record is larger than 500 bytes: {one}");

    // Room for one such record, not two.
    let max = one + one / 2;
    let run = env.run(json!({"budget": {"max_record_bytes": max}})).await;
    assert_ready(
        &env.call(&run, "call-1", "search", json!({"q": "redis"}))
            .await,
        "call-1",
        "EVIDENCE_FOUND",
    );
    let used = env.view(&run.id).await["record_bytes_used"]
        .as_u64()
        .expect("bytes");
    assert!(used > 0 && used <= max);
    let reply = env
        .call(&run, "call-2", "search", json!({"q": "redis"}))
        .await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("call-2"));
    let rec = env.record_ok(&run.id, "call-2").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
    let view = env.view(&run.id).await;
    let after = view["record_bytes_used"].as_u64().expect("bytes");
    assert!(
        after <= max,
        "record_bytes_used {after} went past max_record_bytes {max}"
    );
    assert_eq!(after, used, "the refused record was counted");
    assert_eq!(view["calls_used"], 2);
    let facts = env.facts(&run.id).await;
    assert_eq!(facts["facts"].as_array().map(Vec::len), Some(1));
    assert_eq!(facts["excluded"], 1);
    assert_eq!(
        env.sc
            .metric(
                "toolgate_result_too_large_total",
                &[("tool", "search"), ("stage", "run")]
            )
            .await,
        Some(1.0)
    );
    assert_eq!(
        env.sc
            .metric(
                "toolgate_failures_total",
                &[("layer", "WORKFLOW"), ("code", "RESULT_TOO_LARGE")]
            )
            .await,
        Some(1.0)
    );
}

/// A pointer that does not resolve: PROJECTION_FAILED, raw kept for the harness.
async fn projection_failed(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let reply = env.call(&run, "p1", "unresolved", json!({})).await;
    assert_error(&reply, 502, "PROJECTION_FAILED", Some("p1"));
    let rec = env.record_ok(&run.id, "p1").await;
    assert_error_record(
        &rec,
        "PROJECTION_FAILED",
        Some(&json!({"other": RAW_MARKER})),
    );
    assert_eq!(rec["upstream_status"], 200);
}

/// A body that never ends: RESULT_TOO_LARGE, and toolgate stops reading, so the tool stops
/// sending far below its 200 MiB safety stop.
async fn endless_body_stops_reading(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let reply = env.call(&run, "e1", "endless", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("e1"));
    let d = Deadline::after(Duration::from_secs(10), "the endless body to be dropped");
    while !env.fake.endless_closed.load(Ordering::SeqCst) {
        d.tick().await;
    }
    let sent = env.fake.endless_sent.load(Ordering::SeqCst);
    assert!(
        sent < 32 << 20,
        "the tool pushed {sent} bytes: reading did not stop"
    );
    let rec = env.record_ok(&run.id, "e1").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
}

/// Limits count UTF-8 bytes, not characters.
async fn utf8_limits_count_bytes(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let text = "é".repeat(6000);
    let expected = json!({"item": {"text": text}});
    let serialized = serde_json::to_string(&expected).expect("json");
    assert!(serialized.chars().count() < 8000 && serialized.len() > 8000);

    // Under agent_bytes (8000) by characters, over it by bytes.
    let reply = env.call(&run, "u1", "utf8small", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("u1"));
    // Under the default agent_bytes (16384) both ways: returned whole, unescaped.
    let reply = env.call(&run, "u2", "utf8", json!({})).await;
    assert_eq!(assert_ready(&reply, "u2", "EVIDENCE_FOUND"), expected);
    assert!(reply.raw.contains(&text), "non-ASCII must not be escaped");
}
