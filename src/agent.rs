//! The agent listener: both call forms (envelope and intercept) become one [`Incoming`] call.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming as Body;
use hyper::{Method, Request, Response};

use crate::app::State;
use crate::boundary;
use crate::error::Code;
use crate::http;
use crate::preflight::{Form, Incoming};
use crate::upstream::{ReadError, read_capped};

/// How long a client may take to send its body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one agent request. Never fails.
pub async fn handle(state: Arc<State>, req: Request<Body>) -> Response<http::Body> {
    let form = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/invoke") => Form::Envelope,
        (&Method::POST, path) if path.starts_with("/tools/") => Form::Intercept {
            tool: path["/tools/".len()..].to_string(),
        },
        _ => {
            return http::json(
                Code::NotFound.status(),
                &boundary::error_body(None, Code::NotFound),
            );
        }
    };
    let (parts, body) = req.into_parts();
    // Read with the largest configured limit + 1; preflight step 1 applies the tool's own.
    let cap = state.policy.get().max_request_bytes;
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read_capped(body, cap)).await {
        Ok(Ok(bytes)) => Some(bytes),
        Ok(Err(ReadError::TooLarge)) => None,
        Ok(Err(ReadError::Body(_))) | Err(_) => {
            return http::json(
                Code::InvalidInput.status(),
                &boundary::error_body(None, Code::InvalidInput),
            );
        }
    };
    let incoming = Incoming {
        form,
        headers: parts.headers,
        body,
    };
    let answer = boundary::handle(&state, incoming).await;
    let status = match &answer.result {
        Ok(_) => hyper::StatusCode::OK,
        Err(e) => e.code.status(),
    };
    http::bytes(status, answer.body())
}
