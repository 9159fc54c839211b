//! The one flow of a tool call: preflight → reserve → execute → project → finalize → answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::app::State;
use crate::clock;
use crate::config::Tool;
use crate::error::{Code, Error, SizeStage};
use crate::preflight::{self, Admitted, Incoming, Rejection};
use crate::projection::{self, Evidence, Projected, Projector};
use crate::store::{Finalized, Record, RunView, Status};
use crate::upstream::{ToolRequest, UpstreamError};

/// What the agent is told: a projected result or an error, with the id to echo.
pub struct Answer {
    pub tool_call_id: Option<String>,
    pub result: Result<Shown, Error>,
}

/// A READY result as the agent sees it: serialized once, when its size was checked.
pub struct Shown {
    pub evidence: Evidence,
    /// The compact JSON of the projected result; its length is what `agent_bytes` limits.
    pub result_json: Vec<u8>,
}

impl Answer {
    /// The agent-facing JSON body. Errors carry only the code and its fixed message.
    pub fn body(&self) -> Vec<u8> {
        match &self.result {
            Ok(shown) => {
                let id = serde_json::to_string(&self.tool_call_id).unwrap_or_default();
                let mut out = Vec::with_capacity(shown.result_json.len() + id.len() + 96);
                out.extend_from_slice(br#"{"status":"READY","tool_call_id":"#);
                out.extend_from_slice(id.as_bytes());
                out.extend_from_slice(br#","evidence_status":""#);
                out.extend_from_slice(shown.evidence.as_str().as_bytes());
                out.extend_from_slice(br#"","result":"#);
                out.extend_from_slice(&shown.result_json);
                out.push(b'}');
                out
            }
            Err(e) => error_body(self.tool_call_id.as_deref(), e.code)
                .to_string()
                .into_bytes(),
        }
    }
}

/// The error body shared by every listener.
pub fn error_body(tool_call_id: Option<&str>, code: Code) -> Value {
    json!({
        "status": "ERROR",
        "tool_call_id": tool_call_id,
        "error": {"code": code.as_str(), "message": code.message()},
    })
}

/// Runs one tool call end to end. Never fails: every error becomes an answer.
pub async fn handle(state: &State, incoming: Incoming) -> Answer {
    let started = Instant::now();
    let admitted = match admit(state, &incoming).await {
        Ok(a) => a,
        Err(r) => {
            tracing::info!(
                target: "toolgate::call",
                code = r.error.code.as_str(),
                layer = r.error.layer().as_str(),
                "gen_ai.tool.name" = %r.tool_label,
                "gen_ai.tool.call.id" = r.tool_call_id.as_deref().unwrap_or(""),
                cause = %r.error.cause,
                "call rejected"
            );
            state.metrics.rejected(&r.tool_label, &r.error);
            return Answer {
                tool_call_id: r.tool_call_id,
                result: Err(r.error),
            };
        }
    };
    let Reserved {
        run_id,
        tool_call_id,
        tool,
        record,
        deadline_ms,
        mut guard,
    } = admitted;

    state.metrics.in_flight(&tool.name, 1);
    let executed = execute(state, &tool, &record, deadline_ms, &incoming, &mut guard).await;
    let result = finalize(state, &tool, record, executed, started).await;
    state.metrics.in_flight(&tool.name, -1);
    drop(guard);

    let elapsed = started.elapsed();
    let evidence = result.as_ref().map_or(Evidence::Error, |s| s.evidence);
    state
        .metrics
        .finished(&tool.name, evidence, elapsed, result.as_ref().err());
    let err = result.as_ref().err();
    tracing::info!(
        target: "toolgate::call",
        run_id = %run_id,
        "gen_ai.tool.call.id" = %tool_call_id,
        "gen_ai.tool.name" = %tool.name,
        status = if err.is_some() { "ERROR" } else { "READY" },
        evidence_status = evidence.as_str(),
        code = err.map_or("", |e| e.code.as_str()),
        layer = err.map_or("", |e| e.layer().as_str()),
        duration_ms = elapsed.as_millis() as u64,
        cause = err.map_or("", |e| e.cause.as_str()),
        "call finished"
    );
    Answer {
        tool_call_id: Some(tool_call_id),
        result,
    }
}

/// A reserved call: its PROJECTING record is in the store and its budget is spent.
struct Reserved {
    run_id: String,
    tool_call_id: String,
    tool: Arc<Tool>,
    /// Holds the input exactly as it is forwarded.
    record: Record,
    /// The run's deadline as preflight saw it (`None`: the run was not known yet).
    deadline_ms: Option<u64>,
    guard: CallGuard,
}

/// Preflight steps 1–10.
async fn admit(state: &State, incoming: &Incoming) -> Result<Reserved, Rejection> {
    let policy = state.policy.get();
    if state.is_draining() {
        return Err(preflight::refuse(&policy, incoming, Code::ShuttingDown));
    }
    let identified = preflight::identify(&policy, &state.tokens, incoming)?;
    let store_failed = |error: Error, id: &preflight::Identified| Rejection {
        error,
        tool_call_id: Some(id.tool_call_id.clone()),
        tool_label: id.tool.name.clone(),
    };
    let run = match state.run_spec(&identified.run_id).await {
        Ok(run) => run,
        Err(e) => return Err(store_failed(e, &identified)),
    };
    let Admitted {
        run_id,
        tool_call_id,
        tool,
        input,
    } = identified.authorize(run.as_ref().and_then(|r| r.tools.as_deref()))?;

    // Registered before reserving, so a cancel that lands after the reservation is seen.
    let guard = state.calls.enter(&run_id);
    // Checked again once registered: either the drain sees this call, or this call sees the
    // drain (both sides use SeqCst), so no call runs after the drain found none in flight.
    if state.is_draining() {
        return Err(preflight::refuse(&policy, incoming, Code::ShuttingDown));
    }
    let now = clock::now_ms();
    let record = Record::projecting(&run_id, &tool_call_id, &tool.name, input, now);
    let reserved = state
        .metrics
        .store_op("reserve", state.store.reserve(&record, now))
        .await;
    if let Err(error) = reserved {
        return Err(Rejection {
            error,
            tool_call_id: Some(tool_call_id),
            tool_label: tool.name.clone(),
        });
    }
    Ok(Reserved {
        run_id,
        tool_call_id,
        tool,
        record,
        deadline_ms: run.map(|r| r.deadline_ms),
        guard,
    })
}

/// What execution produced, before it is written down.
enum Executed {
    Ready {
        raw: Value,
        upstream_status: u16,
        projected: Projected,
        result_json: Vec<u8>,
    },
    Failed {
        error: Error,
        raw: Value,
        upstream_status: Option<u16>,
    },
}

impl Executed {
    fn failed(error: Error) -> Executed {
        Executed::Failed {
            error,
            raw: Value::Null,
            upstream_status: None,
        }
    }
}

/// Calls the tool within min(tool timeout, time to the run deadline), aborting on cancel, and
/// projects its answer.
async fn execute(
    state: &State,
    tool: &Tool,
    record: &Record,
    deadline_ms: Option<u64>,
    incoming: &Incoming,
    guard: &mut CallGuard,
) -> Executed {
    let (run_id, tool_call_id, input) = (&record.run_id, &record.tool_call_id, &record.request);
    let deadline_ms = match deadline_ms {
        Some(ms) => ms,
        // Created on another replica between preflight and the reservation.
        None => match state.run_spec(run_id).await {
            Ok(Some(run)) => run.deadline_ms,
            _ => u64::MAX,
        },
    };
    let to_deadline = Duration::from_millis(deadline_ms.saturating_sub(clock::now_ms()));
    let (timeout, timeout_code) = if to_deadline < tool.timeout {
        (to_deadline, Code::RunDeadlineExceeded)
    } else {
        (tool.timeout, Code::ToolTimeout)
    };
    let body = match serde_json::to_vec(input) {
        Ok(b) => Bytes::from(b),
        Err(e) => return Executed::failed(Error::internal(e)),
    };
    let request = ToolRequest {
        uri: &tool.upstream,
        body,
        run_id,
        tool_call_id,
        traceparent: incoming.headers.get("traceparent"),
        raw_bytes: tool.limits.raw_bytes,
    };
    let started = Instant::now();
    let answered = tokio::select! {
        r = tokio::time::timeout(timeout, state.upstream.call(request)) => r,
        () = guard.cancelled() => return Executed::failed(Error::new(Code::RunCancelled)),
    };
    state.metrics.upstream(&tool.name, started.elapsed());
    let response = match answered {
        Err(_) => return Executed::failed(Error::with_cause(timeout_code, "tool timed out")),
        Ok(Err(UpstreamError::TooLarge { status })) => {
            let error = if (200..300).contains(&status) {
                Error::too_large(SizeStage::Raw)
            } else {
                Error::with_cause(Code::ToolExecutionFailed, format!("tool status {status}"))
            };
            return Executed::Failed {
                error,
                raw: Value::Null,
                upstream_status: Some(status),
            };
        }
        Ok(Err(e)) => return Executed::failed(Error::with_cause(Code::ToolExecutionFailed, e)),
        Ok(Ok(response)) => response,
    };
    let status = response.status;
    let parsed = serde_json::from_slice::<Value>(&response.body);
    let raw = match parsed {
        Ok(raw) if (200..300).contains(&status) => raw,
        other => {
            // Kept for the harness only: the agent never sees it.
            let raw = other
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&response.body).into()));
            return Executed::Failed {
                error: Error::with_cause(
                    Code::ToolExecutionFailed,
                    format!("tool status {status}, JSON body: {}", !raw.is_string()),
                ),
                raw,
                upstream_status: Some(status),
            };
        }
    };
    let projected = tool
        .projection
        .project(&tool.name, input, &raw)
        .and_then(projection::check);
    let failed = |error: Error, raw: Value| Executed::Failed {
        error,
        raw,
        upstream_status: Some(status),
    };
    let projected = match projected {
        Ok(p) => p,
        Err(e) => return failed(Error::with_cause(Code::ProjectionFailed, e), raw),
    };
    match serde_json::to_vec(&projected.result) {
        Err(e) => failed(Error::with_cause(Code::ProjectionFailed, e), raw),
        Ok(json) if json.len() as u64 > tool.limits.agent_bytes => {
            failed(Error::too_large(SizeStage::Agent), raw)
        }
        Ok(result_json) => Executed::Ready {
            raw,
            upstream_status: status,
            projected,
            result_json,
        },
    }
}

/// Writes the outcome onto the PROJECTING record and decides what the agent is told.
async fn finalize(
    state: &State,
    tool: &Tool,
    mut record: Record,
    executed: Executed,
    started: Instant,
) -> Result<Shown, Error> {
    let now = clock::now_ms();
    record.updated_at = clock::rfc3339(now);
    record.duration_ms = Some(started.elapsed().as_millis() as u64);
    let answer = match executed {
        Executed::Ready {
            raw,
            upstream_status,
            projected,
            result_json,
        } => {
            record.status = Status::Ready;
            record.evidence_status = Some(projected.evidence);
            record.raw_response = raw;
            record.agent_result = projected.result;
            record.upstream_status = Some(upstream_status);
            Ok(Shown {
                evidence: projected.evidence,
                result_json,
            })
        }
        Executed::Failed {
            error,
            raw,
            upstream_status,
        } => {
            record.status = Status::Error;
            record.evidence_status = Some(Evidence::Error);
            record.raw_response = raw;
            record.error_code = Some(error.code.as_str().to_string());
            record.upstream_status = upstream_status;
            Err(error)
        }
    };
    let written = state
        .metrics
        .store_op(
            "finalize",
            state.store.finalize(&record, tool.limits.record_bytes),
        )
        .await;
    match written {
        Ok(Finalized::Written) => answer,
        Ok(Finalized::TooLarge(stage)) => Err(Error::too_large(stage)),
        Err(e) => Err(e),
    }
}

/// The immutable part of a run that preflight needs, cached per sidecar.
pub struct RunSpec {
    pub tools: Option<Vec<String>>,
    pub deadline_ms: u64,
}

/// Caches run specs: tools and deadline never change after creation, so a cached copy is
/// right while the run can still take calls, and saves a store read per call.
#[derive(Default)]
pub struct RunCache {
    runs: Mutex<HashMap<String, Arc<RunSpec>>>,
}

impl RunCache {
    const MAX: usize = 10_000;

    /// A cached spec is trusted only until its deadline: until then the run key cannot expire
    /// (its TTL is the run's timeout plus the record TTL), so no other run can have taken the
    /// id. After it, the store is asked again.
    pub fn get(&self, run_id: &str) -> Option<Arc<RunSpec>> {
        let mut runs = self.lock();
        match runs.get(run_id) {
            Some(spec) if spec.deadline_ms > clock::now_ms() => Some(spec.clone()),
            Some(_) => {
                runs.remove(run_id);
                None
            }
            None => None,
        }
    }

    pub fn put(&self, run: &RunView) -> Arc<RunSpec> {
        let spec = Arc::new(RunSpec {
            tools: run.tools.clone(),
            deadline_ms: run.deadline_ms,
        });
        let mut runs = self.lock();
        if runs.len() >= Self::MAX {
            let now = clock::now_ms();
            runs.retain(|_, r| r.deadline_ms > now);
            if runs.len() >= Self::MAX {
                runs.clear();
            }
        }
        runs.insert(run.run_id.clone(), spec.clone());
        spec
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RunSpec>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Calls in flight on this sidecar: per-run cancellation and the drain count.
#[derive(Default)]
pub struct Calls {
    runs: Mutex<HashMap<String, (watch::Sender<bool>, usize)>>,
    total: AtomicUsize,
    idle: Notify,
}

impl Calls {
    /// Registers a call of `run_id`; the guard unregisters it when dropped.
    pub fn enter(self: &Arc<Self>, run_id: &str) -> CallGuard {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = runs
            .entry(run_id.to_string())
            .or_insert_with(|| (watch::channel(false).0, 0));
        entry.1 += 1;
        let cancel = entry.0.subscribe();
        self.total.fetch_add(1, Ordering::SeqCst);
        CallGuard {
            calls: self.clone(),
            run_id: run_id.to_string(),
            cancel,
        }
    }

    /// Aborts every call of `run_id` in flight here.
    pub fn cancel(&self, run_id: &str) {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tx, _)) = runs.get(run_id) {
            tx.send_replace(true);
        }
    }

    /// Waits until no call is in flight.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.total.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One registered call.
pub struct CallGuard {
    calls: Arc<Calls>,
    run_id: String,
    cancel: watch::Receiver<bool>,
}

impl CallGuard {
    async fn cancelled(&mut self) {
        if self.cancel.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut runs = self.calls.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = runs.get_mut(&self.run_id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                runs.remove(&self.run_id);
            }
        }
        drop(runs);
        if self.calls.total.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.calls.idle.notify_waiters();
        }
    }
}
