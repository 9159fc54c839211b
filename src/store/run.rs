//! A run as the store keeps it: its fixed spec (deadline, budget, tools), its state and its
//! counters, and the reservation checks for backends that run them in Rust.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::RunPaths;
use crate::error::{Code, Result};
use crate::ids::RunId;

/// Runs stored before runs had paths take the defaults.
fn default_workspace() -> String {
    RunPaths::default().workspace
}

fn default_home() -> String {
    RunPaths::default().home
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

/// How a run is closed: the only moves out of ACTIVE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    End,
    Cancel,
}

impl Close {
    /// The state a closed ACTIVE run takes.
    pub fn state(self) -> RunState {
        match self {
            Close::End => RunState::Ended,
            Close::Cancel => RunState::Cancelled,
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
    pub run_id: RunId,
    pub created_ms: u64,
    pub deadline_ms: u64,
    pub budget: Budget,
    /// `None`: every tool configured at the time of each call.
    pub tools: Option<Vec<String>>,
    /// The workspace and home its path arguments are judged against.
    pub paths: RunPaths,
}

/// A run as stored: its fixed spec plus state and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: RunId,
    pub state: RunState,
    pub created_ms: u64,
    pub deadline_ms: u64,
    pub budget: Budget,
    pub tools: Option<Vec<String>>,
    #[serde(default = "default_workspace")]
    pub workspace: String,
    #[serde(default = "default_home")]
    pub home: String,
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
            workspace: run.paths.workspace,
            home: run.paths.home,
            calls_used: 0,
            calls_per_tool: BTreeMap::new(),
            record_bytes_used: 0,
        }
    }

    /// The reservation checks, in contract order, for backends that run them in Rust (the
    /// Redis store runs the same checks in `reserve.lua`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_checks_in_contract_order() {
        let mut run = RunView::new(NewRun {
            run_id: RunId::parse("r").unwrap(),
            created_ms: 0,
            deadline_ms: 100,
            budget: Budget {
                max_calls: 1,
                max_calls_per_tool: BTreeMap::from([("s".to_string(), 0)]),
                max_record_bytes: 10,
            },
            tools: None,
            paths: RunPaths::default(),
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
