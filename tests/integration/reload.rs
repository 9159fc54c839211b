//! Hot reload of the config file: a valid version applies, an invalid one or one that needs a
//! restart is refused whole, and the running tools keep working either way.

use std::time::Duration;

use serde_json::json;

use crate::boundary::{Env, assert_error, assert_ready, on_both_stores};
use crate::support::Deadline;

on_both_stores!(hot_reload);

/// Hot reload: a valid new file applies within 5 s; an invalid one, or one that changes
/// `listen`, is refused and the old tools keep working.
async fn hot_reload(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let reloads = |result: &'static str| {
        let sc = env.sc.clone();
        async move {
            sc.metric("toolgate_config_reloads_total", &[("result", result)])
                .await
                .unwrap_or(0.0)
        }
    };
    assert_error(
        &env.call(&run, "x0", "extra", json!({})).await,
        404,
        "UNKNOWN_TOOL",
        Some("x0"),
    );
    assert_eq!((reloads("ok").await, reloads("error").await), (0.0, 0.0));

    // A valid new version adds a tool.
    let added = format!(
        "{}  - {{name: extra, upstream: \"{}\", read_only: true, projection: {{select: /results}}}}\n",
        env.config,
        env.fake.url("scalar")
    );
    env.sc.rewrite_config(&added);
    let d = Deadline::after(Duration::from_secs(5), "the new tool to be served");
    let mut n = 0;
    loop {
        n += 1;
        let id = format!("x{n}");
        let reply = env.call(&run, &id, "extra", json!({})).await;
        if reply.status == 200 {
            assert_eq!(
                assert_ready(&reply, &id, "EVIDENCE_FOUND"),
                json!({"item": 42})
            );
            break;
        }
        assert_error(&reply, 404, "UNKNOWN_TOOL", Some(&id));
        d.tick().await;
    }
    assert_eq!(reloads("ok").await, 1.0);
    assert_eq!(reloads("error").await, 0.0);

    // An invalid version is refused whole.
    env.sc.rewrite_config(&format!(
        "{added}  - {{name: broken, upstream: \"ftp://nowhere/\", read_only: true}}\n"
    ));
    let d = Deadline::after(Duration::from_secs(5), "the invalid config to be refused");
    while reloads("error").await < 1.0 {
        d.tick().await;
    }
    assert_ready(
        &env.call(&run, "y1", "extra", json!({})).await,
        "y1",
        "EVIDENCE_FOUND",
    );
    assert_ready(
        &env.call(&run, "y2", "search", json!({"q": "x"})).await,
        "y2",
        "EVIDENCE_FOUND",
    );

    // A version that changes `listen` needs a restart: refused, nothing of it applied.
    env.sc.rewrite_config(&format!(
        "listen: {{agent: \"127.0.0.1:1\"}}\n{added}  - {{name: extra2, upstream: \"{}\", read_only: true}}\n",
        env.fake.url("scalar")
    ));
    let d = Deadline::after(Duration::from_secs(5), "the listen change to be refused");
    while reloads("error").await < 2.0 {
        d.tick().await;
    }
    assert_error(
        &env.call(&run, "z1", "extra2", json!({})).await,
        404,
        "UNKNOWN_TOOL",
        Some("z1"),
    );
    assert_ready(
        &env.call(&run, "z2", "extra", json!({})).await,
        "z2",
        "EVIDENCE_FOUND",
    );
    assert_eq!(reloads("ok").await, 1.0);
    assert_eq!(reloads("error").await, 2.0);
}
