//! The telemetry listener: `/metrics` for Prometheus, `/healthz` and `/readyz` for the kubelet,
//! and the evidence keys' JWK Set. No auth, and nothing here reveals a run, a record or a
//! payload.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::http;
use crate::call::State;
use crate::error::Code;

const TEXT: &str = "text/plain; charset=utf-8";

/// Serves one telemetry request. Never fails.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<http::Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => http::text(
            StatusCode::OK,
            state.metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        (&Method::GET, "/healthz") => http::text(StatusCode::OK, "ok\n", TEXT),
        (&Method::GET, super::admin::JWKS_PATH) => {
            http::bytes(StatusCode::OK, state.tokens.evidence.jwks().to_vec())
        }
        (&Method::GET, "/readyz") => {
            if state.ready().await {
                http::text(StatusCode::OK, "ready\n", TEXT)
            } else {
                http::text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", TEXT)
            }
        }
        _ => http::text(StatusCode::NOT_FOUND, Code::NotFound.message(), TEXT),
    }
}
