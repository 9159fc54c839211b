//! One pipeline for both call forms: a call over MCP is a call like one on `/v1/invoke`.

use serde_json::{Value, json};

use super::{
    assert_mcp_error, assert_mcp_ready, assert_rpc_result, call_msg, fact_ids, mcp_call, mcp_env,
    rpc, rpc_id, upstream_search_result,
};
use crate::boundary::{assert_error, assert_ready, on_both_stores};
use crate::support::store_yaml;

on_both_stores!(concurrent_calls_with_one_id);

/// A call over MCP and the same call over `/v1/invoke` leave records of the same shape, equal
/// but for ids and times, answer the same agent result, and both appear in the facts in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_and_invoke_leave_the_same_record() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let q = json!({"q": "same"});
    let m1 = assert_mcp_ready(
        &mcp_call(&env, &run, "m-1", "search", q.clone()).await,
        "m-1",
        "EVIDENCE_FOUND",
    );
    let v1 = assert_ready(
        &env.call(&run, "v-1", "search", q.clone()).await,
        "v-1",
        "EVIDENCE_FOUND",
    );
    let m2 = assert_mcp_ready(
        &mcp_call(&env, &run, "m-2", "mcp_search_sse", q.clone()).await,
        "m-2",
        "EVIDENCE_FOUND",
    );
    let v2 = assert_ready(
        &env.call(&run, "v-2", "mcp_search_sse", q.clone()).await,
        "v-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &run, "m-3", "fail", json!({})).await;
    assert_mcp_error(&r, &rpc_id("m-3"), "TOOL_EXECUTION_FAILED", Some("m-3"));
    assert_error(
        &env.call(&run, "v-3", "fail", json!({})).await,
        502,
        "TOOL_EXECUTION_FAILED",
        Some("v-3"),
    );
    assert_eq!(m1, v1);
    assert_eq!(m2, v2);
    assert_eq!(m2, upstream_search_result("same"));

    for (m, v) in [("m-1", "v-1"), ("m-2", "v-2"), ("m-3", "v-3")] {
        let a = env.record_ok(&run.id, m).await;
        let b = env.record_ok(&run.id, v).await;
        let keys = |r: &Value| -> Vec<String> {
            r.as_object()
                .expect("record")
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&a), keys(&b), "{m}/{v}: record keys");
        assert_eq!(a["tool_call_id"], m);
        assert_eq!(b["tool_call_id"], v);
        for field in [
            "schema",
            "run_id",
            "tool",
            "status",
            "evidence_status",
            "request",
            "agent_result",
            "error_code",
            "upstream_status",
        ] {
            assert_eq!(a[field], b[field], "{m}/{v}: {field}");
        }
        let (mut ra, mut rb) = (a["raw_response"].clone(), b["raw_response"].clone());
        // The upstream echoes the ids it got in `seen`, and in the text of its result.
        for (raw, id) in [(&mut ra, m), (&mut rb, v)] {
            if raw.get("structuredContent").is_some() {
                assert_eq!(
                    raw["structuredContent"]["seen"],
                    json!({"run_id": run.id, "tool_call_id": id}),
                    "{raw}"
                );
                let object = raw.as_object_mut().expect("object");
                object.remove("content");
                if let Some(Value::Object(sc)) = object.get_mut("structuredContent") {
                    sc.remove("seen");
                }
            }
        }
        assert_eq!(ra, rb, "{m}/{v}: raw_response");
        for r in [&a, &b] {
            assert!(r["created_at"].is_string() && r["duration_ms"].is_u64());
        }
    }
    assert_eq!(fact_ids(&env, &run.id).await, ["m-1", "v-1", "m-2", "v-2"]);
    assert_eq!(env.facts(&run.id).await["excluded"], 2);
    assert_eq!(env.view(&run.id).await["calls_used"], 6);
}

/// 16 concurrent `tools/call` with one tool_call_id: one executes, 15 are duplicates.
async fn concurrent_calls_with_one_id(store_yaml: String) {
    let env = mcp_env(&store_yaml, "").await;
    let run = env.run(json!({})).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let msg = call_msg(
                rpc_id("same"),
                "slow",
                Some(json!({"sleep_ms": 300})),
                Some(&run.id),
                Some("same"),
            );
            rpc(&sc, &run.token, msg).await
        }));
    }
    let (mut ready, mut duplicate) = (0, 0);
    for task in tasks {
        let r = task.await.expect("task");
        let result = assert_rpc_result(&r, &rpc_id("same"));
        if result["isError"] == false {
            assert_mcp_ready(&r, "same", "EVIDENCE_FOUND");
            ready += 1;
        } else {
            assert_mcp_error(&r, &rpc_id("same"), "DUPLICATE_TOOL_CALL", Some("same"));
            duplicate += 1;
        }
    }
    assert_eq!((ready, duplicate), (1, 15));
    assert_eq!(env.fake.calls("slow").len(), 1, "exactly one call executed");
    assert_eq!(env.view(&run.id).await["calls_used"], 1);
    assert_eq!(fact_ids(&env, &run.id).await, ["same"]);
}
