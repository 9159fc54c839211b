//! MCP in the telemetry: the request metric, and the spans of an MCP upstream call.

use std::time::Duration;

use serde_json::{Value, json};

use super::sdk::upstreams;
use super::{
    TRACEPARENT, assert_mcp_error, assert_mcp_ready, assert_rpc_error, assert_rpc_result, mcp_call,
    mcp_env, post, rpc, rpc_id, rpc_stateless,
};
use crate::boundary::assert_ready;
use crate::support::sidecar::metric;
use crate::support::{Deadline, store_yaml};

// ---------------------------------------------------------------------------------------------
// Metrics.

/// `toolgate_mcp_requests_total{method, outcome}` counts every MCP request, and a tools/call is
/// counted like a `/v1/invoke` call too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_requests_are_counted() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = run.token.as_str();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    assert_rpc_result(&rpc(sc, t, init).await, &json!(1));
    for _ in 0..2 {
        let (r, _) = post(
            sc,
            Some(t),
            &[],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        )
        .await;
        assert_eq!(r.status, 202);
    }
    assert_rpc_result(
        &rpc(sc, t, json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await,
        &json!(2),
    );
    assert_rpc_result(
        &rpc(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await,
        &json!(3),
    );
    assert_rpc_result(
        &rpc_stateless(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 4, "method": "server/discover"}),
        )
        .await,
        &json!(4),
    );
    assert_rpc_result(
        &rpc_stateless(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        )
        .await,
        &json!(5),
    );
    assert_mcp_ready(
        &mcp_call(&env, &run, "k-1", "search", json!({"q": "x"})).await,
        "k-1",
        "EVIDENCE_FOUND",
    );
    assert_mcp_ready(
        &mcp_call(&env, &run, "k-2", "mcp_search", json!({"q": "x"})).await,
        "k-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &run, "k-3", "nope-zz9", json!({})).await;
    assert_mcp_error(&r, &rpc_id("k-3"), "UNKNOWN_TOOL", Some("k-3"));
    let r = mcp_call(&env, &run, "k-4", "fail", json!({})).await;
    assert_mcp_error(&r, &rpc_id("k-4"), "TOOL_EXECUTION_FAILED", Some("k-4"));
    let (r, _) = post(
        sc,
        Some(t),
        &[],
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{}}"#,
    )
    .await;
    assert_rpc_error(&r, 200, &json!(6), -32602);
    let (r, _) = post(
        sc,
        Some(t),
        &[],
        r#"{"jsonrpc":"2.0","id":7,"method":"prompts/list"}"#,
    )
    .await;
    assert_rpc_error(&r, 200, &json!(7), -32601);
    let (r, _) = post(sc, Some(t), &[], "{oops").await;
    assert_rpc_error(&r, 200, &Value::Null, -32700);

    let text = sc.metrics().await;
    let m = |method: &str, outcome: &str| {
        metric(
            &text,
            "toolgate_mcp_requests_total",
            &[("method", method), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    for (method, outcome, n) in [
        ("initialize", "ok", 1.0),
        ("initialize", "error", 0.0),
        ("notification", "ok", 2.0),
        ("ping", "ok", 1.0),
        ("tools/list", "ok", 2.0),
        ("server/discover", "ok", 1.0),
        ("tools/call", "ok", 2.0),
        ("tools/call", "error", 3.0),
        ("_other", "error", 2.0),
        ("_other", "ok", 0.0),
    ] {
        assert_eq!(m(method, outcome), n, "{method} {outcome}:\n{text}");
    }
    // The calls are counted like any call.
    let ready = [("status", "READY"), ("evidence_status", "EVIDENCE_FOUND")];
    for tool in ["search", "mcp_search"] {
        let mut labels = vec![("tool", tool)];
        labels.extend(ready);
        assert_eq!(
            metric(&text, "toolgate_invocations_total", &labels),
            Some(1.0),
            "{tool}"
        );
    }
    assert_eq!(
        metric(
            &text,
            "toolgate_preflight_rejections_total",
            &[("tool", "_unknown"), ("code", "UNKNOWN_TOOL")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_invocations_total",
            &[("tool", "fail"), ("status", "ERROR")]
        ),
        Some(1.0)
    );
    // No id in any label.
    for id in [run.id.as_str(), "k-1", "nope-zz9"] {
        assert!(!text.contains(id), "{id} in the metrics");
    }
}

// ---------------------------------------------------------------------------------------------
// Traces of an MCP upstream call.

/// With an `otel` key, the upstream span of an MCP tool is `tools/call <remote_name>` with the MCP
/// attributes, and the upstream gets that span as `_meta.traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_spans_of_an_mcp_upstream_call() {
    let collector = crate::support::otlp::Collector::start().await;
    let store = format!(
        "{}otel: {{endpoint: \"{}\"}}\n",
        store_yaml(None),
        collector.endpoint()
    );
    let env = mcp_env(&store, "").await;
    let ups = upstreams().await;
    let run = env.run(json!({})).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = json!({"run_id": run.id, "tool_call_id": "otel-mcp-1", "tool": "mcp_search", "input": {"q": "mcp"}});
    let r = env
        .sc
        .invoke_raw(
            Some(&run.token),
            body.to_string(),
            &[("traceparent", TRACEPARENT)],
        )
        .await;
    assert_ready(&r, "otel-mcp-1", "EVIDENCE_FOUND");
    let d = Deadline::after(
        Duration::from_secs(15),
        "the spans of the MCP upstream call",
    );
    let spans = loop {
        let spans = collector.trace(trace);
        if spans.len() >= 4 {
            break spans;
        }
        d.tick().await;
    };
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let root = spans
        .iter()
        .find(|s| s.span.name == "execute_tool mcp_search")
        .expect("the call's span");
    let upstream = spans
        .iter()
        .find(|s| s.span.name == "tools/call search")
        .expect("the upstream span");
    assert_eq!(upstream.span.kind, 3, "CLIENT");
    assert_eq!(upstream.parent_span_id(), root.span_id());
    let call = &ups.json.calls_of(&run.id)["otel-mcp-1"];
    for (key, value) in [
        ("mcp.method.name", "tools/call".to_string()),
        ("gen_ai.tool.name", "search".to_string()),
        ("gen_ai.operation.name", "execute_tool".to_string()),
        ("jsonrpc.request.id", call["body"]["id"].to_string()),
        ("http.response.status_code", "200".to_string()),
    ] {
        assert_eq!(upstream.attr(key), Some(value), "{key}: {upstream:#?}");
    }
    assert!(
        upstream
            .attr("mcp.protocol.version")
            .is_some_and(|v| !v.is_empty())
    );
    assert_eq!(
        call["body"]["params"]["_meta"]["traceparent"],
        format!("00-{trace}-{}-01", upstream.span_id()),
        "the upstream's parent is toolgate's upstream span"
    );
}
