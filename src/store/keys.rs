//! The key layout. The braces are the Redis Cluster hash tag, so a run's keys share one slot
//! and every script touches a single primary:
//!
//! | key | holds |
//! |-----|-------|
//! | `{prefix}:{run_id}:{tool_call_id}` | the canonical record |
//! | `{prefix}:{run_id}:run` | run state, deadline, budget, tools, counters |
//! | `{prefix}:{run_id}:progress` | tool_call_ids in completion order |

use crate::ids::{RunId, ToolCallId};

#[derive(Debug, Clone)]
pub struct Keys {
    pub prefix: String,
}

impl Keys {
    pub fn record(&self, run_id: &RunId, tool_call_id: &ToolCallId) -> String {
        self.key(run_id, tool_call_id.as_str())
    }

    /// The common start of every record key of a run.
    pub fn record_prefix(&self, run_id: &RunId) -> String {
        self.key(run_id, "")
    }

    pub fn run(&self, run_id: &RunId) -> String {
        self.key(run_id, "run")
    }

    pub fn progress(&self, run_id: &RunId) -> String {
        self.key(run_id, "progress")
    }

    /// `{prefix}:{run_id}:{last}`, in one allocation (every call makes several keys).
    fn key(&self, run_id: &RunId, last: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + run_id.len() + last.len() + 4);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(run_id.as_str());
        key.push_str("}:");
        key.push_str(last);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_run_hash_tag() {
        let k = Keys {
            prefix: "toolgate".into(),
        };
        let run = RunId::parse("run-42").unwrap();
        let call = ToolCallId::parse("call_abc").unwrap();
        assert_eq!(k.record(&run, &call), "toolgate:{run-42}:call_abc");
        assert_eq!(k.record_prefix(&run), "toolgate:{run-42}:");
        assert_eq!(k.run(&run), "toolgate:{run-42}:run");
        assert_eq!(k.progress(&run), "toolgate:{run-42}:progress");
    }
}
