//! toolgate: a tool-call boundary sidecar for AI agents.
//!
//! Every agent tool call passes preflight, is forwarded to its tool service, is kept as one
//! canonical record, and comes back to the agent only as a bounded projection. The life of a
//! call, with these modules, is told in `docs/architecture.md`.
//!
//! Data flows one way: [`listen`] → [`call`] → [`store`]. The modules sit in layers, each using
//! only the layers below it (`scripts/check_layers.py`, run by `make lint`, keeps this true),
//! lowest first: [`ids`], [`clock`], [`body`], [`paths`], [`wake`], [`workers`]; [`error`],
//! [`compact`], [`log`]; [`config`], plain data; [`evidence`], [`auth`]; [`store`]; [`metrics`],
//! [`otel`]; [`call`]; [`listen`]; and [`demo`], [`injector`] on top.
//!
//! - [`listen`]: the three listeners (agent, admin, telemetry), the accept loop, the drain
//! - [`call`]: the call pipeline (preflight → reserve → execute → project → finalize), and the
//!   live policy: each tool's runtime, swapped whole on reload
//! - [`store`]: the canonical store: the trait, the memory and Redis Cluster backends
//! - [`metrics`]: every metric and the failure-attribution counts
//! - [`otel`]: the OpenTelemetry tracer and its OTLP export, off the call path
//! - [`config`]: the config file and its validation, as plain data; the file watch that hands a
//!   reload over
//! - [`auth`]: admin and run tokens
//! - [`evidence`]: record seals, the signing key, bundles and their offline check
//! - [`error`]: the one error type: code, HTTP status, layer, fixed message
//! - [`ids`]: run ids, tool-call ids and tool names, validated once
//! - [`clock`]: the one clock
//! - [`paths`]: the one canonical path rule and containment check
//! - [`body`]: capped body reads
//! - [`compact`]: a tool's raw JSON validated and made compact in one pass
//! - [`log`]: the JSON log line format
//! - [`wake`]: a future polled only when it was woken itself
//! - [`workers`]: the serving threads, one single-threaded runtime per core
//! - [`injector`]: the Kubernetes admission webhook that injects the sidecar
//! - [`demo`]: `toolgate demo`
#![forbid(unsafe_code)]

pub mod auth;
pub mod body;
pub mod call;
pub mod clock;
pub mod compact;
pub mod config;
pub mod demo;
pub mod error;
pub mod evidence;
pub mod ids;
pub mod injector;
pub mod listen;
pub mod log;
pub mod metrics;
pub mod otel;
pub mod paths;
pub mod store;
pub mod wake;
pub mod workers;
