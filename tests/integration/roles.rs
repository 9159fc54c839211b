//! Parameter roles (preflight step 9b) through the whole sidecar, on both stores: a denial leaves
//! no record, spends no budget and never reaches the tool; an allowed call forwards the canonical
//! value and records what the agent sent; both call forms and MCP behave alike; the schema is
//! checked first; the metrics move.

use serde_json::{Value, json};

use crate::boundary::{Env, Run, assert_error, assert_ready, on_both_stores};

on_both_stores!(
    denial_leaves_no_trace,
    allowed_calls_forward_what_was_judged,
    schema_is_checked_before_roles,
    run_paths_are_validated_and_shown,
    mcp_denials_are_is_error_results,
);

/// The body the echo tool received for the call `id` of `run`.
fn forwarded(env: &Env, run: &Run, id: &str) -> Value {
    env.fake
        .calls("echo")
        .into_iter()
        .find(|s| {
            s.headers.get("x-tool-call-id").map(String::as_str) == Some(id)
                && s.headers.get("x-run-id").map(String::as_str) == Some(run.id.as_str())
        })
        .map(|s| s.body)
        .unwrap_or_else(|| panic!("the tool never saw {id}"))
}

async fn denial_leaves_no_trace(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({"workspace": "/workspace/run-42"})).await;
    for (id, tool, input, role) in [
        ("ssh", "read_file", json!({"path": "~/.ssh/id_rsa"}), "path"),
        ("cache", "read_file", json!({"path": "~/.cache/x"}), "path"),
        (
            "up",
            "read_file",
            json!({"path": "../../etc/passwd"}),
            "path",
        ),
        (
            "sibling",
            "read_file",
            json!({"path": "/workspace/run-420/x"}),
            "path",
        ),
        (
            "src",
            "read_file",
            json!({"path": "a.md", "against": "/etc/shadow"}),
            "source_path",
        ),
        (
            "meta",
            "fetch",
            json!({"url": "http://169.254.169.254/latest/meta-data/"}),
            "network_target",
        ),
        (
            "hex",
            "fetch",
            json!({"url": "http://0x7f.1:6379/"}),
            "network_target",
        ),
        (
            "local",
            "fetch",
            json!({"url": "http://localhost:15002/v1/runs"}),
            "network_target",
        ),
        (
            "creds",
            "fetch",
            json!({"url": "http://user:pw@example.com/"}),
            "network_target",
        ),
    ] {
        let reply = env.call(&run, id, tool, input.clone()).await;
        assert_error(&reply, 403, "POLICY_DENIED", Some(id));
        env.no_record(&run.id, id).await;
        let label = [("tool", tool), ("role", role)];
        assert!(
            env.sc.metric("toolgate_policy_denials_total", &label).await >= Some(1.0),
            "{id}: no denial counted for {tool}/{role}"
        );
    }
    // The intercept form is judged the same way.
    let reply = env
        .intercept(
            &run,
            "intercepted",
            "read_file",
            json!({"path": "/etc/passwd"}).to_string(),
        )
        .await;
    assert_error(&reply, 403, "POLICY_DENIED", Some("intercepted"));
    env.no_record(&run.id, "intercepted").await;

    let view = env.view(&run.id).await;
    assert_eq!(view["calls_used"], 0, "a denial spends no budget");
    assert_eq!(
        env.fake.calls("echo").len(),
        0,
        "a denial never reaches the tool"
    );
    assert_eq!(env.facts(&run.id).await["excluded"], 0);
    assert_eq!(
        env.sc
            .metric(
                "toolgate_preflight_rejections_total",
                &[("code", "POLICY_DENIED")]
            )
            .await,
        Some(10.0)
    );
    assert_eq!(
        env.sc
            .metric(
                "toolgate_failures_total",
                &[("layer", "AGENT"), ("code", "POLICY_DENIED")]
            )
            .await,
        Some(10.0)
    );
    let attribution = env.sc.admin("GET", "/v1/failure-attribution", None).await;
    assert_eq!(
        attribution.body["by_code"]["POLICY_DENIED"], 10,
        "{}",
        attribution.raw
    );
}

async fn allowed_calls_forward_what_was_judged(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env
        .run(json!({"workspace": "/workspace/run-42/", "home": "/home/agent"}))
        .await;
    let cases = [
        (
            "rel",
            "read_file",
            json!({"path": "notes/../a.md"}),
            json!({"path": "/workspace/run-42/a.md"}),
        ),
        (
            "root",
            "read_file",
            json!({"path": "/usr/share/doc/x//y"}),
            json!({"path": "/usr/share/doc/x/y"}),
        ),
        (
            "many",
            "read_file",
            json!({"paths": ["a", "./b"], "against": "/workspace/run-42/c"}),
            json!({"paths": ["/workspace/run-42/a", "/workspace/run-42/b"], "against": "/workspace/run-42/c"}),
        ),
        (
            "url",
            "fetch",
            json!({"url": "HTTP://Example.COM/a/../b"}),
            json!({"url": "http://example.com/b"}),
        ),
        (
            "sub",
            "fetch",
            json!({"url": "https://docs.example.org"}),
            json!({"url": "https://docs.example.org/"}),
        ),
    ];
    for (id, tool, sent, canonical) in &cases {
        let reply = env.call(&run, id, tool, sent.clone()).await;
        let result = assert_ready(&reply, id, "EVIDENCE_FOUND");
        assert_eq!(
            result["item"]["input"], *canonical,
            "{id}: the agent sees what was forwarded"
        );
        assert_eq!(
            forwarded(&env, &run, id),
            *canonical,
            "{id}: the tool got the canonical value"
        );
        let record = env.record_ok(&run.id, id).await;
        assert_eq!(
            record["request"], *canonical,
            "{id}: request is the forwarded input"
        );
        assert_eq!(
            record["agent_input"], *sent,
            "{id}: agent_input is what the agent sent"
        );
    }
    // Nothing to rewrite: no agent_input.
    let same = json!({"path": "/workspace/run-42/a.md"});
    assert_ready(
        &env.call(&run, "same", "read_file", same.clone()).await,
        "same",
        "EVIDENCE_FOUND",
    );
    let record = env.record_ok(&run.id, "same").await;
    assert_eq!(
        (record["request"].clone(), record["agent_input"].clone()),
        (same, Value::Null)
    );
    // An absent argument is skipped.
    assert_ready(
        &env.call(&run, "absent", "read_file", json!({})).await,
        "absent",
        "EVIDENCE_FOUND",
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 7);
    assert_eq!(
        env.facts(&run.id).await["facts"].as_array().map(Vec::len),
        Some(7)
    );
}

async fn schema_is_checked_before_roles(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    // Step 9 before 9b: a schema failure wins over a denied path.
    let reply = env
        .call(
            &run,
            "both",
            "read_file",
            json!({"path": "/etc/passwd", "mode": "binary"}),
        )
        .await;
    assert_error(&reply, 400, "INVALID_INPUT", Some("both"));
    // A malformed argument is INVALID_INPUT, even next to a denied one.
    for (id, input) in [
        ("null", json!({"path": null})),
        ("number", json!({"path": 7})),
        ("empty", json!({"path": ""})),
        ("nul", json!({"path": "a\u{0}b"})),
        ("notarray", json!({"paths": "a"})),
        ("mixed", json!({"path": "/etc/passwd", "against": 5})),
    ] {
        let reply = env.call(&run, id, "read_file", input).await;
        assert_error(&reply, 400, "INVALID_INPUT", Some(id));
    }
    let reply = env
        .call(&run, "badurl", "fetch", json!({"url": "not a url"}))
        .await;
    assert_error(&reply, 400, "INVALID_INPUT", Some("badurl"));
    assert_eq!(env.fake.calls("echo").len(), 0);
    assert_eq!(env.view(&run.id).await["calls_used"], 0);
}

async fn run_paths_are_validated_and_shown(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    for bad in [
        json!({"workspace": "relative/path"}),
        json!({"workspace": "/"}),
        json!({"home": "/.."}),
        json!({"home": ""}),
        json!({"workspace": 5}),
    ] {
        let mut body = bad.clone();
        body["run_id"] = json!(crate::support::unique("badpaths"));
        let reply = env.sc.admin("POST", "/v1/runs", Some(body)).await;
        assert_error(&reply, 400, "INVALID_INPUT", None);
    }
    let run = env
        .run(json!({"workspace": "/srv/work//run-7/./", "home": "/home/u/../agent"}))
        .await;
    let view = env.view(&run.id).await;
    assert_eq!(
        (view["workspace"].as_str(), view["home"].as_str()),
        (Some("/srv/work/run-7"), Some("/home/agent"))
    );
    let reply = env
        .call(&run, "home", "read_file", json!({"path": "~"}))
        .await;
    assert_error(&reply, 403, "POLICY_DENIED", Some("home"));
    let reply = env
        .call(&run, "ws", "read_file", json!({"path": "x"}))
        .await;
    let result = assert_ready(&reply, "ws", "EVIDENCE_FOUND");
    assert_eq!(result["item"]["input"]["path"], "/srv/work/run-7/x");
}

async fn mcp_denials_are_is_error_results(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let call = |id: &str, path: &str| {
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "read_file",
                "arguments": {"path": path},
                "_meta": {"toolgate.dev/run_id": run.id, "toolgate.dev/tool_call_id": id},
            },
        })
        .to_string()
    };
    let url = format!("http://{}/mcp", env.sc.agent);
    let denied = env
        .sc
        .send(
            "POST",
            url.clone(),
            Some(&run.token),
            &[("content-type", "application/json")],
            call("m1", "/etc/passwd"),
        )
        .await;
    assert_eq!(denied.status, 200, "{}", denied.raw);
    let result = &denied.body["result"];
    assert_eq!(result["isError"], true, "{}", denied.raw);
    assert_eq!(
        result["structuredContent"]["error"]["code"],
        "POLICY_DENIED"
    );
    assert_eq!(result["_meta"]["toolgate.dev/tool_call_id"], "m1");
    env.no_record(&run.id, "m1").await;
    let allowed = env
        .sc
        .send(
            "POST",
            url,
            Some(&run.token),
            &[("content-type", "application/json")],
            call("m2", "a/./b"),
        )
        .await;
    assert_eq!(allowed.body["result"]["isError"], false, "{}", allowed.raw);
    let record = env.record_ok(&run.id, "m2").await;
    assert_eq!(record["request"]["path"], "/workspace/a/b");
    assert_eq!(record["agent_input"]["path"], "a/./b");
    assert_eq!(
        env.sc
            .metric(
                "toolgate_policy_denials_total",
                &[("tool", "read_file"), ("role", "path")]
            )
            .await,
        Some(1.0)
    );
}
