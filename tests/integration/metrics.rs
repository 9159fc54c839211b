//! The `/metrics` exposition: every metric of the contract, with bounded labels only.

use serde_json::json;

use crate::boundary::{Env, assert_ready, on_both_stores};
use crate::support::sidecar::metric;

on_both_stores!(metrics_exposition);

/// Every metric of the contract, with the labels a scenario provokes, and no id anywhere.
async fn metrics_exposition(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    assert_ready(
        &env.call(&run, "call_m1", "search", json!({"q": "x"})).await,
        "call_m1",
        "EVIDENCE_FOUND",
    );
    assert_ready(
        &env.call(&run, "call_m2", "empty", json!({})).await,
        "call_m2",
        "NO_EVIDENCE",
    );
    env.call(&run, "call_m3", "big", json!({})).await;
    env.call(&run, "call_m4", "wide", json!({})).await;
    env.call(&run, "call_m5", "no-such-tool-zz9", json!({}))
        .await;
    env.call(&run, "call_m6", "fail", json!({})).await;
    env.call(&run, "call_m1", "search", json!({"q": "x"})).await;

    let text = env.sc.metrics().await;
    let m = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels);
    let found = [
        ("tool", "search"),
        ("status", "READY"),
        ("evidence_status", "EVIDENCE_FOUND"),
    ];
    assert_eq!(m("toolgate_invocations_total", &found), Some(1.0));
    let none = [
        ("tool", "empty"),
        ("status", "READY"),
        ("evidence_status", "NO_EVIDENCE"),
    ];
    assert_eq!(m("toolgate_invocations_total", &none), Some(1.0));
    let err = [
        ("tool", "big"),
        ("status", "ERROR"),
        ("evidence_status", "ERROR"),
    ];
    assert_eq!(m("toolgate_invocations_total", &err), Some(1.0));
    let unknown = [("tool", "_unknown"), ("code", "UNKNOWN_TOOL")];
    assert_eq!(
        m("toolgate_preflight_rejections_total", &unknown),
        Some(1.0)
    );
    let dup = [("tool", "search"), ("code", "DUPLICATE_TOOL_CALL")];
    assert_eq!(m("toolgate_preflight_rejections_total", &dup), Some(1.0));
    assert_eq!(
        m(
            "toolgate_result_too_large_total",
            &[("tool", "big"), ("stage", "raw")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_result_too_large_total",
            &[("tool", "wide"), ("stage", "agent")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "PROVIDER"), ("code", "RESULT_TOO_LARGE")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "HARNESS"), ("code", "RESULT_TOO_LARGE")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "PROVIDER"), ("code", "TOOL_EXECUTION_FAILED")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "AGENT"), ("code", "UNKNOWN_TOOL")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "AGENT"), ("code", "DUPLICATE_TOOL_CALL")]
        ),
        Some(1.0)
    );
    let ready = [("tool", "search"), ("status", "READY")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_count", &ready),
        Some(1.0)
    );
    let bucket = [("tool", "search"), ("status", "READY"), ("le", "+Inf")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_bucket", &bucket),
        Some(1.0)
    );
    let errors = [("tool", "fail"), ("status", "ERROR")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_count", &errors),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_upstream_duration_seconds_count",
            &[("tool", "search")]
        ),
        Some(1.0)
    );
    // Five calls reserved and finalized (the unknown tool and the duplicate never reached it).
    assert_eq!(
        m(
            "toolgate_store_operation_duration_seconds_count",
            &[("op", "finalize")]
        ),
        Some(5.0)
    );
    assert_eq!(
        m(
            "toolgate_store_operation_duration_seconds_count",
            &[("op", "reserve")]
        ),
        Some(6.0)
    );
    assert_eq!(
        m("toolgate_invocations_in_flight", &[("tool", "search")]),
        Some(0.0)
    );
    // Counters no step here provokes are exported at 0 for their whole closed label set.
    for op in [
        "create_run",
        "get_run",
        "end_run",
        "cancel_run",
        "reserve",
        "finalize",
        "get_record",
        "facts",
        "ping",
    ] {
        assert_eq!(
            m("toolgate_store_errors_total", &[("op", op)]),
            Some(0.0),
            "store errors {op}"
        );
    }
    for result in ["ok", "error"] {
        assert_eq!(
            m("toolgate_config_reloads_total", &[("result", result)]),
            Some(0.0),
            "reloads {result}"
        );
    }
    for name in [
        "toolgate_store_errors_total",
        "toolgate_config_reloads_total",
        "toolgate_invocations_total",
        "toolgate_preflight_rejections_total",
        "toolgate_result_too_large_total",
        "toolgate_failures_total",
        "toolgate_invocation_duration_seconds",
        "toolgate_upstream_duration_seconds",
        "toolgate_store_operation_duration_seconds",
        "toolgate_invocations_in_flight",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
    // Bounded labels: no run id, call id or unconfigured tool name.
    for id in [run.id.as_str(), "call_m", "no-such-tool-zz9"] {
        assert!(!text.contains(id), "{id} appears in the metrics");
    }

    // The in-flight gauge counts a call while it runs.
    let call = env.slow_call_in_flight(&run, "call_m7", 800).await;
    assert_eq!(
        env.sc
            .metric("toolgate_invocations_in_flight", &[("tool", "slow")])
            .await,
        Some(1.0)
    );
    assert_eq!(call.await.expect("task").status, 200);
    assert_eq!(
        env.sc
            .metric("toolgate_invocations_in_flight", &[("tool", "slow")])
            .await,
        Some(0.0)
    );
}
