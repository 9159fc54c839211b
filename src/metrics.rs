//! Every metric toolgate exports, all registered here, with label sets drawn from closed sets
//! (enums and configured tool names, never ids or input); and the failure-attribution counts
//! behind `GET /v1/failure-attribution`. The metric table is in `docs/api.md`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::AtomicI64;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};

use crate::error::{Code, Error, Layer, Role, SizeStage};
use crate::ids::ToolName;
use crate::store::{Evidence, Observer, Status, StoreOp};

/// Label value for a tool name that is not configured: keeps cardinality bounded.
pub const UNKNOWN_TOOL: &str = "_unknown";

/// The `tool` label: a configured tool, or `_unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ToolLabel(Option<ToolName>);

/// The `method` label of MCP requests: the closed set of methods toolgate serves, every
/// notification as one, anything else as `_other`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum McpMethod {
    Initialize,
    Discover,
    Ping,
    ToolsList,
    ToolsCall,
    Notification,
    Other,
}

impl McpMethod {
    pub const ALL: [McpMethod; 7] = [
        McpMethod::Initialize,
        McpMethod::Discover,
        McpMethod::Ping,
        McpMethod::ToolsList,
        McpMethod::ToolsCall,
        McpMethod::Notification,
        McpMethod::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            McpMethod::Initialize => "initialize",
            McpMethod::Discover => "server/discover",
            McpMethod::Ping => "ping",
            McpMethod::ToolsList => "tools/list",
            McpMethod::ToolsCall => "tools/call",
            McpMethod::Notification => "notification",
            McpMethod::Other => "_other",
        }
    }
}

/// The `outcome` label of MCP requests: `error` is a JSON-RPC error or an `isError` result.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
}

/// The `reason` label of dropped spans: the export queue was full, or its batch failed to export.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum SpanDrop {
    QueueFull,
    ExportFailed,
}

/// The `listener` label of connection metrics.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Listener {
    Agent,
    Admin,
    Telemetry,
    /// The injector's webhook listener (its own process).
    Webhook,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Agent => "agent",
            Listener::Admin => "admin",
            Listener::Telemetry => "telemetry",
            Listener::Webhook => "webhook",
        }
    }
}

/// The `reason` label of shed connections: closed at the cap to admit a new one, or idle past
/// `listen.idle_timeout_ms`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Shed {
    Cap,
    IdleTimeout,
}

/// The `result` label of config reloads.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReloadResult {
    Ok,
    Error,
}

macro_rules! label_value {
    ($($t:ty => |$v:ident| $s:expr;)*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                let $v = self;
                encoder.write_str($s)
            }
        }
    )*};
}

label_value! {
    ToolLabel => |t| t.0.as_deref().unwrap_or(UNKNOWN_TOOL);
    Code => |c| c.as_str();
    Role => |r| r.as_str();
    Layer => |l| l.as_str();
    SizeStage => |s| s.as_str();
    Evidence => |e| e.as_str();
    Status => |s| s.as_str();
    StoreOp => |o| o.as_str();
    McpMethod => |m| m.as_str();
    Outcome => |o| match o {
        Outcome::Ok => "ok",
        Outcome::Error => "error",
    };
    SpanDrop => |d| match d {
        SpanDrop::QueueFull => "queue_full",
        SpanDrop::ExportFailed => "export_failed",
    };
    Listener => |l| l.as_str();
    Shed => |r| match r {
        Shed::Cap => "cap",
        Shed::IdleTimeout => "idle_timeout",
    };
    ReloadResult => |r| match r {
        ReloadResult::Ok => "ok",
        ReloadResult::Error => "error",
    };
}

/// Latency buckets from 0.25 ms to 60 s.
const BUCKETS: [f64; 16] = [
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0,
    60.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvocationLabels {
    tool: ToolLabel,
    status: Status,
    evidence_status: Evidence,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCodeLabels {
    tool: ToolLabel,
    code: Code,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolStageLabels {
    tool: ToolLabel,
    stage: SizeStage,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LayerCodeLabels {
    layer: Layer,
    code: Code,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolStatusLabels {
    tool: ToolLabel,
    status: Status,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: ToolLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: StoreOp,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolRoleLabels {
    tool: ToolLabel,
    role: Role,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct McpLabels {
    method: McpMethod,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: ReloadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: SpanDrop,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: Listener,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabels {
    listener: Listener,
    reason: Shed,
}

/// One listener's series of the connection metrics, taken once when it starts serving.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCounts {
    open: Gauge<i64, AtomicI64>,
    shed_cap: Counter,
    shed_idle: Counter,
    refused: Counter,
}

impl ConnectionCounts {
    /// A connection was admitted (`1`) or has closed (`-1`).
    pub fn open(&self, by: i64) {
        self.open.inc_by(by);
    }

    pub fn shed(&self, reason: Shed) {
        match reason {
            Shed::Cap => self.shed_cap.inc(),
            Shed::IdleTimeout => self.shed_idle.inc(),
        };
    }

    /// A connection was refused with `OVERLOADED`.
    pub fn refused(&self) {
        self.refused.inc();
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric toolgate exports, plus the failure-attribution counts.
/// One tool's series of the per-call metrics, each taken from its family the first time the
/// tool needs it (so a series appears when it is first observed, as without them) and kept,
/// so a call does not look its labels up again. A tool's config holds one, used with that
/// tool's name only; a series handle shares its value with the family's.
#[derive(Debug, Default)]
pub struct ToolHandles {
    in_flight: OnceLock<Gauge<i64, AtomicI64>>,
    upstream: OnceLock<Histogram>,
    /// By status (READY, ERROR) × evidence status, in `Evidence::ALL` order.
    invocations: [OnceLock<Counter>; 6],
    /// By status (READY, ERROR).
    duration: [OnceLock<Histogram>; 2],
}

pub struct Metrics {
    registry: Registry,
    invocations: Family<InvocationLabels, Counter>,
    preflight_rejections: Family<ToolCodeLabels, Counter>,
    result_too_large: Family<ToolStageLabels, Counter>,
    failures: Family<LayerCodeLabels, Counter>,
    invocation_duration: HistogramFamily<ToolStatusLabels>,
    upstream_duration: HistogramFamily<ToolLabels>,
    store_duration: HistogramFamily<OpLabels>,
    /// Each operation's series of `store_duration`, kept once made: two store operations run
    /// on every call, and a family lookup hashes and locks.
    store_timers: [OnceLock<Histogram>; StoreOp::ALL.len()],
    store_errors: Family<OpLabels, Counter>,
    in_flight: Family<ToolLabels, Gauge<i64, AtomicI64>>,
    config_reloads: Family<ResultLabels, Counter>,
    mcp_requests: Family<McpLabels, Counter>,
    policy_denials: Family<ToolRoleLabels, Counter>,
    spans_dropped: Family<DropLabels, Counter>,
    spans_exported: Counter,
    export_errors: Counter,
    evidence_tampered: Counter,
    connections_open: Family<ListenerLabels, Gauge<i64, AtomicI64>>,
    connections_shed: Family<ShedLabels, Counter>,
    connections_refused: Family<ListenerLabels, Counter>,
    attribution: Mutex<BTreeMap<(Layer, Code), u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let invocations = Family::default();
        let preflight_rejections = Family::default();
        let result_too_large = Family::default();
        let failures = Family::default();
        let invocation_duration: HistogramFamily<_> = Family::new_with_constructor(histogram);
        let upstream_duration: HistogramFamily<_> = Family::new_with_constructor(histogram);
        let store_duration: HistogramFamily<_> = Family::new_with_constructor(histogram);
        let store_errors = Family::default();
        let in_flight = Family::default();
        let config_reloads = Family::default();
        let mcp_requests = Family::default();
        let policy_denials = Family::default();
        let spans_dropped = Family::<DropLabels, Counter>::default();
        let spans_exported = Counter::default();
        let export_errors = Counter::default();
        let evidence_tampered = Counter::default();
        let connections_open = Family::default();
        let connections_shed = Family::default();
        let connections_refused = Family::default();
        registry.register(
            "toolgate_invocations",
            "Calls that reached the tool stage, by final status and evidence status",
            invocations.clone(),
        );
        registry.register(
            "toolgate_preflight_rejections",
            "Calls rejected before reaching the tool, by error code",
            preflight_rejections.clone(),
        );
        registry.register(
            "toolgate_result_too_large",
            "Calls that failed closed on a byte limit, by the stage that exceeded it",
            result_too_large.clone(),
        );
        registry.register(
            "toolgate_failures",
            "Calls that ended in an error, by failure layer and code",
            failures.clone(),
        );
        registry.register(
            "toolgate_invocation_duration_seconds",
            "Time from request to answer for calls that reached the tool stage",
            invocation_duration.clone(),
        );
        registry.register(
            "toolgate_upstream_duration_seconds",
            "Time the tool service took to answer, body included",
            upstream_duration.clone(),
        );
        registry.register(
            "toolgate_store_operation_duration_seconds",
            "Time of one canonical store operation",
            store_duration.clone(),
        );
        registry.register(
            "toolgate_store_errors",
            "Store operations that failed with STORE_UNAVAILABLE",
            store_errors.clone(),
        );
        registry.register(
            "toolgate_invocations_in_flight",
            "Calls currently executing",
            in_flight.clone(),
        );
        registry.register(
            "toolgate_config_reloads",
            "Config file reload attempts, by result",
            config_reloads.clone(),
        );
        registry.register(
            "toolgate_mcp_requests",
            "MCP requests on the agent listener, by method and outcome",
            mcp_requests.clone(),
        );
        registry.register(
            "toolgate_policy_denials",
            "Calls refused because a path or network argument is outside what the tool may touch",
            policy_denials.clone(),
        );
        registry.register(
            "toolgate_otel_spans_dropped",
            "Finished spans never exported: the export queue was full, or their batch failed",
            spans_dropped.clone(),
        );
        registry.register(
            "toolgate_otel_spans_exported",
            "Spans the OTLP collector accepted",
            spans_exported.clone(),
        );
        registry.register(
            "toolgate_otel_export_errors",
            "OTLP export requests that failed or timed out",
            export_errors.clone(),
        );
        registry.register(
            "toolgate_evidence_tampered",
            "Records of a run's progress that failed their seal when its facts were read",
            evidence_tampered.clone(),
        );
        registry.register(
            "toolgate_connections_open",
            "Connections each listener holds open now",
            connections_open.clone(),
        );
        registry.register(
            "toolgate_connections_shed",
            "Connections closed by the listener: at its cap, to admit a new one, or idle too long",
            connections_shed.clone(),
        );
        registry.register(
            "toolgate_connections_refused",
            "Connections refused with OVERLOADED: the listener was at its cap with every connection busy",
            connections_refused.clone(),
        );
        for reason in [SpanDrop::QueueFull, SpanDrop::ExportFailed] {
            let _ = spans_dropped.get_or_create(&DropLabels { reason });
        }
        // Counters of closed label sets start at 0, so they are exported (and rate() and
        // alerts see their first increment) before anything happened.
        for op in StoreOp::ALL {
            let _ = store_errors.get_or_create(&OpLabels { op });
        }
        for result in [ReloadResult::Ok, ReloadResult::Error] {
            let _ = config_reloads.get_or_create(&ResultLabels { result });
        }
        for method in McpMethod::ALL {
            for outcome in [Outcome::Ok, Outcome::Error] {
                let _ = mcp_requests.get_or_create(&McpLabels { method, outcome });
            }
        }
        Metrics {
            registry,
            invocations,
            preflight_rejections,
            result_too_large,
            failures,
            invocation_duration,
            upstream_duration,
            store_duration,
            store_timers: Default::default(),
            store_errors,
            in_flight,
            config_reloads,
            mcp_requests,
            policy_denials,
            spans_dropped,
            spans_exported,
            export_errors,
            evidence_tampered,
            connections_open,
            connections_shed,
            connections_refused,
            attribution: Mutex::new(BTreeMap::new()),
        }
    }

    /// `listener`'s series of the connection metrics (all of them exported from now on, at 0).
    pub fn connections(&self, listener: Listener) -> ConnectionCounts {
        let labels = ListenerLabels { listener };
        let shed = |reason| {
            self.connections_shed
                .get_or_create(&ShedLabels { listener, reason })
                .clone()
        };
        ConnectionCounts {
            open: self.connections_open.get_or_create(&labels).clone(),
            shed_cap: shed(Shed::Cap),
            shed_idle: shed(Shed::IdleTimeout),
            refused: self.connections_refused.get_or_create(&labels).clone(),
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// A call rejected before it reached the tool (preflight steps 1–10, or shutdown).
    pub fn rejected(&self, tool: Option<&ToolName>, err: &Error) {
        let tool = ToolLabel(tool.cloned());
        if let Code::PolicyDenied(role) = err.code {
            self.policy_denials
                .get_or_create(&ToolRoleLabels {
                    tool: tool.clone(),
                    role,
                })
                .inc();
        }
        self.preflight_rejections
            .get_or_create(&ToolCodeLabels {
                tool: tool.clone(),
                code: err.code,
            })
            .inc();
        self.failed(tool, err);
    }

    /// A reserved call that ended. `err` is set for ERROR outcomes.
    pub fn finished(
        &self,
        tool: &ToolName,
        handles: &ToolHandles,
        evidence: Evidence,
        elapsed: Duration,
        err: Option<&Error>,
    ) {
        let label = || ToolLabel(Some(tool.clone()));
        let status = if err.is_some() {
            Status::Error
        } else {
            Status::Ready
        };
        let e = Evidence::ALL
            .iter()
            .position(|&x| x == evidence)
            .unwrap_or(0);
        let s = usize::from(status == Status::Error);
        handles.invocations[s * 3 + e]
            .get_or_init(|| {
                self.invocations.get_or_create_owned(&InvocationLabels {
                    tool: label(),
                    status,
                    evidence_status: evidence,
                })
            })
            .inc();
        handles.duration[s]
            .get_or_init(|| {
                self.invocation_duration
                    .get_or_create_owned(&ToolStatusLabels {
                        tool: label(),
                        status,
                    })
            })
            .observe(elapsed.as_secs_f64());
        if let Some(err) = err {
            self.failed(label(), err);
        }
    }

    fn failed(&self, tool: ToolLabel, err: &Error) {
        let layer = err.layer();
        if let Code::ResultTooLarge(stage) = err.code {
            self.result_too_large
                .get_or_create(&ToolStageLabels { tool, stage })
                .inc();
        }
        self.failures
            .get_or_create(&LayerCodeLabels {
                layer,
                code: err.code,
            })
            .inc();
        let mut counts = self.attribution.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((layer, err.code)).or_insert(0) += 1;
    }

    pub fn upstream(&self, tool: &ToolName, handles: &ToolHandles, elapsed: Duration) {
        handles
            .upstream
            .get_or_init(|| {
                self.upstream_duration.get_or_create_owned(&ToolLabels {
                    tool: ToolLabel(Some(tool.clone())),
                })
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Moves the in-flight gauge of a tool by `delta`.
    pub fn in_flight(&self, tool: &ToolName, handles: &ToolHandles, delta: i64) {
        handles
            .in_flight
            .get_or_init(|| {
                self.in_flight.get_or_create_owned(&ToolLabels {
                    tool: ToolLabel(Some(tool.clone())),
                })
            })
            .inc_by(delta);
    }

    /// One MCP request answered.
    pub fn mcp_request(&self, method: McpMethod, outcome: Outcome) {
        self.mcp_requests
            .get_or_create(&McpLabels { method, outcome })
            .inc();
    }

    /// `n` finished spans that will never reach the collector.
    pub fn spans_dropped(&self, reason: SpanDrop, n: u64) {
        self.spans_dropped
            .get_or_create(&DropLabels { reason })
            .inc_by(n);
    }

    /// An export request the collector accepted, with `n` spans.
    pub fn spans_exported(&self, n: u64) {
        self.spans_exported.inc_by(n);
    }

    /// An export request that failed or timed out.
    pub fn export_error(&self) {
        self.export_errors.inc();
    }

    pub fn evidence_tampered(&self, n: u64) {
        self.evidence_tampered.inc_by(n);
    }

    pub fn config_reload(&self, result: ReloadResult) {
        self.config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// `GET /v1/failure-attribution`: every layer listed; shares are 0.0 while the total is 0.
    pub fn attribution(&self) -> Value {
        let counts = self
            .attribution
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let total: u64 = counts.values().sum();
        let share = |n: u64| {
            if total == 0 {
                0.0
            } else {
                n as f64 / total as f64
            }
        };
        let mut by_layer = Map::new();
        for layer in Layer::ALL {
            let n: u64 = counts
                .iter()
                .filter(|((l, _), _)| *l == layer)
                .map(|(_, n)| n)
                .sum();
            by_layer.insert(
                layer.as_str().to_string(),
                json!({"count": n, "share": share(n)}),
            );
        }
        // Keyed by wire name: the stages of RESULT_TOO_LARGE add up under one code.
        let mut by_code: BTreeMap<&str, u64> = BTreeMap::new();
        for ((_, code), n) in &counts {
            *by_code.entry(code.as_str()).or_insert(0) += n;
        }
        let unknown: u64 = counts
            .iter()
            .filter(|((l, _), _)| *l == Layer::Unknown)
            .map(|(_, n)| n)
            .sum();
        json!({
            "total": total,
            "by_layer": by_layer,
            "unknown_share": share(unknown),
            "by_code": by_code,
        })
    }
}

impl Observer for Metrics {
    fn store_op(&self, op: StoreOp, elapsed: Duration, unavailable: bool) {
        self.store_timers[op as usize]
            .get_or_init(|| self.store_duration.get_or_create(&OpLabels { op }).clone())
            .observe(elapsed.as_secs_f64());
        if unavailable {
            self.store_errors.get_or_create(&OpLabels { op }).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolName {
        ToolName::parse(name).unwrap()
    }

    #[test]
    fn exposition_names_follow_the_contract() {
        let m = Metrics::new();
        m.rejected(None, &Error::new(Code::UnknownTool));
        m.finished(
            &tool("search"),
            &ToolHandles::default(),
            Evidence::Error,
            Duration::from_millis(3),
            Some(&Error::too_large(SizeStage::Raw)),
        );
        m.finished(
            &tool("search"),
            &ToolHandles::default(),
            Evidence::Found,
            Duration::from_millis(3),
            None,
        );
        m.store_op(StoreOp::Reserve, Duration::from_millis(1), true);
        m.in_flight(&tool("search"), &ToolHandles::default(), 1);
        m.config_reload(ReloadResult::Error);
        m.mcp_request(McpMethod::ToolsCall, Outcome::Error);
        m.rejected(
            Some(&tool("fetch")),
            &Error::new(Code::PolicyDenied(Role::NetworkTarget)),
        );
        m.upstream(
            &tool("search"),
            &ToolHandles::default(),
            Duration::from_millis(2),
        );
        m.spans_dropped(SpanDrop::QueueFull, 3);
        m.export_error();
        let text = m.encode();
        for needle in [
            r#"toolgate_preflight_rejections_total{tool="_unknown",code="UNKNOWN_TOOL"} 1"#,
            r#"toolgate_invocations_total{tool="search",status="READY",evidence_status="EVIDENCE_FOUND"} 1"#,
            r#"toolgate_result_too_large_total{tool="search",stage="raw"} 1"#,
            r#"toolgate_failures_total{layer="PROVIDER",code="RESULT_TOO_LARGE"} 1"#,
            r#"toolgate_invocation_duration_seconds_bucket{le="0.005",tool="search",status="READY"} 1"#,
            r#"toolgate_store_errors_total{op="reserve"} 1"#,
            r#"toolgate_invocations_in_flight{tool="search"} 1"#,
            r#"toolgate_config_reloads_total{result="error"} 1"#,
            r#"toolgate_mcp_requests_total{method="tools/call",outcome="error"} 1"#,
            r#"toolgate_mcp_requests_total{method="server/discover",outcome="ok"} 0"#,
            r#"toolgate_policy_denials_total{tool="fetch",role="network_target"} 1"#,
            r#"toolgate_preflight_rejections_total{tool="fetch",code="POLICY_DENIED"} 1"#,
            r#"toolgate_failures_total{layer="AGENT",code="POLICY_DENIED"} 1"#,
            "toolgate_upstream_duration_seconds_count",
            r#"toolgate_otel_spans_dropped_total{reason="queue_full"} 3"#,
            r#"toolgate_otel_spans_dropped_total{reason="export_failed"} 0"#,
            "toolgate_otel_export_errors_total 1",
            "toolgate_otel_spans_exported_total 0",
            "toolgate_store_operation_duration_seconds_count",
            "# HELP toolgate_failures Calls that ended in an error",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    #[test]
    fn each_store_operation_is_timed_in_its_own_series() {
        let m = Metrics::new();
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            for _ in 0..=i {
                m.store_op(op, Duration::from_millis(1), false);
            }
        }
        let text = m.encode();
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            let needle = format!(
                "toolgate_store_operation_duration_seconds_count{{op=\"{}\"}} {}",
                op.as_str(),
                i + 1
            );
            assert!(text.contains(&needle), "missing {needle} in\n{text}");
        }
    }

    #[test]
    fn attribution_counts_by_layer_and_code() {
        let m = Metrics::new();
        let empty = m.attribution();
        assert_eq!(empty["total"], 0);
        assert_eq!(empty["by_layer"]["AGENT"]["share"], 0.0);
        assert_eq!(empty["by_layer"].as_object().unwrap().len(), 7);
        let a = tool("a");
        m.rejected(Some(&a), &Error::new(Code::BudgetExhausted));
        m.rejected(Some(&a), &Error::new(Code::InvalidInput));
        m.rejected(Some(&a), &Error::new(Code::InvalidInput));
        m.finished(
            &a,
            &ToolHandles::default(),
            Evidence::Error,
            Duration::ZERO,
            Some(&Error::new(Code::ToolTimeout)),
        );
        let a = m.attribution();
        assert_eq!(a["total"], 4);
        assert_eq!(a["by_layer"]["AGENT"]["count"], 2);
        assert_eq!(a["by_layer"]["AGENT"]["share"], 0.5);
        assert_eq!(a["by_layer"]["WORKFLOW"]["count"], 1);
        assert_eq!(a["by_code"]["INVALID_INPUT"], 2);
        assert_eq!(a["unknown_share"], 0.0);
    }
}
