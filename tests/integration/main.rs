//! The integration tests: one test binary, one module per topic.
//!
//! The modules that drive a whole sidecar run every case twice, against the embedded memory
//! store (`<case>::memory`) and against a real 6-node Redis Cluster (`<case>::redis`); their
//! common harness is [`boundary`]. The store suite runs each case against both stores too. The
//! harness shared by all of them (sidecar on port 0, fake tools, the Redis Cluster spawner) is in
//! `tests/support/`.
//!
//! - [`preflight`]: the checks before a call reaches a tool, in contract order.
//! - [`execution`]: forwarding, tool failures and timeouts, calls in flight, concurrency.
//! - [`projection`]: bounded READY results and every size limit.
//! - [`runs`]: the admin API: runs, facts, invocation records, failure attribution.
//! - [`mcp`]: the MCP endpoint and MCP upstreams, against the official Python and TypeScript SDKs.
//! - [`metrics`]: the `/metrics` exposition.
//! - [`otel`]: OpenTelemetry spans, as an OTLP/HTTP receiver decodes them, and their export.
//! - [`reload`]: hot reload of the config file.
//! - [`roles`]: parameter roles: paths and network targets (preflight step 9b).
//! - [`drain`]: graceful shutdown.
//! - [`evidence`]: the JWK Set, signed bundles checked offline, and records changed in the store.
//! - [`hardening`]: hostile inputs and clients: JSON depth, request framing, connection caps.
//! - [`connections`]: crowded listeners: idle connections shed at the cap, `OVERLOADED`, the idle
//!   timeout.
//! - [`store`]: the `Store` suite, against memory and Redis Cluster.
//! - [`redis`]: what only a real Redis Cluster shows: key layout, outages, failover, resharding.
//! - [`injector`]: the admission webhook.
//! - [`upstream_tls`]: the real binary against an https tool, and its exit on SIGTERM.
//!
//! Run one topic with `cargo test --test integration preflight::`, one case on one store with
//! `cargo test --test integration preflight_checks_in_order::memory`.

// Test code may unwrap: a panic is a test failure with its location.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod boundary;
mod connections;
mod drain;
mod evidence;
mod execution;
mod hardening;
mod injector;
mod mcp;
mod metrics;
mod otel;
mod preflight;
mod projection;
mod redis;
mod reload;
mod roles;
mod runs;
mod store;
mod upstream_tls;
