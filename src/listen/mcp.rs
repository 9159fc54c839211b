//! The MCP front end: `POST /mcp` on the agent listener (Streamable HTTP), stateless.
//!
//! It only translates. A `tools/call` becomes one [`Incoming`] call and runs the same pipeline,
//! checks, record and metrics as `POST /v1/invoke`; its answer becomes an MCP tool result
//! (`isError` for every toolgate error). toolgate issues no `Mcp-Session-Id` and keeps no MCP
//! state, so any replica that shares the token key serves any request.
//!
//! Each request is answered as its revision defines:
//! - without an `MCP-Protocol-Version` header, or with a handshake-era one (2025-06-18,
//!   2025-11-25 and older), the handshake rules: `initialize`, `ping`, JSON-RPC errors on HTTP 200;
//! - with `2026-07-28` (or any other value), the stateless rules: `_meta` carries the version
//!   and client capabilities, the `Mcp-Method`/`Mcp-Name` headers must match the body, every
//!   result has `resultType`, `tools/list` has `ttlMs` and `cacheScope`, errors carry their HTTP
//!   status (400, or 404 for an unknown method), and there is no `ping`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hyper::body::Incoming as Body;
use hyper::header::{ALLOW, HeaderValue, WWW_AUTHENTICATE};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};

use super::http;
use crate::body::{ReadError, read_capped};
use crate::call::{self, Form, Incoming, McpCall, Received, Shown, State};
use crate::error::{Code, Error};
use crate::ids::ToolCallId;
use crate::metrics::{McpMethod, Outcome};

/// The handshake revisions toolgate answers, newest first.
const HANDSHAKE_VERSIONS: [&str; 2] = ["2025-11-25", "2025-06-18"];
/// Header values of revisions older than toolgate's, still answered with the handshake rules.
const OLDER_VERSIONS: [&str; 2] = ["2025-03-26", "2024-11-05"];
/// The stateless revision.
const STATELESS: &str = "2026-07-28";
/// How long a client may take to send its body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
const RUN_ID_KEY: &str = "toolgate.dev/run_id";
const TOOL_CALL_ID_KEY: &str = "toolgate.dev/tool_call_id";
const EVIDENCE_KEY: &str = "toolgate.dev/evidence_status";

/// JSON-RPC and MCP error codes toolgate answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RpcError {
    Parse,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    Internal,
    HeaderMismatch,
    UnsupportedVersion,
}

impl RpcError {
    fn code(self) -> i64 {
        match self {
            RpcError::Parse => -32700,
            RpcError::InvalidRequest => -32600,
            RpcError::MethodNotFound => -32601,
            RpcError::InvalidParams => -32602,
            RpcError::Internal => -32603,
            RpcError::HeaderMismatch => -32020,
            RpcError::UnsupportedVersion => -32022,
        }
    }

    /// A fixed sentence: never request content.
    fn message(self) -> &'static str {
        match self {
            RpcError::Parse => "Parse error: the body is not JSON.",
            RpcError::InvalidRequest => "Invalid request: not a JSON-RPC 2.0 request object.",
            RpcError::MethodNotFound => "Method not found.",
            RpcError::InvalidParams => "Invalid params.",
            RpcError::Internal => "Internal error.",
            RpcError::HeaderMismatch => "Header mismatch: the MCP headers do not match the body.",
            RpcError::UnsupportedVersion => "Unsupported protocol version.",
        }
    }

    /// The HTTP status under the stateless revision (handshake-era errors travel on 200).
    fn status(self) -> StatusCode {
        match self {
            RpcError::MethodNotFound => StatusCode::NOT_FOUND,
            RpcError::Internal => StatusCode::OK,
            RpcError::Parse
            | RpcError::InvalidRequest
            | RpcError::InvalidParams
            | RpcError::HeaderMismatch
            | RpcError::UnsupportedVersion => StatusCode::BAD_REQUEST,
        }
    }
}

/// Which revision's rules a request is answered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    Handshake,
    Stateless,
}

/// What one POST is answered with.
enum Reply {
    /// A JSON-RPC result (its HTTP status is 200).
    Result(Value),
    /// A READY tool result, already serialized: the agent result is spliced in as it was sized.
    Ready(Vec<u8>),
    Error(RpcError, Option<Value>),
    /// A notification: 202, no body.
    Accepted,
    /// Refused at the HTTP level, with the error body (echoing the call's id when it is safe)
    /// and its status.
    Http(Code, Option<ToolCallId>),
}

/// Serves `/mcp`. Never fails.
pub async fn handle(state: Arc<State>, req: Request<Body>) -> Response<http::Body> {
    if req.method() != Method::POST {
        let mut resp = http::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "",
            "text/plain; charset=utf-8",
        );
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return resp;
    }
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if state.tokens.run_of(&headers).is_none() {
        return refuse(&state, Code::Unauthenticated);
    }
    let cap = state.policy.get().max_request_bytes;
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read_capped(body, cap)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(ReadError::TooLarge)) => return refuse(&state, Code::RequestTooLarge),
        Ok(Err(ReadError::Body(_))) | Err(_) => {
            return respond(
                &state,
                era(&headers),
                McpMethod::Other,
                None,
                Reply::Error(RpcError::Parse, None),
            );
        }
    };
    let era = era(&headers);
    let message = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return respond(
                &state,
                era,
                McpMethod::Other,
                None,
                Reply::Error(RpcError::InvalidRequest, None),
            );
        }
        Err(_) => {
            return respond(
                &state,
                era,
                McpMethod::Other,
                None,
                Reply::Error(RpcError::Parse, None),
            );
        }
    };
    let id = message.get("id").cloned();
    let Some(request) = Rpc::read(message) else {
        let id = id.filter(is_valid_id);
        return respond(
            &state,
            era,
            McpMethod::Other,
            id,
            Reply::Error(RpcError::InvalidRequest, None),
        );
    };
    let method = method_label(&request);
    let id = request.id.clone();
    let reply = match id {
        None => Reply::Accepted,
        Some(_) => dispatch(&state, era, headers, request, &body).await,
    };
    respond(&state, era, method, id, reply)
}

/// A JSON-RPC 2.0 request or notification.
struct Rpc {
    id: Option<Value>,
    method: String,
    params: Option<Value>,
}

impl Rpc {
    fn read(mut m: Map<String, Value>) -> Option<Rpc> {
        if m.get("jsonrpc") != Some(&json!("2.0")) {
            return None;
        }
        let Some(Value::String(method)) = m.remove("method") else {
            return None;
        };
        let id = match m.remove("id") {
            None => None,
            Some(id) if is_valid_id(&id) => Some(id),
            Some(_) => return None,
        };
        let params = m.remove("params");
        if params
            .as_ref()
            .is_some_and(|p| !(p.is_object() || p.is_array()))
        {
            return None;
        }
        Some(Rpc { id, method, params })
    }

    fn params(&self) -> Option<&Map<String, Value>> {
        self.params.as_ref().and_then(Value::as_object)
    }

    fn meta(&self) -> Option<&Map<String, Value>> {
        self.params()?.get("_meta")?.as_object()
    }
}

/// A request id is a string or a number.
fn is_valid_id(id: &Value) -> bool {
    id.is_string() || id.is_number()
}

fn method_label(request: &Rpc) -> McpMethod {
    if request.id.is_none() {
        return McpMethod::Notification;
    }
    match request.method.as_str() {
        "initialize" => McpMethod::Initialize,
        "server/discover" => McpMethod::Discover,
        "ping" => McpMethod::Ping,
        "tools/list" => McpMethod::ToolsList,
        "tools/call" => McpMethod::ToolsCall,
        _ => McpMethod::Other,
    }
}

/// The revision a request is answered by, from its `MCP-Protocol-Version` header.
fn era(headers: &HeaderMap) -> Era {
    match headers
        .get("mcp-protocol-version")
        .map(|v| v.to_str().unwrap_or(""))
    {
        None => Era::Handshake,
        Some(v) if HANDSHAKE_VERSIONS.contains(&v) || OLDER_VERSIONS.contains(&v) => Era::Handshake,
        Some(_) => Era::Stateless,
    }
}

async fn dispatch(
    state: &State,
    era: Era,
    headers: HeaderMap,
    request: Rpc,
    body: &Bytes,
) -> Reply {
    if era == Era::Stateless
        && let Some(refused) = check_stateless(&headers, &request)
    {
        return refused;
    }
    match (request.method.as_str(), era) {
        ("initialize", Era::Handshake) => Reply::Result(initialize(&request)),
        ("ping", Era::Handshake) => Reply::Result(json!({})),
        ("server/discover", _) => Reply::Result(discover()),
        ("tools/list", _) => tools_list(state, &headers).await,
        ("tools/call", _) => tools_call(state, era, headers, request, body).await,
        _ => Reply::Error(RpcError::MethodNotFound, None),
    }
}

/// The stateless revision's checks, in its order: `_meta`, then the headers against the body,
/// then the version.
fn check_stateless(headers: &HeaderMap, request: &Rpc) -> Option<Reply> {
    let meta = request.meta();
    let version = meta
        .and_then(|m| m.get(PROTOCOL_VERSION_KEY))
        .and_then(Value::as_str);
    let capabilities = meta.and_then(|m| m.get(CLIENT_CAPABILITIES_KEY));
    let Some(version) = version.filter(|_| capabilities.is_some_and(Value::is_object)) else {
        return Some(Reply::Error(RpcError::InvalidParams, None));
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("mcp-protocol-version") != Some(version)
        || header("mcp-method") != Some(request.method.as_str())
    {
        return Some(Reply::Error(RpcError::HeaderMismatch, None));
    }
    if request.method == "tools/call" {
        let name = request
            .params()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str);
        if name.is_some() && header("mcp-name").and_then(decode_name).as_deref() != name {
            return Some(Reply::Error(RpcError::HeaderMismatch, None));
        }
    }
    if version != STATELESS {
        let supported: Vec<&str> = std::iter::once(STATELESS)
            .chain(HANDSHAKE_VERSIONS)
            .collect();
        return Some(Reply::Error(
            RpcError::UnsupportedVersion,
            Some(json!({"supported": supported, "requested": version})),
        ));
    }
    None
}

/// An `Mcp-Name` value: plain, or `=?base64?…?=` for values a header cannot carry as they are.
fn decode_name(value: &str) -> Option<String> {
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(encoded) => BASE64
            .decode(encoded)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        None => Some(value.to_string()),
    }
}

fn server_info() -> Value {
    json!({"name": "toolgate", "version": env!("CARGO_PKG_VERSION")})
}

fn capabilities() -> Value {
    json!({"tools": {"listChanged": false}})
}

/// The client's version if toolgate speaks it, else the newest handshake revision.
fn initialize(request: &Rpc) -> Value {
    let asked = request
        .params()
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = asked
        .filter(|v| HANDSHAKE_VERSIONS.contains(v))
        .unwrap_or(HANDSHAKE_VERSIONS[0]);
    json!({"protocolVersion": version, "capabilities": capabilities(), "serverInfo": server_info()})
}

fn discover() -> Value {
    let supported: Vec<&str> = std::iter::once(STATELESS)
        .chain(HANDSHAKE_VERSIONS)
        .collect();
    json!({
        "supportedVersions": supported,
        "capabilities": capabilities(),
        "ttlMs": 0,
        "cacheScope": "public",
    })
}

/// The tools this run may call: configured, read-only, and allowed by the run's `tools`.
async fn tools_list(state: &State, headers: &HeaderMap) -> Reply {
    let Some(run_id) = state.tokens.run_of(headers) else {
        return Reply::Http(Code::Unauthenticated, None);
    };
    let tools = match state.callable_tools(&run_id).await {
        Ok(tools) => tools,
        Err(e) => {
            tracing::warn!(code = e.code.as_str(), cause = %e.cause, "MCP tools/list failed");
            return Reply::Error(RpcError::Internal, None);
        }
    };
    let tools: Vec<Value> = tools
        .into_iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": t.input_schema.clone().unwrap_or_else(|| json!({"type": "object"})),
                "annotations": {"readOnlyHint": true},
            })
        })
        .collect();
    let mut result = json!({"tools": tools});
    result["ttlMs"] = json!(0);
    // The list depends on the run token: it must not be shared across runs.
    result["cacheScope"] = json!("private");
    Reply::Result(result)
}

/// `tools/call`: the call pipeline, its answer as an MCP tool result.
async fn tools_call(
    state: &State,
    era: Era,
    headers: HeaderMap,
    request: Rpc,
    body: &Bytes,
) -> Reply {
    let Some(Value::Object(mut params)) = request.params else {
        return Reply::Error(RpcError::InvalidParams, None);
    };
    // Moved out, not copied: the arguments are the input as parsed once.
    let arguments = params.remove("arguments");
    let Some(tool) = params.get("name").and_then(Value::as_str) else {
        return Reply::Error(RpcError::InvalidParams, None);
    };
    let meta = params.get("_meta").and_then(Value::as_object);
    let claim = |key: &str| {
        meta.and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let input = match arguments {
        None => Some(json!({})),
        Some(v @ Value::Object(_)) => Some(v),
        Some(_) => None,
    };
    let call = McpCall {
        tool: tool.to_string(),
        run_id: claim(RUN_ID_KEY),
        tool_call_id: claim(TOOL_CALL_ID_KEY),
        input,
        traceparent: claim("traceparent").and_then(|t| HeaderValue::from_str(&t).ok()),
        request_id: request.id.as_ref().map(|id| match id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
    };
    let incoming = Incoming {
        form: Form::Mcp(call),
        headers,
        // The body as received: preflight step 1 checks its size against the tool's limit.
        body: Received::Complete(body.clone()),
    };
    let answer = call::handle(state, incoming).await;
    let id = answer.tool_call_id.as_ref();
    match &answer.result {
        Err(Error {
            code: code @ (Code::Unauthenticated | Code::RequestTooLarge),
            ..
        }) => Reply::Http(*code, answer.tool_call_id.clone()),
        Ok(shown) => Reply::Ready(ready_result(era, id, shown)),
        Err(e) => Reply::Result(error_result(id, e)),
    }
}

/// A READY answer: the agent result as `structuredContent` and, as the revisions ask, its
/// compact JSON as text. Written around the bytes whose size was checked, not re-serialized.
fn ready_result(era: Era, id: Option<&ToolCallId>, shown: &Shown) -> Vec<u8> {
    let text =
        serde_json::to_string(&String::from_utf8_lossy(&shown.result_json)).unwrap_or_default();
    let mut meta = json!({
        TOOL_CALL_ID_KEY: id.map(ToolCallId::as_str),
        EVIDENCE_KEY: shown.evidence.as_str(),
    });
    if era == Era::Stateless {
        meta[SERVER_INFO_KEY] = server_info();
    }
    let meta = meta.to_string();
    let mut out = Vec::with_capacity(shown.result_json.len() + text.len() + meta.len() + 128);
    out.extend_from_slice(br#"{"content":[{"type":"text","text":"#);
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(br#"}],"structuredContent":"#);
    out.extend_from_slice(&shown.result_json);
    out.extend_from_slice(br#","isError":false,"_meta":"#);
    out.extend_from_slice(meta.as_bytes());
    if era == Era::Stateless {
        out.extend_from_slice(br#","resultType":"complete""#);
    }
    out.push(b'}');
    out
}

/// An error as an `isError` result carrying the error body, so the model sees the code.
fn error_result(id: Option<&ToolCallId>, e: &Error) -> Value {
    let body: Value =
        serde_json::from_slice(&crate::error::body(id, e.code)).unwrap_or(Value::Null);
    json!({
        "content": [{"type": "text", "text": format!("{}: {}", e.code.as_str(), e.code.message())}],
        "structuredContent": body,
        "isError": true,
        "_meta": {TOOL_CALL_ID_KEY: id.map(ToolCallId::as_str)},
    })
}

/// An HTTP-level refusal (no valid token, body over the cap): the error body, counted like the
/// same refusal on `/v1/invoke`.
fn refuse(state: &State, code: Code) -> Response<http::Body> {
    state.metrics.rejected(None, &Error::new(code));
    state.metrics.mcp_request(McpMethod::Other, Outcome::Error);
    http_refusal(code, None)
}

fn http_refusal(code: Code, tool_call_id: Option<&ToolCallId>) -> Response<http::Body> {
    let mut resp = http::error(code, tool_call_id);
    if code == Code::Unauthenticated {
        resp.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// Writes the JSON-RPC response and counts it.
fn respond(
    state: &State,
    era: Era,
    method: McpMethod,
    id: Option<Value>,
    reply: Reply,
) -> Response<http::Body> {
    let (status, body, outcome) = match reply {
        Reply::Accepted => {
            state.metrics.mcp_request(method, Outcome::Ok);
            return http::text(StatusCode::ACCEPTED, "", "application/json");
        }
        Reply::Http(code, tool_call_id) => {
            state.metrics.mcp_request(method, Outcome::Error);
            return http_refusal(code, tool_call_id.as_ref());
        }
        Reply::Ready(result) => {
            state.metrics.mcp_request(method, Outcome::Ok);
            let id = serde_json::to_vec(&id).unwrap_or_default();
            let mut out = Vec::with_capacity(result.len() + id.len() + 32);
            out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
            out.extend_from_slice(&id);
            out.extend_from_slice(br#","result":"#);
            out.extend_from_slice(&result);
            out.push(b'}');
            return http::bytes(StatusCode::OK, out);
        }
        Reply::Result(mut result) => {
            let outcome = if result.get("isError") == Some(&Value::Bool(true)) {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            if era == Era::Stateless
                && let Value::Object(m) = &mut result
            {
                m.insert("resultType".into(), json!("complete"));
                let meta = m.entry("_meta").or_insert_with(|| json!({}));
                if let Value::Object(meta) = meta {
                    meta.insert(SERVER_INFO_KEY.into(), server_info());
                }
            } else if let Value::Object(m) = &mut result {
                // Handshake-era results carry no caching fields.
                m.remove("ttlMs");
                m.remove("cacheScope");
            }
            (
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
                outcome,
            )
        }
        Reply::Error(error, data) => {
            let mut e = json!({"code": error.code(), "message": error.message()});
            if let Some(data) = data {
                e["data"] = data;
            }
            let status = match era {
                Era::Handshake => StatusCode::OK,
                Era::Stateless => error.status(),
            };
            (
                status,
                json!({"jsonrpc": "2.0", "id": id, "error": e}),
                Outcome::Error,
            )
        }
    };
    state.metrics.mcp_request(method, outcome);
    http::json(status, &body)
}
