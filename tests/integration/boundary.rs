//! The harness of the cases that drive a whole sidecar (the `preflight`, `execution`,
//! `projection`, `runs`, `metrics`, `reload` and `drain` modules): [`Env`] is one sidecar with the
//! standard tools in front of its own fake tool service, [`Req`] a hand-built agent request, and
//! the `assert_*` functions check answers and records against the contract.
//!
//! A case is an `async fn case(store_yaml: String)` that starts its own [`Env`] with that store
//! section; `on_both_stores!(case, ...)` turns each one into two tests, `case::memory` and
//! `case::redis`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use toolgate::error::CodeName;

use crate::support::fake_tool::{FakeTool, RAW_MARKER};
use crate::support::sidecar::{Reply, Sidecar};
use crate::support::{Deadline, unique};

/// For each case `async fn case(store_yaml: String)` of the calling module, a module `case` with
/// two tests: `memory` runs it on the embedded memory store, `redis` on the shared Redis Cluster.
macro_rules! on_both_stores {
    ($($case:ident),+ $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$case($crate::support::store_yaml(None)).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    let nodes = $crate::support::redis_cluster::shared().urls();
                    super::$case($crate::support::store_yaml(Some(&nodes))).await;
                }
            }
        )+
    };
}
pub(crate) use on_both_stores;

// ---------------------------------------------------------------------------------------------
// The sidecar and its standard tools.

/// Strings no agent- or admin-facing error body may contain.
const LEAKS: [&str; 4] = [RAW_MARKER, "127.0.0.1", "toolgate:{", "redis"];

const SEARCH_SCHEMA: &str =
    "{type: object, required: [q], properties: {q: {type: string, maxLength: 512}}}";

/// One sidecar with the standard tools, in front of its own fake tool service.
pub struct Env {
    pub sc: Arc<Sidecar>,
    pub fake: FakeTool,
    /// The config file as first written; `tools` is its last section.
    pub config: String,
}

/// A created run and its token.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: String,
    pub token: String,
}

/// The standard config: every fake route as a tool, plus the variants the cases need.
fn standard_config(store_yaml: &str, fake: &FakeTool) -> String {
    let closed = closed_port();
    let ro = "read_only: true";
    let tool = |name: &str, url: String, extra: &str| {
        format!("  - {{name: \"{name}\", upstream: \"{url}\", {extra}}}\n")
    };
    let mut tools = String::new();
    tools += &tool(
        "search",
        fake.url("search"),
        &format!(
            "{ro}, timeout_ms: 5000, input_schema: {SEARCH_SCHEMA}, limits: {{request_bytes: 4096}}, \
             projection: {{select: /results, max_items: 5, fields: [title, url, snippet]}}"
        ),
    );
    tools += &tool(
        "tiny",
        fake.url("object"),
        &format!(
            "{ro}, limits: {{request_bytes: 200}}, projection: {{select: /results, fields: [title]}}"
        ),
    );
    tools += &tool("writer", fake.url("echo"), "read_only: false");
    tools += &tool(
        "slow",
        fake.url("slow"),
        &format!(
            "{ro}, timeout_ms: 30000, projection: {{select: /results, max_items: 1, fields: [title]}}"
        ),
    );
    tools += &tool(
        "slowtimeout",
        fake.url("slow"),
        &format!("{ro}, timeout_ms: 300, projection: {{select: /results}}"),
    );
    for route in [
        "empty",
        "null",
        "scalar",
        "unresolved",
        "fail",
        "notjson",
        "big",
        "bigfail",
    ] {
        tools += &tool(
            route,
            fake.url(route),
            &format!("{ro}, projection: {{select: /results}}"),
        );
    }
    tools += &tool(
        "object",
        fake.url("object"),
        &format!("{ro}, projection: {{select: /results, fields: [title, url]}}"),
    );
    tools += &tool(
        "unreachable",
        format!("http://127.0.0.1:{closed}/search"),
        &format!("{ro}, projection: {{select: /results}}"),
    );
    tools += &tool(
        "wide",
        fake.url("wide"),
        &format!("{ro}, limits: {{agent_bytes: 4096}}, projection: {{select: /results}}"),
    );
    tools += &tool(
        "echo",
        fake.url("echo"),
        &format!("{ro}, projection: {{select: /results, fields: [input]}}"),
    );
    tools += &tool(
        "utf8",
        fake.url("utf8"),
        &format!("{ro}, projection: {{select: /results}}"),
    );
    tools += &tool(
        "utf8small",
        fake.url("utf8"),
        &format!("{ro}, limits: {{agent_bytes: 8000}}, projection: {{select: /results}}"),
    );
    tools += &tool(
        "endless",
        fake.url("endless"),
        &format!("{ro}, timeout_ms: 20000"),
    );
    tools += &tool(
        "tinyrecord",
        fake.url("search"),
        &format!(
            "{ro}, limits: {{record_bytes: 400}}, projection: {{select: /results, max_items: 1, fields: [title]}}"
        ),
    );
    tools += &tool(
        "deep",
        fake.url("deep"),
        &format!("{ro}, projection: {{select: /results}}"),
    );
    // Parameter roles: a file reader and a fetcher, both answered by the echo route.
    tools += &tool(
        "read_file",
        fake.url("echo"),
        &format!(
            "{ro}, input_schema: {{type: object, properties: {{mode: {{enum: [text]}}}}}}, \
             params: {{/path: path, /against: source_path, /paths/*: path}}, \
             read_roots: [/usr/share/doc], projection: {{select: /results, fields: [input]}}"
        ),
    );
    tools += &tool(
        "fetch",
        fake.url("echo"),
        &format!(
            "{ro}, params: {{/url: network_target}}, network: {{allow_hosts: [example.com, '*.example.org']}}, \
             projection: {{select: /results, fields: [input]}}"
        ),
    );
    format!(
        "{store_yaml}limits: {{request_bytes: 1024}}\n\
         runs: {{default_timeout_ms: 60000, max_timeout_ms: 120000, default_max_calls: 50}}\n\
         tools:\n{tools}"
    )
}

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Env {
    /// A sidecar on this store section with the standard tools, in front of a new fake tool
    /// service.
    pub async fn start(store_yaml: &str) -> Env {
        let fake = FakeTool::start().await;
        let config = standard_config(store_yaml, &fake);
        let sc = Arc::new(Sidecar::start(&config).await);
        Env { sc, fake, config }
    }

    /// Creates a run with a unique id; `extra` adds fields to the create body.
    pub async fn run(&self, extra: Value) -> Run {
        let id = unique("run");
        let mut body = json!({ "run_id": id });
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        let token = self.sc.create_run(body).await;
        Run { id, token }
    }

    /// An envelope call on `run`.
    pub async fn call(&self, run: &Run, id: &str, tool: &str, input: Value) -> Reply {
        self.sc.invoke(&run.token, &run.id, id, tool, input).await
    }

    /// A call on `run` to `slow` (whose tool sleeps `sleep_ms`), sent in the background; returns
    /// once the tool has received it, with the task that gets the reply.
    pub async fn slow_call_in_flight(
        &self,
        run: &Run,
        id: &str,
        sleep_ms: u64,
    ) -> JoinHandle<Reply> {
        let before = self.fake.calls("slow").len();
        let (sc, run, id) = (self.sc.clone(), run.clone(), id.to_string());
        let input = json!({"sleep_ms": sleep_ms});
        let call =
            tokio::spawn(async move { sc.invoke(&run.token, &run.id, &id, "slow", input).await });
        wait_calls(&self.fake, "slow", before + 1).await;
        call
    }

    /// An intercept call on `run`.
    pub async fn intercept(
        &self,
        run: &Run,
        id: &str,
        tool: &str,
        body: impl Into<Vec<u8>>,
    ) -> Reply {
        self.sc
            .intercept(&run.token, &run.id, id, tool, body.into())
            .await
    }

    /// `GET /v1/runs/{run}/invocations/{id}`.
    pub async fn record(&self, run_id: &str, id: &str) -> Reply {
        self.sc
            .admin("GET", &format!("/v1/runs/{run_id}/invocations/{id}"), None)
            .await
    }

    /// The stored record; fails unless it exists.
    pub async fn record_ok(&self, run_id: &str, id: &str) -> Value {
        let r = self.record(run_id, id).await;
        assert_eq!(r.status, 200, "record {id}: {}", r.raw);
        r.body
    }

    /// Asserts that no record exists for `id`.
    pub async fn no_record(&self, run_id: &str, id: &str) {
        let r = self.record(run_id, id).await;
        assert_admin_error(&r, 404, "NOT_FOUND");
    }

    /// `GET /v1/runs/{run}`; fails unless 200.
    pub async fn view(&self, run_id: &str) -> Value {
        let r = self
            .sc
            .admin("GET", &format!("/v1/runs/{run_id}"), None)
            .await;
        assert_eq!(r.status, 200, "get run: {}", r.raw);
        r.body
    }

    /// `GET /v1/runs/{run}/facts`; fails unless 200.
    pub async fn facts(&self, run_id: &str) -> Value {
        let r = self
            .sc
            .admin("GET", &format!("/v1/runs/{run_id}/facts"), None)
            .await;
        assert_eq!(r.status, 200, "facts: {}", r.raw);
        r.body
    }

    /// An admin `POST` with no body.
    pub async fn admin_post(&self, path: &str) -> Reply {
        self.sc.admin("POST", path, None).await
    }

    /// Sends a hand-built agent request.
    pub async fn send(&self, req: &Req) -> Reply {
        let headers: Vec<(&str, &str)> = req
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.sc
            .send(
                "POST",
                format!("http://{}{}", self.sc.agent, req.path),
                req.token.as_deref(),
                &headers,
                req.body.clone(),
            )
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-built agent requests.

/// A hand-built agent request.
#[derive(Debug, Clone)]
pub struct Req {
    path: String,
    token: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    /// The same request with another token (`None`: no `Authorization` header).
    pub fn with_token(mut self, token: Option<&str>) -> Req {
        self.token = token.map(str::to_string);
        self
    }
}

/// `POST /v1/invoke` with this body, as is.
pub fn envelope(token: Option<&str>, body: impl Into<Vec<u8>>) -> Req {
    Req {
        path: "/v1/invoke".into(),
        token: token.map(str::to_string),
        headers: Vec::new(),
        body: body.into(),
    }
}

/// `POST /v1/invoke` with this JSON body.
pub fn envelope_json(token: Option<&str>, body: Value) -> Req {
    envelope(token, body.to_string())
}

/// `POST /tools/{tool}` with the body as the input; `X-Run-Id` and `X-Tool-Call-Id` when given.
pub fn intercept(
    token: Option<&str>,
    tool: &str,
    run_id: Option<&str>,
    id: Option<&str>,
    body: impl Into<Vec<u8>>,
) -> Req {
    let mut headers = Vec::new();
    if let Some(r) = run_id {
        headers.push(("x-run-id".to_string(), r.to_string()));
    }
    if let Some(i) = id {
        headers.push(("x-tool-call-id".to_string(), i.to_string()));
    }
    Req {
        path: format!("/tools/{tool}"),
        token: token.map(str::to_string),
        headers,
        body: body.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Assertions and waits.

/// Checks that no error body leaks a payload, a host, a key or a backend name.
pub fn assert_no_leak(r: &Reply) {
    for leak in LEAKS {
        assert!(
            !r.raw.contains(leak),
            "error body leaks {leak:?}: {}",
            r.raw
        );
    }
}

/// Checks an agent error answer: status, code, fixed message, echoed id, nothing leaked.
#[track_caller]
pub fn assert_error(r: &Reply, status: u16, code: &str, echo: Option<&str>) {
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (status, Some(code)),
        "expected {status} {code}: {}",
        r.raw
    );
    let fixed = CodeName::parse(code).expect("a contract code").message();
    let keys: Vec<&String> = r.body.as_object().expect("error object").keys().collect();
    assert_eq!(keys, ["status", "tool_call_id", "error"], "{}", r.raw);
    assert_eq!(r.body["status"], "ERROR", "{}", r.raw);
    assert_eq!(r.body["error"]["message"], fixed, "{}", r.raw);
    assert_eq!(r.body["tool_call_id"], json!(echo), "echoed id: {}", r.raw);
    assert_no_leak(r);
}

#[track_caller]
pub fn assert_admin_error(r: &Reply, status: u16, code: &str) {
    assert_error(r, status, code, None);
}

/// Checks a READY answer and returns its result.
#[track_caller]
pub fn assert_ready(r: &Reply, id: &str, evidence: &str) -> Value {
    assert_eq!(r.status, 200, "expected READY: {}", r.raw);
    let keys: Vec<&String> = r.body.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["status", "tool_call_id", "evidence_status", "result"],
        "{}",
        r.raw
    );
    assert_eq!(r.body["status"], "READY");
    assert_eq!(r.body["tool_call_id"], id);
    assert_eq!(r.body["evidence_status"], evidence, "{}", r.raw);
    assert!(
        !r.raw.contains(RAW_MARKER),
        "READY leaks raw data: {}",
        r.raw
    );
    r.body["result"].clone()
}

/// Checks an ERROR record: its code, and which of raw and agent result it kept.
#[track_caller]
pub fn assert_error_record(rec: &Value, code: &str, raw: Option<&Value>) {
    assert_eq!(rec["status"], "ERROR", "{rec}");
    assert_eq!(rec["evidence_status"], "ERROR", "{rec}");
    assert_eq!(rec["error_code"], code, "{rec}");
    assert_eq!(rec["agent_result"], Value::Null, "{rec}");
    match raw {
        Some(raw) => assert_eq!(&rec["raw_response"], raw, "{rec}"),
        None => assert_eq!(rec["raw_response"], Value::Null, "{rec}"),
    }
}

/// Waits until the fake tool has received `n` requests on `route`.
pub async fn wait_calls(fake: &FakeTool, route: &str, n: usize) {
    let d = Deadline::after(Duration::from_secs(10), format!("{n} calls on /{route}"));
    while fake.calls(route).len() < n {
        d.tick().await;
    }
}
