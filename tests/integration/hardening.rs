//! Hostile inputs and hostile clients: whatever the agent or a neighbour sends, a record that
//! was written can be read, a run stays readable, and the sidecar keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::boundary::{Env, Run, assert_error, assert_error_record, assert_ready, on_both_stores};
use crate::support::Deadline;

on_both_stores!(
    records_at_the_depth_limit_stay_readable,
    deep_answers_fail_closed_and_stay_readable,
);

/// `{"a": {"a": … 1}}`, `depth` objects deep.
fn nested(depth: usize) -> Value {
    let text = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    serde_json::from_str(&text).expect("nested JSON")
}

/// Reads the record through every admin route that shows it: the record, the facts, the end.
async fn readable_everywhere(env: &Env, run: &Run, id: &str) -> Value {
    let record = env.record_ok(&run.id, id).await;
    let facts = env
        .sc
        .admin("GET", &format!("/v1/runs/{}/facts", run.id), None)
        .await;
    assert_eq!(facts.status, 200, "facts: {}", facts.raw);
    let view = env
        .sc
        .admin("GET", &format!("/v1/runs/{}", run.id), None)
        .await;
    assert_eq!(view.status, 200, "run: {}", view.raw);
    record
}

async fn records_at_the_depth_limit_stay_readable(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    // The echo tool answers {"results": {"input": <input>, …}}: two levels over the input.
    let at_limit = nested(62);
    let reply = env.call(&run, "deep62", "echo", at_limit.clone()).await;
    assert_ready(&reply, "deep62", "EVIDENCE_FOUND");
    let record = readable_everywhere(&env, &run, "deep62").await;
    assert_eq!(record["request"], at_limit);
    // An input at the limit whose answer is over it: ERROR, no raw kept, still readable.
    let reply = env.call(&run, "deep64", "echo", nested(64)).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("deep64"));
    let record = readable_everywhere(&env, &run, "deep64").await;
    assert_error_record(&record, "TOOL_EXECUTION_FAILED", None);
    // Over the limit: refused at step 9, nothing spent.
    let reply = env.call(&run, "deep65", "echo", nested(65)).await;
    assert_error(&reply, 400, "INVALID_INPUT", Some("deep65"));
    env.no_record(&run.id, "deep65").await;
    // Through the intercept form, 127 deep: refused before the tool is called.
    let before = env.fake.calls("echo").len();
    let reply = env
        .intercept(&run, "deep127", "echo", nested(127).to_string())
        .await;
    assert_error(&reply, 400, "INVALID_INPUT", Some("deep127"));
    assert_eq!(env.fake.calls("echo").len(), before, "the tool was called");
    assert_eq!(env.view(&run.id).await["calls_used"], 2);
    let ended = env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    assert_eq!(ended.status, 200, "end: {}", ended.raw);
    assert_eq!(ended.body["facts"].as_array().map(Vec::len), Some(1));
    assert_eq!(ended.body["excluded"], 1);
}

async fn deep_answers_fail_closed_and_stay_readable(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    for depth in [126, 127, 2000] {
        let id = format!("deep{depth}");
        let reply = env.call(&run, &id, "deep", json!({"depth": depth})).await;
        assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some(&id));
        let record = readable_everywhere(&env, &run, &id).await;
        assert_error_record(&record, "TOOL_EXECUTION_FAILED", None);
    }
    let reply = env
        .call(&run, "shallow", "deep", json!({"depth": 63}))
        .await;
    assert_ready(&reply, "shallow", "EVIDENCE_FOUND");
    readable_everywhere(&env, &run, "shallow").await;
    let ended = env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    assert_eq!(ended.status, 200, "end: {}", ended.raw);
}

// ---------------------------------------------------------------------------------------------
// The real binary: framing, connection caps, idle memory.

const ADMIN: &str = "hardening-admin-token";

/// The real binary on free ports, memory store; killed on drop.
struct Toolgate {
    child: Child,
    agent: u16,
    admin: u16,
    telemetry: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl Toolgate {
    fn spawn() -> Toolgate {
        Toolgate::spawn_with("", "error", Stdio::null())
    }

    /// With `more` appended to the config, logging at `log` (`TOOLGATE_LOG`) to `stderr`.
    fn spawn_with(more: &str, log: &str, stderr: Stdio) -> Toolgate {
        let (agent, admin, telemetry) = (free_port(), free_port(), free_port());
        let dir = crate::support::temp_dir("hardening");
        let config = dir.join("toolgate.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {{agent: '127.0.0.1:{agent}', admin: '127.0.0.1:{admin}', telemetry: '127.0.0.1:{telemetry}'}}\n{more}"
            ),
        )
        .expect("config");
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("TOOLGATE_ADMIN_TOKEN", ADMIN)
            .env("TOOLGATE_LOG", log)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn toolgate");
        let tg = Toolgate {
            child,
            agent,
            admin,
            telemetry,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while get(tg.telemetry, "/healthz").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "toolgate never listened"
            );
            std::thread::yield_now();
        }
        tg
    }

    /// One field of /proc/PID/status, without its unit.
    fn status(&self, field: &str) -> String {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
            .unwrap_or_else(|| panic!("{field} is not in /proc/PID/status"))
    }

    /// Resident memory, from /proc.
    fn rss_kib(&self) -> u64 {
        self.status("VmRSS").parse().expect("VmRSS")
    }
}

/// Transparent huge pages are off for the sidecar's process (the kernel's `THP_enabled`), so its
/// heap moves in 4 KiB pages and no background collapse raises its RSS.
#[test]
fn the_process_runs_without_transparent_huge_pages() {
    let tg = Toolgate::spawn();
    assert_eq!(tg.status("THP_enabled"), "0");
}

/// `toolgate serve` serves the agent's connections on one thread per core it may use, at most
/// `MAX_WORKERS`, each named `toolgate-worker-N` (the kernel keeps a name's first 15 bytes).
#[test]
fn the_binary_serves_on_one_thread_per_core() {
    let tg = Toolgate::spawn();
    let want = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(toolgate::workers::MAX_WORKERS);
    let serving = || {
        std::fs::read_dir(format!("/proc/{}/task", tg.child.id()))
            .expect("the process's threads")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("toolgate-worker"))
            .count()
    };
    // A thread names itself once it runs: give the last one a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while serving() != want && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(serving(), want);
}

impl Drop for Toolgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a fresh connection; the whole answer, or None if the connection failed.
fn exchange(port: u16, request: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    Some(String::from_utf8_lossy(&out).into_owned())
}

fn get(port: u16, path: &str) -> Option<String> {
    exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .filter(|a| a.starts_with("HTTP/1.1 200"))
}

/// A POST with a JSON body on a fresh connection.
fn post(port: u16, path: &str, token: &str, body: &str) -> Option<String> {
    exchange(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The lines of `text` that are JSON objects with this `message`.
fn lines_of(text: &str, message: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["message"] == message)
        .collect()
}

/// The binary writes one JSON line per call, `call rejected` or `call finished`, with the
/// fields the docs list; a filter that leaves INFO out leaves them out.
#[test]
fn the_binary_logs_a_json_line_per_call_as_filtered() {
    let tools =
        "tools:\n  - name: search\n    upstream: http://127.0.0.1:9/\n    read_only: true\n";
    for (filter, logged) in [("info", true), ("warn", false)] {
        let mut tg = Toolgate::spawn_with(tools, filter, Stdio::piped());
        let envelope = r#"{"run_id":"run-log","tool_call_id":"call-1","tool":"search","input":{}}"#;
        let refused = post(tg.agent, "/v1/invoke", "not-a-token", envelope).expect("invoke");
        assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
        let created = post(tg.admin, "/v1/runs", ADMIN, r#"{"run_id":"run-log"}"#).expect("run");
        assert!(created.starts_with("HTTP/1.1 201"), "{created}");
        let body: Value =
            serde_json::from_str(created.split("\r\n\r\n").nth(1).expect("body")).expect("json");
        let token = body["run_token"].as_str().expect("run_token");
        let failed = post(tg.agent, "/v1/invoke", token, envelope).expect("invoke");
        assert!(failed.starts_with("HTTP/1.1 5"), "{failed}");
        let _ = tg.child.kill();
        let _ = tg.child.wait();
        let mut text = String::new();
        tg.child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut text)
            .expect("read the log");
        let rejected = lines_of(&text, "call rejected");
        let finished = lines_of(&text, "call finished");
        if !logged {
            assert!(rejected.is_empty() && finished.is_empty(), "{text}");
            continue;
        }
        assert_eq!((rejected.len(), finished.len()), (1, 1), "{text}");
        let r = &rejected[0];
        assert_eq!(r["level"], "INFO");
        assert_eq!(r["target"], "toolgate::call");
        assert_eq!(r["code"], "UNAUTHENTICATED", "{r}");
        assert_eq!(r["gen_ai.tool.call.id"], "call-1", "{r}");
        let f = &finished[0];
        assert_eq!(f["run_id"], "run-log", "{f}");
        assert_eq!(f["gen_ai.tool.call.id"], "call-1", "{f}");
        assert_eq!(f["gen_ai.tool.name"], "search", "{f}");
        assert_eq!(f["status"], "ERROR", "{f}");
        assert_eq!(f["evidence_status"], "ERROR", "{f}");
        assert_eq!(f["code"], "TOOL_EXECUTION_FAILED", "{f}");
        assert_eq!(f["layer"], "PROVIDER", "{f}");
        assert!(f["duration_ms"].is_u64(), "{f}");
        assert!(
            f["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{f}"
        );
        let keys: Vec<&str> = f
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "timestamp",
                "level",
                "message",
                "run_id",
                "gen_ai.tool.call.id",
                "gen_ai.tool.name",
                "status",
                "evidence_status",
                "code",
                "layer",
                "duration_ms",
                "cause",
                "target"
            ],
            "{f}"
        );
    }
}

#[test]
fn content_length_with_transfer_encoding_is_refused_and_closed() {
    let tg = Toolgate::spawn();
    for (port, path) in [
        (tg.agent, "/v1/invoke"),
        (tg.admin, "/v1/runs"),
        (tg.telemetry, "/metrics"),
    ] {
        for head in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
        ] {
            // A second request follows on the same connection: it must never be served.
            let answer = exchange(
                port,
                &format!(
                    "POST {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                ),
            )
            .expect("an answer");
            assert!(answer.starts_with("HTTP/1.1 400"), "{port}{path}: {answer}");
            assert!(answer.contains("connection: close"), "{answer}");
            assert_eq!(
                answer.matches("HTTP/1.1").count(),
                1,
                "the pipelined request was served: {answer}"
            );
        }
    }
    // The usual framings still work.
    let answer = exchange(
        tg.admin,
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    )
    .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// Polls the RSS until two readings agree (the server has taken in what was sent).
async fn settled_rss(tg: &Toolgate) -> u64 {
    let d = Deadline::after(Duration::from_secs(10), "RSS to settle");
    let mut last = tg.rss_kib();
    loop {
        d.tick().await;
        d.tick().await;
        let now = tg.rss_kib();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test]
async fn idle_connections_are_capped_and_cost_little() {
    let tg = Toolgate::spawn();
    let base = settled_rss(&tg).await;
    // Idle connections on the agent listener, within its cap: what one costs.
    let held: Vec<TcpStream> = (0..400)
        .map(|_| TcpStream::connect(("127.0.0.1", tg.agent)).expect("connect"))
        .collect();
    let with = settled_rss(&tg).await;
    let per_conn = with.saturating_sub(base) * 1024 / held.len() as u64;
    eprintln!(
        "idle connection: about {per_conn} bytes each (RSS {base} KiB, then {with} KiB with 400 idle)"
    );
    // The caps bound the total: 672 connections at this cost stay a small part of the 64 MiB
    // the injector gives the sidecar.
    assert!(
        per_conn < 48 * 1024,
        "an idle connection costs {per_conn} bytes"
    );
    drop(held);

    // 3,000 silent connections to the unauthenticated telemetry listener.
    let flood: Vec<TcpStream> = (0..3000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", tg.telemetry)).ok())
        .collect();
    assert!(flood.len() > 2900, "only {} connected", flood.len());
    let rss = settled_rss(&tg).await;
    eprintln!("RSS with 3000 idle telemetry connections: {rss} KiB");
    assert!(rss < 64 * 1024, "RSS {rss} KiB");
    // /metrics answers without a restart: at the cap, the new connection takes the slot of the
    // silent one held longest.
    let d = Deadline::after(Duration::from_secs(30), "/metrics to answer again");
    while get(tg.telemetry, "/metrics").is_none() {
        d.tick().await;
    }
    drop(flood);
}
