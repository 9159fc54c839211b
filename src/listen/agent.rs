//! The agent listener: both call forms (envelope `POST /v1/invoke` and intercept
//! `POST /tools/{tool}`) become one [`Incoming`] call, and its [`Answer`] becomes the envelope
//! response; `/mcp` goes to the MCP front end; `GET /v1/tools` lists the tools the token's run may
//! call. Nothing is checked, stored or metered here.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming as Body;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::http;
use crate::body::{ReadError, read_capped};
use crate::call::{self, Answer, Form, Incoming, Received, State};
use crate::error::Code;

/// How long a client may take to send its body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one agent request. Never fails.
pub async fn handle(state: Arc<State>, req: Request<Body>) -> Response<http::Body> {
    let form = match (req.method(), req.uri().path()) {
        // Boxed: the MCP session's future is the largest, and held inline it would make every
        // envelope and intercept request's future (moved into hyper's dispatcher) as large.
        (_, "/mcp") => return Box::pin(super::mcp::handle(state, req)).await,
        (&Method::GET, "/v1/tools") => return tools(&state, &req).await,
        (&Method::POST, "/v1/invoke") => Form::Envelope,
        (&Method::POST, path) if path.starts_with("/tools/") => Form::Intercept {
            tool: http::path_segment(&path["/tools/".len()..]).into_owned(),
        },
        _ => return http::error(Code::NotFound, None),
    };
    let (parts, body) = req.into_parts();
    // Read with the largest configured limit + 1; preflight step 1 applies the tool's own.
    let cap = state.policy.get().max_request_bytes;
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read_capped(body, cap)).await {
        Ok(Ok(bytes)) => Received::Complete(bytes),
        Ok(Err(ReadError::TooLarge)) => Received::TooLarge,
        Ok(Err(ReadError::Body(_))) | Err(_) => Received::Broken,
    };
    let incoming = Incoming {
        form,
        headers: parts.headers,
        body,
    };
    respond(call::handle(&state, incoming).await)
}

/// `GET /v1/tools`: `{"tools":[{"name","description","input_schema"}]}`, the same tools and
/// schemas as MCP `tools/list`.
async fn tools(state: &State, req: &Request<Body>) -> Response<http::Body> {
    let Some(run_id) = state.tokens.run_of(req.headers()) else {
        return http::error(Code::Unauthenticated, None);
    };
    match state.callable_tools(&run_id).await {
        Ok(tools) => {
            let tools: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.input_schema.clone().unwrap_or_else(|| json!({"type": "object"})),
                    })
                })
                .collect();
            http::json(StatusCode::OK, &json!({ "tools": tools }))
        }
        Err(e) => {
            tracing::warn!(code = e.code.as_str(), cause = %e.cause, "GET /v1/tools failed");
            http::error(e.code, None)
        }
    }
}

/// The envelope response: `{"status":"READY","tool_call_id","evidence_status","result"}`, or
/// the error body.
fn respond(answer: Answer) -> Response<http::Body> {
    match answer.result {
        Ok(shown) => {
            let id = answer.tool_call_id.as_ref().map_or("", |id| id.as_str());
            let mut out = String::with_capacity(shown.result_json.len() + id.len() + 96);
            out.push_str(r#"{"status":"READY","tool_call_id":"#);
            match &answer.tool_call_id {
                Some(id) => crate::log::push_json_string(&mut out, id.as_str()),
                None => out.push_str("null"),
            }
            out.push_str(r#","evidence_status":""#);
            out.push_str(shown.evidence.as_str());
            out.push_str(r#"","result":"#);
            let mut out = out.into_bytes();
            out.extend_from_slice(&shown.result_json);
            out.push(b'}');
            http::bytes(StatusCode::OK, out)
        }
        Err(e) => http::error(e.code, answer.tool_call_id.as_ref()),
    }
}
