//! toolgate: a tool-call boundary sidecar for AI agents.
//!
//! Every agent tool call passes preflight, is forwarded to its tool service, is kept as one
//! canonical record, and comes back to the agent only as a bounded projection.
//!
//! - [`app`]: shared state, the three listeners, graceful shutdown
//! - [`agent`], [`admin`]: the agent and admin listeners
//! - [`boundary`]: the one flow of a call: preflight → reserve → execute → project → finalize
//! - [`preflight`]: the ordered checks that need no store
//! - [`upstream`]: the tool-service client with bounded body reads
//! - [`projection`]: raw tool output → bounded agent result
//! - [`store`]: the canonical store trait, the memory and Redis Cluster implementations
//! - [`config`]: the config file and its hot-reloadable policy
//! - [`auth`]: admin and run tokens
//! - [`error`]: the one error type: code, HTTP status, layer, fixed message
//! - [`telemetry`]: metrics and failure attribution
//! - [`demo`]: `toolgate demo`
//! - [`injector`]: the Kubernetes admission webhook that injects the sidecar
#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod app;
pub mod auth;
pub mod boundary;
pub mod clock;
pub mod config;
pub mod demo;
pub mod error;
pub mod http;
pub mod injector;
pub mod preflight;
pub mod projection;
pub mod store;
pub mod telemetry;
pub mod upstream;
