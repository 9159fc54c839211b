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
        format!("{}:{{{run_id}}}:{tool_call_id}", self.prefix)
    }

    /// The common start of every record key of a run.
    pub fn record_prefix(&self, run_id: &RunId) -> String {
        format!("{}:{{{run_id}}}:", self.prefix)
    }

    pub fn run(&self, run_id: &RunId) -> String {
        format!("{}:{{{run_id}}}:run", self.prefix)
    }

    pub fn progress(&self, run_id: &RunId) -> String {
        format!("{}:{{{run_id}}}:progress", self.prefix)
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
