//! The admin listener: runs, records, facts and failure attribution, for the harness. Every
//! route needs the admin token; errors use the same error body as tool calls.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::http;
use crate::body::read_capped;
use crate::call::State;
use crate::clock;
use crate::config::{RunPaths, run_path};
use crate::error::{Code, Error, Result};
use crate::ids::{RunId, ToolCallId};
use crate::store::{self, Budget, Close, NewRun, RunState, RunView};

/// Largest accepted admin request body.
const MAX_BODY: u64 = 65_536;

/// Serves one admin request. Never fails: errors become the contract's error body.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<http::Body> {
    // The API description is public: it names routes and shapes, nothing of a run.
    if req.method() == Method::GET && req.uri().path() == "/openapi.json" {
        return http::bytes(StatusCode::OK, openapi().to_vec());
    }
    // The public keys that check evidence bundles: public by nature.
    if req.method() == Method::GET && req.uri().path() == JWKS_PATH {
        return http::bytes(StatusCode::OK, state.tokens.evidence.jwks().to_vec());
    }
    if !state.tokens.is_admin(req.headers()) {
        return http::error(Code::Unauthenticated, None);
    }
    match route(&state, req).await {
        Ok((status, body)) => http::json(status, &body),
        Err(e) => {
            if e.code == Code::StoreUnavailable || e.code == Code::Internal {
                tracing::warn!(code = e.code.as_str(), cause = %e.cause, "admin request failed");
            }
            http::error(e.code, None)
        }
    }
}

async fn route(state: &State, req: Request<Incoming>) -> Result<(StatusCode, Value)> {
    let path = req.uri().path().to_string();
    let segments: Vec<std::borrow::Cow<'_, str>> = path
        .trim_matches('/')
        .split('/')
        .map(http::path_segment)
        .collect();
    let segments: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
    let method = req.method().clone();
    match (method, segments.as_slice()) {
        (Method::POST, ["v1", "runs"]) => create_run(state, req).await,
        (Method::GET, ["v1", "failure-attribution"]) => {
            Ok((StatusCode::OK, state.metrics.attribution()))
        }
        (Method::GET, ["v1", "runs", run]) => {
            let run = get_run(state, &run_id(run)?).await?;
            Ok((StatusCode::OK, run_json(&run)))
        }
        (Method::POST, ["v1", "runs", run, "end"]) => {
            let run = run_id(run)?;
            close(state, &run, Close::End).await?;
            state.runs.forget(&run);
            Ok((StatusCode::OK, facts(state, &run).await?))
        }
        (Method::POST, ["v1", "runs", run, "cancel"]) => {
            let run = run_id(run)?;
            let view = close(state, &run, Close::Cancel).await?;
            state.runs.forget(&run);
            // An ended run stays ended, and its calls in flight finish normally.
            if view.state == RunState::Cancelled {
                state.calls.cancel(&run);
            }
            Ok((StatusCode::OK, run_json(&view)))
        }
        (Method::GET, ["v1", "runs", run, "facts"]) => {
            Ok((StatusCode::OK, facts(state, &run_id(run)?).await?))
        }
        (Method::GET, ["v1", "runs", run, "evidence"]) => {
            Ok((StatusCode::OK, evidence(state, &run_id(run)?).await?))
        }
        (Method::GET, ["v1", "runs", run, "invocations", id]) => {
            let run = run_id(run)?;
            let id = ToolCallId::parse(id).ok_or(Error::new(Code::InvalidInput))?;
            let found = state.store.get_record(&run, &id).await?;
            let (record, ttl_ms) = found.ok_or(Error::new(Code::NotFound))?;
            let mut body = serde_json::to_value(&record).map_err(Error::internal)?;
            if let Value::Object(m) = &mut body {
                m.insert("ttl_ms".into(), json!(ttl_ms));
            }
            Ok((StatusCode::OK, body))
        }
        _ => Err(Code::NotFound.into()),
    }
}

/// `docs/openapi.yaml`, the one description of the wire API, as JSON.
fn openapi() -> &'static [u8] {
    static DOC: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        let doc: Value = serde_saphyr::from_str(include_str!("../../docs/openapi.yaml"))
            .unwrap_or_else(|_| json!({}));
        serde_json::to_vec(&doc).unwrap_or_default()
    })
}

fn run_id(s: &str) -> Result<RunId> {
    RunId::parse(s).ok_or(Error::new(Code::InvalidInput))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRun {
    run_id: String,
    timeout_ms: Option<u64>,
    tools: Option<Vec<String>>,
    #[serde(default)]
    budget: BudgetInput,
    workspace: Option<String>,
    home: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetInput {
    max_calls: Option<u64>,
    max_calls_per_tool: Option<BTreeMap<String, u64>>,
    max_record_bytes: Option<u64>,
}

async fn create_run(state: &State, req: Request<Incoming>) -> Result<(StatusCode, Value)> {
    let body = read_capped(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| Error::new(Code::InvalidInput))?;
    let input: CreateRun =
        serde_json::from_slice(&body).map_err(|e| Error::with_cause(Code::InvalidInput, e))?;
    let run_id = run_id(&input.run_id)?;
    let policy = state.policy.get();
    let runs = policy.runs;
    let path = |v: Option<String>, default: &String| match v {
        None => Ok(default.clone()),
        Some(v) => run_path(&v)
            .ok_or_else(|| Error::with_cause(Code::InvalidInput, "workspace or home not absolute")),
    };
    let paths = RunPaths {
        workspace: path(input.workspace, &policy.paths.workspace)?,
        home: path(input.home, &policy.paths.home)?,
    };
    let timeout_ms = input.timeout_ms.unwrap_or(runs.default_timeout_ms);
    if timeout_ms == 0 || timeout_ms > runs.max_timeout_ms {
        return Err(Error::with_cause(
            Code::InvalidInput,
            "timeout_ms out of range",
        ));
    }
    let now = clock::now_ms();
    let run = NewRun {
        run_id,
        created_ms: now,
        deadline_ms: now + timeout_ms,
        budget: Budget {
            max_calls: input.budget.max_calls.unwrap_or(runs.default_max_calls),
            max_calls_per_tool: input.budget.max_calls_per_tool.unwrap_or_default(),
            max_record_bytes: input
                .budget
                .max_record_bytes
                .unwrap_or(runs.default_max_record_bytes),
        },
        tools: input.tools,
        paths,
    };
    let view = state.store.create_run(run).await?;
    state.runs.put(&view);
    Ok((
        StatusCode::CREATED,
        json!({
            "run_id": view.run_id,
            "run_token": state.tokens.issue(&view.run_id),
            "deadline": clock::rfc3339(view.deadline_ms),
        }),
    ))
}

async fn get_run(state: &State, run_id: &RunId) -> Result<RunView> {
    state
        .store
        .get_run(run_id)
        .await?
        .ok_or(Error::new(Code::NotFound))
}

async fn close(state: &State, run_id: &RunId, how: Close) -> Result<RunView> {
    state
        .store
        .close_run(run_id, how)
        .await?
        .ok_or(Error::new(Code::NotFound))
}

/// Where both the admin and the telemetry listener serve the JWK Set.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// The run's facts, their seals checked; the tampered records logged and counted.
async fn checked_facts(state: &State, run_id: &RunId) -> Result<store::Facts> {
    let entries = state
        .store
        .progress(run_id)
        .await?
        .ok_or(Error::new(Code::NotFound))?;
    let facts = store::facts(run_id, entries, &state.tokens.evidence.sealer);
    state.report_tampered(&facts);
    Ok(facts)
}

async fn facts(state: &State, run_id: &RunId) -> Result<Value> {
    serde_json::to_value(checked_facts(state, run_id).await?).map_err(Error::internal)
}

/// `GET /v1/runs/{run_id}/evidence`: the facts of this moment, as a signed statement.
async fn evidence(state: &State, run_id: &RunId) -> Result<Value> {
    let run = get_run(state, run_id).await?;
    let facts = checked_facts(state, run_id).await?;
    let keys = &state.tokens.evidence;
    let statement = json!({
        "typ": crate::evidence::jws::TYP_STATEMENT,
        "iss": keys.issuer(),
        "run_id": run_id.as_str(),
        "state": run.state.as_str(),
        "issued_at": clock::rfc3339(clock::now_ms()),
        "facts": facts.facts.iter().enumerate().map(|(i, f)| json!({
            "seq": i + 1,
            "tool_call_id": f.tool_call_id,
            "tool": f.tool,
            "evidence_status": f.evidence_status,
            "result": f.result,
            "request_sha256": f.request_sha256,
            "raw_sha256": f.raw_sha256,
            "result_sha256": f.result_sha256,
            "created_at": f.created_at,
            "updated_at": f.updated_at,
        })).collect::<Vec<_>>(),
        "excluded": facts.excluded,
        "tampered": facts.tampered,
    });
    let payload = serde_json::to_vec(&statement).map_err(Error::internal)?;
    serde_json::from_slice(&keys.sign(&payload)).map_err(Error::internal)
}

fn run_json(run: &RunView) -> Value {
    json!({
        "run_id": run.run_id,
        "state": run.state.as_str(),
        "deadline": clock::rfc3339(run.deadline_ms),
        "calls_used": run.calls_used,
        "record_bytes_used": run.record_bytes_used,
        "budget": run.budget,
        "tools": run.tools,
        "workspace": run.workspace,
        "home": run.home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_parses() {
        let doc: Value = serde_json::from_slice(openapi()).expect("JSON");
        assert_eq!(
            doc["openapi"], "3.1.0",
            "docs/openapi.yaml did not parse as YAML"
        );
        assert!(doc["paths"].is_object());
    }
}
