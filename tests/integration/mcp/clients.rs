//! The official clients against toolgate: the Python SDK in `auto` and `legacy` mode, and the
//! TypeScript SDK.

use serde_json::{Value, json};

use super::sdk::{Sdk, run_client, upstreams};
use super::{
    RUN_ID_KEY, TRACEPARENT, check_is_error, check_ready, fact_ids, fake_search_result, mcp_env,
    mcp_url, search_schema, toolgate_info, upstream_search_result,
};
use crate::support::fake_tool::RAW_MARKER;
use crate::support::store_yaml;

/// One SDK client: lists the run's tools, calls an HTTP tool (the fake tool) and the same MCP
/// tool through the JSON and the SSE upstream, with `_meta` ids, then an unknown tool and a bad
/// input; every answer is checked as that SDK saw it, then against the records, the facts and
/// what the tool and the upstreams received.
async fn sdk_case(sdk: Sdk) {
    let env = mcp_env(&store_yaml(None), "").await;
    let ups = upstreams().await;
    let run = env
        .run(json!({"tools": ["search", "mcp_search", "mcp_search_sse", "writer"]}))
        .await;
    let p = match sdk {
        Sdk::PythonAuto => "py-auto",
        Sdk::PythonLegacy => "py-legacy",
        Sdk::Node => "node",
    };
    let id = |n: u32| format!("{p}-{n}");
    let calls = json!([
        {"name": "search", "arguments": {"q": "mcp"}, "tool_call_id": id(1), "traceparent": TRACEPARENT},
        {"name": "mcp_search", "arguments": {"q": "mcp"}, "tool_call_id": id(2)},
        {"name": "mcp_search_sse", "arguments": {"q": "mcp"}, "tool_call_id": id(3)},
        {"name": "nope", "arguments": {}, "tool_call_id": id(4)},
        {"name": "search", "arguments": {"q": 5}, "tool_call_id": id(5)},
    ]);
    let out = run_client(sdk, &mcp_url(&env.sc), &run.token, &run.id, &calls).await;

    assert_eq!(out["protocol_version"], sdk.version(), "{out}");
    if !out["server_info"].is_null() {
        assert_eq!(out["server_info"], toolgate_info());
    }
    assert_eq!(out["next_cursor"], Value::Null, "no pagination");
    let mut tools = out["tools"].as_array().expect("tools").clone();
    tools.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_string());
    let ro = json!({"readOnlyHint": true});
    assert_eq!(
        Value::Array(tools),
        json!([
            {"name": "mcp_search", "description": "Searches over MCP.", "inputSchema": search_schema(), "annotations": ro},
            {"name": "mcp_search_sse", "description": "", "inputSchema": {"type": "object"}, "annotations": ro},
            {"name": "search", "description": "Searches the fake corpus.", "inputSchema": search_schema(), "annotations": ro},
        ]),
        "{sdk:?}: tools/list is the run's read-only tools"
    );

    let results = out["calls"].as_array().expect("calls");
    assert_eq!(results.len(), 5, "{out}");
    let st = sdk.stateless();
    assert_eq!(
        check_ready(&results[0], &id(1), "EVIDENCE_FOUND", st),
        fake_search_result()
    );
    for (n, result) in [(2, &results[1]), (3, &results[2])] {
        assert_eq!(
            check_ready(result, &id(n), "EVIDENCE_FOUND", st),
            upstream_search_result("mcp"),
            "{sdk:?} call {n}"
        );
    }
    check_is_error(&results[3], "UNKNOWN_TOOL", Some(&id(4)), st);
    check_is_error(&results[4], "INVALID_INPUT", Some(&id(5)), st);
    assert!(!out.to_string().contains(RAW_MARKER), "{out}");

    // The record keeps the raw response (the upstream's JSON-RPC result for MCP tools), the
    // agent result is what the SDK got, and the facts list the three calls in order.
    for (n, result) in results.iter().take(3).enumerate() {
        let rec = env.record_ok(&run.id, &id(n as u32 + 1)).await;
        assert_eq!(rec["status"], "READY");
        assert_eq!(rec["agent_result"], result["structuredContent"]);
        assert_eq!(rec["request"], json!({"q": "mcp"}));
    }
    for n in [2, 3] {
        let raw = &env.record_ok(&run.id, &id(n)).await["raw_response"];
        assert_eq!(raw["isError"], false, "{raw}");
        assert_eq!(raw["structuredContent"]["results"][6]["extra"], RAW_MARKER);
        assert_eq!(
            raw["structuredContent"]["seen"],
            json!({"run_id": run.id, "tool_call_id": id(n)}),
            "toolgate passes the ids in _meta"
        );
    }
    env.no_record(&run.id, &id(4)).await;
    env.no_record(&run.id, &id(5)).await;
    assert_eq!(fact_ids(&env, &run.id).await, [id(1), id(2), id(3)]);
    assert_eq!(env.facts(&run.id).await["excluded"], 0);

    // The HTTP tool got the ids and the traceparent as headers.
    let seen = env.fake.calls("search");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, json!({"q": "mcp"}));
    assert_eq!(seen[0].headers["x-run-id"], run.id);
    assert_eq!(seen[0].headers["x-tool-call-id"], id(1));
    assert_eq!(seen[0].headers["traceparent"], TRACEPARENT);
    assert!(!seen[0].headers.contains_key("authorization"));

    // Each upstream got one tools/call of the remote name, with the ids and its token.
    for (up, n) in [(&ups.json, 2), (&ups.sse, 3)] {
        let calls = up.calls_of(&run.id);
        assert_eq!(calls.len(), 1, "{calls:?}\n{}", up.stderr());
        let call = &calls[&id(n)];
        assert_eq!(call["body"]["params"]["name"], "search");
        assert_eq!(call["body"]["params"]["arguments"], json!({"q": "mcp"}));
        assert_eq!(call["body"]["params"]["_meta"][RUN_ID_KEY], run.id);
        assert_eq!(
            call["authorization"],
            format!("Bearer {}", ups.token),
            "the tool's upstream token"
        );
        assert_eq!(call["session_id"], Value::Null);
        assert!(
            call["protocol_version"] == "2025-11-25" || call["protocol_version"] == "2025-06-18",
            "{call}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_auto() {
    sdk_case(Sdk::PythonAuto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_legacy() {
    sdk_case(Sdk::PythonLegacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client() {
    sdk_case(Sdk::Node).await;
}
