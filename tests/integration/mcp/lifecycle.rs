//! The protocol surface, request by request: initialize, ping, server/discover, tools/list in
//! both revisions, and a tools/call with no arguments.

use serde_json::{Value, json};

use super::{
    STATELESS, assert_mcp_ready, assert_rpc_result, call_msg, check_is_error, check_ready,
    fact_ids, mcp_env, post, rpc, rpc_id, rpc_stateless, search_schema, toolgate_info,
    upstream_search_result,
};
use crate::support::store_yaml;

/// initialize (version negotiation), ping, server/discover, tools/list in both revisions, and
/// a tools/call with no arguments; nothing carries a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_listing() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = run.token.as_str();

    for (asked, answered) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
        ("1999-01-01", "2025-11-25"),
    ] {
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
        let result = assert_rpc_result(&rpc(sc, t, msg).await, &json!(1));
        assert_eq!(
            result,
            json!({"protocolVersion": answered, "capabilities": {"tools": {"listChanged": false}}, "serverInfo": toolgate_info()}),
            "initialize asking {asked}"
        );
    }
    let (r, _) = post(
        sc,
        Some(t),
        &[("mcp-protocol-version", "2025-11-25")],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!((r.status, r.raw.as_str()), (202, ""), "a notification");
    for headers in [vec![], vec![("mcp-protocol-version", "2025-06-18")]] {
        let (r, _) = post(
            sc,
            Some(t),
            &headers,
            r#"{"jsonrpc":"2.0","id":"p-1","method":"ping"}"#,
        )
        .await;
        assert_eq!(assert_rpc_result(&r, &json!("p-1")), json!({}));
    }

    // server/discover, in the revision that defines it.
    let r = rpc_stateless(
        sc,
        t,
        json!({"jsonrpc": "2.0", "id": "d", "method": "server/discover"}),
    )
    .await;
    let d = assert_rpc_result(&r, &json!("d"));
    assert_eq!(d["resultType"], "complete", "{d}");
    let versions = d["supportedVersions"]
        .as_array()
        .expect("supportedVersions");
    assert!(versions.contains(&json!(STATELESS)), "{d}");
    assert!(
        !versions.is_empty() && versions.iter().all(Value::is_string),
        "{d}"
    );
    assert!(d["capabilities"]["tools"].is_object(), "{d}");
    assert!(d["ttlMs"].is_u64(), "{d}");
    assert!(
        d["cacheScope"] == "public" || d["cacheScope"] == "private",
        "{d}"
    );

    // tools/list: every configured read-only tool for a run without a tools list, in the same
    // order every time.
    let all_ro = [
        "big",
        "echo",
        "fail",
        "mcp_broken",
        "mcp_down",
        "mcp_nosuch",
        "mcp_rpcerror",
        "mcp_search",
        "mcp_search_sse",
        "mcp_slow",
        "mcp_small",
        "mcp_unresolved",
        "search",
        "slow",
        "slowtimeout",
        "tiny",
        "unresolved",
    ];
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let legacy = assert_rpc_result(&rpc(sc, t, list.clone()).await, &json!(2));
    let keys: Vec<&String> = legacy.as_object().expect("result").keys().collect();
    assert_eq!(
        keys,
        ["tools"],
        "no nextCursor, no caching fields: {legacy}"
    );
    let mut names: Vec<&str> = legacy["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, all_ro, "writer is not read-only");
    for tool in legacy["tools"].as_array().expect("tools") {
        let keys: Vec<&String> = tool.as_object().expect("tool").keys().collect();
        let mut keys = keys.clone();
        keys.sort();
        assert_eq!(
            keys,
            ["annotations", "description", "inputSchema", "name"],
            "{tool}"
        );
        assert_eq!(tool["annotations"], json!({"readOnlyHint": true}));
    }
    let again = assert_rpc_result(&rpc(sc, t, list.clone()).await, &json!(2));
    assert_eq!(again, legacy, "a deterministic list");
    let (r, _) = post(
        sc,
        Some(t),
        &[("mcp-protocol-version", "2025-11-25")],
        list.to_string(),
    )
    .await;
    assert_eq!(assert_rpc_result(&r, &json!(2)), legacy);
    let modern = assert_rpc_result(&rpc_stateless(sc, t, list.clone()).await, &json!(2));
    assert_eq!(modern["resultType"], "complete");
    assert!(modern["ttlMs"].is_u64(), "{modern}");
    assert!(
        modern["cacheScope"] == "public" || modern["cacheScope"] == "private",
        "{modern}"
    );
    assert_eq!(modern["tools"], legacy["tools"]);
    assert!(modern.get("nextCursor").is_none(), "{modern}");

    // A run's tools list narrows it; a tool outside it or not read-only is not listed.
    let narrow = env
        .run(json!({"tools": ["search", "writer", "mcp_search_sse"]}))
        .await;
    let r = assert_rpc_result(&rpc(sc, &narrow.token, list.clone()).await, &json!(2));
    let mut tools = r["tools"].as_array().expect("tools").clone();
    tools.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        Value::Array(tools),
        json!([
            {"name": "mcp_search_sse", "description": "", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
            {"name": "search", "description": "Searches the fake corpus.", "inputSchema": search_schema(), "annotations": {"readOnlyHint": true}},
        ])
    );

    // A call without arguments has the input {}; a stateless call carries resultType.
    let msg = call_msg(rpc_id("l-1"), "slow", None, Some(&run.id), Some("l-1"));
    let result = assert_mcp_ready(&rpc(sc, t, msg).await, "l-1", "EVIDENCE_FOUND");
    assert_eq!(
        result,
        json!({"items": [{"title": "t0"}], "total_items": 7})
    );
    assert_eq!(env.record_ok(&run.id, "l-1").await["request"], json!({}));
    assert_eq!(env.fake.calls("slow")[0].body, json!({}));
    let msg = call_msg(
        rpc_id("l-2"),
        "mcp_search",
        Some(json!({"q": "modern"})),
        Some(&run.id),
        Some("l-2"),
    );
    let r = rpc_stateless(sc, t, msg).await;
    let result = assert_rpc_result(&r, &rpc_id("l-2"));
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(
        check_ready(&result, "l-2", "EVIDENCE_FOUND", true),
        upstream_search_result("modern")
    );
    let msg = call_msg(rpc_id("l-3"), "nope", None, Some(&run.id), Some("l-3"));
    let result = assert_rpc_result(&rpc_stateless(sc, t, msg).await, &rpc_id("l-3"));
    assert_eq!(result["resultType"], "complete", "{result}");
    check_is_error(&result, "UNKNOWN_TOOL", Some("l-3"), true);
    assert_eq!(fact_ids(&env, &run.id).await, ["l-1", "l-2"]);
}
