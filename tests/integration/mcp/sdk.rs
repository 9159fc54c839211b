//! The official MCP SDKs: where they are (a missing one fails with the command that installs
//! it), the Python SDK upstream every test shares, and the SDK clients run as processes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

use super::{RUN_ID_KEY, STATELESS, TOOL_CALL_ID_KEY};
use crate::support::fake_tool::RAW_MARKER;
use crate::support::{Deadline, temp_dir, unique};

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
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("blocking task: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The Python SDK upstream (tests/mcp/upstream.py).

/// One `upstream.py` process: a stateless MCP server on a free loopback port.
pub(super) struct PyUpstream {
    port: u16,
    log: PathBuf,
    proc: Mutex<Proc>,
}

impl PyUpstream {
    /// Starts it (blocking: waits for its `LISTENING <port>` line).
    pub(super) fn spawn(mode: &str, token_file: &Path) -> PyUpstream {
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

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every request it received, as logged: `{http_method, path, authorization,
    /// protocol_version, session_id, body}`.
    pub(super) fn seen(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The `tools/call` requests it received for this run, by tool_call_id.
    pub(super) fn calls_of(&self, run_id: &str) -> BTreeMap<String, Value> {
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

    pub(super) fn stderr(&self) -> String {
        self.proc.lock().expect("lock").stderr()
    }
}

/// The upstreams every test shares: the same server in JSON and in SSE mode, both expecting
/// `Authorization: Bearer <token>` (from `token_file`, which the tools send).
pub(super) struct Upstreams {
    pub(super) json: PyUpstream,
    pub(super) sse: PyUpstream,
    pub(super) token: String,
    pub(super) token_file: PathBuf,
}

pub(super) async fn upstreams() -> &'static Upstreams {
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
pub(super) enum Sdk {
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
    pub(super) fn version(self) -> &'static str {
        match self {
            Sdk::PythonAuto => STATELESS,
            Sdk::PythonLegacy | Sdk::Node => "2025-11-25",
        }
    }

    pub(super) fn stateless(self) -> bool {
        self == Sdk::PythonAuto
    }
}

/// Runs an SDK client against `url` (60 s deadline) and returns the JSON line it printed.
pub(super) async fn run_client(
    sdk: Sdk,
    url: &str,
    token: &str,
    run_id: &str,
    calls: &Value,
) -> Value {
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
