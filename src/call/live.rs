//! The live policy every call reads, and each tool's runtime.
//!
//! `config` is data: a validated [`Policy`] and its [`Tool`]s. When a policy is installed (at
//! start, and on each reload the config watch hands over) every tool gets its runtime here: the
//! names and attributes its spans share, its series of the per-call metrics, and the connections
//! kept open to its upstream. A reload swaps the whole [`LivePolicy`]; a call keeps the snapshot it
//! started with until it ends.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use super::trace::ToolSpans;
use super::upstream::pool::Connections;
use crate::config::{Policy, Tool};
use crate::ids::ToolName;
use crate::metrics::ToolHandles;

/// A configured tool with its runtime. Reads as its [`Tool`] (`Deref`), so a check written
/// against the config takes a live tool as it is.
pub struct LiveTool {
    config: Arc<Tool>,
    /// The names and attributes of this tool's spans that every call shares.
    pub spans: ToolSpans,
    /// This tool's series of the per-call metrics, taken on first use.
    pub metrics: ToolHandles,
    /// The open connections to the tool's upstream between calls (plain HTTP tools).
    pub connections: Connections,
}

impl LiveTool {
    fn new(config: Arc<Tool>) -> LiveTool {
        LiveTool {
            spans: ToolSpans::new(config.name.as_ref(), &config.upstream, &config.protocol),
            metrics: ToolHandles::default(),
            connections: Connections::new(&config.upstream),
            config,
        }
    }
}

impl Deref for LiveTool {
    type Target = Tool;

    fn deref(&self) -> &Tool {
        &self.config
    }
}

/// A policy as installed: the config's [`Policy`] (`Deref`) and its tools made live.
pub struct LivePolicy {
    config: Arc<Policy>,
    pub tools: HashMap<ToolName, Arc<LiveTool>>,
}

impl LivePolicy {
    pub fn new(config: Arc<Policy>) -> LivePolicy {
        let tools = config
            .tools
            .iter()
            .map(|(name, tool)| (name.clone(), Arc::new(LiveTool::new(tool.clone()))))
            .collect();
        LivePolicy { config, tools }
    }

    pub fn tool(&self, name: &str) -> Option<&Arc<LiveTool>> {
        self.tools.get(name)
    }
}

impl Deref for LivePolicy {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        &self.config
    }
}

/// The policy calls read now: readers take a cheap `Arc` snapshot; [`PolicySwap::install`]
/// replaces it whole.
pub struct PolicySwap(RwLock<Arc<LivePolicy>>);

impl PolicySwap {
    pub fn new(policy: Arc<Policy>) -> PolicySwap {
        PolicySwap(RwLock::new(Arc::new(LivePolicy::new(policy))))
    }

    pub fn get(&self) -> Arc<LivePolicy> {
        match self.0.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Makes `policy` live: calls that start from now on read it.
    pub fn install(&self, policy: Arc<Policy>) {
        let live = Arc::new(LivePolicy::new(policy));
        match self.0.write() {
            Ok(mut p) => *p = live,
            Err(poisoned) => *poisoned.into_inner() = live,
        }
    }
}
