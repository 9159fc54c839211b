//! OpenTelemetry traces: the spans a call makes, as a real OTLP/HTTP receiver decodes them with
//! the official protobuf definitions; the `traceparent` the tool receives; and export that never
//! holds a call up, with a collector that is down or slow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::boundary::{Env, Run, assert_error, assert_ready};
use crate::support::fake_tool::RAW_MARKER;
use crate::support::otlp::{Collector, Received};
use crate::support::sidecar::Sidecar;
use crate::support::{Deadline, store_yaml};

const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const INTERNAL: i32 = 1;
const STATUS_ERROR: i32 = 2;

/// A fresh agent trace context: (trace id, parent span id, `traceparent`).
fn agent_context() -> (String, String, String) {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let nanos = toolgate::clock::now_ms() ^ (u64::from(std::process::id()) << 40);
    let trace_id = format!("{nanos:016x}{n:016x}");
    let span_id = format!("{:016x}", nanos ^ 0xa5a5_0000_0000_0001 ^ n);
    let traceparent = format!("00-{trace_id}-{span_id}-01");
    (trace_id, span_id, traceparent)
}

/// A sidecar with the standard tools whose spans go to `collector` (`extra`: more `otel` keys).
async fn traced_env(endpoint: &str, extra: &str) -> Env {
    let store = format!(
        "{}otel: {{endpoint: \"{endpoint}\", service_name: toolgate-test{extra}}}\n",
        store_yaml(None)
    );
    Env::start(&store).await
}

/// An envelope call carrying `traceparent`.
async fn traced_call(
    env: &Env,
    run: &Run,
    id: &str,
    tool: &str,
    input: Value,
    traceparent: &str,
) -> crate::support::sidecar::Reply {
    let body = json!({"run_id": run.id, "tool_call_id": id, "tool": tool, "input": input});
    env.sc
        .invoke_raw(
            Some(&run.token),
            body.to_string(),
            &[("traceparent", traceparent)],
        )
        .await
}

/// Waits until `collector` holds `n` spans of `trace_id`.
async fn wait_trace(collector: &Collector, trace_id: &str, n: usize) -> Vec<Received> {
    let d = Deadline::after(Duration::from_secs(15), format!("{n} spans of {trace_id}"));
    loop {
        let spans = collector.trace(trace_id);
        if spans.len() >= n {
            assert_eq!(spans.len(), n, "{spans:#?}");
            return spans;
        }
        d.tick().await;
    }
}

/// The `traceparent` of the last request the fake tool got on `route`.
fn tool_traceparent(env: &Env, route: &str) -> String {
    let seen = env.fake.calls(route);
    let last = seen.last().expect("the tool was called");
    last.headers
        .get("traceparent")
        .cloned()
        .expect("a traceparent")
}

fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| s.span.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

/// The common shape of a reserved call's trace: the `execute_tool` span under the agent's span,
/// and its three children. Returns (root, upstream).
fn assert_call_trace<'a>(
    spans: &'a [Received],
    tool: &str,
    agent_span: &str,
    upstream_name: &str,
) -> (&'a Received, &'a Received) {
    let root = named(spans, &format!("execute_tool {tool}"));
    assert_eq!(root.span.kind, SERVER, "{root:#?}");
    assert_eq!(
        root.parent_span_id(),
        agent_span,
        "child of the agent's span"
    );
    assert_eq!(root.scope, "toolgate");
    assert_eq!(
        root.resource_attr("service.name").as_deref(),
        Some("toolgate-test")
    );
    for (name, kind) in [
        ("reserve", INTERNAL),
        (upstream_name, CLIENT),
        ("finalize", INTERNAL),
    ] {
        let child = named(spans, name);
        assert_eq!(child.span.kind, kind, "{child:#?}");
        assert_eq!(
            child.parent_span_id(),
            root.span_id(),
            "{name} under the call"
        );
        assert!(
            child.span.start_time_unix_nano >= root.span.start_time_unix_nano
                && child.span.end_time_unix_nano <= root.span.end_time_unix_nano,
            "{name} within the call"
        );
    }
    let reserve = named(spans, "reserve");
    let upstream = named(spans, upstream_name);
    let finalize = named(spans, "finalize");
    assert!(reserve.span.end_time_unix_nano <= upstream.span.start_time_unix_nano);
    assert!(upstream.span.end_time_unix_nano <= finalize.span.start_time_unix_nano);
    (root, upstream)
}

/// Every attribute key is set once, and no value carries input or raw payload.
fn assert_no_payload(spans: &[Received], secret: &str) {
    for s in spans {
        for kv in &s.span.attributes {
            assert_eq!(
                s.attr_count(&kv.key),
                1,
                "{} set twice on {}",
                kv.key,
                s.span.name
            );
            let v = s.attr(&kv.key).unwrap_or_default();
            assert!(
                !v.contains(secret) && !v.contains(RAW_MARKER),
                "{} = {v:?} on {} carries payload",
                kv.key,
                s.span.name
            );
        }
        assert!(s.span.events.is_empty(), "events on {}", s.span.name);
    }
}

#[track_caller]
fn assert_attr(span: &Received, key: &str, value: &str) {
    assert_eq!(
        span.attr(key).as_deref(),
        Some(value),
        "{key} on {}: {:#?}",
        span.span.name,
        span.span.attributes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_spans_of_ready_no_evidence_rejected_and_failed_calls() {
    let collector = Collector::start().await;
    let env = traced_env(&collector.endpoint(), "").await;
    let run = env.run(json!({})).await;
    let secret = "query-that-must-not-be-traced";

    // READY with evidence.
    let (trace, agent_span, tp) = agent_context();
    let r = traced_call(&env, &run, "ready-1", "search", json!({"q": secret}), &tp).await;
    assert_ready(&r, "ready-1", "EVIDENCE_FOUND");
    let spans = wait_trace(&collector, &trace, 4).await;
    let (root, upstream) = assert_call_trace(&spans, "search", &agent_span, "POST");
    for (k, v) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "search"),
        ("gen_ai.tool.call.id", "ready-1"),
        ("gen_ai.tool.type", "extension"),
        ("toolgate.run.id", run.id.as_str()),
        ("toolgate.status", "READY"),
        ("toolgate.evidence_status", "EVIDENCE_FOUND"),
    ] {
        assert_attr(root, k, v);
    }
    assert_eq!(root.attr("error.type"), None);
    assert_ne!(root.status_code(), STATUS_ERROR);
    let port = env.fake.addr.port().to_string();
    for (k, v) in [
        ("http.request.method", "POST"),
        ("server.address", "127.0.0.1"),
        ("server.port", port.as_str()),
        ("http.response.status_code", "200"),
    ] {
        assert_attr(upstream, k, v);
    }
    assert_attr(upstream, "url.full", &env.fake.url("search"));
    assert_ne!(upstream.status_code(), STATUS_ERROR);
    // The tool got toolgate's upstream span as its parent, in the agent's trace.
    let got = tool_traceparent(&env, "search");
    assert_eq!(got, format!("00-{trace}-{}-01", upstream.span_id()));
    assert_no_payload(&spans, secret);

    // READY without evidence.
    let (trace, agent_span, tp) = agent_context();
    let r = traced_call(&env, &run, "empty-1", "empty", json!({"q": secret}), &tp).await;
    assert_ready(&r, "empty-1", "NO_EVIDENCE");
    let spans = wait_trace(&collector, &trace, 4).await;
    let (root, upstream) = assert_call_trace(&spans, "empty", &agent_span, "POST");
    assert_attr(root, "toolgate.status", "READY");
    assert_attr(root, "toolgate.evidence_status", "NO_EVIDENCE");
    let got = tool_traceparent(&env, "empty");
    assert_eq!(got, format!("00-{trace}-{}-01", upstream.span_id()));
    assert_no_payload(&spans, secret);

    // A preflight rejection: one span, the error on it, nothing forwarded.
    let (trace, agent_span, tp) = agent_context();
    let before = env.fake.calls("echo").len();
    let r = traced_call(&env, &run, "writer-1", "writer", json!({"q": secret}), &tp).await;
    assert_error(&r, 403, "TOOL_NOT_READ_ONLY", Some("writer-1"));
    let spans = wait_trace(&collector, &trace, 1).await;
    let root = named(&spans, "execute_tool writer");
    assert_eq!(root.span.kind, SERVER);
    assert_eq!(root.parent_span_id(), agent_span);
    for (k, v) in [
        ("gen_ai.tool.name", "writer"),
        ("gen_ai.tool.call.id", "writer-1"),
        ("toolgate.run.id", run.id.as_str()),
        ("toolgate.status", "ERROR"),
        ("toolgate.error.code", "TOOL_NOT_READ_ONLY"),
        ("toolgate.failure.layer", "AGENT"),
        ("error.type", "TOOL_NOT_READ_ONLY"),
    ] {
        assert_attr(root, k, v);
    }
    assert_eq!(root.attr("toolgate.evidence_status"), None);
    assert_eq!(root.status_code(), STATUS_ERROR);
    assert_eq!(
        env.fake.calls("echo").len(),
        before,
        "a rejected call is not forwarded"
    );
    assert_no_payload(&spans, secret);

    // A rejection before the caller is identified: the configured tool it named, but no run.
    let (trace, _, tp) = agent_context();
    let r = env
        .sc
        .invoke_raw(
            None,
            json!({"tool": "search"}).to_string(),
            &[("traceparent", &tp)],
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.raw);
    let spans = wait_trace(&collector, &trace, 1).await;
    let root = named(&spans, "execute_tool search");
    assert_attr(root, "toolgate.error.code", "UNAUTHENTICATED");
    assert_attr(root, "gen_ai.tool.name", "search");
    assert_eq!(root.attr("gen_ai.tool.call.id"), None);
    assert_eq!(root.attr("toolgate.run.id"), None);
    // One naming a tool that is not configured: the bare span name, no tool.
    let (trace, _, tp) = agent_context();
    let body = json!({"run_id": run.id, "tool_call_id": "nope-1", "tool": secret, "input": {}});
    let r = env
        .sc
        .invoke_raw(Some(&run.token), body.to_string(), &[("traceparent", &tp)])
        .await;
    assert_error(&r, 404, "UNKNOWN_TOOL", Some("nope-1"));
    let spans = wait_trace(&collector, &trace, 1).await;
    let root = named(&spans, "execute_tool");
    assert_eq!(root.attr("gen_ai.tool.name"), None);
    assert_no_payload(&spans, secret);

    // An upstream failure: the error on the call's span and on the upstream span.
    let (trace, agent_span, tp) = agent_context();
    let r = traced_call(&env, &run, "fail-1", "fail", json!({"q": secret}), &tp).await;
    assert_error(&r, 502, "TOOL_EXECUTION_FAILED", Some("fail-1"));
    let spans = wait_trace(&collector, &trace, 4).await;
    let (root, upstream) = assert_call_trace(&spans, "fail", &agent_span, "POST");
    for (k, v) in [
        ("toolgate.status", "ERROR"),
        ("toolgate.evidence_status", "ERROR"),
        ("toolgate.error.code", "TOOL_EXECUTION_FAILED"),
        ("toolgate.failure.layer", "PROVIDER"),
        ("error.type", "TOOL_EXECUTION_FAILED"),
    ] {
        assert_attr(root, k, v);
    }
    assert_eq!(root.status_code(), STATUS_ERROR);
    assert_attr(upstream, "http.response.status_code", "500");
    assert_attr(upstream, "error.type", "500");
    assert_eq!(upstream.status_code(), STATUS_ERROR);
    assert_ne!(named(&spans, "reserve").status_code(), STATUS_ERROR);
    assert_ne!(named(&spans, "finalize").status_code(), STATUS_ERROR);
    let got = tool_traceparent(&env, "fail");
    assert_eq!(got, format!("00-{trace}-{}-01", upstream.span_id()));
    assert_no_payload(&spans, secret);

    // An unreachable tool: no status code, the failure class instead.
    let (trace, agent_span, tp) = agent_context();
    let r = traced_call(&env, &run, "down-1", "unreachable", json!({"q": "x"}), &tp).await;
    assert_error(&r, 502, "TOOL_EXECUTION_FAILED", Some("down-1"));
    let spans = wait_trace(&collector, &trace, 4).await;
    let (_, upstream) = assert_call_trace(&spans, "unreachable", &agent_span, "POST");
    assert_attr(upstream, "error.type", "unreachable");
    assert_eq!(upstream.attr("http.response.status_code"), None);

    assert_eq!(
        collector.rejected.load(Ordering::SeqCst),
        0,
        "malformed exports"
    );
    let d = Deadline::after(Duration::from_secs(5), "exported spans counted");
    while env
        .sc
        .metric("toolgate_otel_spans_exported_total", &[])
        .await
        .unwrap_or(0.0)
        < 18.0
    {
        d.tick().await;
    }
    assert_eq!(
        env.sc
            .metric("toolgate_otel_spans_dropped_total", &[])
            .await,
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_a_call_without_traceparent_starts_a_trace_and_the_tool_is_told() {
    let collector = Collector::start().await;
    let env = traced_env(&collector.endpoint(), "").await;
    let run = env.run(json!({})).await;
    let r = env.call(&run, "root-1", "search", json!({"q": "x"})).await;
    assert_ready(&r, "root-1", "EVIDENCE_FOUND");
    let d = Deadline::after(Duration::from_secs(15), "the spans of root-1");
    let root = loop {
        let found = collector
            .spans()
            .into_iter()
            .find(|s| s.attr("gen_ai.tool.call.id").as_deref() == Some("root-1"));
        if let Some(root) = found {
            break root;
        }
        d.tick().await;
    };
    assert!(root.span.parent_span_id.is_empty(), "a root span");
    let spans = wait_trace(&collector, &root.trace_id(), 4).await;
    let upstream = named(&spans, "POST");
    let got = tool_traceparent(&env, "search");
    assert_eq!(
        got,
        format!("00-{}-{}-01", root.trace_id(), upstream.span_id())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_an_unsampled_parent_records_nothing_but_still_propagates() {
    let collector = Collector::start().await;
    let env = traced_env(&collector.endpoint(), ", sample_ratio: 1.0").await;
    let run = env.run(json!({})).await;
    let (trace, agent_span, _) = agent_context();
    let unsampled = format!("00-{trace}-{agent_span}-00");
    let r = traced_call(
        &env,
        &run,
        "unsampled-1",
        "search",
        json!({"q": "x"}),
        &unsampled,
    )
    .await;
    assert_ready(&r, "unsampled-1", "EVIDENCE_FOUND");
    let got = tool_traceparent(&env, "search");
    assert!(
        got.starts_with(&format!("00-{trace}-")) && got.ends_with("-00"),
        "{got}"
    );
    assert_ne!(got, unsampled, "the tool gets toolgate's span id");
    // A sampled call after it is exported, so the unsampled one had its chance to be.
    let (sampled, _, tp) = agent_context();
    let r = traced_call(&env, &run, "sampled-1", "search", json!({"q": "x"}), &tp).await;
    assert_ready(&r, "sampled-1", "EVIDENCE_FOUND");
    wait_trace(&collector, &sampled, 4).await;
    assert!(
        collector.trace(&trace).is_empty(),
        "unsampled spans exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_mcp_calls_carry_the_mcp_attributes() {
    let collector = Collector::start().await;
    let env = traced_env(&collector.endpoint(), "").await;
    let run = env.run(json!({})).await;
    let (trace, agent_span, tp) = agent_context();
    let msg = json!({
        "jsonrpc": "2.0",
        "id": "req-7",
        "method": "tools/call",
        "params": {
            "name": "search",
            "arguments": {"q": "x"},
            "_meta": {
                "toolgate.dev/run_id": run.id,
                "toolgate.dev/tool_call_id": "mcp-1",
                "traceparent": tp,
            },
        },
    });
    let r = env
        .sc
        .send(
            "POST",
            format!("http://{}/mcp", env.sc.agent),
            Some(&run.token),
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ],
            msg.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["result"]["isError"], false, "{}", r.raw);
    let spans = wait_trace(&collector, &trace, 4).await;
    let (root, upstream) = assert_call_trace(&spans, "search", &agent_span, "POST");
    assert_attr(root, "mcp.method.name", "tools/call");
    assert_attr(root, "jsonrpc.request.id", "req-7");
    assert_attr(root, "gen_ai.tool.call.id", "mcp-1");
    let got = tool_traceparent(&env, "search");
    assert_eq!(got, format!("00-{trace}-{}-01", upstream.span_id()));
}

/// Calls made while the collector misbehaves: each must answer READY well within `bound`.
async fn calls_unaffected(env: &Env, run: &Run, prefix: &str, n: usize, bound: Duration) {
    for i in 0..n {
        let (_, _, tp) = agent_context();
        let id = format!("{prefix}-{i}");
        let started = Instant::now();
        let r = traced_call(env, run, &id, "search", json!({"q": "x"}), &tp).await;
        let took = started.elapsed();
        assert_ready(&r, &id, "EVIDENCE_FOUND");
        assert!(took < bound, "call {i} took {took:?}");
    }
}

/// Waits until every span of `calls` calls is either exported or dropped, and returns
/// (exported, dropped because the queue was full, dropped because the export failed).
async fn accounted(sc: &Sidecar, calls: usize) -> (f64, f64, f64) {
    let d = Deadline::after(Duration::from_secs(30), "every span exported or dropped");
    loop {
        let m = sc.metrics().await;
        let get = |name: &str, labels: &[(&str, &str)]| {
            crate::support::sidecar::metric(&m, name, labels).unwrap_or(0.0)
        };
        let exported = get("toolgate_otel_spans_exported_total", &[]);
        let full = get(
            "toolgate_otel_spans_dropped_total",
            &[("reason", "queue_full")],
        );
        let failed = get(
            "toolgate_otel_spans_dropped_total",
            &[("reason", "export_failed")],
        );
        if exported + full + failed >= (4 * calls) as f64 {
            assert_eq!(exported + full + failed, (4 * calls) as f64);
            return (exported, full, failed);
        }
        d.tick().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_collector_down_drops_and_counts_without_slowing_calls() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let env = traced_env(&endpoint, ", max_queue_spans: 8, timeout_ms: 500").await;
    let run = env.run(json!({})).await;
    calls_unaffected(&env, &run, "c", 30, Duration::from_secs(2)).await;
    let (exported, _, failed) = accounted(&env.sc, 30).await;
    assert_eq!(exported, 0.0);
    assert!(failed > 0.0, "failed exports count their spans");
    let errors = env
        .sc
        .metric("toolgate_otel_export_errors_total", &[])
        .await
        .unwrap();
    assert!(errors >= 1.0, "export errors: {errors}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_slow_collector_drops_and_counts_without_slowing_calls() {
    let delay = Duration::from_secs(3);
    let collector = Collector::start_slow(delay).await;
    let env = traced_env(
        &collector.endpoint(),
        ", max_queue_spans: 8, timeout_ms: 10000",
    )
    .await;
    let run = env.run(json!({})).await;
    // One call, whose export the collector now holds up; then calls while it does, each
    // answering well before one export could.
    calls_unaffected(&env, &run, "first", 1, delay / 2).await;
    let d = Deadline::after(Duration::from_secs(10), "the first export request");
    while collector.requests.load(Ordering::SeqCst) == 0 {
        d.tick().await;
    }
    calls_unaffected(&env, &run, "c", 40, delay / 2).await;
    let (exported, full, failed) = accounted(&env.sc, 41).await;
    assert!(full > 0.0, "a full queue drops spans");
    assert_eq!(failed, 0.0, "a slow collector still accepts what it gets");
    assert_eq!(collector.spans().len() as f64, exported);
    assert_eq!(collector.rejected.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_without_the_key_the_agents_traceparent_goes_through_unchanged() {
    let env = Env::start(&store_yaml(None)).await;
    let run = env.run(json!({})).await;
    let (_, _, tp) = agent_context();
    let r = traced_call(&env, &run, "plain-1", "search", json!({"q": "x"}), &tp).await;
    assert_ready(&r, "plain-1", "EVIDENCE_FOUND");
    let got = tool_traceparent(&env, "search");
    assert_eq!(got, tp);
    assert_eq!(
        env.sc
            .metric("toolgate_otel_spans_exported_total", &[])
            .await,
        Some(0.0)
    );
}
