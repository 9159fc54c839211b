//! toolgate: a tool-call boundary sidecar for AI agents.
//!
//! Every agent tool call passes preflight, is forwarded to its tool service, is kept as one
//! canonical record, and comes back to the agent only as a bounded projection.
//!
//! - [`config`]: the config file and its hot-reloadable policy
//! - [`error`]: the one error type: code, HTTP status, layer, fixed message
//! - [`store`]: the canonical store trait, the memory and Redis Cluster implementations
//! - [`projection`]: raw tool output → bounded agent result
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod error;
pub mod projection;
pub mod store;
