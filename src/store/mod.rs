//! The canonical store: the [`Store`] trait, the record and run types, the key layout, and the
//! rules every implementation shares (lifecycle shapes, size fallbacks, the facts filter).
//!
//! Implementations: [`memory::MemoryStore`] (embedded) and [`redis::RedisStore`] (Redis Cluster).
//! Both enforce the same invariants and pass the same test suite.

pub mod memory;
pub mod redis;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Code, Error, Result, SizeStage};
use crate::projection::Evidence;

/// A boxed store future, so the trait stays object-safe (`Arc<dyn Store>`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The canonical store. Every method fails with `STORE_UNAVAILABLE` when the backend does not
/// answer in time; the other codes are listed per method.
pub trait Store: Send + Sync + 'static {
    /// Creates an ACTIVE run. `RUN_EXISTS` if the id is taken.
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView>;

    /// The run, or `None` if unknown or expired.
    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunView>>;

    /// Moves an ACTIVE run to `to` (ENDED or CANCELLED); any other state is left as it is.
    fn close_run<'a>(&'a self, run_id: &'a str, to: RunState) -> StoreFuture<'a, Option<RunView>>;

    /// The atomic step 10 of preflight: checks run state, deadline, duplicate id and budgets,
    /// then creates the PROJECTING record with its TTL and moves the run's counters.
    /// Codes: RUN_INACTIVE, RUN_DEADLINE_EXCEEDED, DUPLICATE_TOOL_CALL, BUDGET_EXHAUSTED.
    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()>;

    /// Compare-and-set PROJECTING → READY | ERROR, keeping the TTL, with size accounting and the
    /// progress append in the same atomic step. Codes: RECORD_EXPIRED, INTERNAL (bad transition).
    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized>;

    /// A record and its remaining TTL in milliseconds. Never renews the TTL.
    fn get_record<'a>(
        &'a self,
        run_id: &'a str,
        tool_call_id: &'a str,
    ) -> StoreFuture<'a, Option<(Record, u64)>>;

    /// The run's progress list resolved through the records, in order; `None` if the run is
    /// unknown. Missing records are `None` entries.
    fn progress<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Vec<ProgressEntry>>>;

    /// Whether the backend answers (every primary, for a cluster).
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// One entry of a run's progress list.
pub type ProgressEntry = (String, Option<Record>);

/// What finalize wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalized {
    /// The record as given.
    Written,
    /// A stripped `ERROR/RESULT_TOO_LARGE` record, because the record or the run was too large.
    TooLarge(SizeStage),
}

/// Lifecycle state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Projecting,
    Ready,
    Error,
}

/// The canonical record of one call (SPEC §5); serialized compactly as one JSON string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub run_id: String,
    pub tool_call_id: String,
    pub tool: String,
    pub status: Status,
    pub evidence_status: Option<Evidence>,
    pub request: Value,
    pub raw_response: Value,
    pub agent_result: Value,
    pub error_code: Option<String>,
    pub upstream_status: Option<u16>,
    pub created_at: String,
    pub updated_at: String,
    pub duration_ms: Option<u64>,
}

impl Record {
    /// A fresh PROJECTING record.
    pub fn projecting(
        run_id: &str,
        tool_call_id: &str,
        tool: &str,
        request: Value,
        now: u64,
    ) -> Record {
        let at = crate::clock::rfc3339(now);
        Record {
            schema: 1,
            run_id: run_id.to_string(),
            tool_call_id: tool_call_id.to_string(),
            tool: tool.to_string(),
            status: Status::Projecting,
            evidence_status: None,
            request,
            raw_response: Value::Null,
            agent_result: Value::Null,
            error_code: None,
            upstream_status: None,
            created_at: at.clone(),
            updated_at: at,
            duration_ms: None,
        }
    }

    /// The compact JSON form whose byte length every size limit counts.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(Error::internal)
    }

    pub fn from_json(s: &str) -> Result<Record> {
        serde_json::from_str(s).map_err(|e| Error::internal(format!("corrupt record: {e}")))
    }

    /// This record turned into a stripped `ERROR/RESULT_TOO_LARGE`: no raw, no agent result.
    /// Built field by field so the (possibly large) raw response and result are never copied.
    fn too_large(&self) -> Record {
        Record {
            schema: self.schema,
            run_id: self.run_id.clone(),
            tool_call_id: self.tool_call_id.clone(),
            tool: self.tool.clone(),
            status: Status::Error,
            evidence_status: Some(Evidence::Error),
            request: self.request.clone(),
            raw_response: Value::Null,
            agent_result: Value::Null,
            error_code: Some(Code::ResultTooLarge.as_str().to_string()),
            upstream_status: self.upstream_status,
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            duration_ms: self.duration_ms,
        }
    }
}

/// Checks that a record is a valid new PROJECTING record.
pub fn check_projecting(r: &Record) -> Result<()> {
    let ok = r.status == Status::Projecting
        && r.evidence_status.is_none()
        && r.agent_result.is_null()
        && r.error_code.is_none()
        && crate::config::is_safe_run_id(&r.run_id)
        && crate::config::is_safe_tool_call_id(&r.tool_call_id);
    if ok {
        Ok(())
    } else {
        Err(Error::internal(
            "reserve needs a well-formed PROJECTING record",
        ))
    }
}

/// Checks the shape of a final record: READY has evidence and a result; ERROR has a code,
/// `evidence_status: ERROR` and no agent result.
pub fn check_final(r: &Record) -> Result<()> {
    let ok = match r.status {
        Status::Ready => {
            matches!(r.evidence_status, Some(Evidence::Found | Evidence::None))
                && r.error_code.is_none()
                && !r.agent_result.is_null()
        }
        Status::Error => {
            r.evidence_status == Some(Evidence::Error)
                && r.agent_result.is_null()
                && r.error_code.as_deref().and_then(Code::parse).is_some()
        }
        Status::Projecting => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "invalid transition PROJECTING -> {:?}",
            r.status
        )))
    }
}

/// A final record serialized and sized, with the fallback the backend writes if the run's byte
/// budget cannot take it.
pub struct PreparedFinal {
    pub body: String,
    /// `Some(Record)` when `body` is already the stripped fallback for the record limit.
    pub replaced: Option<SizeStage>,
    pub run_fallback: String,
}

impl PreparedFinal {
    pub fn new(record: &Record, record_bytes: u64) -> Result<PreparedFinal> {
        check_final(record)?;
        let full = record.to_json()?;
        let stripped = record.too_large().to_json()?;
        let (body, replaced) = if full.len() as u64 > record_bytes {
            (stripped.clone(), Some(SizeStage::Record))
        } else {
            (full, None)
        };
        Ok(PreparedFinal {
            body,
            replaced,
            run_fallback: stripped,
        })
    }

    pub fn size(&self) -> u64 {
        self.body.len() as u64
    }

    /// The outcome when `body` was written.
    pub fn written(&self) -> Finalized {
        match self.replaced {
            Some(stage) => Finalized::TooLarge(stage),
            None => Finalized::Written,
        }
    }
}

/// Run lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    Active,
    Ended,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Active => "ACTIVE",
            RunState::Ended => "ENDED",
            RunState::Cancelled => "CANCELLED",
        }
    }
}

/// A run's budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub max_calls: u64,
    pub max_calls_per_tool: BTreeMap<String, u64>,
    pub max_record_bytes: u64,
}

/// A run to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    pub run_id: String,
    pub created_ms: u64,
    pub deadline_ms: u64,
    pub budget: Budget,
    /// `None`: every tool configured at the time of each call.
    pub tools: Option<Vec<String>>,
}

/// A run as stored: its fixed spec plus state and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: String,
    pub state: RunState,
    pub created_ms: u64,
    pub deadline_ms: u64,
    pub budget: Budget,
    pub tools: Option<Vec<String>>,
    pub calls_used: u64,
    pub calls_per_tool: BTreeMap<String, u64>,
    pub record_bytes_used: u64,
}

impl RunView {
    pub fn new(run: NewRun) -> RunView {
        RunView {
            run_id: run.run_id,
            state: RunState::Active,
            created_ms: run.created_ms,
            deadline_ms: run.deadline_ms,
            budget: run.budget,
            tools: run.tools,
            calls_used: 0,
            calls_per_tool: BTreeMap::new(),
            record_bytes_used: 0,
        }
    }

    /// The reservation checks, in contract order, for backends that run them in Rust.
    pub fn admit(&self, tool: &str, now_ms: u64, duplicate: bool) -> Result<()> {
        if self.state != RunState::Active {
            return Err(Code::RunInactive.into());
        }
        if now_ms >= self.deadline_ms {
            return Err(Code::RunDeadlineExceeded.into());
        }
        if duplicate {
            return Err(Code::DuplicateToolCall.into());
        }
        let tool_used = self.calls_per_tool.get(tool).copied().unwrap_or(0);
        let tool_cap = self.budget.max_calls_per_tool.get(tool).copied();
        if self.calls_used >= self.budget.max_calls
            || tool_cap.is_some_and(|cap| tool_used >= cap)
            || self.record_bytes_used >= self.budget.max_record_bytes
        {
            return Err(Code::BudgetExhausted.into());
        }
        Ok(())
    }

    /// How long the run and progress keys live: they outlive every record of the run.
    pub fn key_ttl_ms(&self, record_ttl_ms: u64) -> u64 {
        self.deadline_ms.saturating_sub(self.created_ms) + record_ttl_ms
    }
}

/// Key layout (SPEC §5). The braces are the Redis Cluster hash tag: a run's keys share a slot.
#[derive(Debug, Clone)]
pub struct Keys {
    pub prefix: String,
}

impl Keys {
    pub fn record(&self, run_id: &str, tool_call_id: &str) -> String {
        format!("{}:{{{run_id}}}:{tool_call_id}", self.prefix)
    }

    pub fn run(&self, run_id: &str) -> String {
        format!("{}:{{{run_id}}}:run", self.prefix)
    }

    pub fn progress(&self, run_id: &str) -> String {
        format!("{}:{{{run_id}}}:progress", self.prefix)
    }
}

/// One fact: a READY record of the run, as the harness sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fact {
    pub tool_call_id: String,
    pub tool: String,
    pub evidence_status: Evidence,
    pub result: Value,
}

/// The facts projection of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Facts {
    pub run_id: String,
    pub facts: Vec<Fact>,
    pub excluded: u64,
}

/// Keeps only the progress entries that exist, are READY and belong to this run.
pub fn facts(run_id: &str, entries: Vec<ProgressEntry>) -> Facts {
    let mut out = Facts {
        run_id: run_id.to_string(),
        facts: Vec::new(),
        excluded: 0,
    };
    for (id, record) in entries {
        match record {
            Some(r)
                if r.status == Status::Ready
                    && r.run_id == run_id
                    && r.tool_call_id == id
                    && r.evidence_status.is_some() =>
            {
                out.facts.push(Fact {
                    tool_call_id: r.tool_call_id,
                    tool: r.tool,
                    evidence_status: r.evidence_status.unwrap_or(Evidence::Error),
                    result: r.agent_result,
                });
            }
            _ => out.excluded += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ready(run: &str, id: &str) -> Record {
        let mut r = Record::projecting(run, id, "search", json!({"q": "x"}), 0);
        r.status = Status::Ready;
        r.evidence_status = Some(Evidence::Found);
        r.agent_result = json!({"item": 1});
        r
    }

    #[test]
    fn keys_share_the_run_hash_tag() {
        let k = Keys {
            prefix: "toolgate".into(),
        };
        assert_eq!(k.record("run-42", "call_abc"), "toolgate:{run-42}:call_abc");
        assert_eq!(k.run("run-42"), "toolgate:{run-42}:run");
        assert_eq!(k.progress("run-42"), "toolgate:{run-42}:progress");
    }

    #[test]
    fn record_serializes_in_contract_order() {
        let s = Record::projecting("r", "c", "t", json!({"b": 1, "a": "é"}), 0)
            .to_json()
            .unwrap();
        assert!(s.starts_with(r#"{"schema":1,"run_id":"r","tool_call_id":"c","tool":"t","status":"PROJECTING","evidence_status":null,"request":{"b":1,"a":"é"}"#), "{s}");
    }

    #[test]
    fn final_shapes_are_checked() {
        assert!(check_final(&ready("r", "c")).is_ok());
        let mut r = ready("r", "c");
        r.evidence_status = Some(Evidence::Error);
        assert!(check_final(&r).is_err());
        let mut r = ready("r", "c");
        r.status = Status::Projecting;
        assert!(check_final(&r).is_err());
        let mut e = ready("r", "c");
        e.status = Status::Error;
        e.evidence_status = Some(Evidence::Error);
        e.error_code = Some("TOOL_TIMEOUT".into());
        assert!(
            check_final(&e).is_err(),
            "ERROR must not carry an agent result"
        );
        e.agent_result = Value::Null;
        assert!(check_final(&e).is_ok());
    }

    #[test]
    fn oversized_record_is_replaced_by_a_stripped_error() {
        let mut r = ready("r", "c");
        r.raw_response = json!({"blob": "x".repeat(1000)});
        let p = PreparedFinal::new(&r, 500).unwrap();
        assert_eq!(p.written(), Finalized::TooLarge(SizeStage::Record));
        let stored = Record::from_json(&p.body).unwrap();
        assert_eq!(stored.status, Status::Error);
        assert!(stored.raw_response.is_null() && stored.agent_result.is_null());
        assert_eq!(stored.error_code.as_deref(), Some("RESULT_TOO_LARGE"));
    }

    #[test]
    fn facts_keep_only_ready_records_of_the_run() {
        let mut err = ready("r", "e");
        err.status = Status::Error;
        let entries = vec![
            ("a".to_string(), Some(ready("r", "a"))),
            ("gone".to_string(), None),
            ("e".to_string(), Some(err)),
            ("f".to_string(), Some(ready("other", "f"))),
            ("b".to_string(), Some(ready("r", "b"))),
        ];
        let f = facts("r", entries);
        let ids: Vec<&str> = f.facts.iter().map(|f| f.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(f.excluded, 3);
    }

    #[test]
    fn admit_checks_in_contract_order() {
        let mut run = RunView::new(NewRun {
            run_id: "r".into(),
            created_ms: 0,
            deadline_ms: 100,
            budget: Budget {
                max_calls: 1,
                max_calls_per_tool: BTreeMap::from([("s".to_string(), 0)]),
                max_record_bytes: 10,
            },
            tools: None,
        });
        assert_eq!(
            run.admit("s", 200, true).unwrap_err().code,
            Code::RunDeadlineExceeded
        );
        assert_eq!(
            run.admit("s", 0, true).unwrap_err().code,
            Code::DuplicateToolCall
        );
        assert_eq!(
            run.admit("s", 0, false).unwrap_err().code,
            Code::BudgetExhausted
        );
        assert!(run.admit("t", 0, false).is_ok());
        run.state = RunState::Ended;
        assert_eq!(
            run.admit("t", 200, true).unwrap_err().code,
            Code::RunInactive
        );
    }
}
