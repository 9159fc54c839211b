//! The boundary integration cases, unchanged, against a real 6-node Redis Cluster.

mod support;

boundary_cases!(support::store_yaml(Some(
    &support::redis_cluster::shared().urls()
)));

/// The whole sidecar against a frozen cluster: calls fail closed with STORE_UNAVAILABLE without
/// reaching the tool, `/readyz` turns 503, and both recover by themselves after the thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_cluster_fails_closed_and_recovers() {
    use serde_json::json;
    use std::time::Duration;
    use support::Deadline;
    use support::fake_tool::FakeTool;
    use support::redis_cluster::RedisCluster;
    use support::sidecar::Sidecar;

    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("spawn cluster");
    let tool = FakeTool::start().await;
    let nodes = cluster
        .urls()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = format!(
        "store: {{kind: redis-cluster, nodes: [{nodes}], timeout_ms: 500}}\n\
         tools:\n  - {{name: search, upstream: '{}', read_only: true}}\n",
        tool.url("search")
    );
    let sidecar = Sidecar::start(&config).await;
    let run_id = support::unique("frozen");
    let token = sidecar.create_run(json!({"run_id": run_id})).await;
    let ok = sidecar
        .invoke(&token, &run_id, "before", "search", json!({"q": "x"}))
        .await;
    assert_eq!(ok.status, 200, "{}", ok.raw);

    cluster.pause_primaries();
    let (ready, _) = sidecar.get_telemetry("/readyz").await;
    assert_eq!(ready, 503, "/readyz while the primaries are frozen");
    let frozen = sidecar
        .invoke(&token, &run_id, "frozen", "search", json!({"q": "x"}))
        .await;
    assert_eq!(frozen.status, 503, "{}", frozen.raw);
    assert_eq!(frozen.body["error"]["code"], "STORE_UNAVAILABLE");
    assert_eq!(frozen.body["tool_call_id"], "frozen");
    assert_eq!(
        tool.calls("search").len(),
        1,
        "the tool is not called without a reservation"
    );
    let admin = sidecar
        .admin("GET", &format!("/v1/runs/{run_id}"), None)
        .await;
    assert_eq!(admin.status, 503, "{}", admin.raw);
    assert_eq!(admin.body["error"]["code"], "STORE_UNAVAILABLE");

    cluster.resume();
    let deadline = Deadline::after(Duration::from_secs(30), "/readyz after the thaw");
    while sidecar.get_telemetry("/readyz").await.0 != 200 {
        deadline.tick().await;
    }
    let after = sidecar
        .invoke(&token, &run_id, "after", "search", json!({"q": "x"}))
        .await;
    assert_eq!(after.status, 200, "{}", after.raw);
    let metrics = sidecar.metrics().await;
    assert!(
        metrics.contains(
            r#"toolgate_preflight_rejections_total{tool="search",code="STORE_UNAVAILABLE"} 1"#
        ),
        "{metrics}"
    );
}
