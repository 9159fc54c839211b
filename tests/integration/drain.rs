//! Graceful shutdown: the drain refuses new calls and lets the calls in flight finish.

use std::time::Duration;

use serde_json::json;

use crate::boundary::{Env, assert_error, assert_ready, envelope, on_both_stores};
use crate::support::Deadline;

on_both_stores!(graceful_shutdown);

/// Graceful shutdown: /readyz turns 503 at once, new calls get 503 SHUTTING_DOWN, the call in
/// flight finishes, then the sidecar's run task ends cleanly.
async fn graceful_shutdown(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let in_flight = env.slow_call_in_flight(&run, "s1", 2000).await;
    assert_eq!(env.sc.get_telemetry("/readyz").await.0, 200);

    let task = env.sc.begin_shutdown();
    let d = Deadline::after(Duration::from_millis(1000), "/readyz to turn 503");
    while env.sc.get_telemetry("/readyz").await.0 != 503 {
        d.tick().await;
    }
    let reply = env.call(&run, "s2", "search", json!({"q": "x"})).await;
    assert_error(&reply, 503, "SHUTTING_DOWN", Some("s2"));
    let reply = env.intercept(&run, "s3", "search", r#"{"q":"x"}"#).await;
    assert_error(&reply, 503, "SHUTTING_DOWN", Some("s3"));
    let reply = env.send(&envelope(None, "{oops")).await;
    assert_error(&reply, 503, "SHUTTING_DOWN", None);
    assert!(
        !in_flight.is_finished(),
        "the slow call should still be in flight"
    );
    assert!(
        !task.is_finished(),
        "the sidecar stopped before its call in flight finished"
    );
    assert_eq!(
        env.fake.calls("search").len(),
        0,
        "a call during the drain reached a tool"
    );

    let reply = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the call in flight finished")
        .expect("task");
    assert_ready(&reply, "s1", "EVIDENCE_FOUND");
    let ran = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the sidecar finished draining")
        .expect("run task");
    assert!(ran.is_ok(), "run ended with {ran:?}");
}
