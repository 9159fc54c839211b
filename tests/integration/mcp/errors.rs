//! Errors: what toolgate refuses as JSON-RPC errors or at the HTTP level, in both revisions,
//! and toolgate's own errors as `isError` tool results, the same body `/v1/invoke` gives.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    STATELESS, assert_http_refusal, assert_mcp_error, assert_mcp_ready, assert_no_leak,
    assert_rpc_error, assert_rpc_result, call_msg, check_is_error, mcp_call, mcp_env, mcp_url,
    post, rpc, rpc_id, rpc_stateless, stateless_meta,
};
use crate::boundary::{assert_ready, wait_calls};
use crate::support::sidecar::ADMIN_TOKEN;
use crate::support::{Deadline, store_yaml};

// ---------------------------------------------------------------------------------------------
// The protocol's errors.

/// Every JSON-RPC error, in both revisions, with the id it echoes and a fixed message; the
/// HTTP-level refusals (401, 413, 405) and notifications (202).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpc_errors() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = Some(run.token.as_str());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    .to_string();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let modern = [
        ("mcp-protocol-version", STATELESS),
        ("mcp-method", "tools/list"),
    ];

    // 401: no token, a bad one, the admin token; whatever the body.
    let other_run_mac = {
        let other = env.run(json!({})).await;
        format!(
            "{}.{}",
            run.id,
            other.token.split_once('.').expect("token").1
        )
    };
    for (token, headers, body) in [
        (None, &[][..], init.as_str()),
        (Some("garbage"), &[][..], list.as_str()),
        (Some(ADMIN_TOKEN), &[][..], list.as_str()),
        (Some(other_run_mac.as_str()), &[][..], list.as_str()),
        (None, &modern[..], list.as_str()),
        (None, &[][..], "{oops"),
        (
            None,
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
    ] {
        let (r, h) = post(sc, token, headers, body.to_string()).await;
        assert_http_refusal(&r, &h, 401, "UNAUTHENTICATED");
    }

    // 413: a body over every limit, and one over the called tool's own request_bytes.
    let pad = "p".repeat(9000);
    let big = call_msg(
        json!(9),
        "search",
        Some(json!({"q": "x", "pad": pad})),
        Some(&run.id),
        Some("big-1"),
    );
    let (r, h) = post(sc, t, &[], big.to_string()).await;
    assert_http_refusal(&r, &h, 413, "REQUEST_TOO_LARGE");
    let over_tool = call_msg(
        json!(9),
        "tiny",
        Some(json!({"pad": "p".repeat(500)})),
        Some(&run.id),
        Some("big-2"),
    );
    let (r, _) = post(sc, t, &[], over_tool.to_string()).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (413, Some("REQUEST_TOO_LARGE")),
        "{}",
        r.raw
    );
    // Over the tool's own limit the call was read: its safe id is echoed, as on /v1/invoke.
    assert_eq!(r.body["tool_call_id"], "big-2", "{}", r.raw);
    env.no_record(&run.id, "big-1").await;
    env.no_record(&run.id, "big-2").await;

    // 405: GET and DELETE.
    for method in ["GET", "DELETE"] {
        let (r, h) = sc
            .send_with_headers(method, mcp_url(sc), t, &[], Bytes::new())
            .await;
        assert_eq!(r.status, 405, "{method}: {}", r.raw);
        assert!(!h.contains_key("mcp-session-id"));
    }

    // Notifications: 202, no body, in both revisions.
    for (headers, body) in [
        (
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
        (
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
        ),
        (
            &[
                ("mcp-protocol-version", STATELESS),
                ("mcp-method", "notifications/cancelled"),
            ][..],
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
        ),
    ] {
        let (r, _) = post(sc, t, headers, body).await;
        assert_eq!((r.status, r.raw.as_str()), (202, ""), "{body}");
    }

    // Every message of a code is the same fixed sentence.
    let mut messages: BTreeMap<i64, String> = BTreeMap::new();
    let mut fixed = |e: &Value| {
        let code = e["code"].as_i64().expect("code");
        let message = e["message"].as_str().expect("message").to_string();
        let first = messages.entry(code).or_insert_with(|| message.clone());
        assert_eq!(*first, message, "the message of {code} is not fixed");
    };

    // Handshake era: on HTTP 200. Then the same bodies under 2026-07-28: 400 or 404.
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Value, i64)> = vec![
        ("not JSON", "{oops", Value::Null, -32700),
        ("empty body", "", Value::Null, -32700),
        ("truncated", r#"{"jsonrpc":"2.0","id":3,"#, Value::Null, -32700),
        ("a batch", r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, Value::Null, -32600),
        ("an empty batch", "[]", Value::Null, -32600),
        ("a string", r#""ping""#, Value::Null, -32600),
        ("a number", "42", Value::Null, -32600),
        ("no jsonrpc", r#"{"id":4,"method":"ping"}"#, json!(4), -32600),
        ("jsonrpc 1.0", r#"{"jsonrpc":"1.0","id":"v1","method":"ping"}"#, json!("v1"), -32600),
        ("no method", r#"{"jsonrpc":"2.0","id":5}"#, json!(5), -32600),
        ("method not a string", r#"{"jsonrpc":"2.0","id":6,"method":7}"#, json!(6), -32600),
        ("id null", r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, Value::Null, -32600),
        ("id an object", r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, Value::Null, -32600),
        ("params a string", r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":"x"}"#, json!(8), -32600),
        ("unknown method", r#"{"jsonrpc":"2.0","id":"m-1","method":"resources/list"}"#, json!("m-1"), -32601),
        ("another unknown method", r#"{"jsonrpc":"2.0","id":10,"method":"tools/delete","params":{}}"#, json!(10), -32601),
        ("tools/call without params", r#"{"jsonrpc":"2.0","id":11,"method":"tools/call"}"#, json!(11), -32602),
        ("tools/call, params an array", r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":["search"]}"#, json!(12), -32602),
        ("tools/call without a name", r#"{"jsonrpc":"2.0","id":"n-13","method":"tools/call","params":{"arguments":{}}}"#, json!("n-13"), -32602),
        ("tools/call, name not a string", r#"{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":5}}"#, json!(14), -32602),
    ];
    for (what, body, id, code) in &cases {
        for headers in [&[][..], &[("mcp-protocol-version", "2025-06-18")][..]] {
            let (r, _) = post(sc, t, headers, body.to_string()).await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_i64()),
                (200, Some(*code)),
                "{what} {headers:?}: {}",
                r.raw
            );
            fixed(&assert_rpc_error(&r, 200, id, *code));
        }
    }
    for (what, body, id, code) in &cases {
        // Under 2026-07-28 the body carries the version where it can; the headers match it.
        let mut body = body.to_string();
        let mut method = String::from("ping");
        if let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(&body) {
            if let Some(Value::String(name)) = m.get("method") {
                method = name.clone();
            }
            match m.get_mut("params") {
                Some(Value::Object(p)) => {
                    p.insert("_meta".into(), Value::Object(stateless_meta()));
                }
                None if *code != -32600 => {
                    m.insert("params".into(), json!({"_meta": stateless_meta()}));
                }
                _ => {}
            }
            body = Value::Object(m).to_string();
        }
        let headers = [
            ("mcp-protocol-version", STATELESS),
            ("mcp-method", method.as_str()),
        ];
        let (r, _) = post(sc, t, &headers, body.clone()).await;
        let status = if *code == -32601 { 404 } else { 400 };
        assert_eq!(
            (r.status, r.body["error"]["code"].as_i64()),
            (status, Some(*code)),
            "2026-07-28, {what}: {}",
            r.raw
        );
        fixed(&assert_rpc_error(&r, status, id, *code));
    }

    // What only the stateless revision checks.
    let with_meta = |id: i64, method: &str, extra: Value| {
        let mut params = json!({"_meta": stateless_meta()});
        if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
            p.extend(e);
        }
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    };
    // _meta without the version or the capabilities: -32602 (400).
    for (id, meta) in [
        (20, json!({})),
        (
            21,
            json!({"io.modelcontextprotocol/clientCapabilities": {}}),
        ),
        (
            22,
            json!({"io.modelcontextprotocol/protocolVersion": STATELESS}),
        ),
    ] {
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": meta}});
        let (r, _) = post(sc, t, &modern, body.to_string()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(id), -32602));
    }
    let (r, _) = post(
        sc,
        t,
        &modern,
        r#"{"jsonrpc":"2.0","id":23,"method":"tools/list"}"#,
    )
    .await;
    fixed(&assert_rpc_error(&r, 400, &json!(23), -32602));
    // Headers that do not match the body: -32020 (400).
    let body = with_meta(24, "tools/list", json!({})).to_string();
    for headers in [
        vec![("mcp-protocol-version", STATELESS), ("mcp-method", "ping")],
        vec![("mcp-protocol-version", STATELESS)],
    ] {
        let (r, _) = post(sc, t, &headers, body.clone()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(24), -32020));
    }
    let call = with_meta(
        25,
        "tools/call",
        json!({"name": "search", "arguments": {"q": "x"}}),
    )
    .to_string();
    for name in [Some("slow"), None] {
        let mut headers = vec![
            ("mcp-protocol-version", STATELESS),
            ("mcp-method", "tools/call"),
        ];
        if let Some(n) = name {
            headers.push(("mcp-name", n));
        }
        let (r, _) = post(sc, t, &headers, call.clone()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(25), -32020));
    }
    // A version toolgate does not speak: -32022 (400), naming the ones it does.
    let mut odd = stateless_meta();
    odd.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        json!("2099-01-01"),
    );
    let body =
        json!({"jsonrpc": "2.0", "id": 26, "method": "tools/list", "params": {"_meta": odd}});
    let (r, _) = post(
        sc,
        t,
        &[
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "tools/list"),
        ],
        body.to_string(),
    )
    .await;
    let e = assert_rpc_error(&r, 400, &json!(26), -32022);
    fixed(&e);
    let supported = e["data"]["supported"].as_array().expect("data.supported");
    assert!(supported.contains(&json!(STATELESS)), "{e}");
    // No ping and no initialize in the stateless revision: -32601 (404).
    for (id, method) in [(27, "ping"), (28, "initialize")] {
        let body = with_meta(id, method, json!({})).to_string();
        let headers = [("mcp-protocol-version", STATELESS), ("mcp-method", method)];
        let (r, _) = post(sc, t, &headers, body).await;
        fixed(&assert_rpc_error(&r, 404, &json!(id), -32601));
    }

    // None of it reached a tool, created a record or spent budget.
    assert_eq!(env.fake.total_calls(), 0);
    assert_eq!(env.view(&run.id).await["calls_used"], 0);
    assert_eq!(env.facts(&run.id).await["excluded"], 0);
}

// ---------------------------------------------------------------------------------------------
// toolgate's errors as tool results.

/// Every toolgate error an MCP call can meet is an `isError` result on HTTP 200 with the id it
/// should echo, leaking nothing; its structuredContent is the body `/v1/invoke` gives for the
/// same fault (checked in a twin run with the same ids), and the record is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolgate_errors_are_tool_results() {
    let env = mcp_env(&store_yaml(None), "").await;
    let sc = &env.sc;
    let q = || json!({"q": "x"});
    let too_long: &'static str = Box::leak("a".repeat(129).into_boxed_str());

    // (what, tool, arguments (null: absent), tool_call_id ("": absent), code). The id is
    // echoed unless it is the fault; the run may call only `search` in the UNAUTHORIZED case.
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Value, &str, &str)> = vec![
        ("schema: q not a string", "search", json!({"q": 5}), "e-1", "INVALID_INPUT"),
        ("schema: arguments absent", "search", Value::Null, "e-2", "INVALID_INPUT"),
        ("arguments an array", "slow", json!([1]), "e-3", "INVALID_INPUT"),
        ("arguments a string", "mcp_search", json!("q"), "e-4", "INVALID_INPUT"),
        ("tool_call_id absent", "search", q(), "", "INVALID_TOOL_CALL_ID"),
        ("tool_call_id unsafe", "search", q(), "bad id", "INVALID_TOOL_CALL_ID"),
        ("tool_call_id too long", "search", q(), too_long, "INVALID_TOOL_CALL_ID"),
        ("unknown tool", "nope", q(), "e-6", "UNKNOWN_TOOL"),
        ("tool outside the run's tools", "mcp_search", q(), "e-7", "UNAUTHORIZED"),
        ("tool not read-only", "writer", q(), "e-8", "TOOL_NOT_READ_ONLY"),
        ("HTTP tool fails", "fail", json!({}), "e-9", "TOOL_EXECUTION_FAILED"),
        ("HTTP tool too slow", "slowtimeout", json!({"sleep_ms": 3000}), "e-10", "TOOL_TIMEOUT"),
        ("HTTP tool answers too much", "big", json!({}), "e-11", "RESULT_TOO_LARGE"),
        ("HTTP result not selectable", "unresolved", json!({}), "e-12", "PROJECTION_FAILED"),
        ("MCP tool answers isError", "mcp_broken", json!({}), "e-13", "TOOL_EXECUTION_FAILED"),
        ("MCP JSON-RPC error over SSE", "mcp_rpcerror", json!({}), "e-14", "TOOL_EXECUTION_FAILED"),
        ("MCP remote name unknown", "mcp_nosuch", json!({}), "e-15", "TOOL_EXECUTION_FAILED"),
        ("MCP upstream unreachable", "mcp_down", json!({}), "e-16", "TOOL_EXECUTION_FAILED"),
        ("MCP tool too slow (SSE)", "mcp_slow", json!({"ms": 5000}), "e-17", "TOOL_TIMEOUT"),
        ("MCP answer over raw_bytes", "mcp_small", q(), "e-18", "RESULT_TOO_LARGE"),
        ("MCP result not selectable", "mcp_unresolved", q(), "e-19", "PROJECTION_FAILED"),
    ];
    for (what, tool, args, id, code) in cases {
        let extra = if code == "UNAUTHORIZED" {
            json!({"tools": ["search"]})
        } else {
            json!({})
        };
        let echo = (code != "INVALID_TOOL_CALL_ID").then_some(id);
        let (id, args) = (
            (!id.is_empty()).then_some(id),
            (!args.is_null()).then_some(args),
        );
        let a = env.run(extra.clone()).await;
        let b = env.run(extra).await;
        let msg = call_msg(rpc_id(what), tool, args.clone(), Some(&a.id), id);
        let r = rpc(sc, &a.token, msg).await;
        let body = assert_mcp_error(&r, &rpc_id(what), code, echo);
        // The twin call on /v1/invoke (absent arguments are the input {}).
        let mut envelope =
            json!({"run_id": b.id, "tool": tool, "input": args.unwrap_or(json!({}))});
        if let Some(id) = id {
            envelope["tool_call_id"] = json!(id);
        }
        let twin = sc
            .invoke_raw(Some(&b.token), envelope.to_string(), &[])
            .await;
        assert_ne!(twin.status, 200, "{what}: {}", twin.raw);
        assert_eq!(body, twin.body, "{what}: MCP and /v1/invoke disagree");
        if let Some(id) = echo {
            let (ra, rb) = (env.record(&a.id, id).await, env.record(&b.id, id).await);
            assert_eq!(ra.status, rb.status, "{what}: one form left a record");
            if ra.status == 200 {
                for field in [
                    "tool",
                    "status",
                    "evidence_status",
                    "agent_result",
                    "error_code",
                ] {
                    assert_eq!(ra.body[field], rb.body[field], "{what}: {field}");
                }
                assert_eq!(ra.body["error_code"], code, "{what}");
            }
        }
    }

    // The stateless revision answers the same way, on 200 too.
    let a = env.run(json!({})).await;
    for (tool, id, code) in [
        ("nope", "s-1", "UNKNOWN_TOOL"),
        ("mcp_broken", "s-2", "TOOL_EXECUTION_FAILED"),
    ] {
        let msg = call_msg(rpc_id(id), tool, Some(json!({})), Some(&a.id), Some(id));
        let r = rpc_stateless(sc, &a.token, msg).await;
        let result = assert_rpc_result(&r, &rpc_id(id));
        check_is_error(&result, code, Some(id), true);
        assert_no_leak(&r.raw);
    }

    // The run binding: no run id, another run's id, an unsafe one.
    let a = env.run(json!({})).await;
    let other = env.run(json!({})).await;
    for (run_id, id) in [
        (None, "r-1"),
        (Some(other.id.as_str()), "r-2"),
        (Some("run 1"), "r-3"),
    ] {
        let msg = call_msg(rpc_id(id), "search", Some(q()), run_id, Some(id));
        let r = rpc(sc, &a.token, msg).await;
        assert_mcp_error(&r, &rpc_id(id), "RUN_MISMATCH", Some(id));
        env.no_record(&a.id, id).await;
        env.no_record(&other.id, id).await;
    }

    // The reservation: a duplicate id, the call budget, an ended run, a passed deadline.
    let a = env.run(json!({"budget": {"max_calls": 2}})).await;
    assert_mcp_ready(
        &mcp_call(&env, &a, "d-1", "search", q()).await,
        "d-1",
        "EVIDENCE_FOUND",
    );
    let first = env.record_ok(&a.id, "d-1").await;
    for tool in ["search", "mcp_search", "nope"] {
        let r = mcp_call(&env, &a, "d-1", tool, q()).await;
        if tool == "nope" {
            assert_mcp_error(&r, &rpc_id("d-1"), "UNKNOWN_TOOL", Some("d-1"));
        } else {
            assert_mcp_error(&r, &rpc_id("d-1"), "DUPLICATE_TOOL_CALL", Some("d-1"));
        }
    }
    let mut again = env.record_ok(&a.id, "d-1").await;
    let mut first = first;
    first.as_object_mut().expect("record").remove("ttl_ms");
    again.as_object_mut().expect("record").remove("ttl_ms");
    assert_eq!(first, again, "a duplicate touched the first record");
    assert_mcp_ready(
        &mcp_call(&env, &a, "d-2", "mcp_search", q()).await,
        "d-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &a, "d-3", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("d-3"), "BUDGET_EXHAUSTED", Some("d-3"));
    env.no_record(&a.id, "d-3").await;
    assert_eq!(env.view(&a.id).await["calls_used"], 2);

    let ended = env.run(json!({})).await;
    env.admin_post(&format!("/v1/runs/{}/end", ended.id)).await;
    let r = mcp_call(&env, &ended, "i-1", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("i-1"), "RUN_INACTIVE", Some("i-1"));

    let late = env.run(json!({"timeout_ms": 50})).await;
    let past = toolgate::clock::now_ms() + 50;
    let d = Deadline::after(Duration::from_secs(10), "the run deadline to pass");
    while toolgate::clock::now_ms() <= past {
        d.tick().await;
    }
    let r = mcp_call(&env, &late, "t-1", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("t-1"), "RUN_DEADLINE_EXCEEDED", Some("t-1"));
    env.no_record(&late.id, "t-1").await;

    // A cancel cuts a call in flight.
    let a = env.run(json!({})).await;
    let sc2 = env.sc.clone();
    let a2 = a.clone();
    let slow_calls = env.fake.calls("slow").len();
    let in_flight = tokio::spawn(async move {
        let msg = call_msg(
            rpc_id("c-1"),
            "slow",
            Some(json!({"sleep_ms": 15000})),
            Some(&a2.id),
            Some("c-1"),
        );
        rpc(&sc2, &a2.token, msg).await
    });
    wait_calls(&env.fake, "slow", slow_calls + 1).await;
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", a.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let r = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the cancelled call answered promptly")
        .expect("task");
    assert_mcp_error(&r, &rpc_id("c-1"), "RUN_CANCELLED", Some("c-1"));
    assert_eq!(
        env.record_ok(&a.id, "c-1").await["error_code"],
        "RUN_CANCELLED"
    );

    // The drain: a new call is refused while one is in flight.
    let a = env.run(json!({})).await;
    let in_flight = env.slow_call_in_flight(&a, "h-1", 1500).await;
    let task = env.sc.begin_shutdown();
    let d = Deadline::after(Duration::from_secs(2), "/readyz to turn 503");
    while env.sc.get_telemetry("/readyz").await.0 != 503 {
        d.tick().await;
    }
    let r = mcp_call(&env, &a, "h-2", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("h-2"), "SHUTTING_DOWN", Some("h-2"));
    assert_ready(
        &tokio::time::timeout(Duration::from_secs(10), in_flight)
            .await
            .expect("the call in flight finished")
            .expect("task"),
        "h-1",
        "EVIDENCE_FOUND",
    );
    let ran = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the sidecar drained")
        .expect("run task");
    assert!(ran.is_ok(), "{ran:?}");
}
