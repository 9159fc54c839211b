//! A tool call as it arrived, whatever front end it came through, and a call refused before it
//! reached the tool: the data the pipeline's steps share (preflight reads it, the trace
//! records it).

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::HeaderValue;
use serde_json::Value;

use crate::error::Error;
use crate::ids::{ToolCallId, ToolName};

/// Which of the two equivalent call forms a request used.
#[derive(Debug, Clone)]
pub enum Form {
    /// `POST /v1/invoke` with `{"run_id","tool_call_id","tool","input"}`.
    Envelope,
    /// An MCP `tools/call`, already read from its JSON-RPC message: `name` is the tool,
    /// `arguments` the input, the ids come from `_meta`.
    Mcp(McpCall),
    /// `POST /tools/{tool}` with `X-Run-Id` and `X-Tool-Call-Id`; the body is the input.
    Intercept { tool: String },
}

/// What an MCP `tools/call` claims. Each field is only trusted by the step that checks it.
#[derive(Debug, Clone)]
pub struct McpCall {
    pub tool: String,
    pub run_id: Option<String>,
    pub tool_call_id: Option<String>,
    /// `arguments`; `None` when it is not a JSON object (step 9 refuses it).
    pub input: Option<Value>,
    pub traceparent: Option<HeaderValue>,
    /// The JSON-RPC id of the request, as a string: for the trace only.
    pub request_id: Option<String>,
}

/// A request body as the listener read it.
pub enum Received {
    Complete(Bytes),
    /// Over the read cap (the largest configured `request_bytes` + 1).
    TooLarge,
    /// The client failed to send it (a broken connection, or too slow).
    Broken,
}

/// A request as it arrived.
pub struct Incoming {
    pub form: Form,
    pub headers: HeaderMap,
    pub body: Received,
}

/// A rejected call: the error, the id to echo (safe or none), and the tool if it is configured.
#[derive(Debug)]
pub struct Rejection {
    pub error: Error,
    pub tool_call_id: Option<ToolCallId>,
    pub tool: Option<ToolName>,
}

impl Incoming {
    /// The W3C trace context to pass on to the tool: the header, or for MCP the `_meta` key.
    pub fn traceparent(&self) -> Option<&HeaderValue> {
        match &self.form {
            Form::Mcp(call) => call.traceparent.as_ref(),
            Form::Envelope | Form::Intercept { .. } => self.headers.get("traceparent"),
        }
    }
}
