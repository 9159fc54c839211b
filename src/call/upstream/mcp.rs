//! The MCP upstream client (Streamable HTTP): a `tools/call` of the tool's `remote_name`, after
//! the `initialize` handshake, once per upstream URL.
//!
//! - The session (its `Mcp-Session-Id`, if the server issued one, and the negotiated protocol
//!   version) is shared by every tool on that URL. A 404 to a request that carried a session id
//!   means the session expired: toolgate initializes again and retries once.
//! - The answer may be `application/json` or a `text/event-stream`; the stream is read until the
//!   response with the request's id, every byte counted against `raw_bytes`, other messages
//!   ignored. A stream that never sends the response is cut by the caller's timeout.
//! - The raw response is the JSON-RPC `result` object. `isError: true`, a JSON-RPC error, a
//!   non-2xx status or a body that is not a JSON-RPC response is a [`Failed`] reply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::{Answer, Failed, Reply, ToolRequest, Upstream, UpstreamError, read_body, too_deep};
use crate::body::value_depth;

/// The protocol revision toolgate asks an upstream for in `initialize`.
const CLIENT_VERSION: &str = "2025-11-25";
/// The handshake answer is small; an upstream that sends more is not worth reading.
const HANDSHAKE_BYTES: u64 = 1 << 20;
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// The sessions toolgate holds, by upstream URL.
#[derive(Default)]
pub struct McpSessions {
    by_url: Mutex<HashMap<String, Arc<Session>>>,
    next_id: AtomicU64,
}

/// What an upstream's `initialize` gave.
#[derive(Debug)]
struct Session {
    id: Option<HeaderValue>,
    version: HeaderValue,
}

impl McpSessions {
    fn get(&self, url: &str) -> Option<Arc<Session>> {
        self.lock().get(url).cloned()
    }

    fn put(&self, url: &str, session: Arc<Session>) {
        self.lock().insert(url.to_string(), session);
    }

    /// Forgets `stale`, unless another call already replaced it.
    fn drop_stale(&self, url: &str, stale: &Arc<Session>) {
        let mut by_url = self.lock();
        if by_url.get(url).is_some_and(|s| Arc::ptr_eq(s, stale)) {
            by_url.remove(url);
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.by_url.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Upstream {
    /// `tools/call` of `remote_name` with the call's input and ids.
    pub(super) async fn mcp(
        &self,
        remote_name: &str,
        req: ToolRequest<'_>,
    ) -> Result<Reply, UpstreamError> {
        let url = req.uri.to_string();
        let mut meta = serde_json::Map::new();
        meta.insert("toolgate.dev/run_id".into(), json!(req.run_id));
        meta.insert("toolgate.dev/tool_call_id".into(), json!(req.tool_call_id));
        if let Some(tp) = req.traceparent.and_then(|v| v.to_str().ok()) {
            meta.insert("traceparent".into(), json!(tp));
        }
        let params = json!({"name": remote_name, "arguments": req.input, "_meta": meta});
        let mut retried = false;
        loop {
            let session = match self.sessions.get(&url) {
                Some(s) => s,
                None => {
                    let s = Arc::new(self.initialize(&req).await?);
                    self.sessions.put(&url, s.clone());
                    s
                }
            };
            let id = self.sessions.next_id();
            req.span.mcp_request(id, &session.version);
            let message =
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
            let response = self.post(&req, Some(&session), &message).await?;
            if response.status() == StatusCode::NOT_FOUND && session.id.is_some() && !retried {
                // The upstream forgot the session: start over once.
                self.sessions.drop_stale(&url, &session);
                retried = true;
                continue;
            }
            let decoded = answer(response, id, req.raw_bytes, req.json_depth).await?;
            return Ok(Reply {
                status: decoded.status,
                raw: decoded.raw.map(|raw| Answer::from_tree(&raw)),
            });
        }
    }

    /// `initialize`, then `notifications/initialized`.
    async fn initialize(&self, req: &ToolRequest<'_>) -> Result<Session, UpstreamError> {
        let id = self.sessions.next_id();
        let message = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": CLIENT_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "toolgate", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        let response = self.post(req, None, &message).await?;
        let session_id = response.headers().get(MCP_SESSION_ID).cloned();
        let reply = answer(response, id, HANDSHAKE_BYTES, req.json_depth)
            .await
            .map_err(|e| match e {
                UpstreamError::TooLarge { status } => UpstreamError::Unreachable(format!(
                    "initialize answer too large (status {status})"
                )),
                other => other,
            })?;
        let result = reply
            .raw
            .map_err(|f| UpstreamError::Unreachable(format!("initialize failed: {}", f.why)))?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|v| HeaderValue::from_str(v).ok())
            .ok_or_else(|| {
                UpstreamError::Unreachable("initialize gave no protocolVersion".into())
            })?;
        let session = Session {
            id: session_id,
            version,
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let response = self.post(req, Some(&session), &note).await?;
        if !response.status().is_success() {
            return Err(UpstreamError::Unreachable(format!(
                "notifications/initialized answered {}",
                response.status()
            )));
        }
        Ok(session)
    }

    async fn post(
        &self,
        req: &ToolRequest<'_>,
        session: Option<&Session>,
        message: &Value,
    ) -> Result<hyper::Response<hyper::body::Incoming>, UpstreamError> {
        let body = serde_json::to_vec(message).map_err(|e| UpstreamError::Body(e.to_string()))?;
        let mut request = Upstream::request(req, req.uri, body)?;
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        if let Some(session) = session {
            headers.insert(MCP_PROTOCOL_VERSION, session.version.clone());
            if let Some(id) = &session.id {
                headers.insert(MCP_SESSION_ID, id.clone());
            }
        }
        self.client
            .request(request)
            .await
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))
    }
}

/// An MCP answer decoded: its HTTP status, and the JSON-RPC result or why it is a failure.
struct Decoded {
    status: u16,
    raw: Result<Value, Failed>,
}

/// Reads the response to request `id`, as JSON or as an event stream, within `raw_bytes`.
async fn answer(
    response: hyper::Response<hyper::body::Incoming>,
    id: u64,
    raw_bytes: u64,
    json_depth: usize,
) -> Result<Decoded, UpstreamError> {
    let status = response.status().as_u16();
    let is_stream = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if !(200..300).contains(&status) {
        let body = read_body(response, raw_bytes).await?;
        let raw = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
        return Ok(Decoded {
            status,
            raw: Err(Failed {
                raw,
                why: format!("MCP upstream status {status}"),
            }),
        });
    }
    let message = if is_stream {
        read_stream(response.into_body(), id, raw_bytes, status).await?
    } else {
        let body = read_body(response, raw_bytes).await?;
        serde_json::from_slice::<Value>(&body).ok()
    };
    let raw = match message {
        // The result sits one level below the message.
        Some(m) if value_depth(&m) > json_depth + 1 => Err(too_deep()),
        message => outcome(message, id),
    };
    Ok(Decoded { status, raw })
}

/// A JSON-RPC response turned into the raw response or a failure.
fn outcome(message: Option<Value>, id: u64) -> Result<Value, Failed> {
    let Some(Value::Object(mut message)) = message else {
        return Err(Failed {
            raw: Value::Null,
            why: "MCP upstream answer is not a JSON-RPC response".into(),
        });
    };
    if message.get("id") != Some(&json!(id)) {
        return Err(Failed {
            raw: Value::Object(message),
            why: "MCP upstream answered another request id".into(),
        });
    }
    if let Some(error) = message.remove("error") {
        return Err(Failed {
            raw: error,
            why: "MCP upstream answered a JSON-RPC error".into(),
        });
    }
    match message.remove("result") {
        Some(result) if result.get("isError") == Some(&Value::Bool(true)) => Err(Failed {
            raw: result,
            why: "MCP tool result has isError".into(),
        }),
        Some(result @ Value::Object(_)) => Ok(result),
        other => Err(Failed {
            raw: other.unwrap_or(Value::Null),
            why: "MCP upstream result is not an object".into(),
        }),
    }
}

/// Reads server-sent events until the JSON-RPC response with `id`; every byte read counts
/// against `raw_bytes`, and only the unparsed tail is kept.
async fn read_stream(
    mut body: hyper::body::Incoming,
    id: u64,
    raw_bytes: u64,
    status: u16,
) -> Result<Option<Value>, UpstreamError> {
    let mut pending = BytesMut::new();
    let mut read: u64 = 0;
    let mut events = Events::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| UpstreamError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read += data.len() as u64;
        if read > raw_bytes {
            return Err(UpstreamError::TooLarge { status });
        }
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line = pending.split_to(end + 1);
            if let Some(message) = events.line(&line)
                && is_response_to(&message, id)
            {
                return Ok(Some(message));
            }
        }
    }
    // The stream ended: a last line and event without their line endings still count.
    let tail = pending.split_to(pending.len());
    let last = [events.line(&tail), events.line(b"\n")];
    Ok(last
        .into_iter()
        .flatten()
        .find(|message| is_response_to(message, id)))
}

fn is_response_to(message: &Value, id: u64) -> bool {
    message.get("id") == Some(&json!(id))
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// The WHATWG event-stream line rules, as far as JSON-RPC needs them: `data:` lines of one
/// event are joined, a blank line ends it, `event:` other than `message` and comments are
/// skipped.
#[derive(Default)]
struct Events {
    data: Vec<u8>,
    other_type: bool,
}

impl Events {
    /// Takes one line (with its line ending); gives the event's JSON when the line ends an
    /// event that holds one.
    fn line(&mut self, line: &[u8]) -> Option<Value> {
        let mut line = line;
        while let [rest @ .., b'\n' | b'\r'] = line {
            line = rest;
        }
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            let skip = std::mem::take(&mut self.other_type);
            if skip || data.is_empty() {
                return None;
            }
            return serde_json::from_slice(&data).ok();
        }
        if line.first() == Some(&b':') {
            return None;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let mut value = &line[i + 1..];
                if value.first() == Some(&b' ') {
                    value.advance(1);
                }
                (&line[..i], value)
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
            b"event" => self.other_type = value != b"message",
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(text: &str) -> Vec<Value> {
        let mut events = Events::default();
        text.split_inclusive('\n')
            .filter_map(|l| events.line(l.as_bytes()))
            .collect()
    }

    #[test]
    fn events_join_data_lines_and_skip_other_types() {
        let got = feed(
            ": keepalive\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: other\ndata: {\"b\":2}\n\nid: 7\ndata: \n\ndata: {\"c\":3}\n\n",
        );
        assert_eq!(got, vec![json!({"a": 1}), json!({"c": 3})]);
    }

    #[test]
    fn outcomes() {
        let ok = outcome(
            Some(json!({"jsonrpc":"2.0","id":3,"result":{"content":[]}})),
            3,
        );
        assert_eq!(ok.ok(), Some(json!({"content": []})));
        let tool_error = outcome(
            Some(json!({"jsonrpc":"2.0","id":3,"result":{"content":[],"isError":true}})),
            3,
        );
        assert_eq!(tool_error.expect_err("failed").raw["isError"], json!(true));
        let rpc_error = outcome(
            Some(json!({"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"x"}})),
            3,
        );
        assert_eq!(rpc_error.expect_err("failed").raw["code"], json!(-32602));
        assert!(outcome(Some(json!({"jsonrpc":"2.0","id":4,"result":{}})), 3).is_err());
        assert!(outcome(None, 3).is_err());
    }
}
