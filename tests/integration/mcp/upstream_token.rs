//! The upstream token: it reaches its tool's upstream and nothing else, not even a log line.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::json;

use super::sdk::{PyUpstream, blocking, upstreams};
use super::{
    assert_mcp_error, assert_mcp_ready, assert_rpc_result, mcp_call, mcp_config, rpc, rpc_id,
};
use crate::boundary::{Env, assert_error, assert_ready};
use crate::support::fake_tool::FakeTool;
use crate::support::sidecar::Sidecar;
use crate::support::{store_yaml, temp_dir, unique};

/// The sidecar's log lines that contain a watched string. The integration binary's tracing
/// goes to [`LogSink`] once a test called [`watch_logs`].
static LOG_HITS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static LOG_WATCHED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static LOG_LINES: AtomicU64 = AtomicU64::new(0);

struct LogSink;

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG_LINES.fetch_add(1, Ordering::Relaxed);
        let text = String::from_utf8_lossy(buf);
        let watched = LOG_WATCHED.lock().expect("lock").clone();
        if watched.iter().any(|w| text.contains(w.as_str())) {
            LOG_HITS.lock().expect("lock").push(text.into_owned());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends every toolgate log event of this process (all levels) through [`LogSink`], watching
/// for `secrets`.
fn watch_logs(secrets: &[&str]) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    LOG_WATCHED
        .lock()
        .expect("lock")
        .extend(secrets.iter().map(|s| s.to_string()));
    INSTALLED.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::new("toolgate=trace,info");
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(|| LogSink)
            .try_init()
            .expect("the MCP tests install the only tracing subscriber");
    });
}

/// The token of `upstream_token_file` reaches that tool's upstream, HTTP or MCP, and no other;
/// it appears in no record, no agent- or admin-facing body, no metric and no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_token_stays_private() {
    let token = format!("{}-do-not-leak", unique("upstream-token"));
    let dir = temp_dir("mcp-private");
    let token_file = dir.join("upstream.token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let tf = token_file.display().to_string();
    let private = blocking({
        let tf = token_file.clone();
        move || PyUpstream::spawn("json", &tf)
    })
    .await;
    let url = private.url();
    let extra = format!(
        "  - {{name: priv_whoami, upstream: \"{url}\", protocol: mcp, remote_name: whoami, read_only: true, \
         upstream_token_file: \"{tf}\", projection: {{select: /structuredContent/results}}}}\n\
         \x20 - {{name: priv_anonymous, upstream: \"{url}\", protocol: mcp, remote_name: whoami, read_only: true, \
         projection: {{select: /structuredContent/results}}}}\n\
         \x20 - {{name: priv_search, upstream: \"{url}\", protocol: mcp, remote_name: search, read_only: true, \
         upstream_token_file: \"{tf}\", projection: {{select: /structuredContent/results, fields: [title]}}}}\n\
         \x20 - {{name: priv_broken, upstream: \"{url}\", protocol: mcp, remote_name: broken, read_only: true, \
         upstream_token_file: \"{tf}\"}}\n"
    );
    // The HTTP tool that sends it: the fake tool's /echo, configured after the fake started.
    let ups = upstreams().await;
    let fake = FakeTool::start().await;
    let extra = format!(
        "{extra}  - {{name: priv_echo, upstream: \"{}\", read_only: true, upstream_token_file: \"{tf}\", \
         projection: {{select: /results, fields: [input]}}}}\n",
        fake.url("echo")
    );
    watch_logs(&[&token]);
    let config = mcp_config(&store_yaml(None), &fake, ups, &extra);
    assert!(!config.contains(&token));
    let sc = Arc::new(Sidecar::start(&config).await);
    let env = Env { sc, fake, config };
    let run = env.run(json!({})).await;
    let mut bodies = Vec::new();

    let list = rpc(
        &env.sc,
        &run.token,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert_rpc_result(&list, &json!(1));
    bodies.push(list.raw);
    let r = mcp_call(&env, &run, "p-1", "priv_whoami", json!({})).await;
    let result = assert_mcp_ready(&r, "p-1", "EVIDENCE_FOUND");
    assert_eq!(result["items"], json!([{"authorized": true}]), "{}", r.raw);
    bodies.push(r.raw);
    let r = mcp_call(&env, &run, "p-2", "priv_anonymous", json!({})).await;
    let result = assert_mcp_ready(&r, "p-2", "EVIDENCE_FOUND");
    assert_eq!(result["items"], json!([{"authorized": false}]), "{}", r.raw);
    bodies.push(r.raw);
    let r = mcp_call(&env, &run, "p-3", "priv_search", json!({"q": "t"})).await;
    assert_mcp_ready(&r, "p-3", "EVIDENCE_FOUND");
    bodies.push(r.raw);
    let r = mcp_call(&env, &run, "p-4", "priv_broken", json!({})).await;
    assert_mcp_error(&r, &rpc_id("p-4"), "TOOL_EXECUTION_FAILED", Some("p-4"));
    bodies.push(r.raw);
    let r = mcp_call(&env, &run, "p-5", "priv_echo", json!({"k": "v"})).await;
    assert_eq!(
        assert_mcp_ready(&r, "p-5", "EVIDENCE_FOUND"),
        json!({"item": {"input": {"k": "v"}}})
    );
    bodies.push(r.raw);
    let r = mcp_call(&env, &run, "p-6", "search", json!({"q": "t"})).await;
    assert_mcp_ready(&r, "p-6", "EVIDENCE_FOUND");
    bodies.push(r.raw);
    let r = env.call(&run, "p-7", "priv_whoami", json!({})).await;
    assert_ready(&r, "p-7", "EVIDENCE_FOUND");
    bodies.push(r.raw);
    let r = env.call(&run, "p-8", "priv_broken", json!({})).await;
    assert_error(&r, 502, "TOOL_EXECUTION_FAILED", Some("p-8"));
    bodies.push(r.raw);

    // The upstream saw the token on the calls of the tools that send it, and nothing on the
    // other; the run token never left toolgate.
    let seen = private.calls_of(&run.id);
    let bearer = format!("Bearer {token}");
    for (id, auth) in [
        ("p-1", Some(bearer.as_str())),
        ("p-2", None),
        ("p-3", Some(bearer.as_str())),
        ("p-4", Some(bearer.as_str())),
        ("p-7", Some(bearer.as_str())),
        ("p-8", Some(bearer.as_str())),
    ] {
        assert_eq!(
            seen[id]["authorization"].as_str(),
            auth,
            "{id}: {:?}",
            seen[id]
        );
    }
    for entry in private.seen() {
        assert_ne!(
            entry["authorization"].as_str(),
            Some(format!("Bearer {}", run.token).as_str()),
            "the run token reached an upstream"
        );
    }
    let echo = env.fake.calls("echo");
    assert_eq!(echo.len(), 1);
    assert_eq!(echo[0].headers["authorization"], bearer);
    let search = env.fake.calls("search");
    assert_eq!(search.len(), 1);
    assert!(!search[0].headers.contains_key("authorization"));

    // Nowhere else.
    for id in ["p-1", "p-2", "p-3", "p-4", "p-5", "p-6", "p-7", "p-8"] {
        let r = env.record(&run.id, id).await;
        assert_eq!(r.status, 200, "{id}: {}", r.raw);
        bodies.push(r.raw);
    }
    for path in [
        format!("/v1/runs/{}", run.id),
        format!("/v1/runs/{}/facts", run.id),
    ] {
        bodies.push(env.sc.admin("GET", &path, None).await.raw);
    }
    bodies.push(env.sc.metrics().await);
    for body in &bodies {
        assert!(!body.contains(&token), "the upstream token leaked: {body}");
    }
    let hits = LOG_HITS.lock().expect("lock").clone();
    assert!(
        hits.is_empty(),
        "the upstream token is in the logs: {hits:?}"
    );
    assert!(
        LOG_LINES.load(Ordering::Relaxed) > 0,
        "no log line was captured, so the log check saw nothing"
    );
    drop(private);
}
