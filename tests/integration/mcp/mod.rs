//! MCP: toolgate as an MCP server (`POST /mcp` on the agent listener) and MCP servers as tool
//! upstreams (`protocol: mcp`), against the official SDKs, pinned in `tests/mcp/`: the Python
//! `mcp` client (default `auto` mode, which probes `server/discover`, and `legacy`, the
//! `initialize` handshake), the TypeScript `@modelcontextprotocol/sdk` 1.x client, and an
//! upstream built with the Python SDK's `MCPServer` in JSON and in SSE response mode.
//!
//! `scripts/test.sh` installs the SDKs (through `scripts/install-deps.sh test`) and exports
//! `TOOLGATE_MCP_PYTHON` (the virtualenv's python, default `tests/mcp/.venv/bin/python`) and
//! `TOOLGATE_MCP_NODE_DIR` (where `client.mjs` and its `node_modules` are, default `tests/mcp`).
//! A missing SDK fails the test with the command that installs it; nothing is skipped.
//!
//! The two Python upstreams (JSON and SSE) are shared by the whole test binary; each test tells
//! its requests apart by its own run id. A stream that never ends is a small hyper server
//! ([`endless`]), so its bytes can be counted.
//!
//! This module holds what the topics share: the sidecar with the MCP tools, raw MCP requests,
//! and the checks of MCP answers; [`sdk`] finds the SDKs and runs their upstream and clients.
//!
//! - [`clients`]: the official Python and TypeScript clients against toolgate.
//! - [`lifecycle`]: initialize, ping, server/discover and tools/list, request by request.
//! - [`errors`]: JSON-RPC errors, refusals at the HTTP level, and toolgate's errors as
//!   `isError` tool results.
//! - [`pipeline`]: one pipeline for both call forms, MCP and `/v1/invoke`.
//! - [`endless`]: an upstream event stream that never ends.
//! - [`upstream_token`]: the upstream token reaches its upstream and nothing else.
//! - [`telemetry`]: the MCP request metric, and the spans of an MCP upstream call.

mod clients;
mod endless;
mod errors;
mod lifecycle;
mod pipeline;
mod sdk;
mod telemetry;
mod upstream_token;

use std::sync::Arc;

use bytes::Bytes;
use hyper::HeaderMap;
use serde_json::{Map, Value, json};
use toolgate::error::CodeName;

use crate::boundary::{Env, Run, assert_error};
use crate::support::fake_tool::{FakeTool, RAW_MARKER};
use crate::support::sidecar::{Reply, Sidecar};

use sdk::{Upstreams, upstreams};

/// The stateless revision.
const STATELESS: &str = "2026-07-28";
const RUN_ID_KEY: &str = "toolgate.dev/run_id";
const TOOL_CALL_ID_KEY: &str = "toolgate.dev/tool_call_id";
const EVIDENCE_KEY: &str = "toolgate.dev/evidence_status";
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
/// Strings no agent-facing error may contain: a payload, a host, a store key, a backend name.
const LEAKS: [&str; 4] = [RAW_MARKER, "127.0.0.1", "toolgate:{", "redis"];
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const SEARCH_SCHEMA_YAML: &str =
    "{type: object, required: [q], properties: {q: {type: string, maxLength: 512}}}";

fn search_schema() -> Value {
    json!({"type": "object", "required": ["q"], "properties": {"q": {"type": "string", "maxLength": 512}}})
}

fn toolgate_info() -> Value {
    json!({"name": "toolgate", "version": env!("CARGO_PKG_VERSION")})
}

// ---------------------------------------------------------------------------------------------
// The sidecar and its tools.

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The tools the MCP tests call: HTTP tools on the fake tool service, MCP tools on the shared
/// upstreams (sending their token), then `extra` (YAML list items).
fn mcp_config(store: &str, fake: &FakeTool, ups: &Upstreams, extra: &str) -> String {
    let ro = "read_only: true";
    let token_file = ups.token_file.display().to_string();
    let http = |name: &str, route: &str, rest: &str| {
        format!(
            "  - {{name: {name}, upstream: \"{}\", {ro}, {rest}}}\n",
            fake.url(route)
        )
    };
    let mcp = |name: &str, url: &str, remote: &str, rest: &str| {
        format!(
            "  - {{name: {name}, upstream: \"{url}\", protocol: mcp, remote_name: {remote}, {ro}, \
             upstream_token_file: \"{token_file}\", {rest}}}\n"
        )
    };
    let (json_url, sse_url) = (ups.json.url(), ups.sse.url());
    let items = "projection: {select: /structuredContent/results, max_items: 5, fields: [title, url, snippet]}";
    let mut t = String::new();
    t += &http(
        "search",
        "search",
        &format!(
            "description: \"Searches the fake corpus.\", timeout_ms: 5000, input_schema: {SEARCH_SCHEMA_YAML}, \
             projection: {{select: /results, max_items: 5, fields: [title, url, snippet]}}"
        ),
    );
    t += &http(
        "slow",
        "slow",
        "timeout_ms: 30000, projection: {select: /results, max_items: 1, fields: [title]}",
    );
    t += &http(
        "slowtimeout",
        "slow",
        "timeout_ms: 300, projection: {select: /results}",
    );
    for route in ["fail", "big", "unresolved"] {
        t += &http(route, route, "projection: {select: /results}");
    }
    t += &http(
        "tiny",
        "object",
        "limits: {request_bytes: 400}, projection: {select: /results, fields: [title]}",
    );
    t += &http(
        "echo",
        "echo",
        "projection: {select: /results, fields: [input]}",
    );
    t += &format!(
        "  - {{name: writer, upstream: \"{}\", read_only: false}}\n",
        fake.url("echo")
    );
    t += &mcp(
        "mcp_search",
        &json_url,
        "search",
        &format!(
            "description: \"Searches over MCP.\", input_schema: {SEARCH_SCHEMA_YAML}, {items}"
        ),
    );
    t += &mcp("mcp_search_sse", &sse_url, "search", items);
    t += &mcp(
        "mcp_broken",
        &json_url,
        "broken",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_rpcerror",
        &sse_url,
        "rpcerror",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_nosuch",
        &json_url,
        "nosuch",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_slow",
        &sse_url,
        "slow",
        "timeout_ms: 300, projection: {select: /structuredContent/results}",
    );
    t += &mcp(
        "mcp_small",
        &json_url,
        "search",
        &format!("limits: {{raw_bytes: 256}}, {items}"),
    );
    t += &mcp(
        "mcp_unresolved",
        &json_url,
        "search",
        "projection: {select: /structuredContent/nothing}",
    );
    t += &format!(
        "  - {{name: mcp_down, upstream: \"http://127.0.0.1:{}/mcp\", protocol: mcp, {ro}}}\n",
        closed_port()
    );
    t += extra;
    format!(
        "{store}limits: {{request_bytes: 8192}}\n\
         runs: {{default_timeout_ms: 60000, max_timeout_ms: 120000, default_max_calls: 100}}\n\
         tools:\n{t}"
    )
}

/// A sidecar with the MCP tools (plus `extra`), in front of a new fake tool service.
async fn mcp_env(store: &str, extra: &str) -> Env {
    let ups = upstreams().await;
    let fake = FakeTool::start().await;
    let config = mcp_config(store, &fake, ups, extra);
    let sc = Arc::new(Sidecar::start(&config).await);
    Env { sc, fake, config }
}

// ---------------------------------------------------------------------------------------------
// Raw MCP requests.

fn mcp_url(sc: &Sidecar) -> String {
    format!("http://{}/mcp", sc.agent)
}

/// `POST /mcp` with the headers a Streamable HTTP client sends, plus `headers`. Checks that no
/// answer ever carries an `Mcp-Session-Id`.
async fn post(
    sc: &Sidecar,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (Reply, HeaderMap) {
    let mut h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    h.extend_from_slice(headers);
    let (reply, headers) = sc
        .send_with_headers("POST", mcp_url(sc), token, &h, body)
        .await;
    assert!(
        !headers.contains_key("mcp-session-id"),
        "toolgate issued an Mcp-Session-Id: {headers:?}"
    );
    reply_checks(&reply, &headers);
    (reply, headers)
}

/// Every JSON answer is `application/json`.
fn reply_checks(reply: &Reply, headers: &HeaderMap) {
    if !reply.raw.is_empty() {
        let ct = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            ct.starts_with("application/json"),
            "content-type {ct:?}: {}",
            reply.raw
        );
    }
}

/// A handshake-era request (no `MCP-Protocol-Version` header).
async fn rpc(sc: &Sidecar, token: &str, msg: Value) -> Reply {
    post(sc, Some(token), &[], msg.to_string()).await.0
}

/// The `_meta` a 2026-07-28 request must carry.
fn stateless_meta() -> Map<String, Value> {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
    });
    meta.as_object().expect("object").clone()
}

/// A 2026-07-28 request: `_meta` merged into `msg.params._meta`, and the `MCP-Protocol-Version`,
/// `Mcp-Method` (and for `tools/call` `Mcp-Name`) headers matching the body.
async fn rpc_stateless(sc: &Sidecar, token: &str, mut msg: Value) -> Reply {
    let method = msg["method"].as_str().expect("method").to_string();
    if msg.get("params").is_none() {
        msg["params"] = json!({});
    }
    let meta = msg["params"]
        .as_object_mut()
        .expect("params object")
        .entry("_meta")
        .or_insert_with(|| json!({}));
    meta.as_object_mut()
        .expect("_meta")
        .extend(stateless_meta());
    let name = msg["params"]["name"].as_str().map(str::to_string);
    let mut headers = vec![
        ("mcp-protocol-version", STATELESS),
        ("mcp-method", method.as_str()),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name.as_str()));
    }
    post(sc, Some(token), &headers, msg.to_string()).await.0
}

/// A `tools/call` message; `run_id` and `call_id` go in `_meta`, `args` (when given) in
/// `arguments`.
fn call_msg(
    rpc_id: Value,
    tool: &str,
    args: Option<Value>,
    run_id: Option<&str>,
    call_id: Option<&str>,
) -> Value {
    let mut meta = Map::new();
    if let Some(r) = run_id {
        meta.insert(RUN_ID_KEY.into(), json!(r));
    }
    if let Some(c) = call_id {
        meta.insert(TOOL_CALL_ID_KEY.into(), json!(c));
    }
    let mut params = json!({"name": tool, "_meta": meta});
    if let Some(a) = args {
        params["arguments"] = a;
    }
    json!({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params})
}

/// The JSON-RPC id a test uses for a call: derived from its tool_call_id.
fn rpc_id(call_id: &str) -> Value {
    json!(format!("rpc-{call_id}"))
}

/// A handshake-era `tools/call` on `run`.
async fn mcp_call(env: &Env, run: &Run, call_id: &str, tool: &str, args: Value) -> Reply {
    let msg = call_msg(
        rpc_id(call_id),
        tool,
        Some(args),
        Some(&run.id),
        Some(call_id),
    );
    rpc(&env.sc, &run.token, msg).await
}

// ---------------------------------------------------------------------------------------------
// Assertions.

#[track_caller]
fn assert_no_leak(raw: &str) {
    for leak in LEAKS {
        assert!(!raw.contains(leak), "MCP answer leaks {leak:?}: {raw}");
    }
}

/// A JSON-RPC success on HTTP 200 echoing `id`; returns its result.
#[track_caller]
fn assert_rpc_result(r: &Reply, id: &Value) -> Value {
    assert_eq!(r.status, 200, "expected a JSON-RPC result: {}", r.raw);
    let keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, ["id", "jsonrpc", "result"], "{}", r.raw);
    assert_eq!(r.body["jsonrpc"], "2.0");
    assert_eq!(&r.body["id"], id, "echoed id: {}", r.raw);
    r.body["result"].clone()
}

/// A JSON-RPC error with this HTTP status, id and code, and a non-empty message, leaking
/// nothing; returns the error object.
#[track_caller]
fn assert_rpc_error(r: &Reply, status: u16, id: &Value, code: i64) -> Value {
    assert_eq!(
        (r.status, r.body["error"]["code"].as_i64()),
        (status, Some(code)),
        "expected HTTP {status} with JSON-RPC error {code}: {}",
        r.raw
    );
    let mut keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    keys.sort();
    assert_eq!(keys, ["error", "id", "jsonrpc"], "{}", r.raw);
    assert_eq!(r.body["jsonrpc"], "2.0");
    assert_eq!(&r.body["id"], id, "echoed id: {}", r.raw);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{}", r.raw);
    assert_no_leak(&r.raw);
    r.body["error"].clone()
}

/// Compares a result's `_meta` with `expected`; the stateless revision may add toolgate's
/// serverInfo.
#[track_caller]
fn check_meta(meta: &Value, expected: Value, stateless: bool) {
    let mut m = meta.as_object().cloned().unwrap_or_default();
    if stateless && let Some(info) = m.remove(SERVER_INFO_KEY) {
        assert_eq!(info, toolgate_info());
    }
    assert_eq!(Value::Object(m), expected, "_meta");
}

/// A tools/call result that is toolgate's READY answer, as sent or as an SDK saw it; returns its
/// structuredContent (the agent result).
#[track_caller]
fn check_ready(result: &Value, call_id: &str, evidence: &str, stateless: bool) -> Value {
    assert_eq!(result["isError"], false, "{result}");
    let structured = result["structuredContent"].clone();
    assert!(structured.is_object(), "{result}");
    let content = result["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{result}");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().expect("text");
    let parsed: Value = serde_json::from_str(text).expect("the text is JSON");
    assert_eq!(parsed, structured, "the text is the structured result");
    assert_eq!(
        text,
        serde_json::to_string(&parsed).expect("json"),
        "the text is compact JSON"
    );
    check_meta(
        &result["_meta"],
        json!({TOOL_CALL_ID_KEY: call_id, EVIDENCE_KEY: evidence}),
        stateless,
    );
    assert!(!result.to_string().contains(RAW_MARKER), "{result}");
    structured
}

/// A tools/call result that is toolgate's error `code`: fixed text, the error body as
/// structuredContent, the echoed id in `_meta`.
#[track_caller]
fn check_is_error(result: &Value, code: &str, echo: Option<&str>, stateless: bool) {
    let message = CodeName::parse(code).expect("a contract code").message();
    assert_eq!(result["isError"], true, "expected {code}: {result}");
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": format!("{code}: {message}")}]),
        "{result}"
    );
    let body = &result["structuredContent"];
    let keys: Vec<&String> = body.as_object().expect("error body").keys().collect();
    assert_eq!(keys, ["status", "tool_call_id", "error"], "{result}");
    assert_eq!(
        body,
        &json!({"status": "ERROR", "tool_call_id": echo, "error": {"code": code, "message": message}}),
        "{result}"
    );
    check_meta(&result["_meta"], json!({TOOL_CALL_ID_KEY: echo}), stateless);
}

/// The wire keys of a handshake-era tools/call result.
#[track_caller]
fn check_result_keys(result: &Value) {
    let keys: Vec<&String> = result.as_object().expect("result").keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["_meta", "content", "isError", "structuredContent"],
        "{result}"
    );
}

/// A READY tools/call answer on the wire (handshake era); returns the agent result.
#[track_caller]
fn assert_mcp_ready(r: &Reply, call_id: &str, evidence: &str) -> Value {
    let result = assert_rpc_result(r, &rpc_id(call_id));
    check_result_keys(&result);
    assert!(
        !r.raw.contains(RAW_MARKER),
        "READY leaks raw data: {}",
        r.raw
    );
    check_ready(&result, call_id, evidence, false)
}

/// An `isError` tools/call answer on the wire (handshake era) for `code`; returns the error
/// body.
#[track_caller]
fn assert_mcp_error(r: &Reply, rpc: &Value, code: &str, echo: Option<&str>) -> Value {
    let result = assert_rpc_result(r, rpc);
    check_result_keys(&result);
    check_is_error(&result, code, echo, false);
    assert_no_leak(&r.raw);
    result["structuredContent"].clone()
}

/// A toolgate error body at the HTTP level (401, 413).
#[track_caller]
fn assert_http_refusal(r: &Reply, headers: &HeaderMap, status: u16, code: &str) {
    assert_error(r, status, code, None);
    if code == "UNAUTHENTICATED" {
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer"),
            "{headers:?}"
        );
    }
}

/// The agent result of the fake `/search` through `search`'s projection.
fn fake_search_result() -> Value {
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"title": format!("t{i}"), "url": format!("https://e.x/{i}"), "snippet": "s"}))
        .collect();
    json!({"items": items, "total_items": 7})
}

/// The agent result of the upstream's `search` through the MCP tools' projection.
fn upstream_search_result(q: &str) -> Value {
    let items: Vec<Value> = (1..=5)
        .map(|i| {
            json!({
                "title": format!("Result {i} for {q}"),
                "url": format!("https://example.com/{i}"),
                "snippet": format!("Snippet {i} about {q}."),
            })
        })
        .collect();
    json!({"items": items, "total_items": 7})
}

/// The tool_call_ids of a run's facts, in order.
async fn fact_ids(env: &Env, run_id: &str) -> Vec<String> {
    env.facts(run_id).await["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| f["tool_call_id"].as_str().expect("id").to_string())
        .collect()
}
