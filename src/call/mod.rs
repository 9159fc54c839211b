//! The call pipeline: one screen for the whole life of a tool call, whatever front end it came
//! through.
//!
//! ```text
//! handle: admit ────────────────────────────────────▶ execute ─────────────▶ finalize ──▶ Answer
//!         preflight 1–9 (no store) → 9b roles → reserve   upstream → project      store CAS
//! ```
//!
//! Front ends (`listen::agent`, `listen::mcp`) only turn their wire format into an [`Incoming`] and an
//! [`Answer`] back into theirs; every check, record, limit and metric is here or one call away.

pub mod incoming;
pub mod live;
pub mod preflight;
pub mod projection;
pub mod roles;
pub mod runs;
pub mod trace;
pub mod upstream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::auth::Tokens;
use crate::clock;
use crate::config::Config;
use crate::error::{Code, Error, Result, SizeStage};
use crate::ids::{RunId, ToolCallId};
use crate::metrics::Metrics;
use crate::store::{self, Evidence, Finalized, Record, Status, Store};
use incoming::Rejection;
pub use incoming::{Form, Incoming, McpCall, Received};
use live::{LiveTool, PolicySwap};
use preflight::Admitted;
use projection::ProjectedJson;
use runs::{CallGuard, Calls, RunCache, RunSpec};
use trace::CallSpan;
use upstream::{ToolRequest, Upstream, UpstreamError};

/// Everything a call needs, shared by all listeners.
pub struct State {
    pub policy: Arc<PolicySwap>,
    pub tokens: Tokens,
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub upstream: Upstream,
    pub runs: RunCache,
    pub calls: Arc<Calls>,
    /// `None` without an `otel` config key: then no call makes a span.
    pub otel: Option<crate::otel::Tracing>,
    store_timeout: Duration,
    draining: AtomicBool,
}

impl State {
    /// Opens the store and the upstream client for `config`.
    pub async fn new(config: &Config, tokens: Tokens) -> Result<State> {
        let metrics = Arc::new(Metrics::new());
        let store = store::open(
            &config.store,
            metrics.clone(),
            tokens.evidence.sealer.clone(),
        )
        .await?;
        let upstream = Upstream::new().map_err(Error::internal)?;
        let otel = match &config.otel {
            None => None,
            Some(otel) => Some(
                crate::otel::Tracing::start(otel, upstream.connector.clone(), metrics.clone())
                    .map_err(Error::internal)?,
            ),
        };
        Ok(State {
            policy: Arc::new(PolicySwap::new(config.policy.clone())),
            tokens,
            store,
            metrics,
            upstream,
            runs: RunCache::default(),
            calls: Arc::new(Calls::default()),
            otel,
            store_timeout: config.store.timeout,
            draining: AtomicBool::new(false),
        })
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// From now on new calls get `SHUTTING_DOWN` and `/readyz` answers 503.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// The immutable part of a run, from this sidecar's cache or else the store.
    pub async fn run_spec(&self, run_id: &RunId) -> Result<Option<Arc<RunSpec>>> {
        if let Some(spec) = self.runs.get(run_id) {
            return Ok(Some(spec));
        }
        let run = self.store.get_run(run_id).await?;
        Ok(run.map(|r| self.runs.put(&r)))
    }

    /// The tools `run_id` may call, by name: configured, read-only, and in the run's `tools`
    /// (every such tool when the run names none, or is not known here). MCP `tools/list` and
    /// `GET /v1/tools` both list exactly these.
    pub async fn callable_tools(&self, run_id: &RunId) -> Result<Vec<Arc<LiveTool>>> {
        let allowed = self.run_spec(run_id).await?.and_then(|s| s.tools.clone());
        let policy = self.policy.get();
        let mut tools: Vec<Arc<LiveTool>> = policy
            .tools
            .values()
            .filter(|t| t.read_only)
            .filter(|t| {
                allowed
                    .as_ref()
                    .is_none_or(|a| a.iter().any(|n| t.name == n.as_str()))
            })
            .cloned()
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tools)
    }

    /// Logs and counts the records that failed their seal when `facts` were read.
    pub fn report_tampered(&self, facts: &store::Facts) {
        for id in &facts.tampered_ids {
            tracing::error!(
                run_id = %facts.run_id,
                tool_call_id = %id,
                "a record failed its seal: it was changed in the store, or not written by toolgate; it is not a fact"
            );
        }
        if facts.tampered > 0 {
            self.metrics.evidence_tampered(facts.tampered);
        }
    }

    /// `/readyz`: not draining, and the store answers within its timeout.
    pub async fn ready(&self) -> bool {
        if self.is_draining() {
            return false;
        }
        matches!(
            tokio::time::timeout(self.store_timeout, self.store.ping()).await,
            Ok(Ok(()))
        )
    }
}

/// What the agent is told: a projected result or an error, with the id to echo.
pub struct Answer {
    pub tool_call_id: Option<ToolCallId>,
    pub result: Result<Shown, Error>,
}

/// A READY result as the agent sees it: serialized once, when its size was checked.
pub struct Shown {
    pub evidence: Evidence,
    /// The compact JSON of the projected result; its length is what `agent_bytes` limits.
    pub result_json: Vec<u8>,
}

/// Runs one tool call end to end. Never fails: every error becomes an answer.
pub async fn handle(state: &State, mut incoming: Incoming) -> Answer {
    let started = Instant::now();
    let mut span = CallSpan::start(state.otel.as_ref(), &incoming);
    let admitted = match admit(state, &mut incoming, &mut span).await {
        Ok(a) => a,
        Err(r) => {
            crate::log::Rejected {
                code: r.error.code.as_str(),
                layer: r.error.layer().as_str(),
                tool: r.tool.as_deref().unwrap_or(crate::metrics::UNKNOWN_TOOL),
                tool_call_id: r.tool_call_id.as_deref().unwrap_or(""),
                cause: &r.error.cause,
            }
            .log();
            state.metrics.rejected(r.tool.as_ref(), &r.error);
            span.rejected(&r);
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
        guard,
    } = admitted;

    state.metrics.in_flight(&tool.name, &tool.metrics, 1);
    let executed = execute(state, &tool, &record, deadline_ms, &incoming, &guard, &span).await;
    let result = finalize(state, &tool, record, executed, started, &span).await;
    state.metrics.in_flight(&tool.name, &tool.metrics, -1);
    drop(guard);

    let elapsed = started.elapsed();
    let evidence = result.as_ref().map_or(Evidence::Error, |s| s.evidence);
    state.metrics.finished(
        &tool.name,
        &tool.metrics,
        evidence,
        elapsed,
        result.as_ref().err(),
    );
    span.finish(result.as_ref().map(|s| s.evidence));
    let err = result.as_ref().err();
    crate::log::Finished {
        run_id: run_id.as_str(),
        tool_call_id: tool_call_id.as_str(),
        tool: tool.name.as_str(),
        status: if err.is_some() { "ERROR" } else { "READY" },
        evidence_status: evidence.as_str(),
        code: err.map_or("", |e| e.code.as_str()),
        layer: err.map_or("", |e| e.layer().as_str()),
        duration_ms: elapsed.as_millis() as u64,
        cause: err.map_or("", |e| e.cause.as_str()),
    }
    .log();
    Answer {
        tool_call_id: Some(tool_call_id),
        result,
    }
}

/// A reserved call: its PROJECTING record is in the store and its budget is spent.
struct Reserved {
    run_id: RunId,
    tool_call_id: ToolCallId,
    tool: Arc<LiveTool>,
    /// Holds the input exactly as it is forwarded.
    record: Record,
    /// The run's deadline as preflight saw it (`None`: the run was not known yet).
    deadline_ms: Option<u64>,
    guard: CallGuard,
}

/// Preflight steps 1–10.
async fn admit(
    state: &State,
    incoming: &mut Incoming,
    span: &mut CallSpan,
) -> Result<Reserved, Rejection> {
    let policy = state.policy.get();
    if state.is_draining() {
        return Err(preflight::refuse(&policy, incoming, Code::ShuttingDown));
    }
    let identified = preflight::identify(&policy, &state.tokens, incoming)?;
    span.identified(
        &identified.run_id,
        &identified.tool_call_id,
        &identified.tool.spans,
    );
    let incoming = &*incoming;
    let store_failed = |error: Error, id: &preflight::Identified| Rejection {
        error,
        tool_call_id: Some(id.tool_call_id.clone()),
        tool: Some(id.tool.name.clone()),
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

    // 9b. Parameter roles: what the call may touch, judged on the canonical values. A run this
    // sidecar does not know yet is judged on the current defaults; its reservation then
    // answers for it.
    let paths = run.as_ref().map_or(&policy.paths, |r| &r.paths);
    let checked = match roles::check(&tool, paths, input, &roles::SystemResolver).await {
        Ok(checked) => checked,
        Err(error) => {
            return Err(Rejection {
                error,
                tool_call_id: Some(tool_call_id),
                tool: Some(tool.name.clone()),
            });
        }
    };

    // Registered before reserving, so a cancel that lands after the reservation is seen.
    let guard = state.calls.enter(&run_id);
    // Checked again once registered: either the drain sees this call, or this call sees the
    // drain (both sides use SeqCst), so no call runs after the drain found none in flight.
    if state.is_draining() {
        return Err(preflight::refuse(&policy, incoming, Code::ShuttingDown));
    }
    let now = clock::now_ms();
    let mut record = Record::projecting(
        run_id.clone(),
        tool_call_id.clone(),
        tool.name.clone(),
        checked.input,
        now,
    );
    record.agent_input = checked.agent_input.unwrap_or(Value::Null);
    // The input is serialized here once, for both records and the tool's request body.
    let reserved = match record.keep_request_json() {
        Ok(()) => span.reservation(state.store.reserve(&record, now)).await,
        Err(error) => Err(error),
    };
    if let Err(error) = reserved {
        return Err(Rejection {
            error,
            tool_call_id: Some(tool_call_id),
            tool: Some(tool.name.clone()),
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

/// What execution produced, before it is written down: the record's parts in the one form
/// the call path carries them, compact JSON text.
enum Executed {
    Ready {
        raw: String,
        upstream_status: u16,
        projected: ProjectedJson,
    },
    Failed {
        error: Error,
        /// What the tool answered, kept for the harness only (`None` when nothing usable was).
        raw: Option<String>,
        upstream_status: Option<u16>,
    },
}

impl Executed {
    fn failed(error: Error) -> Executed {
        Executed::Failed {
            error,
            raw: None,
            upstream_status: None,
        }
    }
}

/// Calls the tool within min(tool timeout, time to the run deadline), aborting on cancel, and
/// projects its answer.
async fn execute(
    state: &State,
    tool: &LiveTool,
    record: &Record,
    deadline_ms: Option<u64>,
    incoming: &Incoming,
    guard: &CallGuard,
    span: &CallSpan,
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
    let upstream_span = span.upstream(&tool.spans);
    let request = ToolRequest {
        uri: &tool.upstream,
        connections: &tool.connections,
        host: &tool.upstream_host,
        input,
        input_json: record.request_text(),
        run_id,
        tool_call_id,
        traceparent: upstream_span.traceparent().or(incoming.traceparent()),
        span: &upstream_span,
        auth: tool.upstream_auth.as_ref(),
        raw_bytes: tool.limits.raw_bytes,
        json_depth: tool.limits.json_depth,
        select: Some(&tool.select),
    };
    let started = Instant::now();
    let answered = tokio::select! {
        // Boxed: the exchange's state is large, and the timeout and the select would otherwise
        // copy it each time they move.
        r = tokio::time::timeout(timeout, Box::pin(state.upstream.call(&tool.protocol, request))) => r,
        () = guard.cancelled() => return Executed::failed(Error::new(Code::RunCancelled)),
    };
    state
        .metrics
        .upstream(&tool.name, &tool.metrics, started.elapsed());
    upstream_span.end(|| upstream::span_outcome(&answered));
    let reply = match answered {
        Err(_) => return Executed::failed(Error::with_cause(timeout_code, "tool timed out")),
        Ok(Err(UpstreamError::TooLarge { status })) => {
            let error = if (200..300).contains(&status) {
                Error::too_large(SizeStage::Raw)
            } else {
                Error::with_cause(Code::ToolExecutionFailed, format!("tool status {status}"))
            };
            return Executed::Failed {
                error,
                raw: None,
                upstream_status: Some(status),
            };
        }
        Ok(Err(e)) => return Executed::failed(Error::with_cause(Code::ToolExecutionFailed, e)),
        Ok(Ok(reply)) => reply,
    };
    let status = reply.status;
    let failed = |error: Error, raw: Option<String>| Executed::Failed {
        error,
        raw,
        upstream_status: Some(status),
    };
    let answer = match reply.raw {
        Ok(answer) => answer,
        // Kept for the harness only: the agent never sees it.
        Err(failed_answer) => {
            return failed(
                Error::with_cause(Code::ToolExecutionFailed, failed_answer.why),
                Some(failed_answer.raw.to_string()),
            );
        }
    };
    let projected =
        tool.projection
            .project_json(&tool.name, input, &answer.json, answer.selected.as_ref());
    match projected {
        Err(e) => failed(
            Error::with_cause(Code::ProjectionFailed, e),
            Some(answer.json),
        ),
        Ok(p) if p.json.len() as u64 > tool.limits.agent_bytes => {
            failed(Error::too_large(SizeStage::Agent), Some(answer.json))
        }
        Ok(projected) => Executed::Ready {
            raw: answer.json,
            upstream_status: status,
            projected,
        },
    }
}

/// Writes the outcome onto the PROJECTING record and decides what the agent is told.
async fn finalize(
    state: &State,
    tool: &LiveTool,
    mut record: Record,
    executed: Executed,
    started: Instant,
    span: &CallSpan,
) -> Result<Shown, Error> {
    let now = clock::now_ms();
    record.updated_at = clock::rfc3339(now);
    record.duration_ms = Some(started.elapsed().as_millis() as u64);
    let answer = match executed {
        Executed::Ready {
            raw,
            upstream_status,
            projected,
        } => {
            record.status = Status::Ready;
            record.evidence_status = Some(projected.evidence);
            record.raw_json = Some(raw);
            record.upstream_status = Some(upstream_status);
            let result_json = projected.json.as_bytes().to_vec();
            record.agent_json = Some(projected.json);
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
            record.raw_json = raw;
            record.error_code = Some(error.code.into());
            record.upstream_status = upstream_status;
            Err(error)
        }
    };
    match span
        .finalize(state.store.finalize(&record, tool.limits.record_bytes))
        .await
    {
        Ok(Finalized::Written) => answer,
        Ok(Finalized::TooLarge(stage)) => Err(Error::too_large(stage)),
        Err(e) => Err(e),
    }
}
