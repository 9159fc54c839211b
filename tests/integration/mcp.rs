//! MCP: toolgate as an MCP server (`POST /mcp` on the agent listener) and MCP servers as tool
//! upstreams (`protocol: mcp`), against the official SDKs, pinned in `tests/mcp/`: the Python
//! `mcp` client (default `auto` mode, which probes `server/discover`, and `legacy`, the
//! `initialize` handshake), the TypeScript `@modelcontextprotocol/sdk` 1.x client, and an
//! upstream built with the Python SDK's `MCPServer` in JSON and in SSE response mode.
//!
//! `scripts/test.sh` installs the SDKs (through `scripts/install-deps.sh test`) and exports
//! `TOOLGATE_MCP_PYTHON` (the virtualenv's python, default `tests/mcp/.venv/bin/python`) and
//! `TOOLGATE_MCP_NODE_DIR` (where `client.mjs` and its `node_modules` are, default `tests/mcp`).
//! A missing SDK fails the test with the command that installs it; nothing is skipped.
//!
//! The two Python upstreams (JSON and SSE) are shared by the whole test binary; each test tells
//! its requests apart by its own run id. A stream that never ends is a small hyper server here
//! ([`EndlessMcp`]), so its bytes can be counted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{HeaderMap, Request, Response};
use serde_json::{Map, Value, json};
use toolgate::error::CodeName;

use crate::boundary::{Env, Run, assert_error, assert_ready, on_both_stores, wait_calls};
use crate::support::fake_tool::{FakeTool, RAW_MARKER, serve_http1};
use crate::support::sidecar::{ADMIN_TOKEN, Reply, Sidecar, metric};
use crate::support::{Deadline, store_yaml, temp_dir, unique};

on_both_stores!(concurrent_calls_with_one_id);

/// The stateless revision.
const STATELESS: &str = "2026-07-28";
const RUN_ID_KEY: &str = "toolgate.dev/run_id";
const TOOL_CALL_ID_KEY: &str = "toolgate.dev/tool_call_id";
const EVIDENCE_KEY: &str = "toolgate.dev/evidence_status";
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
/// Strings no agent-facing error may contain: a payload, a host, a store key, a backend name.
const LEAKS: [&str; 4] = [RAW_MARKER, "127.0.0.1", "toolgate:{", "redis"];
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const SEARCH_SCHEMA_YAML: &str =
    "{type: object, required: [q], properties: {q: {type: string, maxLength: 512}}}";

fn search_schema() -> Value {
    json!({"type": "object", "required": ["q"], "properties": {"q": {"type": "string", "maxLength": 512}}})
}

fn toolgate_info() -> Value {
    json!({"name": "toolgate", "version": env!("CARGO_PKG_VERSION")})
}

// ---------------------------------------------------------------------------------------------
// The SDKs: where they are, and a failure that says how to install them.

fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The pinned version of `package` in a requirements.txt or package.json text.
fn pinned(text: &str, package: &str) -> String {
    for line in text.lines() {
        if let Some(v) = line.trim().strip_prefix(&format!("{package}==")) {
            return v.to_string();
        }
    }
    let json: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    json["dependencies"][package]
        .as_str()
        .unwrap_or_else(|| panic!("{package} is not pinned"))
        .to_string()
}

/// The python of the MCP virtualenv, checked once: it imports the pinned `mcp`.
fn python() -> PathBuf {
    static CHECKED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let path = std::env::var_os("TOOLGATE_MCP_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| mcp_dir().join(".venv/bin/python"));
            let requirements = std::fs::read_to_string(mcp_dir().join("requirements.txt"))
                .expect("tests/mcp/requirements.txt");
            let want = pinned(&requirements, "mcp");
            let hint = "run scripts/test.sh, or: python3 -m venv tests/mcp/.venv && \
                 tests/mcp/.venv/bin/pip install -r tests/mcp/requirements.txt \
                 (TOOLGATE_MCP_PYTHON names another python)";
            let out = Command::new(&path)
                .args([
                    "-c",
                    "import importlib.metadata as m, mcp; print(m.version('mcp'))",
                ])
                .output()
                .map_err(|e| {
                    format!(
                        "the MCP tests need the Python SDK mcp=={want}, but {} does not run ({e}): {hint}",
                        path.display()
                    )
                })?;
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() || got != want {
                return Err(format!(
                    "the MCP tests need the Python SDK mcp=={want} in {} (found {:?}; {}): {hint}",
                    path.display(),
                    got,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(path)
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The directory of `client.mjs` and its `node_modules`, checked once: node runs and the pinned
/// `@modelcontextprotocol/sdk` is installed there.
fn node_dir() -> PathBuf {
    static CHECKED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let dir = std::env::var_os("TOOLGATE_MCP_NODE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(mcp_dir);
            let manifest = std::fs::read_to_string(mcp_dir().join("package.json"))
                .expect("tests/mcp/package.json");
            let want = pinned(&manifest, "@modelcontextprotocol/sdk");
            let hint = "run scripts/test.sh, or: (cd tests/mcp && npm ci) \
                 (TOOLGATE_MCP_NODE_DIR names another directory with client.mjs and node_modules)";
            match Command::new("node").arg("--version").output() {
                Ok(out) if out.status.success() => {}
                _ => {
                    return Err(format!(
                        "the MCP tests need node (Node.js 18 or later) on PATH: \
                         scripts/install-deps.sh test installs it; then {hint}"
                    ));
                }
            }
            let installed =
                dir.join("node_modules/@modelcontextprotocol/sdk/package.json");
            let got = std::fs::read_to_string(&installed)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["version"].as_str().map(str::to_string));
            if got.as_deref() != Some(want.as_str()) {
                return Err(format!(
                    "the MCP tests need @modelcontextprotocol/sdk {want} in {} (found {got:?}): {hint}",
                    dir.display()
                ));
            }
            if !dir.join("client.mjs").is_file() {
                return Err(format!("{} has no client.mjs: {hint}", dir.display()));
            }
            Ok(dir)
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A child process killed (and reaped) when dropped. Its stdin stays open as long as it lives:
/// the Python upstream exits at EOF, so it never outlives the test binary either.
struct Proc {
    child: Child,
    _stdin: Option<ChildStdin>,
    stderr: PathBuf,
}

impl Proc {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs blocking work (a process, a file) off the test's runtime threads; a panic in it is the
/// test's panic, message and all.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("blocking task: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The Python SDK upstream (tests/mcp/upstream.py).

/// One `upstream.py` process: a stateless MCP server on a free loopback port.
struct PyUpstream {
    port: u16,
    log: PathBuf,
    proc: Mutex<Proc>,
}

impl PyUpstream {
    /// Starts it (blocking: waits for its `LISTENING <port>` line).
    fn spawn(mode: &str, token_file: &Path) -> PyUpstream {
        let dir = temp_dir("mcp-upstream");
        let log = dir.join("requests.jsonl");
        let stderr = dir.join("stderr.txt");
        let mut child = Command::new(python())
            .arg(mcp_dir().join("upstream.py"))
            .args(["--mode", mode, "--marker", RAW_MARKER, "--token-file"])
            .arg(token_file)
            .arg("--log")
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start tests/mcp/upstream.py");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let proc = Proc {
            child,
            _stdin: stdin,
            stderr,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep reading, so the pipe never fills.
            let mut rest = String::new();
            while reader.read_line(&mut rest).unwrap_or(0) > 0 {
                rest.clear();
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let port = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "upstream.py --mode {mode} did not start (stdout {line:?}): {}",
                    proc.stderr()
                )
            });
        PyUpstream {
            port,
            log,
            proc: Mutex::new(proc),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every request it received, as logged: `{http_method, path, authorization,
    /// protocol_version, session_id, body}`.
    fn seen(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The `tools/call` requests it received for this run, by tool_call_id.
    fn calls_of(&self, run_id: &str) -> BTreeMap<String, Value> {
        self.seen()
            .into_iter()
            .filter(|e| e["body"]["method"] == "tools/call")
            .filter(|e| e["body"]["params"]["_meta"][RUN_ID_KEY] == run_id)
            .map(|e| {
                let id = e["body"]["params"]["_meta"][TOOL_CALL_ID_KEY]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                (id, e)
            })
            .collect()
    }

    fn stderr(&self) -> String {
        self.proc.lock().expect("lock").stderr()
    }
}

/// The upstreams every test shares: the same server in JSON and in SSE mode, both expecting
/// `Authorization: Bearer <token>` (from `token_file`, which the tools send).
struct Upstreams {
    json: PyUpstream,
    sse: PyUpstream,
    token: String,
    token_file: PathBuf,
}

async fn upstreams() -> &'static Upstreams {
    static SHARED: OnceLock<Upstreams> = OnceLock::new();
    blocking(|| {
        SHARED.get_or_init(|| {
            let token = unique("shared-upstream-token");
            let token_file = temp_dir("mcp-token").join("token");
            std::fs::write(&token_file, format!("{token}\n")).expect("token file");
            let (json, sse) = std::thread::scope(|s| {
                let json = s.spawn(|| PyUpstream::spawn("json", &token_file));
                let sse = s.spawn(|| PyUpstream::spawn("sse", &token_file));
                let join = |h: std::thread::ScopedJoinHandle<'_, PyUpstream>| {
                    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
                };
                (join(json), join(sse))
            });
            Upstreams {
                json,
                sse,
                token,
                token_file,
            }
        })
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// The SDK clients (tests/mcp/client.py and client.mjs).

#[derive(Clone, Copy, Debug, PartialEq)]
enum Sdk {
    /// The Python client in its default mode: `server/discover` first (2026-07-28).
    PythonAuto,
    /// The Python client in handshake mode.
    PythonLegacy,
    /// The TypeScript client 1.x (handshake only).
    Node,
}

impl Sdk {
    fn command(self) -> Command {
        match self {
            Sdk::PythonAuto | Sdk::PythonLegacy => {
                let mut c = Command::new(python());
                c.arg(mcp_dir().join("client.py"));
                c
            }
            Sdk::Node => {
                let mut c = Command::new("node");
                c.arg(node_dir().join("client.mjs"));
                c
            }
        }
    }

    fn mode(self) -> &'static str {
        match self {
            Sdk::PythonAuto => "auto",
            Sdk::PythonLegacy | Sdk::Node => "legacy",
        }
    }

    /// The revision the client should end up speaking with toolgate.
    fn version(self) -> &'static str {
        match self {
            Sdk::PythonAuto => STATELESS,
            Sdk::PythonLegacy | Sdk::Node => "2025-11-25",
        }
    }

    fn stateless(self) -> bool {
        self == Sdk::PythonAuto
    }
}

/// Runs an SDK client against `url` (60 s deadline) and returns the JSON line it printed.
async fn run_client(sdk: Sdk, url: &str, token: &str, run_id: &str, calls: &Value) -> Value {
    let args = [
        url.to_string(),
        token.to_string(),
        sdk.mode().to_string(),
        run_id.to_string(),
        calls.to_string(),
    ];
    // Finding and checking the SDK runs a process: off the runtime threads.
    let mut command = blocking(move || sdk.command()).await;
    let dir = temp_dir("mcp-client");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let child = command
        .args(&args)
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("stdout file"))
        .stderr(File::create(&err).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("start the {sdk:?} client: {e}"));
    // Killed on drop, so a client that hangs past the deadline goes with the test.
    let mut proc = Proc {
        child,
        _stdin: None,
        stderr: err,
    };
    let d = Deadline::after(
        Duration::from_secs(60),
        format!("the {sdk:?} client to finish"),
    );
    let status = loop {
        if let Some(status) = proc.child.try_wait().expect("wait") {
            break status;
        }
        d.tick().await;
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        status.success(),
        "the {sdk:?} client failed ({status}): {}\n{stdout}",
        proc.stderr()
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the {sdk:?} client printed no JSON ({e}): {stdout}"))
}

// ---------------------------------------------------------------------------------------------
// The sidecar and its tools.

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The tools the MCP tests call: HTTP tools on the fake tool service, MCP tools on the shared
/// upstreams (sending their token), then `extra` (YAML list items).
fn mcp_config(store: &str, fake: &FakeTool, ups: &Upstreams, extra: &str) -> String {
    let ro = "read_only: true";
    let token_file = ups.token_file.display().to_string();
    let http = |name: &str, route: &str, rest: &str| {
        format!(
            "  - {{name: {name}, upstream: \"{}\", {ro}, {rest}}}\n",
            fake.url(route)
        )
    };
    let mcp = |name: &str, url: &str, remote: &str, rest: &str| {
        format!(
            "  - {{name: {name}, upstream: \"{url}\", protocol: mcp, remote_name: {remote}, {ro}, \
             upstream_token_file: \"{token_file}\", {rest}}}\n"
        )
    };
    let (json_url, sse_url) = (ups.json.url(), ups.sse.url());
    let items = "projection: {select: /structuredContent/results, max_items: 5, fields: [title, url, snippet]}";
    let mut t = String::new();
    t += &http(
        "search",
        "search",
        &format!(
            "description: \"Searches the fake corpus.\", timeout_ms: 5000, input_schema: {SEARCH_SCHEMA_YAML}, \
             projection: {{select: /results, max_items: 5, fields: [title, url, snippet]}}"
        ),
    );
    t += &http(
        "slow",
        "slow",
        "timeout_ms: 30000, projection: {select: /results, max_items: 1, fields: [title]}",
    );
    t += &http(
        "slowtimeout",
        "slow",
        "timeout_ms: 300, projection: {select: /results}",
    );
    for route in ["fail", "big", "unresolved"] {
        t += &http(route, route, "projection: {select: /results}");
    }
    t += &http(
        "tiny",
        "object",
        "limits: {request_bytes: 400}, projection: {select: /results, fields: [title]}",
    );
    t += &http(
        "echo",
        "echo",
        "projection: {select: /results, fields: [input]}",
    );
    t += &format!(
        "  - {{name: writer, upstream: \"{}\", read_only: false}}\n",
        fake.url("echo")
    );
    t += &mcp(
        "mcp_search",
        &json_url,
        "search",
        &format!(
            "description: \"Searches over MCP.\", input_schema: {SEARCH_SCHEMA_YAML}, {items}"
        ),
    );
    t += &mcp("mcp_search_sse", &sse_url, "search", items);
    t += &mcp(
        "mcp_broken",
        &json_url,
        "broken",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_rpcerror",
        &sse_url,
        "rpcerror",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_nosuch",
        &json_url,
        "nosuch",
        "projection: {select: /structuredContent}",
    );
    t += &mcp(
        "mcp_slow",
        &sse_url,
        "slow",
        "timeout_ms: 300, projection: {select: /structuredContent/results}",
    );
    t += &mcp(
        "mcp_small",
        &json_url,
        "search",
        &format!("limits: {{raw_bytes: 256}}, {items}"),
    );
    t += &mcp(
        "mcp_unresolved",
        &json_url,
        "search",
        "projection: {select: /structuredContent/nothing}",
    );
    t += &format!(
        "  - {{name: mcp_down, upstream: \"http://127.0.0.1:{}/mcp\", protocol: mcp, {ro}}}\n",
        closed_port()
    );
    t += extra;
    format!(
        "{store}limits: {{request_bytes: 8192}}\n\
         runs: {{default_timeout_ms: 60000, max_timeout_ms: 120000, default_max_calls: 100}}\n\
         tools:\n{t}"
    )
}

/// A sidecar with the MCP tools (plus `extra`), in front of a new fake tool service.
async fn mcp_env(store: &str, extra: &str) -> Env {
    let ups = upstreams().await;
    let fake = FakeTool::start().await;
    let config = mcp_config(store, &fake, ups, extra);
    let sc = Arc::new(Sidecar::start(&config).await);
    Env { sc, fake, config }
}

// ---------------------------------------------------------------------------------------------
// Raw MCP requests.

fn mcp_url(sc: &Sidecar) -> String {
    format!("http://{}/mcp", sc.agent)
}

/// `POST /mcp` with the headers a Streamable HTTP client sends, plus `headers`. Checks that no
/// answer ever carries an `Mcp-Session-Id`.
async fn post(
    sc: &Sidecar,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (Reply, HeaderMap) {
    let mut h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    h.extend_from_slice(headers);
    let (reply, headers) = sc
        .send_with_headers("POST", mcp_url(sc), token, &h, body)
        .await;
    assert!(
        !headers.contains_key("mcp-session-id"),
        "toolgate issued an Mcp-Session-Id: {headers:?}"
    );
    reply_checks(&reply, &headers);
    (reply, headers)
}

/// Every JSON answer is `application/json`.
fn reply_checks(reply: &Reply, headers: &HeaderMap) {
    if !reply.raw.is_empty() {
        let ct = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            ct.starts_with("application/json"),
            "content-type {ct:?}: {}",
            reply.raw
        );
    }
}

/// A handshake-era request (no `MCP-Protocol-Version` header).
async fn rpc(sc: &Sidecar, token: &str, msg: Value) -> Reply {
    post(sc, Some(token), &[], msg.to_string()).await.0
}

/// The `_meta` a 2026-07-28 request must carry.
fn stateless_meta() -> Map<String, Value> {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
    });
    meta.as_object().expect("object").clone()
}

/// A 2026-07-28 request: `_meta` merged into `msg.params._meta`, and the `MCP-Protocol-Version`,
/// `Mcp-Method` (and for `tools/call` `Mcp-Name`) headers matching the body.
async fn rpc_stateless(sc: &Sidecar, token: &str, mut msg: Value) -> Reply {
    let method = msg["method"].as_str().expect("method").to_string();
    if msg.get("params").is_none() {
        msg["params"] = json!({});
    }
    let meta = msg["params"]
        .as_object_mut()
        .expect("params object")
        .entry("_meta")
        .or_insert_with(|| json!({}));
    meta.as_object_mut()
        .expect("_meta")
        .extend(stateless_meta());
    let name = msg["params"]["name"].as_str().map(str::to_string);
    let mut headers = vec![
        ("mcp-protocol-version", STATELESS),
        ("mcp-method", method.as_str()),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name.as_str()));
    }
    post(sc, Some(token), &headers, msg.to_string()).await.0
}

/// A `tools/call` message; `run_id` and `call_id` go in `_meta`, `args` (when given) in
/// `arguments`.
fn call_msg(
    rpc_id: Value,
    tool: &str,
    args: Option<Value>,
    run_id: Option<&str>,
    call_id: Option<&str>,
) -> Value {
    let mut meta = Map::new();
    if let Some(r) = run_id {
        meta.insert(RUN_ID_KEY.into(), json!(r));
    }
    if let Some(c) = call_id {
        meta.insert(TOOL_CALL_ID_KEY.into(), json!(c));
    }
    let mut params = json!({"name": tool, "_meta": meta});
    if let Some(a) = args {
        params["arguments"] = a;
    }
    json!({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params})
}

/// The JSON-RPC id a test uses for a call: derived from its tool_call_id.
fn rpc_id(call_id: &str) -> Value {
    json!(format!("rpc-{call_id}"))
}

/// A handshake-era `tools/call` on `run`.
async fn mcp_call(env: &Env, run: &Run, call_id: &str, tool: &str, args: Value) -> Reply {
    let msg = call_msg(
        rpc_id(call_id),
        tool,
        Some(args),
        Some(&run.id),
        Some(call_id),
    );
    rpc(&env.sc, &run.token, msg).await
}

// ---------------------------------------------------------------------------------------------
// Assertions.

#[track_caller]
fn assert_no_leak(raw: &str) {
    for leak in LEAKS {
        assert!(!raw.contains(leak), "MCP answer leaks {leak:?}: {raw}");
    }
}

/// A JSON-RPC success on HTTP 200 echoing `id`; returns its result.
#[track_caller]
fn assert_rpc_result(r: &Reply, id: &Value) -> Value {
    assert_eq!(r.status, 200, "expected a JSON-RPC result: {}", r.raw);
    let keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, ["id", "jsonrpc", "result"], "{}", r.raw);
    assert_eq!(r.body["jsonrpc"], "2.0");
    assert_eq!(&r.body["id"], id, "echoed id: {}", r.raw);
    r.body["result"].clone()
}

/// A JSON-RPC error with this HTTP status, id and code, and a non-empty message, leaking
/// nothing; returns the error object.
#[track_caller]
fn assert_rpc_error(r: &Reply, status: u16, id: &Value, code: i64) -> Value {
    assert_eq!(
        (r.status, r.body["error"]["code"].as_i64()),
        (status, Some(code)),
        "expected HTTP {status} with JSON-RPC error {code}: {}",
        r.raw
    );
    let mut keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    keys.sort();
    assert_eq!(keys, ["error", "id", "jsonrpc"], "{}", r.raw);
    assert_eq!(r.body["jsonrpc"], "2.0");
    assert_eq!(&r.body["id"], id, "echoed id: {}", r.raw);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{}", r.raw);
    assert_no_leak(&r.raw);
    r.body["error"].clone()
}

/// Compares a result's `_meta` with `expected`; the stateless revision may add toolgate's
/// serverInfo.
#[track_caller]
fn check_meta(meta: &Value, expected: Value, stateless: bool) {
    let mut m = meta.as_object().cloned().unwrap_or_default();
    if stateless && let Some(info) = m.remove(SERVER_INFO_KEY) {
        assert_eq!(info, toolgate_info());
    }
    assert_eq!(Value::Object(m), expected, "_meta");
}

/// A tools/call result that is toolgate's READY answer, as sent or as an SDK saw it; returns its
/// structuredContent (the agent result).
#[track_caller]
fn check_ready(result: &Value, call_id: &str, evidence: &str, stateless: bool) -> Value {
    assert_eq!(result["isError"], false, "{result}");
    let structured = result["structuredContent"].clone();
    assert!(structured.is_object(), "{result}");
    let content = result["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{result}");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().expect("text");
    let parsed: Value = serde_json::from_str(text).expect("the text is JSON");
    assert_eq!(parsed, structured, "the text is the structured result");
    assert_eq!(
        text,
        serde_json::to_string(&parsed).expect("json"),
        "the text is compact JSON"
    );
    check_meta(
        &result["_meta"],
        json!({TOOL_CALL_ID_KEY: call_id, EVIDENCE_KEY: evidence}),
        stateless,
    );
    assert!(!result.to_string().contains(RAW_MARKER), "{result}");
    structured
}

/// A tools/call result that is toolgate's error `code`: fixed text, the error body as
/// structuredContent, the echoed id in `_meta`.
#[track_caller]
fn check_is_error(result: &Value, code: &str, echo: Option<&str>, stateless: bool) {
    let message = CodeName::parse(code).expect("a contract code").message();
    assert_eq!(result["isError"], true, "expected {code}: {result}");
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": format!("{code}: {message}")}]),
        "{result}"
    );
    let body = &result["structuredContent"];
    let keys: Vec<&String> = body.as_object().expect("error body").keys().collect();
    assert_eq!(keys, ["status", "tool_call_id", "error"], "{result}");
    assert_eq!(
        body,
        &json!({"status": "ERROR", "tool_call_id": echo, "error": {"code": code, "message": message}}),
        "{result}"
    );
    check_meta(&result["_meta"], json!({TOOL_CALL_ID_KEY: echo}), stateless);
}

/// The wire keys of a handshake-era tools/call result.
#[track_caller]
fn check_result_keys(result: &Value) {
    let keys: Vec<&String> = result.as_object().expect("result").keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["_meta", "content", "isError", "structuredContent"],
        "{result}"
    );
}

/// A READY tools/call answer on the wire (handshake era); returns the agent result.
#[track_caller]
fn assert_mcp_ready(r: &Reply, call_id: &str, evidence: &str) -> Value {
    let result = assert_rpc_result(r, &rpc_id(call_id));
    check_result_keys(&result);
    assert!(
        !r.raw.contains(RAW_MARKER),
        "READY leaks raw data: {}",
        r.raw
    );
    check_ready(&result, call_id, evidence, false)
}

/// An `isError` tools/call answer on the wire (handshake era) for `code`; returns the error
/// body.
#[track_caller]
fn assert_mcp_error(r: &Reply, rpc: &Value, code: &str, echo: Option<&str>) -> Value {
    let result = assert_rpc_result(r, rpc);
    check_result_keys(&result);
    check_is_error(&result, code, echo, false);
    assert_no_leak(&r.raw);
    result["structuredContent"].clone()
}

/// A toolgate error body at the HTTP level (401, 413).
#[track_caller]
fn assert_http_refusal(r: &Reply, headers: &HeaderMap, status: u16, code: &str) {
    assert_error(r, status, code, None);
    if code == "UNAUTHENTICATED" {
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer"),
            "{headers:?}"
        );
    }
}

/// The agent result of the fake `/search` through `search`'s projection.
fn fake_search_result() -> Value {
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"title": format!("t{i}"), "url": format!("https://e.x/{i}"), "snippet": "s"}))
        .collect();
    json!({"items": items, "total_items": 7})
}

/// The agent result of the upstream's `search` through the MCP tools' projection.
fn upstream_search_result(q: &str) -> Value {
    let items: Vec<Value> = (1..=5)
        .map(|i| {
            json!({
                "title": format!("Result {i} for {q}"),
                "url": format!("https://example.com/{i}"),
                "snippet": format!("Snippet {i} about {q}."),
            })
        })
        .collect();
    json!({"items": items, "total_items": 7})
}

/// The tool_call_ids of a run's facts, in order.
async fn fact_ids(env: &Env, run_id: &str) -> Vec<String> {
    env.facts(run_id).await["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| f["tool_call_id"].as_str().expect("id").to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The official clients against toolgate.

/// One SDK client: lists the run's tools, calls an HTTP tool (the fake tool) and the same MCP
/// tool through the JSON and the SSE upstream, with `_meta` ids, then an unknown tool and a bad
/// input; every answer is checked as that SDK saw it, then against the records, the facts and
/// what the tool and the upstreams received.
async fn sdk_case(sdk: Sdk) {
    let env = mcp_env(&store_yaml(None), "").await;
    let ups = upstreams().await;
    let run = env
        .run(json!({"tools": ["search", "mcp_search", "mcp_search_sse", "writer"]}))
        .await;
    let p = match sdk {
        Sdk::PythonAuto => "py-auto",
        Sdk::PythonLegacy => "py-legacy",
        Sdk::Node => "node",
    };
    let id = |n: u32| format!("{p}-{n}");
    let calls = json!([
        {"name": "search", "arguments": {"q": "mcp"}, "tool_call_id": id(1), "traceparent": TRACEPARENT},
        {"name": "mcp_search", "arguments": {"q": "mcp"}, "tool_call_id": id(2)},
        {"name": "mcp_search_sse", "arguments": {"q": "mcp"}, "tool_call_id": id(3)},
        {"name": "nope", "arguments": {}, "tool_call_id": id(4)},
        {"name": "search", "arguments": {"q": 5}, "tool_call_id": id(5)},
    ]);
    let out = run_client(sdk, &mcp_url(&env.sc), &run.token, &run.id, &calls).await;

    assert_eq!(out["protocol_version"], sdk.version(), "{out}");
    if !out["server_info"].is_null() {
        assert_eq!(out["server_info"], toolgate_info());
    }
    assert_eq!(out["next_cursor"], Value::Null, "no pagination");
    let mut tools = out["tools"].as_array().expect("tools").clone();
    tools.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_string());
    let ro = json!({"readOnlyHint": true});
    assert_eq!(
        Value::Array(tools),
        json!([
            {"name": "mcp_search", "description": "Searches over MCP.", "inputSchema": search_schema(), "annotations": ro},
            {"name": "mcp_search_sse", "description": "", "inputSchema": {"type": "object"}, "annotations": ro},
            {"name": "search", "description": "Searches the fake corpus.", "inputSchema": search_schema(), "annotations": ro},
        ]),
        "{sdk:?}: tools/list is the run's read-only tools"
    );

    let results = out["calls"].as_array().expect("calls");
    assert_eq!(results.len(), 5, "{out}");
    let st = sdk.stateless();
    assert_eq!(
        check_ready(&results[0], &id(1), "EVIDENCE_FOUND", st),
        fake_search_result()
    );
    for (n, result) in [(2, &results[1]), (3, &results[2])] {
        assert_eq!(
            check_ready(result, &id(n), "EVIDENCE_FOUND", st),
            upstream_search_result("mcp"),
            "{sdk:?} call {n}"
        );
    }
    check_is_error(&results[3], "UNKNOWN_TOOL", Some(&id(4)), st);
    check_is_error(&results[4], "INVALID_INPUT", Some(&id(5)), st);
    assert!(!out.to_string().contains(RAW_MARKER), "{out}");

    // The record keeps the raw response (the upstream's JSON-RPC result for MCP tools), the
    // agent result is what the SDK got, and the facts list the three calls in order.
    for (n, result) in results.iter().take(3).enumerate() {
        let rec = env.record_ok(&run.id, &id(n as u32 + 1)).await;
        assert_eq!(rec["status"], "READY");
        assert_eq!(rec["agent_result"], result["structuredContent"]);
        assert_eq!(rec["request"], json!({"q": "mcp"}));
    }
    for n in [2, 3] {
        let raw = &env.record_ok(&run.id, &id(n)).await["raw_response"];
        assert_eq!(raw["isError"], false, "{raw}");
        assert_eq!(raw["structuredContent"]["results"][6]["extra"], RAW_MARKER);
        assert_eq!(
            raw["structuredContent"]["seen"],
            json!({"run_id": run.id, "tool_call_id": id(n)}),
            "toolgate passes the ids in _meta"
        );
    }
    env.no_record(&run.id, &id(4)).await;
    env.no_record(&run.id, &id(5)).await;
    assert_eq!(fact_ids(&env, &run.id).await, [id(1), id(2), id(3)]);
    assert_eq!(env.facts(&run.id).await["excluded"], 0);

    // The HTTP tool got the ids and the traceparent as headers.
    let seen = env.fake.calls("search");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, json!({"q": "mcp"}));
    assert_eq!(seen[0].headers["x-run-id"], run.id);
    assert_eq!(seen[0].headers["x-tool-call-id"], id(1));
    assert_eq!(seen[0].headers["traceparent"], TRACEPARENT);
    assert!(!seen[0].headers.contains_key("authorization"));

    // Each upstream got one tools/call of the remote name, with the ids and its token.
    for (up, n) in [(&ups.json, 2), (&ups.sse, 3)] {
        let calls = up.calls_of(&run.id);
        assert_eq!(calls.len(), 1, "{calls:?}\n{}", up.stderr());
        let call = &calls[&id(n)];
        assert_eq!(call["body"]["params"]["name"], "search");
        assert_eq!(call["body"]["params"]["arguments"], json!({"q": "mcp"}));
        assert_eq!(call["body"]["params"]["_meta"][RUN_ID_KEY], run.id);
        assert_eq!(
            call["authorization"],
            format!("Bearer {}", ups.token),
            "the tool's upstream token"
        );
        assert_eq!(call["session_id"], Value::Null);
        assert!(
            call["protocol_version"] == "2025-11-25" || call["protocol_version"] == "2025-06-18",
            "{call}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_auto() {
    sdk_case(Sdk::PythonAuto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_legacy() {
    sdk_case(Sdk::PythonLegacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client() {
    sdk_case(Sdk::Node).await;
}

// ---------------------------------------------------------------------------------------------
// The protocol surface, request by request.

/// initialize (version negotiation), ping, server/discover, tools/list in both revisions, and
/// a tools/call with no arguments; nothing carries a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_listing() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = run.token.as_str();

    for (asked, answered) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
        ("1999-01-01", "2025-11-25"),
    ] {
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
        let result = assert_rpc_result(&rpc(sc, t, msg).await, &json!(1));
        assert_eq!(
            result,
            json!({"protocolVersion": answered, "capabilities": {"tools": {"listChanged": false}}, "serverInfo": toolgate_info()}),
            "initialize asking {asked}"
        );
    }
    let (r, _) = post(
        sc,
        Some(t),
        &[("mcp-protocol-version", "2025-11-25")],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!((r.status, r.raw.as_str()), (202, ""), "a notification");
    for headers in [vec![], vec![("mcp-protocol-version", "2025-06-18")]] {
        let (r, _) = post(
            sc,
            Some(t),
            &headers,
            r#"{"jsonrpc":"2.0","id":"p-1","method":"ping"}"#,
        )
        .await;
        assert_eq!(assert_rpc_result(&r, &json!("p-1")), json!({}));
    }

    // server/discover, in the revision that defines it.
    let r = rpc_stateless(
        sc,
        t,
        json!({"jsonrpc": "2.0", "id": "d", "method": "server/discover"}),
    )
    .await;
    let d = assert_rpc_result(&r, &json!("d"));
    assert_eq!(d["resultType"], "complete", "{d}");
    let versions = d["supportedVersions"]
        .as_array()
        .expect("supportedVersions");
    assert!(versions.contains(&json!(STATELESS)), "{d}");
    assert!(
        !versions.is_empty() && versions.iter().all(Value::is_string),
        "{d}"
    );
    assert!(d["capabilities"]["tools"].is_object(), "{d}");
    assert!(d["ttlMs"].is_u64(), "{d}");
    assert!(
        d["cacheScope"] == "public" || d["cacheScope"] == "private",
        "{d}"
    );

    // tools/list: every configured read-only tool for a run without a tools list, in the same
    // order every time.
    let all_ro = [
        "big",
        "echo",
        "fail",
        "mcp_broken",
        "mcp_down",
        "mcp_nosuch",
        "mcp_rpcerror",
        "mcp_search",
        "mcp_search_sse",
        "mcp_slow",
        "mcp_small",
        "mcp_unresolved",
        "search",
        "slow",
        "slowtimeout",
        "tiny",
        "unresolved",
    ];
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let legacy = assert_rpc_result(&rpc(sc, t, list.clone()).await, &json!(2));
    let keys: Vec<&String> = legacy.as_object().expect("result").keys().collect();
    assert_eq!(
        keys,
        ["tools"],
        "no nextCursor, no caching fields: {legacy}"
    );
    let mut names: Vec<&str> = legacy["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, all_ro, "writer is not read-only");
    for tool in legacy["tools"].as_array().expect("tools") {
        let keys: Vec<&String> = tool.as_object().expect("tool").keys().collect();
        let mut keys = keys.clone();
        keys.sort();
        assert_eq!(
            keys,
            ["annotations", "description", "inputSchema", "name"],
            "{tool}"
        );
        assert_eq!(tool["annotations"], json!({"readOnlyHint": true}));
    }
    let again = assert_rpc_result(&rpc(sc, t, list.clone()).await, &json!(2));
    assert_eq!(again, legacy, "a deterministic list");
    let (r, _) = post(
        sc,
        Some(t),
        &[("mcp-protocol-version", "2025-11-25")],
        list.to_string(),
    )
    .await;
    assert_eq!(assert_rpc_result(&r, &json!(2)), legacy);
    let modern = assert_rpc_result(&rpc_stateless(sc, t, list.clone()).await, &json!(2));
    assert_eq!(modern["resultType"], "complete");
    assert!(modern["ttlMs"].is_u64(), "{modern}");
    assert!(
        modern["cacheScope"] == "public" || modern["cacheScope"] == "private",
        "{modern}"
    );
    assert_eq!(modern["tools"], legacy["tools"]);
    assert!(modern.get("nextCursor").is_none(), "{modern}");

    // A run's tools list narrows it; a tool outside it or not read-only is not listed.
    let narrow = env
        .run(json!({"tools": ["search", "writer", "mcp_search_sse"]}))
        .await;
    let r = assert_rpc_result(&rpc(sc, &narrow.token, list.clone()).await, &json!(2));
    let mut tools = r["tools"].as_array().expect("tools").clone();
    tools.sort_by_key(|t| t["name"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        Value::Array(tools),
        json!([
            {"name": "mcp_search_sse", "description": "", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
            {"name": "search", "description": "Searches the fake corpus.", "inputSchema": search_schema(), "annotations": {"readOnlyHint": true}},
        ])
    );

    // A call without arguments has the input {}; a stateless call carries resultType.
    let msg = call_msg(rpc_id("l-1"), "slow", None, Some(&run.id), Some("l-1"));
    let result = assert_mcp_ready(&rpc(sc, t, msg).await, "l-1", "EVIDENCE_FOUND");
    assert_eq!(
        result,
        json!({"items": [{"title": "t0"}], "total_items": 7})
    );
    assert_eq!(env.record_ok(&run.id, "l-1").await["request"], json!({}));
    assert_eq!(env.fake.calls("slow")[0].body, json!({}));
    let msg = call_msg(
        rpc_id("l-2"),
        "mcp_search",
        Some(json!({"q": "modern"})),
        Some(&run.id),
        Some("l-2"),
    );
    let r = rpc_stateless(sc, t, msg).await;
    let result = assert_rpc_result(&r, &rpc_id("l-2"));
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(
        check_ready(&result, "l-2", "EVIDENCE_FOUND", true),
        upstream_search_result("modern")
    );
    let msg = call_msg(rpc_id("l-3"), "nope", None, Some(&run.id), Some("l-3"));
    let result = assert_rpc_result(&rpc_stateless(sc, t, msg).await, &rpc_id("l-3"));
    assert_eq!(result["resultType"], "complete", "{result}");
    check_is_error(&result, "UNKNOWN_TOOL", Some("l-3"), true);
    assert_eq!(fact_ids(&env, &run.id).await, ["l-1", "l-2"]);
}

/// Every JSON-RPC error, in both revisions, with the id it echoes and a fixed message; the
/// HTTP-level refusals (401, 413, 405) and notifications (202).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpc_errors() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = Some(run.token.as_str());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    .to_string();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let modern = [
        ("mcp-protocol-version", STATELESS),
        ("mcp-method", "tools/list"),
    ];

    // 401: no token, a bad one, the admin token; whatever the body.
    let other_run_mac = {
        let other = env.run(json!({})).await;
        format!(
            "{}.{}",
            run.id,
            other.token.split_once('.').expect("token").1
        )
    };
    for (token, headers, body) in [
        (None, &[][..], init.as_str()),
        (Some("garbage"), &[][..], list.as_str()),
        (Some(ADMIN_TOKEN), &[][..], list.as_str()),
        (Some(other_run_mac.as_str()), &[][..], list.as_str()),
        (None, &modern[..], list.as_str()),
        (None, &[][..], "{oops"),
        (
            None,
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
    ] {
        let (r, h) = post(sc, token, headers, body.to_string()).await;
        assert_http_refusal(&r, &h, 401, "UNAUTHENTICATED");
    }

    // 413: a body over every limit, and one over the called tool's own request_bytes.
    let pad = "p".repeat(9000);
    let big = call_msg(
        json!(9),
        "search",
        Some(json!({"q": "x", "pad": pad})),
        Some(&run.id),
        Some("big-1"),
    );
    let (r, h) = post(sc, t, &[], big.to_string()).await;
    assert_http_refusal(&r, &h, 413, "REQUEST_TOO_LARGE");
    let over_tool = call_msg(
        json!(9),
        "tiny",
        Some(json!({"pad": "p".repeat(500)})),
        Some(&run.id),
        Some("big-2"),
    );
    let (r, _) = post(sc, t, &[], over_tool.to_string()).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (413, Some("REQUEST_TOO_LARGE")),
        "{}",
        r.raw
    );
    // Over the tool's own limit the call was read: its safe id is echoed, as on /v1/invoke.
    assert_eq!(r.body["tool_call_id"], "big-2", "{}", r.raw);
    env.no_record(&run.id, "big-1").await;
    env.no_record(&run.id, "big-2").await;

    // 405: GET and DELETE.
    for method in ["GET", "DELETE"] {
        let (r, h) = sc
            .send_with_headers(method, mcp_url(sc), t, &[], Bytes::new())
            .await;
        assert_eq!(r.status, 405, "{method}: {}", r.raw);
        assert!(!h.contains_key("mcp-session-id"));
    }

    // Notifications: 202, no body, in both revisions.
    for (headers, body) in [
        (
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
        (
            &[][..],
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
        ),
        (
            &[
                ("mcp-protocol-version", STATELESS),
                ("mcp-method", "notifications/cancelled"),
            ][..],
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
        ),
    ] {
        let (r, _) = post(sc, t, headers, body).await;
        assert_eq!((r.status, r.raw.as_str()), (202, ""), "{body}");
    }

    // Every message of a code is the same fixed sentence.
    let mut messages: BTreeMap<i64, String> = BTreeMap::new();
    let mut fixed = |e: &Value| {
        let code = e["code"].as_i64().expect("code");
        let message = e["message"].as_str().expect("message").to_string();
        let first = messages.entry(code).or_insert_with(|| message.clone());
        assert_eq!(*first, message, "the message of {code} is not fixed");
    };

    // Handshake era: on HTTP 200. Then the same bodies under 2026-07-28: 400 or 404.
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Value, i64)> = vec![
        ("not JSON", "{oops", Value::Null, -32700),
        ("empty body", "", Value::Null, -32700),
        ("truncated", r#"{"jsonrpc":"2.0","id":3,"#, Value::Null, -32700),
        ("a batch", r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, Value::Null, -32600),
        ("an empty batch", "[]", Value::Null, -32600),
        ("a string", r#""ping""#, Value::Null, -32600),
        ("a number", "42", Value::Null, -32600),
        ("no jsonrpc", r#"{"id":4,"method":"ping"}"#, json!(4), -32600),
        ("jsonrpc 1.0", r#"{"jsonrpc":"1.0","id":"v1","method":"ping"}"#, json!("v1"), -32600),
        ("no method", r#"{"jsonrpc":"2.0","id":5}"#, json!(5), -32600),
        ("method not a string", r#"{"jsonrpc":"2.0","id":6,"method":7}"#, json!(6), -32600),
        ("id null", r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, Value::Null, -32600),
        ("id an object", r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, Value::Null, -32600),
        ("params a string", r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":"x"}"#, json!(8), -32600),
        ("unknown method", r#"{"jsonrpc":"2.0","id":"m-1","method":"resources/list"}"#, json!("m-1"), -32601),
        ("another unknown method", r#"{"jsonrpc":"2.0","id":10,"method":"tools/delete","params":{}}"#, json!(10), -32601),
        ("tools/call without params", r#"{"jsonrpc":"2.0","id":11,"method":"tools/call"}"#, json!(11), -32602),
        ("tools/call, params an array", r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":["search"]}"#, json!(12), -32602),
        ("tools/call without a name", r#"{"jsonrpc":"2.0","id":"n-13","method":"tools/call","params":{"arguments":{}}}"#, json!("n-13"), -32602),
        ("tools/call, name not a string", r#"{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":5}}"#, json!(14), -32602),
    ];
    for (what, body, id, code) in &cases {
        for headers in [&[][..], &[("mcp-protocol-version", "2025-06-18")][..]] {
            let (r, _) = post(sc, t, headers, body.to_string()).await;
            assert_eq!(
                (r.status, r.body["error"]["code"].as_i64()),
                (200, Some(*code)),
                "{what} {headers:?}: {}",
                r.raw
            );
            fixed(&assert_rpc_error(&r, 200, id, *code));
        }
    }
    for (what, body, id, code) in &cases {
        // Under 2026-07-28 the body carries the version where it can; the headers match it.
        let mut body = body.to_string();
        let mut method = String::from("ping");
        if let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(&body) {
            if let Some(Value::String(name)) = m.get("method") {
                method = name.clone();
            }
            match m.get_mut("params") {
                Some(Value::Object(p)) => {
                    p.insert("_meta".into(), Value::Object(stateless_meta()));
                }
                None if *code != -32600 => {
                    m.insert("params".into(), json!({"_meta": stateless_meta()}));
                }
                _ => {}
            }
            body = Value::Object(m).to_string();
        }
        let headers = [
            ("mcp-protocol-version", STATELESS),
            ("mcp-method", method.as_str()),
        ];
        let (r, _) = post(sc, t, &headers, body.clone()).await;
        let status = if *code == -32601 { 404 } else { 400 };
        assert_eq!(
            (r.status, r.body["error"]["code"].as_i64()),
            (status, Some(*code)),
            "2026-07-28, {what}: {}",
            r.raw
        );
        fixed(&assert_rpc_error(&r, status, id, *code));
    }

    // What only the stateless revision checks.
    let with_meta = |id: i64, method: &str, extra: Value| {
        let mut params = json!({"_meta": stateless_meta()});
        if let (Value::Object(p), Value::Object(e)) = (&mut params, extra) {
            p.extend(e);
        }
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    };
    // _meta without the version or the capabilities: -32602 (400).
    for (id, meta) in [
        (20, json!({})),
        (
            21,
            json!({"io.modelcontextprotocol/clientCapabilities": {}}),
        ),
        (
            22,
            json!({"io.modelcontextprotocol/protocolVersion": STATELESS}),
        ),
    ] {
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": meta}});
        let (r, _) = post(sc, t, &modern, body.to_string()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(id), -32602));
    }
    let (r, _) = post(
        sc,
        t,
        &modern,
        r#"{"jsonrpc":"2.0","id":23,"method":"tools/list"}"#,
    )
    .await;
    fixed(&assert_rpc_error(&r, 400, &json!(23), -32602));
    // Headers that do not match the body: -32020 (400).
    let body = with_meta(24, "tools/list", json!({})).to_string();
    for headers in [
        vec![("mcp-protocol-version", STATELESS), ("mcp-method", "ping")],
        vec![("mcp-protocol-version", STATELESS)],
    ] {
        let (r, _) = post(sc, t, &headers, body.clone()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(24), -32020));
    }
    let call = with_meta(
        25,
        "tools/call",
        json!({"name": "search", "arguments": {"q": "x"}}),
    )
    .to_string();
    for name in [Some("slow"), None] {
        let mut headers = vec![
            ("mcp-protocol-version", STATELESS),
            ("mcp-method", "tools/call"),
        ];
        if let Some(n) = name {
            headers.push(("mcp-name", n));
        }
        let (r, _) = post(sc, t, &headers, call.clone()).await;
        fixed(&assert_rpc_error(&r, 400, &json!(25), -32020));
    }
    // A version toolgate does not speak: -32022 (400), naming the ones it does.
    let mut odd = stateless_meta();
    odd.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        json!("2099-01-01"),
    );
    let body =
        json!({"jsonrpc": "2.0", "id": 26, "method": "tools/list", "params": {"_meta": odd}});
    let (r, _) = post(
        sc,
        t,
        &[
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "tools/list"),
        ],
        body.to_string(),
    )
    .await;
    let e = assert_rpc_error(&r, 400, &json!(26), -32022);
    fixed(&e);
    let supported = e["data"]["supported"].as_array().expect("data.supported");
    assert!(supported.contains(&json!(STATELESS)), "{e}");
    // No ping and no initialize in the stateless revision: -32601 (404).
    for (id, method) in [(27, "ping"), (28, "initialize")] {
        let body = with_meta(id, method, json!({})).to_string();
        let headers = [("mcp-protocol-version", STATELESS), ("mcp-method", method)];
        let (r, _) = post(sc, t, &headers, body).await;
        fixed(&assert_rpc_error(&r, 404, &json!(id), -32601));
    }

    // None of it reached a tool, created a record or spent budget.
    assert_eq!(env.fake.total_calls(), 0);
    assert_eq!(env.view(&run.id).await["calls_used"], 0);
    assert_eq!(env.facts(&run.id).await["excluded"], 0);
}

// ---------------------------------------------------------------------------------------------
// toolgate's errors as tool results.

/// Every toolgate error an MCP call can meet is an `isError` result on HTTP 200 with the id it
/// should echo, leaking nothing; its structuredContent is the body `/v1/invoke` gives for the
/// same fault (checked in a twin run with the same ids), and the record is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolgate_errors_are_tool_results() {
    let env = mcp_env(&store_yaml(None), "").await;
    let sc = &env.sc;
    let q = || json!({"q": "x"});
    let too_long: &'static str = Box::leak("a".repeat(129).into_boxed_str());

    // (what, tool, arguments (null: absent), tool_call_id ("": absent), code). The id is
    // echoed unless it is the fault; the run may call only `search` in the UNAUTHORIZED case.
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Value, &str, &str)> = vec![
        ("schema: q not a string", "search", json!({"q": 5}), "e-1", "INVALID_INPUT"),
        ("schema: arguments absent", "search", Value::Null, "e-2", "INVALID_INPUT"),
        ("arguments an array", "slow", json!([1]), "e-3", "INVALID_INPUT"),
        ("arguments a string", "mcp_search", json!("q"), "e-4", "INVALID_INPUT"),
        ("tool_call_id absent", "search", q(), "", "INVALID_TOOL_CALL_ID"),
        ("tool_call_id unsafe", "search", q(), "bad id", "INVALID_TOOL_CALL_ID"),
        ("tool_call_id too long", "search", q(), too_long, "INVALID_TOOL_CALL_ID"),
        ("unknown tool", "nope", q(), "e-6", "UNKNOWN_TOOL"),
        ("tool outside the run's tools", "mcp_search", q(), "e-7", "UNAUTHORIZED"),
        ("tool not read-only", "writer", q(), "e-8", "TOOL_NOT_READ_ONLY"),
        ("HTTP tool fails", "fail", json!({}), "e-9", "TOOL_EXECUTION_FAILED"),
        ("HTTP tool too slow", "slowtimeout", json!({"sleep_ms": 3000}), "e-10", "TOOL_TIMEOUT"),
        ("HTTP tool answers too much", "big", json!({}), "e-11", "RESULT_TOO_LARGE"),
        ("HTTP result not selectable", "unresolved", json!({}), "e-12", "PROJECTION_FAILED"),
        ("MCP tool answers isError", "mcp_broken", json!({}), "e-13", "TOOL_EXECUTION_FAILED"),
        ("MCP JSON-RPC error over SSE", "mcp_rpcerror", json!({}), "e-14", "TOOL_EXECUTION_FAILED"),
        ("MCP remote name unknown", "mcp_nosuch", json!({}), "e-15", "TOOL_EXECUTION_FAILED"),
        ("MCP upstream unreachable", "mcp_down", json!({}), "e-16", "TOOL_EXECUTION_FAILED"),
        ("MCP tool too slow (SSE)", "mcp_slow", json!({"ms": 5000}), "e-17", "TOOL_TIMEOUT"),
        ("MCP answer over raw_bytes", "mcp_small", q(), "e-18", "RESULT_TOO_LARGE"),
        ("MCP result not selectable", "mcp_unresolved", q(), "e-19", "PROJECTION_FAILED"),
    ];
    for (what, tool, args, id, code) in cases {
        let extra = if code == "UNAUTHORIZED" {
            json!({"tools": ["search"]})
        } else {
            json!({})
        };
        let echo = (code != "INVALID_TOOL_CALL_ID").then_some(id);
        let (id, args) = (
            (!id.is_empty()).then_some(id),
            (!args.is_null()).then_some(args),
        );
        let a = env.run(extra.clone()).await;
        let b = env.run(extra).await;
        let msg = call_msg(rpc_id(what), tool, args.clone(), Some(&a.id), id);
        let r = rpc(sc, &a.token, msg).await;
        let body = assert_mcp_error(&r, &rpc_id(what), code, echo);
        // The twin call on /v1/invoke (absent arguments are the input {}).
        let mut envelope =
            json!({"run_id": b.id, "tool": tool, "input": args.unwrap_or(json!({}))});
        if let Some(id) = id {
            envelope["tool_call_id"] = json!(id);
        }
        let twin = sc
            .invoke_raw(Some(&b.token), envelope.to_string(), &[])
            .await;
        assert_ne!(twin.status, 200, "{what}: {}", twin.raw);
        assert_eq!(body, twin.body, "{what}: MCP and /v1/invoke disagree");
        if let Some(id) = echo {
            let (ra, rb) = (env.record(&a.id, id).await, env.record(&b.id, id).await);
            assert_eq!(ra.status, rb.status, "{what}: one form left a record");
            if ra.status == 200 {
                for field in [
                    "tool",
                    "status",
                    "evidence_status",
                    "agent_result",
                    "error_code",
                ] {
                    assert_eq!(ra.body[field], rb.body[field], "{what}: {field}");
                }
                assert_eq!(ra.body["error_code"], code, "{what}");
            }
        }
    }

    // The stateless revision answers the same way, on 200 too.
    let a = env.run(json!({})).await;
    for (tool, id, code) in [
        ("nope", "s-1", "UNKNOWN_TOOL"),
        ("mcp_broken", "s-2", "TOOL_EXECUTION_FAILED"),
    ] {
        let msg = call_msg(rpc_id(id), tool, Some(json!({})), Some(&a.id), Some(id));
        let r = rpc_stateless(sc, &a.token, msg).await;
        let result = assert_rpc_result(&r, &rpc_id(id));
        check_is_error(&result, code, Some(id), true);
        assert_no_leak(&r.raw);
    }

    // The run binding: no run id, another run's id, an unsafe one.
    let a = env.run(json!({})).await;
    let other = env.run(json!({})).await;
    for (run_id, id) in [
        (None, "r-1"),
        (Some(other.id.as_str()), "r-2"),
        (Some("run 1"), "r-3"),
    ] {
        let msg = call_msg(rpc_id(id), "search", Some(q()), run_id, Some(id));
        let r = rpc(sc, &a.token, msg).await;
        assert_mcp_error(&r, &rpc_id(id), "RUN_MISMATCH", Some(id));
        env.no_record(&a.id, id).await;
        env.no_record(&other.id, id).await;
    }

    // The reservation: a duplicate id, the call budget, an ended run, a passed deadline.
    let a = env.run(json!({"budget": {"max_calls": 2}})).await;
    assert_mcp_ready(
        &mcp_call(&env, &a, "d-1", "search", q()).await,
        "d-1",
        "EVIDENCE_FOUND",
    );
    let first = env.record_ok(&a.id, "d-1").await;
    for tool in ["search", "mcp_search", "nope"] {
        let r = mcp_call(&env, &a, "d-1", tool, q()).await;
        if tool == "nope" {
            assert_mcp_error(&r, &rpc_id("d-1"), "UNKNOWN_TOOL", Some("d-1"));
        } else {
            assert_mcp_error(&r, &rpc_id("d-1"), "DUPLICATE_TOOL_CALL", Some("d-1"));
        }
    }
    let mut again = env.record_ok(&a.id, "d-1").await;
    let mut first = first;
    first.as_object_mut().expect("record").remove("ttl_ms");
    again.as_object_mut().expect("record").remove("ttl_ms");
    assert_eq!(first, again, "a duplicate touched the first record");
    assert_mcp_ready(
        &mcp_call(&env, &a, "d-2", "mcp_search", q()).await,
        "d-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &a, "d-3", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("d-3"), "BUDGET_EXHAUSTED", Some("d-3"));
    env.no_record(&a.id, "d-3").await;
    assert_eq!(env.view(&a.id).await["calls_used"], 2);

    let ended = env.run(json!({})).await;
    env.admin_post(&format!("/v1/runs/{}/end", ended.id)).await;
    let r = mcp_call(&env, &ended, "i-1", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("i-1"), "RUN_INACTIVE", Some("i-1"));

    let late = env.run(json!({"timeout_ms": 50})).await;
    let past = toolgate::clock::now_ms() + 50;
    let d = Deadline::after(Duration::from_secs(10), "the run deadline to pass");
    while toolgate::clock::now_ms() <= past {
        d.tick().await;
    }
    let r = mcp_call(&env, &late, "t-1", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("t-1"), "RUN_DEADLINE_EXCEEDED", Some("t-1"));
    env.no_record(&late.id, "t-1").await;

    // A cancel cuts a call in flight.
    let a = env.run(json!({})).await;
    let sc2 = env.sc.clone();
    let a2 = a.clone();
    let slow_calls = env.fake.calls("slow").len();
    let in_flight = tokio::spawn(async move {
        let msg = call_msg(
            rpc_id("c-1"),
            "slow",
            Some(json!({"sleep_ms": 15000})),
            Some(&a2.id),
            Some("c-1"),
        );
        rpc(&sc2, &a2.token, msg).await
    });
    wait_calls(&env.fake, "slow", slow_calls + 1).await;
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", a.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let r = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the cancelled call answered promptly")
        .expect("task");
    assert_mcp_error(&r, &rpc_id("c-1"), "RUN_CANCELLED", Some("c-1"));
    assert_eq!(
        env.record_ok(&a.id, "c-1").await["error_code"],
        "RUN_CANCELLED"
    );

    // The drain: a new call is refused while one is in flight.
    let a = env.run(json!({})).await;
    let sc2 = env.sc.clone();
    let a2 = a.clone();
    let slow_calls = env.fake.calls("slow").len();
    let in_flight = tokio::spawn(async move {
        sc2.invoke(&a2.token, &a2.id, "h-1", "slow", json!({"sleep_ms": 1500}))
            .await
    });
    wait_calls(&env.fake, "slow", slow_calls + 1).await;
    let task = env.sc.begin_shutdown();
    let d = Deadline::after(Duration::from_secs(2), "/readyz to turn 503");
    while env.sc.get_telemetry("/readyz").await.0 != 503 {
        d.tick().await;
    }
    let r = mcp_call(&env, &a, "h-2", "search", q()).await;
    assert_mcp_error(&r, &rpc_id("h-2"), "SHUTTING_DOWN", Some("h-2"));
    assert_ready(
        &tokio::time::timeout(Duration::from_secs(10), in_flight)
            .await
            .expect("the call in flight finished")
            .expect("task"),
        "h-1",
        "EVIDENCE_FOUND",
    );
    let ran = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the sidecar drained")
        .expect("run task");
    assert!(ran.is_ok(), "{ran:?}");
}

// ---------------------------------------------------------------------------------------------
// One pipeline for both call forms.

/// A call over MCP and the same call over `/v1/invoke` leave records of the same shape, equal
/// but for ids and times, answer the same agent result, and both appear in the facts in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_and_invoke_leave_the_same_record() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let q = json!({"q": "same"});
    let m1 = assert_mcp_ready(
        &mcp_call(&env, &run, "m-1", "search", q.clone()).await,
        "m-1",
        "EVIDENCE_FOUND",
    );
    let v1 = assert_ready(
        &env.call(&run, "v-1", "search", q.clone()).await,
        "v-1",
        "EVIDENCE_FOUND",
    );
    let m2 = assert_mcp_ready(
        &mcp_call(&env, &run, "m-2", "mcp_search_sse", q.clone()).await,
        "m-2",
        "EVIDENCE_FOUND",
    );
    let v2 = assert_ready(
        &env.call(&run, "v-2", "mcp_search_sse", q.clone()).await,
        "v-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &run, "m-3", "fail", json!({})).await;
    assert_mcp_error(&r, &rpc_id("m-3"), "TOOL_EXECUTION_FAILED", Some("m-3"));
    assert_error(
        &env.call(&run, "v-3", "fail", json!({})).await,
        502,
        "TOOL_EXECUTION_FAILED",
        Some("v-3"),
    );
    assert_eq!(m1, v1);
    assert_eq!(m2, v2);
    assert_eq!(m2, upstream_search_result("same"));

    for (m, v) in [("m-1", "v-1"), ("m-2", "v-2"), ("m-3", "v-3")] {
        let a = env.record_ok(&run.id, m).await;
        let b = env.record_ok(&run.id, v).await;
        let keys = |r: &Value| -> Vec<String> {
            r.as_object()
                .expect("record")
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&a), keys(&b), "{m}/{v}: record keys");
        assert_eq!(a["tool_call_id"], m);
        assert_eq!(b["tool_call_id"], v);
        for field in [
            "schema",
            "run_id",
            "tool",
            "status",
            "evidence_status",
            "request",
            "agent_result",
            "error_code",
            "upstream_status",
        ] {
            assert_eq!(a[field], b[field], "{m}/{v}: {field}");
        }
        let (mut ra, mut rb) = (a["raw_response"].clone(), b["raw_response"].clone());
        // The upstream echoes the ids it got in `seen`, and in the text of its result.
        for (raw, id) in [(&mut ra, m), (&mut rb, v)] {
            if raw.get("structuredContent").is_some() {
                assert_eq!(
                    raw["structuredContent"]["seen"],
                    json!({"run_id": run.id, "tool_call_id": id}),
                    "{raw}"
                );
                let object = raw.as_object_mut().expect("object");
                object.remove("content");
                if let Some(Value::Object(sc)) = object.get_mut("structuredContent") {
                    sc.remove("seen");
                }
            }
        }
        assert_eq!(ra, rb, "{m}/{v}: raw_response");
        for r in [&a, &b] {
            assert!(r["created_at"].is_string() && r["duration_ms"].is_u64());
        }
    }
    assert_eq!(fact_ids(&env, &run.id).await, ["m-1", "v-1", "m-2", "v-2"]);
    assert_eq!(env.facts(&run.id).await["excluded"], 2);
    assert_eq!(env.view(&run.id).await["calls_used"], 6);
}

/// 16 concurrent `tools/call` with one tool_call_id: one executes, 15 are duplicates.
async fn concurrent_calls_with_one_id(store_yaml: String) {
    let env = mcp_env(&store_yaml, "").await;
    let run = env.run(json!({})).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let msg = call_msg(
                rpc_id("same"),
                "slow",
                Some(json!({"sleep_ms": 300})),
                Some(&run.id),
                Some("same"),
            );
            rpc(&sc, &run.token, msg).await
        }));
    }
    let (mut ready, mut duplicate) = (0, 0);
    for task in tasks {
        let r = task.await.expect("task");
        let result = assert_rpc_result(&r, &rpc_id("same"));
        if result["isError"] == false {
            assert_mcp_ready(&r, "same", "EVIDENCE_FOUND");
            ready += 1;
        } else {
            assert_mcp_error(&r, &rpc_id("same"), "DUPLICATE_TOOL_CALL", Some("same"));
            duplicate += 1;
        }
    }
    assert_eq!((ready, duplicate), (1, 15));
    assert_eq!(env.fake.calls("slow").len(), 1, "exactly one call executed");
    assert_eq!(env.view(&run.id).await["calls_used"], 1);
    assert_eq!(fact_ids(&env, &run.id).await, ["same"]);
}

// ---------------------------------------------------------------------------------------------
// An upstream stream that never ends.

/// A hand-made MCP upstream: `initialize` as usual, then every `tools/call` is answered with an
/// SSE stream of progress notifications that never sends the response: `/flood` as fast as the
/// reader takes them (16 KiB each), `/trickle` one small event every 50 ms. It keeps the
/// JSON-RPC methods it received per path, and counts the bytes it sent and the streams that
/// ended.
#[derive(Clone)]
struct EndlessMcp {
    addr: SocketAddr,
    /// (path, JSON-RPC method) of every request, in order.
    received: Arc<Mutex<Vec<(String, String)>>>,
    sent: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
}

/// Where an endless stream stops by itself, so a client that never stops reading cannot hang
/// the test.
const ENDLESS_SAFETY_STOP: u64 = 256 << 20;

impl EndlessMcp {
    async fn start() -> EndlessMcp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let up = EndlessMcp {
            addr: listener.local_addr().expect("addr"),
            received: Arc::default(),
            sent: Arc::default(),
            closed: Arc::default(),
        };
        let u = up.clone();
        serve_http1(listener, move |req| {
            let u = u.clone();
            async move { u.answer(req).await }
        });
        up
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The methods received on `path`, in order.
    fn received(&self, path: &str) -> Vec<String> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .collect()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<SseBody> {
        let path = req.uri().path().to_string();
        let bytes = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let msg: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let method = msg["method"].as_str().unwrap_or("?").to_string();
        self.received
            .lock()
            .expect("lock")
            .push((path.clone(), method));
        let Some(id) = msg.get("id").cloned() else {
            let mut r = Response::new(SseBody::Full(None));
            *r.status_mut() = hyper::StatusCode::ACCEPTED;
            return r;
        };
        let json_answer = |v: Value| {
            let mut r = Response::new(SseBody::Full(Some(Bytes::from(v.to_string()))));
            r.headers_mut()
                .insert("content-type", "application/json".parse().expect("ct"));
            r
        };
        match msg["method"].as_str() {
            Some("initialize") => {
                let version = msg["params"]["protocolVersion"]
                    .as_str()
                    .unwrap_or("2025-11-25");
                json_answer(json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": version, "capabilities": {"tools": {}},
                    "serverInfo": {"name": "endless", "version": "1.0.0"}}}))
            }
            Some("tools/call") => {
                let pace = (path == "/trickle").then_some(Duration::from_millis(50));
                let mut r = Response::new(SseBody::Endless(Endless {
                    pace,
                    timer: None,
                    n: 0,
                    sent: self.sent.clone(),
                    closed: self.closed.clone(),
                }));
                r.headers_mut()
                    .insert("content-type", "text/event-stream".parse().expect("ct"));
                r
            }
            _ => json_answer(
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}}),
            ),
        }
    }
}

/// A complete body, or the endless event stream.
enum SseBody {
    Full(Option<Bytes>),
    Endless(Endless),
}

struct Endless {
    pace: Option<Duration>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    n: u64,
    sent: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
}

impl Drop for Endless {
    fn drop(&mut self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SseBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SseBody::Endless(e) => {
                if let Some(pace) = e.pace {
                    let timer = e
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(pace)));
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    e.timer = None;
                }
                e.n += 1;
                let pad = if e.pace.is_some() { 0 } else { 16 * 1024 };
                let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": "endless", "progress": e.n, "message": "x".repeat(pad)}});
                let event = format!("event: message\r\ndata: {note}\r\n\r\n");
                if e.sent.fetch_add(event.len() as u64, Ordering::SeqCst) > ENDLESS_SAFETY_STOP {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
            }
        }
    }
}

/// An SSE answer that never sends the response: RESULT_TOO_LARGE once raw_bytes are read,
/// TOOL_TIMEOUT once timeout_ms passed; either way toolgate stops reading, so the upstream stops
/// sending far below its safety stop, and the handshake is done once per upstream URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_event_stream_is_cut() {
    let up = EndlessMcp::start().await;
    let extra = format!(
        "  - {{name: mcp_flood, upstream: \"{}\", protocol: mcp, read_only: true, timeout_ms: 20000, limits: {{raw_bytes: 65536}}}}\n\
         \x20 - {{name: mcp_trickle, upstream: \"{}\", protocol: mcp, read_only: true, timeout_ms: 500}}\n",
        up.url("/flood"),
        up.url("/trickle")
    );
    let env = mcp_env(&store_yaml(None), &extra).await;
    let run = env.run(json!({})).await;

    for (n, id) in ["e-1", "e-2"].into_iter().enumerate() {
        let started = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(15),
            mcp_call(&env, &run, id, "mcp_flood", json!({})),
        )
        .await
        .expect("the flooded call answered");
        assert_mcp_error(&r, &rpc_id(id), "RESULT_TOO_LARGE", Some(id));
        assert!(started.elapsed() < Duration::from_secs(10));
        let d = Deadline::after(Duration::from_secs(10), "the flood stream to be dropped");
        while up.closed.load(Ordering::SeqCst) < n as u64 + 1 {
            d.tick().await;
        }
        let rec = env.record_ok(&run.id, id).await;
        assert_eq!(rec["error_code"], "RESULT_TOO_LARGE");
        assert_eq!(rec["raw_response"], Value::Null, "{rec}");
    }
    let sent = up.sent.load(Ordering::SeqCst);
    assert!(
        sent < 32 << 20,
        "the upstream pushed {sent} bytes: reading did not stop"
    );
    assert_eq!(
        up.received("/flood"),
        [
            "initialize",
            "notifications/initialized",
            "tools/call",
            "tools/call"
        ],
        "one handshake per upstream URL, then the calls"
    );

    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        mcp_call(&env, &run, "t-1", "mcp_trickle", json!({})),
    )
    .await
    .expect("the trickled call answered");
    assert_mcp_error(&r, &rpc_id("t-1"), "TOOL_TIMEOUT", Some("t-1"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let d = Deadline::after(Duration::from_secs(10), "the trickle stream to be dropped");
    while up.closed.load(Ordering::SeqCst) < 3 {
        d.tick().await;
    }
    assert_eq!(
        env.record_ok(&run.id, "t-1").await["error_code"],
        "TOOL_TIMEOUT"
    );
    assert_eq!(
        up.received("/trickle"),
        ["initialize", "notifications/initialized", "tools/call"]
    );
    assert!(
        up.sent.load(Ordering::SeqCst) < 32 << 20,
        "memory stays bounded"
    );
    // The sidecar is still fine.
    assert_mcp_ready(
        &mcp_call(&env, &run, "ok-1", "search", json!({"q": "x"})).await,
        "ok-1",
        "EVIDENCE_FOUND",
    );
}

// ---------------------------------------------------------------------------------------------
// The upstream token.

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

// ---------------------------------------------------------------------------------------------
// Metrics.

/// `toolgate_mcp_requests_total{method, outcome}` counts every MCP request, and a tools/call is
/// counted like a `/v1/invoke` call too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_requests_are_counted() {
    let env = mcp_env(&store_yaml(None), "").await;
    let run = env.run(json!({})).await;
    let sc = &env.sc;
    let t = run.token.as_str();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    assert_rpc_result(&rpc(sc, t, init).await, &json!(1));
    for _ in 0..2 {
        let (r, _) = post(
            sc,
            Some(t),
            &[],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        )
        .await;
        assert_eq!(r.status, 202);
    }
    assert_rpc_result(
        &rpc(sc, t, json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await,
        &json!(2),
    );
    assert_rpc_result(
        &rpc(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await,
        &json!(3),
    );
    assert_rpc_result(
        &rpc_stateless(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 4, "method": "server/discover"}),
        )
        .await,
        &json!(4),
    );
    assert_rpc_result(
        &rpc_stateless(
            sc,
            t,
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        )
        .await,
        &json!(5),
    );
    assert_mcp_ready(
        &mcp_call(&env, &run, "k-1", "search", json!({"q": "x"})).await,
        "k-1",
        "EVIDENCE_FOUND",
    );
    assert_mcp_ready(
        &mcp_call(&env, &run, "k-2", "mcp_search", json!({"q": "x"})).await,
        "k-2",
        "EVIDENCE_FOUND",
    );
    let r = mcp_call(&env, &run, "k-3", "nope-zz9", json!({})).await;
    assert_mcp_error(&r, &rpc_id("k-3"), "UNKNOWN_TOOL", Some("k-3"));
    let r = mcp_call(&env, &run, "k-4", "fail", json!({})).await;
    assert_mcp_error(&r, &rpc_id("k-4"), "TOOL_EXECUTION_FAILED", Some("k-4"));
    let (r, _) = post(
        sc,
        Some(t),
        &[],
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{}}"#,
    )
    .await;
    assert_rpc_error(&r, 200, &json!(6), -32602);
    let (r, _) = post(
        sc,
        Some(t),
        &[],
        r#"{"jsonrpc":"2.0","id":7,"method":"prompts/list"}"#,
    )
    .await;
    assert_rpc_error(&r, 200, &json!(7), -32601);
    let (r, _) = post(sc, Some(t), &[], "{oops").await;
    assert_rpc_error(&r, 200, &Value::Null, -32700);

    let text = sc.metrics().await;
    let m = |method: &str, outcome: &str| {
        metric(
            &text,
            "toolgate_mcp_requests_total",
            &[("method", method), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    for (method, outcome, n) in [
        ("initialize", "ok", 1.0),
        ("initialize", "error", 0.0),
        ("notification", "ok", 2.0),
        ("ping", "ok", 1.0),
        ("tools/list", "ok", 2.0),
        ("server/discover", "ok", 1.0),
        ("tools/call", "ok", 2.0),
        ("tools/call", "error", 3.0),
        ("_other", "error", 2.0),
        ("_other", "ok", 0.0),
    ] {
        assert_eq!(m(method, outcome), n, "{method} {outcome}:\n{text}");
    }
    // The calls are counted like any call.
    let ready = [("status", "READY"), ("evidence_status", "EVIDENCE_FOUND")];
    for tool in ["search", "mcp_search"] {
        let mut labels = vec![("tool", tool)];
        labels.extend(ready);
        assert_eq!(
            metric(&text, "toolgate_invocations_total", &labels),
            Some(1.0),
            "{tool}"
        );
    }
    assert_eq!(
        metric(
            &text,
            "toolgate_preflight_rejections_total",
            &[("tool", "_unknown"), ("code", "UNKNOWN_TOOL")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_invocations_total",
            &[("tool", "fail"), ("status", "ERROR")]
        ),
        Some(1.0)
    );
    // No id in any label.
    for id in [run.id.as_str(), "k-1", "nope-zz9"] {
        assert!(!text.contains(id), "{id} in the metrics");
    }
}

// ---------------------------------------------------------------------------------------------
// Traces of an MCP upstream call.

/// With an `otel` key, the upstream span of an MCP tool is `tools/call <remote_name>` with the MCP
/// attributes, and the upstream gets that span as `_meta.traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_spans_of_an_mcp_upstream_call() {
    let collector = crate::support::otlp::Collector::start().await;
    let store = format!(
        "{}otel: {{endpoint: \"{}\"}}\n",
        store_yaml(None),
        collector.endpoint()
    );
    let env = mcp_env(&store, "").await;
    let ups = upstreams().await;
    let run = env.run(json!({})).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = json!({"run_id": run.id, "tool_call_id": "otel-mcp-1", "tool": "mcp_search", "input": {"q": "mcp"}});
    let r = env
        .sc
        .invoke_raw(
            Some(&run.token),
            body.to_string(),
            &[("traceparent", TRACEPARENT)],
        )
        .await;
    assert_ready(&r, "otel-mcp-1", "EVIDENCE_FOUND");
    let d = Deadline::after(
        Duration::from_secs(15),
        "the spans of the MCP upstream call",
    );
    let spans = loop {
        let spans = collector.trace(trace);
        if spans.len() >= 4 {
            break spans;
        }
        d.tick().await;
    };
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let root = spans
        .iter()
        .find(|s| s.span.name == "execute_tool mcp_search")
        .expect("the call's span");
    let upstream = spans
        .iter()
        .find(|s| s.span.name == "tools/call search")
        .expect("the upstream span");
    assert_eq!(upstream.span.kind, 3, "CLIENT");
    assert_eq!(upstream.parent_span_id(), root.span_id());
    let call = &ups.json.calls_of(&run.id)["otel-mcp-1"];
    for (key, value) in [
        ("mcp.method.name", "tools/call".to_string()),
        ("gen_ai.tool.name", "search".to_string()),
        ("gen_ai.operation.name", "execute_tool".to_string()),
        ("jsonrpc.request.id", call["body"]["id"].to_string()),
        ("http.response.status_code", "200".to_string()),
    ] {
        assert_eq!(upstream.attr(key), Some(value), "{key}: {upstream:#?}");
    }
    assert!(
        upstream
            .attr("mcp.protocol.version")
            .is_some_and(|v| !v.is_empty())
    );
    assert_eq!(
        call["body"]["params"]["_meta"]["traceparent"],
        format!("00-{trace}-{}-01", upstream.span_id()),
        "the upstream's parent is toolgate's upstream span"
    );
}
