//! Execution: how a call that passed preflight is forwarded and how its failures end. The tool
//! gets the input exactly, with the contract's headers; a non-2xx, a non-JSON body or an
//! unreachable tool is TOOL_EXECUTION_FAILED, a slow one TOOL_TIMEOUT, and each keeps its diagnosis
//! in the record only. Calls in flight: the run deadline and a cancel cut them, an end lets them
//! finish, and concurrent calls never share an id or overspend the budget.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::boundary::{Env, assert_error, assert_error_record, assert_ready, on_both_stores};
use crate::support::fake_tool::RAW_MARKER;

on_both_stores!(
    tool_failures_keep_a_diagnosis,
    tool_timeout,
    forwarding_headers_and_input,
    deadline_during_call,
    cancel_during_call,
    end_during_call_lets_it_finish,
    concurrent_duplicate_ids_have_one_winner,
    concurrent_calls_never_overspend,
);

/// Non-2xx, non-JSON 2xx and an unreachable tool fail as TOOL_EXECUTION_FAILED; the diagnosis
/// stays in the record for the harness only.
async fn tool_failures_keep_a_diagnosis(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    let reply = env.call(&run, "f1", "fail", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f1"));
    let rec = env.record_ok(&run.id, "f1").await;
    assert_error_record(
        &rec,
        "TOOL_EXECUTION_FAILED",
        Some(&json!({"error": RAW_MARKER})),
    );
    assert_eq!(rec["upstream_status"], 500);

    let reply = env.call(&run, "f2", "notjson", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f2"));
    let rec = env.record_ok(&run.id, "f2").await;
    let diagnosis = json!(format!("<html>{RAW_MARKER}</html>"));
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", Some(&diagnosis));
    assert_eq!(rec["upstream_status"], 200);

    let reply = env.call(&run, "f3", "unreachable", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f3"));
    let rec = env.record_ok(&run.id, "f3").await;
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", None);
    assert_eq!(rec["upstream_status"], Value::Null);

    // A non-2xx is a tool failure whatever its size; the oversized body is not kept.
    let reply = env.call(&run, "f4", "bigfail", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f4"));
    let rec = env.record_ok(&run.id, "f4").await;
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", None);
    assert_eq!(rec["upstream_status"], 503);

    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(4))
    );
}

/// A tool slower than its timeout_ms: 504 TOOL_TIMEOUT, promptly.
async fn tool_timeout(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let started = Instant::now();
    let reply = env
        .call(&run, "t1", "slowtimeout", json!({"sleep_ms": 5000}))
        .await;
    let took = started.elapsed();
    assert_error(&reply, 504, "TOOL_TIMEOUT", Some("t1"));
    assert!(
        took >= Duration::from_millis(300),
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3000),
        "did not cut the call at timeout_ms: {took:?}"
    );
    let rec = env.record_ok(&run.id, "t1").await;
    assert_error_record(&rec, "TOOL_TIMEOUT", None);
}

/// The tool receives the input exactly, with the contract's headers; the record's request is it.
async fn forwarding_headers_and_input(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let input = json!({"z": 1, "a": {"é": [1, 2.5, null, true, "ü"]}, "q": "redis", "n": -7});
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body =
        json!({"run_id": run.id, "tool_call_id": "call_fwd-1", "tool": "echo", "input": input});
    let reply = env
        .sc
        .invoke_raw(
            Some(&run.token),
            body.to_string(),
            &[("traceparent", traceparent)],
        )
        .await;
    let result = assert_ready(&reply, "call_fwd-1", "EVIDENCE_FOUND");
    assert_eq!(result, json!({"item": {"input": input}}));

    let seen = env.fake.calls("echo");
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(
        h.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(h.get("x-run-id"), Some(&run.id));
    assert_eq!(
        h.get("x-tool-call-id").map(String::as_str),
        Some("call_fwd-1")
    );
    assert_eq!(h.get("traceparent").map(String::as_str), Some(traceparent));
    assert_eq!(seen[0].body, input);
    assert_eq!(
        seen[0].body_text,
        serde_json::to_string(&input).expect("json"),
        "key order and values kept"
    );
    assert!(
        !h.contains_key("authorization"),
        "the run token must not reach the tool"
    );
    let rec = env.record_ok(&run.id, "call_fwd-1").await;
    assert_eq!(rec["request"], input);
    assert_eq!(
        serde_json::to_string(&rec["request"]).expect("json"),
        seen[0].body_text
    );

    // No traceparent when the agent sent none; the intercept form forwards the same way.
    let reply = env
        .intercept(
            &run,
            "toolu_01:fwd",
            "echo",
            serde_json::to_vec(&input).expect("json"),
        )
        .await;
    assert_ready(&reply, "toolu_01:fwd", "EVIDENCE_FOUND");
    let seen = env.fake.calls("echo");
    let h = &seen[1].headers;
    assert!(!h.contains_key("traceparent"));
    assert_eq!(
        h.get("x-tool-call-id").map(String::as_str),
        Some("toolu_01:fwd")
    );
    assert_eq!(h.get("x-run-id"), Some(&run.id));
    assert_eq!(seen[1].body, input);
    assert_eq!(
        env.record_ok(&run.id, "toolu_01:fwd").await["request"],
        input
    );
}

// ---------------------------------------------------------------------------------------------
// Calls in flight.

/// The run deadline cuts a call in flight: 409 RUN_DEADLINE_EXCEEDED, recorded as such.
async fn deadline_during_call(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({"timeout_ms": 800})).await;
    let started = Instant::now();
    let reply = env
        .call(&run, "d1", "slow", json!({"sleep_ms": 10000}))
        .await;
    assert_error(&reply, 409, "RUN_DEADLINE_EXCEEDED", Some("d1"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the deadline did not cut the call"
    );
    assert_eq!(
        env.fake.calls("slow").len(),
        1,
        "the call was forwarded before the deadline"
    );
    let rec = env.record_ok(&run.id, "d1").await;
    assert_error_record(&rec, "RUN_DEADLINE_EXCEEDED", None);
}

/// Cancelling a run aborts its call in flight: 409 RUN_CANCELLED, promptly, recorded as such.
async fn cancel_during_call(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let call = env.slow_call_in_flight(&run, "c1", 15000).await;
    let cancelled_at = Instant::now();
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", run.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["state"], "CANCELLED");
    let reply = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the cancelled call answered promptly")
        .expect("call task");
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert_error(&reply, 409, "RUN_CANCELLED", Some("c1"));
    let rec = env.record_ok(&run.id, "c1").await;
    assert_error_record(&rec, "RUN_CANCELLED", None);
    assert_eq!(env.view(&run.id).await["state"], "CANCELLED");
    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(
        env.sc
            .metric(
                "toolgate_failures_total",
                &[("layer", "OPERATOR"), ("code", "RUN_CANCELLED")]
            )
            .await,
        Some(1.0)
    );
}

/// Ending a run lets its calls in flight finish normally; a cancel of the already ended run
/// changes nothing and aborts nothing.
async fn end_during_call_lets_it_finish(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let call = env.slow_call_in_flight(&run, "c1", 1500).await;
    let r = env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", run.id)).await;
    assert_eq!(
        (r.status, r.body["state"].as_str()),
        (200, Some("ENDED")),
        "{}",
        r.raw
    );
    let reply = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call answered")
        .expect("call task");
    let result = assert_ready(&reply, "c1", "EVIDENCE_FOUND");
    assert_eq!(
        result,
        json!({"items": [{"title": "t0"}], "total_items": 7})
    );
    assert_eq!(env.record_ok(&run.id, "c1").await["status"], "READY");
    assert_eq!(env.view(&run.id).await["state"], "ENDED");
    let facts = env.facts(&run.id).await;
    assert_eq!(facts["facts"][0]["tool_call_id"], "c1");
}

/// 16 concurrent calls with one tool_call_id: one wins, 15 are duplicates, the tool runs once.
async fn concurrent_duplicate_ids_have_one_winner(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            sc.invoke(
                &run.token,
                &run.id,
                "same",
                "slow",
                json!({"sleep_ms": 300}),
            )
            .await
        }));
    }
    let (mut ok, mut dup) = (0, 0);
    for t in tasks {
        let reply = t.await.expect("task");
        match reply.status {
            200 => ok += 1,
            _ => {
                assert_error(&reply, 409, "DUPLICATE_TOOL_CALL", Some("same"));
                dup += 1;
            }
        }
    }
    assert_eq!((ok, dup), (1, 15));
    assert_eq!(
        env.fake.calls("slow").len(),
        1,
        "the tool ran more than once"
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 1);
    assert_eq!(env.record_ok(&run.id, "same").await["status"], "READY");
}

/// 20 concurrent distinct calls against max_calls 5: exactly 5 run, 15 are refused.
async fn concurrent_calls_never_overspend(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({"budget": {"max_calls": 5}})).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("c{i}");
            let reply = sc
                .invoke(&run.token, &run.id, &id, "slow", json!({"sleep_ms": 200}))
                .await;
            (id, reply)
        }));
    }
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for t in tasks {
        let (id, reply) = t.await.expect("task");
        if reply.status == 200 {
            ok.push(id);
        } else {
            assert_error(&reply, 429, "BUDGET_EXHAUSTED", Some(&id));
            refused.push(id);
        }
    }
    assert_eq!((ok.len(), refused.len()), (5, 15));
    assert_eq!(
        env.fake.calls("slow").len(),
        5,
        "the tool ran a call over budget"
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 5);
    for id in &refused {
        env.no_record(&run.id, id).await;
    }
    assert_eq!(
        env.facts(&run.id).await["facts"].as_array().map(Vec::len),
        Some(5)
    );
}
