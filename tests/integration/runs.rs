//! The admin API: runs (create, get, end, cancel, and every refusal), a run's facts, the
//! canonical invocation record, and failure attribution by layer and code.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate::clock;
use toolgate::error::CodeName;

use crate::boundary::{Env, Run, assert_admin_error, assert_error, assert_ready, on_both_stores};
use crate::support::fake_tool::RAW_MARKER;
use crate::support::sidecar::{ADMIN_TOKEN, Reply, Sidecar};
use crate::support::{Deadline, unique};

on_both_stores!(
    admin_runs_api,
    facts_in_completion_order,
    invocation_record_shape,
    failure_attribution,
    tools_of_a_run,
    percent_encoded_path_segments,
);

/// Runs: create, conflicts, validation, auth, get, end and cancel.
async fn admin_runs_api(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let sc = &env.sc;
    let id = unique("run");

    let before = clock::now_ms();
    let r = sc
        .admin("POST", "/v1/runs", Some(json!({"run_id": id, "timeout_ms": 90000, "tools": ["search", "empty"], "budget": {"max_calls": 7, "max_calls_per_tool": {"search": 3}, "max_record_bytes": 100000}})))
        .await;
    let after = clock::now_ms();
    assert_eq!(r.status, 201, "{}", r.raw);
    let keys: Vec<&String> = r.body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["run_id", "run_token", "deadline"]);
    assert_eq!(r.body["run_id"], id);
    let token = r.body["run_token"].as_str().expect("token");
    let (token_run, mac) = token.rsplit_once('.').expect("<run_id>.<mac>");
    assert_eq!(token_run, id);
    assert_eq!(mac.len(), 43, "unpadded base64url of 32 bytes");
    assert!(
        mac.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    );
    let deadline = r.body["deadline"].as_str().expect("deadline");
    assert!(is_rfc3339_millis(deadline), "{deadline}");
    assert!(
        (before + 90000..=after + 90000).any(|ms| clock::rfc3339(ms) == deadline),
        "deadline {deadline} is not creation + timeout_ms"
    );
    let run = Run {
        id: id.clone(),
        token: token.to_string(),
    };

    // GET: fields and counters.
    let view = env.view(&id).await;
    let mut keys: Vec<&String> = view.as_object().expect("object").keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "budget",
            "calls_used",
            "deadline",
            "home",
            "record_bytes_used",
            "run_id",
            "state",
            "tools",
            "workspace"
        ]
    );
    assert_eq!(view["state"], "ACTIVE");
    assert_eq!(
        (view["workspace"].as_str(), view["home"].as_str()),
        (Some("/workspace"), Some("/home/agent")),
        "a run without paths takes the config defaults"
    );
    assert_eq!(view["deadline"], deadline);
    assert_eq!(
        (
            view["calls_used"].as_u64(),
            view["record_bytes_used"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert_eq!(
        view["budget"],
        json!({"max_calls": 7, "max_calls_per_tool": {"search": 3}, "max_record_bytes": 100000})
    );
    assert_eq!(view["tools"], json!(["search", "empty"]));
    assert_ready(
        &env.call(&run, "a1", "search", json!({"q": "x"})).await,
        "a1",
        "EVIDENCE_FOUND",
    );
    let view = env.view(&id).await;
    assert_eq!(view["calls_used"], 1);
    let bytes = view["record_bytes_used"].as_u64().expect("bytes");
    let rec = env.record_ok(&id, "a1").await;
    let mut stored = rec.clone();
    stored.as_object_mut().expect("record").remove("ttl_ms");
    assert_eq!(
        bytes,
        serde_json::to_string(&stored).expect("json").len() as u64,
        "record_bytes_used is the compact record size"
    );

    // Defaults from config.
    let d = env.run(json!({})).await;
    let view = env.view(&d.id).await;
    assert_eq!(
        view["budget"],
        json!({"max_calls": 50, "max_calls_per_tool": {}, "max_record_bytes": 8388608})
    );
    assert_eq!(view["tools"], Value::Null);

    // Refusals.
    let r = sc
        .admin("POST", "/v1/runs", Some(json!({"run_id": id})))
        .await;
    assert_admin_error(&r, 409, "RUN_EXISTS");
    let r = sc
        .admin(
            "POST",
            "/v1/runs",
            Some(json!({"run_id": unique("run"), "timeout_ms": 120001})),
        )
        .await;
    assert_admin_error(&r, 400, "INVALID_INPUT");
    let at_max = unique("run");
    let r = sc
        .admin(
            "POST",
            "/v1/runs",
            Some(json!({"run_id": at_max, "timeout_ms": 120000})),
        )
        .await;
    assert_eq!(
        r.status, 201,
        "timeout_ms at the max is accepted: {}",
        r.raw
    );
    for body in [
        "",
        "{not json",
        "[]",
        r#"{"timeout_ms": 1000}"#,
        r#"{"run_id": 5}"#,
        r#"{"run_id": "r", "colour": "red"}"#,
        r#"{"run_id": "r", "timeout_ms": -1}"#,
    ] {
        let r = sc
            .send(
                "POST",
                format!("http://{}/v1/runs", sc.admin),
                Some(ADMIN_TOKEN),
                &[],
                body.to_string(),
            )
            .await;
        assert_admin_error(&r, 400, "INVALID_INPUT");
    }
    for bad in ["-run", "run 1", "run:1", "run/1", &"r".repeat(65)] {
        let r = sc
            .admin("POST", "/v1/runs", Some(json!({"run_id": bad})))
            .await;
        assert_admin_error(&r, 400, "INVALID_INPUT");
    }
    let r = sc.admin("GET", "/v1/runs/run%201", None).await;
    assert_admin_error(&r, 400, "INVALID_INPUT");

    // Auth: every admin route wants the admin token.
    let routes = [
        ("POST", "/v1/runs".to_string()),
        ("GET", format!("/v1/runs/{id}")),
        ("POST", format!("/v1/runs/{id}/end")),
        ("POST", format!("/v1/runs/{id}/cancel")),
        ("GET", format!("/v1/runs/{id}/facts")),
        ("GET", format!("/v1/runs/{id}/invocations/a1")),
        ("GET", "/v1/failure-attribution".to_string()),
    ];
    for (method, path) in &routes {
        for token in [None, Some("wrong"), Some(token), Some("test-admin-token2")] {
            let body = json!({"run_id": unique("run")}).to_string();
            let r = sc
                .send(
                    method,
                    format!("http://{}{path}", sc.admin),
                    token,
                    &[],
                    body,
                )
                .await;
            assert_admin_error(&r, 401, "UNAUTHENTICATED");
        }
    }
    assert_eq!(
        env.view(&id).await["state"],
        "ACTIVE",
        "an unauthenticated end changed the run"
    );

    // Unknown runs and records.
    let ghost = unique("ghost");
    for (method, path) in [
        ("GET", format!("/v1/runs/{ghost}")),
        ("POST", format!("/v1/runs/{ghost}/end")),
        ("POST", format!("/v1/runs/{ghost}/cancel")),
        ("GET", format!("/v1/runs/{ghost}/facts")),
        ("GET", format!("/v1/runs/{ghost}/invocations/a1")),
        ("GET", format!("/v1/runs/{id}/invocations/never")),
    ] {
        assert_admin_error(&sc.admin(method, &path, None).await, 404, "NOT_FOUND");
    }
    let r = sc
        .admin("GET", &format!("/v1/runs/{id}/invocations/bad%20id"), None)
        .await;
    assert_admin_error(&r, 400, "INVALID_INPUT");
    assert_admin_error(
        &sc.admin("GET", "/v1/nothing", None).await,
        404,
        "NOT_FOUND",
    );

    // End returns the facts, again on a second end; cancel leaves an ended run ENDED.
    let end1 = env.admin_post(&format!("/v1/runs/{id}/end")).await;
    assert_eq!(end1.status, 200, "{}", end1.raw);
    assert_eq!(end1.body["run_id"], id);
    assert_eq!(end1.body["facts"][0]["tool_call_id"], "a1");
    assert_eq!(end1.body["excluded"], 0);
    let end2 = env.admin_post(&format!("/v1/runs/{id}/end")).await;
    assert_eq!((end2.status, &end2.body), (200, &end1.body));
    assert_eq!(env.facts(&id).await, end1.body);
    let c = env.admin_post(&format!("/v1/runs/{id}/cancel")).await;
    assert_eq!((c.status, c.body["state"].as_str()), (200, Some("ENDED")));
    assert_eq!(env.view(&id).await["state"], "ENDED");

    // Cancel answers like GET; a second cancel and a later end change nothing.
    let c1 = env.admin_post(&format!("/v1/runs/{}/cancel", d.id)).await;
    assert_eq!(c1.status, 200);
    assert_eq!(c1.body, env.view(&d.id).await);
    assert_eq!(c1.body["state"], "CANCELLED");
    let c2 = env.admin_post(&format!("/v1/runs/{}/cancel", d.id)).await;
    assert_eq!((c2.status, &c2.body), (200, &c1.body));
    let e = env.admin_post(&format!("/v1/runs/{}/end", d.id)).await;
    assert_eq!(e.status, 200);
    assert_eq!(env.view(&d.id).await["state"], "CANCELLED");

    // Admin errors are not tool-call failures.
    let a = sc.admin("GET", "/v1/failure-attribution", None).await;
    assert_eq!(a.body["total"], 0, "{}", a.raw);
}

/// Facts: READY records (NO_EVIDENCE included) in completion order; ERROR records counted in
/// `excluded`; rejected calls leave no trace.
async fn facts_in_completion_order(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    // A slow call started first completes after a fast one started later.
    let slow = env.slow_call_in_flight(&run, "f-slow", 1000).await;
    assert_ready(
        &env.call(&run, "f-fast", "search", json!({"q": "a"})).await,
        "f-fast",
        "EVIDENCE_FOUND",
    );
    assert_ready(&slow.await.expect("task"), "f-slow", "EVIDENCE_FOUND");

    assert_ready(
        &env.call(&run, "f-empty", "empty", json!({"q": "none"}))
            .await,
        "f-empty",
        "NO_EVIDENCE",
    );
    assert_error(
        &env.call(&run, "f-fail", "fail", json!({})).await,
        502,
        "TOOL_EXECUTION_FAILED",
        Some("f-fail"),
    );
    assert_error(
        &env.call(&run, "f-fast", "empty", json!({})).await,
        409,
        "DUPLICATE_TOOL_CALL",
        Some("f-fast"),
    );
    assert_error(
        &env.call(&run, "f-unknown", "nope", json!({})).await,
        404,
        "UNKNOWN_TOOL",
        Some("f-unknown"),
    );
    assert_error(
        &env.call(&run, "f-bad", "search", json!({})).await,
        400,
        "INVALID_INPUT",
        Some("f-bad"),
    );
    assert_ready(
        &env.call(&run, "f-null", "null", json!({})).await,
        "f-null",
        "NO_EVIDENCE",
    );

    let facts = env.facts(&run.id).await;
    let mut keys: Vec<&String> = facts.as_object().expect("object").keys().collect();
    keys.sort();
    assert_eq!(keys, ["excluded", "facts", "run_id", "tampered"]);
    assert_eq!(facts["run_id"], run.id);
    assert_eq!(facts["tampered"], 0);
    let ids: Vec<&str> = facts["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| f["tool_call_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["f-fast", "f-slow", "f-empty", "f-null"]);
    assert_eq!(
        facts["excluded"], 1,
        "the ERROR record is excluded; rejections are absent"
    );
    assert_eq!(
        facts["facts"][2],
        json!({"tool_call_id": "f-empty", "tool": "empty", "evidence_status": "NO_EVIDENCE", "result": {"scope": {"tool": "empty", "input": {"q": "none"}}}})
    );
    assert_eq!(facts["facts"][0]["tool"], "search");
    assert_eq!(facts["facts"][0]["evidence_status"], "EVIDENCE_FOUND");
    assert_eq!(
        facts["facts"][0]["result"],
        env.record_ok(&run.id, "f-fast").await["agent_result"]
    );
    assert!(
        !facts.to_string().contains(RAW_MARKER),
        "facts carry raw data"
    );
    // Facts of another run are its own.
    let other = env.run(json!({})).await;
    assert_eq!(
        env.facts(&other.id).await,
        json!({"run_id": other.id, "facts": [], "excluded": 0, "tampered": 0})
    );
}

/// The canonical record: every field, RFC 3339 times, the request as forwarded, and a TTL that
/// a read never renews.
async fn invocation_record_shape(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let before = clock::now_ms();
    let reply = env
        .call(&run, "call_rec", "search", json!({"q": "redis"}))
        .await;
    let result = assert_ready(&reply, "call_rec", "EVIDENCE_FOUND");

    let rec = env.record_ok(&run.id, "call_rec").await;
    let keys: Vec<&String> = rec.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        [
            "schema",
            "run_id",
            "tool_call_id",
            "tool",
            "status",
            "evidence_status",
            "request",
            "agent_input",
            "raw_response",
            "agent_result",
            "error_code",
            "upstream_status",
            "created_at",
            "updated_at",
            "duration_ms",
            "request_sha256",
            "raw_sha256",
            "result_sha256",
            "seal",
            "ttl_ms"
        ]
    );
    assert_eq!(rec["schema"], 1);
    assert_eq!(rec["run_id"], run.id);
    assert_eq!(rec["tool_call_id"], "call_rec");
    assert_eq!(rec["tool"], "search");
    assert_eq!(rec["status"], "READY");
    assert_eq!(rec["evidence_status"], "EVIDENCE_FOUND");
    assert_eq!(rec["request"], json!({"q": "redis"}));
    assert_eq!(rec["agent_input"], Value::Null, "no argument was rewritten");
    assert_eq!(
        rec["raw_response"]["results"].as_array().map(Vec::len),
        Some(7)
    );
    assert_eq!(rec["agent_result"], result);
    assert_eq!(rec["error_code"], Value::Null);
    assert_eq!(rec["upstream_status"], 200);
    let created = rec["created_at"].as_str().expect("created_at");
    let updated = rec["updated_at"].as_str().expect("updated_at");
    assert!(
        is_rfc3339_millis(created) && is_rfc3339_millis(updated),
        "{created} {updated}"
    );
    assert!(created >= clock::rfc3339(before).as_str() && created <= updated);
    assert!(rec["duration_ms"].is_u64());

    let ttl1 = rec["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl1 > 0 && ttl1 <= 600_000, "ttl_ms {ttl1}");
    let d = Deadline::after(Duration::from_secs(5), "the TTL to tick");
    let mut ttl2 = ttl1;
    while ttl2 == ttl1 {
        d.tick().await;
        ttl2 = env.record_ok(&run.id, "call_rec").await["ttl_ms"]
            .as_u64()
            .expect("ttl_ms");
    }
    assert!(ttl2 < ttl1, "a read renewed the TTL: {ttl1} then {ttl2}");

    // An ERROR record has the same fields.
    env.call(&run, "call_err", "fail", json!({})).await;
    let rec = env.record_ok(&run.id, "call_err").await;
    assert_eq!(rec.as_object().map(|o| o.len()), Some(20));
    assert_eq!(rec["request"], json!({}));
    assert!(is_rfc3339_millis(
        rec["updated_at"].as_str().expect("updated_at")
    ));
}

/// Failure attribution counts preflight rejections and execution errors by layer and code.
async fn failure_attribution(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let a = attribution(&env.sc).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["total"], 0);
    let layers = [
        "AGENT",
        "WORKFLOW",
        "PROVIDER",
        "ENVIRONMENT",
        "HARNESS",
        "OPERATOR",
        "UNKNOWN",
    ];
    for layer in layers {
        assert_eq!(
            a.body["by_layer"][layer],
            json!({"count": 0, "share": 0.0}),
            "{layer}"
        );
    }
    assert_eq!(a.body["unknown_share"], 0.0);

    let run = env.run(json!({})).await;
    let ended = env.run(json!({})).await;
    env.admin_post(&format!("/v1/runs/{}/end", ended.id)).await;
    let failures = [
        (&run, "a1", "nope", json!({}), "UNKNOWN_TOOL"),
        (&run, "a2", "search", json!({}), "INVALID_INPUT"),
        (&run, "a3", "search", json!({"q": 1}), "INVALID_INPUT"),
        (&ended, "w1", "search", json!({"q": "x"}), "RUN_INACTIVE"),
        (&run, "p1", "fail", json!({}), "TOOL_EXECUTION_FAILED"),
        (
            &run,
            "p2",
            "slowtimeout",
            json!({"sleep_ms": 3000}),
            "TOOL_TIMEOUT",
        ),
        (&run, "p3", "big", json!({}), "RESULT_TOO_LARGE"),
        (&run, "h1", "unresolved", json!({}), "PROJECTION_FAILED"),
        (&run, "h2", "wide", json!({}), "RESULT_TOO_LARGE"),
    ];
    for (run, id, tool, input, code) in failures {
        let reply = env.call(run, id, tool, input).await;
        let status = CodeName::parse(code).expect("code").status().as_u16();
        assert_error(&reply, status, code, Some(id));
    }
    // Neither a READY call nor an admin error is a failure.
    assert_ready(
        &env.call(&run, "ok", "search", json!({"q": "x"})).await,
        "ok",
        "EVIDENCE_FOUND",
    );
    let r = env.sc.admin("GET", "/v1/runs/nope-run", None).await;
    assert_admin_error(&r, 404, "NOT_FOUND");

    let a = attribution(&env.sc).await;
    let body = &a.body;
    assert_eq!(body["total"], 9, "{}", a.raw);
    let expect = [
        ("AGENT", 3),
        ("WORKFLOW", 1),
        ("PROVIDER", 3),
        ("ENVIRONMENT", 0),
        ("HARNESS", 2),
        ("OPERATOR", 0),
        ("UNKNOWN", 0),
    ];
    let mut shares = 0.0;
    for (layer, n) in expect {
        assert_eq!(body["by_layer"][layer]["count"], n, "{layer}: {}", a.raw);
        let share = body["by_layer"][layer]["share"].as_f64().expect("share");
        assert!(
            (share - n as f64 / 9.0).abs() < 1e-9,
            "{layer} share {share}"
        );
        shares += share;
    }
    assert!((shares - 1.0).abs() < 1e-9, "shares sum to {shares}");
    assert_eq!(body["by_layer"].as_object().map(|o| o.len()), Some(7));
    assert_eq!(body["unknown_share"], 0.0);
    assert_eq!(
        body["by_code"],
        json!({"UNKNOWN_TOOL": 1, "INVALID_INPUT": 2, "RUN_INACTIVE": 1, "TOOL_EXECUTION_FAILED": 1, "TOOL_TIMEOUT": 1, "RESULT_TOO_LARGE": 2, "PROJECTION_FAILED": 1})
    );
}

async fn attribution(sc: &Sidecar) -> Reply {
    let a = sc.admin("GET", "/v1/failure-attribution", None).await;
    assert_eq!(a.status, 200, "{}", a.raw);
    a
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn is_rfc3339_millis(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// `GET /v1/tools` (agent listener): the token's run's read-only tools, with their schemas; the
/// same set as MCP `tools/list`.
async fn tools_of_a_run(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let sc = &env.sc;
    let tools_of = |token: Option<String>| async move {
        sc.send(
            "GET",
            format!("http://{}/v1/tools", sc.agent),
            token.as_deref(),
            &[],
            "",
        )
        .await
    };

    // A run naming its tools: the read-only ones among them, sorted by name.
    let run = env
        .run(json!({"tools": ["search", "writer", "object"]}))
        .await;
    let r = tools_of(Some(run.token.clone())).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let keys: Vec<&String> = r.body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["tools"]);
    let tools = r.body["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["object", "search"], "writer is not read-only");
    for t in tools {
        let keys: Vec<&String> = t.as_object().expect("tool").keys().collect();
        assert_eq!(keys, ["name", "description", "input_schema"], "{t}");
        assert!(t["description"].is_string(), "{t}");
    }
    assert_eq!(
        tools[0]["input_schema"],
        json!({"type": "object"}),
        "no schema configured"
    );
    assert_eq!(
        tools[1]["input_schema"],
        json!({"type": "object", "required": ["q"], "properties": {"q": {"type": "string", "maxLength": 512}}})
    );

    // A run without a tools list: every read-only tool, exactly MCP tools/list's names.
    let open = env.run(json!({})).await;
    let r = tools_of(Some(open.token.clone())).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let listed: Vec<Value> = r.body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    let mcp = sc
        .send(
            "POST",
            format!("http://{}/mcp", sc.agent),
            Some(&open.token),
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(mcp.status, 200, "{}", mcp.raw);
    let mcp_names: Vec<Value> = mcp.body["result"]["tools"]
        .as_array()
        .expect("MCP tools")
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert!(listed.len() > 2, "{listed:?}");
    assert_eq!(listed, mcp_names);
    assert!(!listed.contains(&json!("writer")));

    // No token, or a forged one: 401 with the error body.
    for token in [None, Some(format!("{}.AAAA", run.id))] {
        let r = tools_of(token).await;
        assert_error(&r, 401, "UNAUTHENTICATED", None);
    }
    // Only GET.
    let r = sc
        .send(
            "POST",
            format!("http://{}/v1/tools", sc.agent),
            Some(&run.token),
            &[],
            "{}",
        )
        .await;
    assert_error(&r, 404, "NOT_FOUND", None);
}

/// Ids and tool names in a path are percent-decoded once: `%3A` is `:`, and an encoded
/// character that is not allowed in an id is still refused.
async fn percent_encoded_path_segments(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let sc = &env.sc;
    let run = env.run(json!({})).await;
    let id = "functions.search:0";

    // Intercept with an encoded tool name.
    let r = sc
        .send(
            "POST",
            format!("http://{}/tools/se%61rch", sc.agent),
            Some(&run.token),
            &[("x-run-id", run.id.as_str()), ("x-tool-call-id", id)],
            r#"{"q": "redis"}"#,
        )
        .await;
    assert_ready(&r, id, "EVIDENCE_FOUND");

    // The record of an id with a `:`, by its encoded and its plain form.
    let encoded_run: String = run.id.replace('-', "%2D");
    for path in [
        format!("/v1/runs/{}/invocations/functions.search%3A0", run.id),
        format!("/v1/runs/{encoded_run}/invocations/functions%2Esearch%3a0"),
        format!("/v1/runs/{}/invocations/{id}", run.id),
    ] {
        let r = sc.admin("GET", &path, None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.raw);
        assert_eq!(r.body["tool_call_id"], id, "{path}");
    }
    let r = sc
        .admin("GET", &format!("/v1/runs/{encoded_run}/facts"), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["facts"][0]["tool_call_id"], id);

    // Decoded once only, and then checked: `%253A` is `%3A`, `%2F` a slash, `%FF` not UTF-8.
    for bad in ["functions.search%253A0", "a%2Fb", "a%FF", "a%20b"] {
        let r = sc
            .admin(
                "GET",
                &format!("/v1/runs/{}/invocations/{bad}", run.id),
                None,
            )
            .await;
        assert_admin_error(&r, 400, "INVALID_INPUT");
    }
    let r = sc
        .send(
            "POST",
            format!("http://{}/tools/se%2Farch", sc.agent),
            Some(&run.token),
            &[
                ("x-run-id", run.id.as_str()),
                ("x-tool-call-id", "call-pct-1"),
            ],
            r#"{"q": "redis"}"#,
        )
        .await;
    assert_error(&r, 404, "UNKNOWN_TOOL", Some("call-pct-1"));
}
