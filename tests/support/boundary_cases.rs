//! The boundary integration cases, independent of the store: each case starts its own
//! sidecar, with the store section it is given, in front of its own fake tools.
//! `boundary_cases!(store_expr)` expands into one test per case.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate::auth::Tokens;
use toolgate::clock;
use toolgate::error::Code;

use super::fake_tool::{FakeTool, RAW_MARKER};
use super::sidecar::{ADMIN_TOKEN, Reply, Sidecar, metric};
use super::{Deadline, unique};

/// Expands into one multi-thread tokio test per boundary case. `$store` is evaluated inside
/// each test (it may `.await`) and yields the store section of the config, e.g.
/// `support::store_yaml(None)`.
#[macro_export]
macro_rules! boundary_cases {
    ($store:expr) => {
        $crate::boundary_cases!(@each $store;
            preflight_checks_in_order,
            reservation_checks,
            first_failing_check_wins,
            call_forms_answer_identically,
            ready_results_are_bounded_projections,
            tool_failures_keep_a_diagnosis,
            tool_timeout,
            result_too_large_at_every_stage,
            run_record_bytes_budget,
            projection_failed,
            endless_body_stops_reading,
            utf8_limits_count_bytes,
            forwarding_headers_and_input,
            deadline_during_call,
            cancel_during_call,
            end_during_call_lets_it_finish,
            concurrent_duplicate_ids_have_one_winner,
            concurrent_calls_never_overspend,
            admin_runs_api,
            facts_in_completion_order,
            invocation_record_shape,
            failure_attribution,
            metrics_exposition,
            hot_reload,
            graceful_shutdown,
        );
    };
    (@each $store:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let store_yaml: String = $store;
                $crate::support::boundary_cases::$case(store_yaml).await;
            }
        )+
    };
}

// ---------------------------------------------------------------------------------------------
// Harness.

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

/// What a run has spent so far, to prove a rejection spent nothing.
#[derive(Debug, Clone, PartialEq)]
struct Spent {
    tool_calls: usize,
    calls_used: Value,
    record_bytes_used: Value,
    progress: u64,
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

    pub async fn call(&self, run: &Run, id: &str, tool: &str, input: Value) -> Reply {
        self.sc.invoke(&run.token, &run.id, id, tool, input).await
    }

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

    pub async fn facts(&self, run_id: &str) -> Value {
        let r = self
            .sc
            .admin("GET", &format!("/v1/runs/{run_id}/facts"), None)
            .await;
        assert_eq!(r.status, 200, "facts: {}", r.raw);
        r.body
    }

    async fn spent(&self, run: &Run) -> Spent {
        let v = self.view(&run.id).await;
        let f = self.facts(&run.id).await;
        Spent {
            tool_calls: self.fake.total_calls(),
            calls_used: v["calls_used"].clone(),
            record_bytes_used: v["record_bytes_used"].clone(),
            progress: f["facts"].as_array().expect("facts").len() as u64
                + f["excluded"].as_u64().expect("excluded"),
        }
    }

    pub async fn admin_post(&self, path: &str) -> Reply {
        self.sc.admin("POST", path, None).await
    }

    /// Sends a hand-built agent request.
    async fn send(&self, req: &Req) -> Reply {
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

/// A hand-built agent request.
#[derive(Debug, Clone)]
struct Req {
    path: String,
    token: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn envelope(token: Option<&str>, body: impl Into<Vec<u8>>) -> Req {
    Req {
        path: "/v1/invoke".into(),
        token: token.map(str::to_string),
        headers: Vec::new(),
        body: body.into(),
    }
}

fn envelope_json(token: Option<&str>, body: Value) -> Req {
    envelope(token, body.to_string())
}

fn intercept(
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

/// An envelope body of at least `len` bytes (padding inside the input).
fn padded(run_id: &str, id: &str, tool: &str, len: usize) -> Vec<u8> {
    let input = padded_input(len);
    json!({"run_id": run_id, "tool_call_id": id, "tool": tool, "input": input})
        .to_string()
        .into_bytes()
}

/// An input object of at least `len` bytes once serialized.
fn padded_input(len: usize) -> Value {
    json!({"q": "redis", "pad": "p".repeat(len)})
}

/// Checks that no error body leaks a payload, a host, a key or a backend name.
fn assert_no_leak(r: &Reply) {
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
fn assert_error(r: &Reply, status: u16, code: &str, echo: Option<&str>) {
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (status, Some(code)),
        "expected {status} {code}: {}",
        r.raw
    );
    let fixed = Code::parse(code).expect("a contract code").message();
    let keys: Vec<&String> = r.body.as_object().expect("error object").keys().collect();
    assert_eq!(keys, ["status", "tool_call_id", "error"], "{}", r.raw);
    assert_eq!(r.body["status"], "ERROR", "{}", r.raw);
    assert_eq!(r.body["error"]["message"], fixed, "{}", r.raw);
    assert_eq!(r.body["tool_call_id"], json!(echo), "echoed id: {}", r.raw);
    assert_no_leak(r);
}

#[track_caller]
fn assert_admin_error(r: &Reply, status: u16, code: &str) {
    assert_error(r, status, code, None);
}

/// Checks a READY answer and returns its result.
#[track_caller]
fn assert_ready(r: &Reply, id: &str, evidence: &str) -> Value {
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
fn assert_error_record(rec: &Value, code: &str, raw: Option<&Value>) {
    assert_eq!(rec["status"], "ERROR", "{rec}");
    assert_eq!(rec["evidence_status"], "ERROR", "{rec}");
    assert_eq!(rec["error_code"], code, "{rec}");
    assert_eq!(rec["agent_result"], Value::Null, "{rec}");
    match raw {
        Some(raw) => assert_eq!(&rec["raw_response"], raw, "{rec}"),
        None => assert_eq!(rec["raw_response"], Value::Null, "{rec}"),
    }
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

/// Waits (polling the wall clock) until epoch millisecond `ms` has passed.
async fn wait_past(ms: u64) {
    let d = Deadline::after(Duration::from_secs(10), "the wall clock");
    while clock::now_ms() <= ms {
        d.tick().await;
    }
}

/// Waits until the fake tool has received `n` requests on `route`.
async fn wait_calls(fake: &FakeTool, route: &str, n: usize) {
    let d = Deadline::after(Duration::from_secs(10), format!("{n} calls on /{route}"));
    while fake.calls(route).len() < n {
        d.tick().await;
    }
}

/// A run token for `run_id` as the sidecar would issue it (same admin token, same derivation).
fn token_for(run_id: &str) -> String {
    Tokens::new(ADMIN_TOKEN, None)
        .expect("tokens")
        .issue(run_id)
}

// ---------------------------------------------------------------------------------------------
// Preflight.

/// Steps 1–9, one row per fault, in both forms where the form matters. No row reaches the tool,
/// creates a record or spends budget.
pub async fn preflight_checks_in_order(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let r = env.run(json!({})).await;
    let only_search = env.run(json!({"tools": ["search"]})).await;
    let other = env.run(json!({})).await;
    let t = Some(r.token.as_str());
    let rid = r.id.as_str();
    let good = |id: &str, tool: &str, input: Value| {
        envelope_json(
            t,
            json!({"run_id": rid, "tool_call_id": id, "tool": tool, "input": input}),
        )
    };
    let q = || json!({"q": "redis"});
    let foreign_key = Tokens::new("another-admin-token", None)
        .expect("tokens")
        .issue(rid);
    let other_mac = format!(
        "{rid}.{}",
        other.token.split_once('.').expect("token shape").1
    );
    let mut bad_mac = r.token.clone();
    bad_mac.push('A');

    struct Row {
        what: &'static str,
        req: Req,
        status: u16,
        code: &'static str,
        echo: Option<&'static str>,
    }
    let row = |what, req, status, code, echo| Row {
        what,
        req,
        status,
        code,
        echo,
    };
    let rows = vec![
        // 1. Request size: the tool's own limit once known, the global one before.
        row(
            "envelope over every limit (body unread)",
            envelope(t, padded(rid, "c-big", "search", 5000)),
            413,
            "REQUEST_TOO_LARGE",
            None,
        ),
        row(
            "envelope over the tool's smaller request_bytes",
            envelope(t, padded(rid, "c-tiny", "tiny", 300)),
            413,
            "REQUEST_TOO_LARGE",
            Some("c-tiny"),
        ),
        row(
            "envelope over the global limit, tool unknown",
            envelope(t, padded(rid, "c-unk", "nope", 2000)),
            413,
            "REQUEST_TOO_LARGE",
            Some("c-unk"),
        ),
        row(
            "envelope over the global limit, tool without override",
            envelope(t, padded(rid, "c-w", "writer", 2000)),
            413,
            "REQUEST_TOO_LARGE",
            Some("c-w"),
        ),
        row(
            "intercept over the tool's request_bytes",
            intercept(
                t,
                "search",
                Some(rid),
                Some("i-big"),
                padded_input(5000).to_string(),
            ),
            413,
            "REQUEST_TOO_LARGE",
            Some("i-big"),
        ),
        row(
            "intercept over the tool's smaller request_bytes",
            intercept(
                t,
                "tiny",
                Some(rid),
                Some("i-tiny"),
                padded_input(300).to_string(),
            ),
            413,
            "REQUEST_TOO_LARGE",
            Some("i-tiny"),
        ),
        row(
            "intercept over the global limit, tool unknown",
            intercept(
                t,
                "nope",
                Some(rid),
                Some("i-unk"),
                padded_input(2000).to_string(),
            ),
            413,
            "REQUEST_TOO_LARGE",
            Some("i-unk"),
        ),
        // 2. The run token.
        row(
            "no token",
            good("c2", "search", q()).with_token(None),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "garbage token",
            good("c2", "search", q()).with_token(Some("garbage")),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "forged mac",
            good("c2", "search", q()).with_token(Some(&bad_mac)),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "token signed with another key",
            good("c2", "search", q()).with_token(Some(&foreign_key)),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "another run's mac on this run's id",
            good("c2", "search", q()).with_token(Some(&other_mac)),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "admin token as run token",
            good("c2", "search", q()).with_token(Some(ADMIN_TOKEN)),
            401,
            "UNAUTHENTICATED",
            Some("c2"),
        ),
        row(
            "intercept without token",
            intercept(None, "search", Some(rid), Some("i2"), q().to_string()),
            401,
            "UNAUTHENTICATED",
            Some("i2"),
        ),
        // 3. The envelope is JSON.
        row(
            "envelope not JSON",
            envelope(t, "{not json"),
            400,
            "INVALID_INPUT",
            None,
        ),
        row(
            "envelope empty",
            envelope(t, ""),
            400,
            "INVALID_INPUT",
            None,
        ),
        row(
            "envelope not an object",
            envelope(t, "[1,2]"),
            400,
            "INVALID_INPUT",
            None,
        ),
        // 4. tool_call_id.
        row(
            "tool_call_id missing",
            envelope_json(t, json!({"run_id": rid, "tool": "search", "input": q()})),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id empty",
            good("", "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id blank",
            good("   ", "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id with a space",
            good("call abc", "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id with a leading dash",
            good("-call", "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id with a slash",
            good("call/../x", "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id too long",
            good(&"a".repeat(129), "search", q()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "tool_call_id not a string",
            envelope_json(
                t,
                json!({"run_id": rid, "tool_call_id": 123, "tool": "search", "input": q()}),
            ),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "intercept without X-Tool-Call-Id",
            intercept(t, "search", Some(rid), None, q().to_string()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        row(
            "intercept with an unsafe X-Tool-Call-Id",
            intercept(t, "search", Some(rid), Some("bad id"), q().to_string()),
            400,
            "INVALID_TOOL_CALL_ID",
            None,
        ),
        // 5. run_id.
        row(
            "run_id missing",
            envelope_json(
                t,
                json!({"tool_call_id": "c5", "tool": "search", "input": q()}),
            ),
            403,
            "RUN_MISMATCH",
            Some("c5"),
        ),
        row(
            "run_id of another run",
            envelope_json(
                t,
                json!({"run_id": other.id, "tool_call_id": "c5", "tool": "search", "input": q()}),
            ),
            403,
            "RUN_MISMATCH",
            Some("c5"),
        ),
        row(
            "run_id unsafe",
            envelope_json(
                t,
                json!({"run_id": "run 1", "tool_call_id": "c5", "tool": "search", "input": q()}),
            ),
            403,
            "RUN_MISMATCH",
            Some("c5"),
        ),
        row(
            "intercept with another run",
            intercept(t, "search", Some(&other.id), Some("i5"), q().to_string()),
            403,
            "RUN_MISMATCH",
            Some("i5"),
        ),
        row(
            "intercept without X-Run-Id",
            intercept(t, "search", None, Some("i5"), q().to_string()),
            403,
            "RUN_MISMATCH",
            Some("i5"),
        ),
        // 6. Tool configured.
        row(
            "unknown tool",
            good("c6", "nope", q()),
            404,
            "UNKNOWN_TOOL",
            Some("c6"),
        ),
        row(
            "tool missing",
            envelope_json(
                t,
                json!({"run_id": rid, "tool_call_id": "c6", "input": q()}),
            ),
            404,
            "UNKNOWN_TOOL",
            Some("c6"),
        ),
        row(
            "intercept unknown tool",
            intercept(t, "nope", Some(rid), Some("i6"), q().to_string()),
            404,
            "UNKNOWN_TOOL",
            Some("i6"),
        ),
        // 7. Tool allowed for the run.
        row(
            "tool outside the run's tools",
            envelope_json(
                Some(&only_search.token),
                json!({"run_id": only_search.id, "tool_call_id": "c7", "tool": "object", "input": {}}),
            ),
            403,
            "UNAUTHORIZED",
            Some("c7"),
        ),
        row(
            "intercept tool outside the run's tools",
            intercept(
                Some(&only_search.token),
                "object",
                Some(&only_search.id),
                Some("i7"),
                "{}",
            ),
            403,
            "UNAUTHORIZED",
            Some("i7"),
        ),
        // 8. Read-only.
        row(
            "tool not read-only",
            good("c8", "writer", q()),
            403,
            "TOOL_NOT_READ_ONLY",
            Some("c8"),
        ),
        row(
            "intercept tool not read-only",
            intercept(t, "writer", Some(rid), Some("i8"), q().to_string()),
            403,
            "TOOL_NOT_READ_ONLY",
            Some("i8"),
        ),
        // 9. Input.
        row(
            "input missing",
            envelope_json(
                t,
                json!({"run_id": rid, "tool_call_id": "c9", "tool": "object"}),
            ),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "input an array",
            good("c9", "object", json!([1])),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "input a string",
            good("c9", "object", json!("q")),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "input null",
            good("c9", "object", Value::Null),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "schema: q missing",
            good("c9", "search", json!({})),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "schema: q not a string",
            good("c9", "search", json!({"q": 5})),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "schema: q too long",
            good("c9", "search", json!({"q": "x".repeat(513)})),
            400,
            "INVALID_INPUT",
            Some("c9"),
        ),
        row(
            "intercept body not JSON",
            intercept(t, "object", Some(rid), Some("i9"), "{oops"),
            400,
            "INVALID_INPUT",
            Some("i9"),
        ),
        row(
            "intercept body empty",
            intercept(t, "object", Some(rid), Some("i9"), ""),
            400,
            "INVALID_INPUT",
            Some("i9"),
        ),
        row(
            "intercept body an array",
            intercept(t, "object", Some(rid), Some("i9"), "[1]"),
            400,
            "INVALID_INPUT",
            Some("i9"),
        ),
        row(
            "intercept schema failure",
            intercept(t, "search", Some(rid), Some("i9"), r#"{"q": 5}"#),
            400,
            "INVALID_INPUT",
            Some("i9"),
        ),
    ];

    let runs = [&r, &only_search, &other];
    for row in rows {
        let mut before = Vec::new();
        for run in runs {
            before.push(env.spent(run).await);
        }
        let reply = env.send(&row.req).await;
        assert_eq!(
            (reply.status, reply.body["error"]["code"].as_str()),
            (row.status, Some(row.code)),
            "{}: {}",
            row.what,
            reply.raw
        );
        assert_error(&reply, row.status, row.code, row.echo);
        let mut after = Vec::new();
        for run in runs {
            after.push(env.spent(run).await);
        }
        assert_eq!(before, after, "{}: a rejection spent something", row.what);
        if let Some(id) = row.echo {
            for run in runs {
                env.no_record(&run.id, id).await;
            }
        }
    }
    assert_eq!(
        env.fake.total_calls(),
        0,
        "a rejected call reached the tool"
    );

    // The same runs and tokens work when nothing is wrong, so each row failed on its own fault.
    assert_ready(
        &env.send(&good("ok-1", "search", q())).await,
        "ok-1",
        "EVIDENCE_FOUND",
    );
    let body = padded(rid, "ok-2", "search", 2000);
    assert!(body.len() > 1024 && body.len() < 4096);
    assert_ready(
        &env.send(&envelope(t, body)).await,
        "ok-2",
        "EVIDENCE_FOUND",
    );
    let input = padded_input(2000).to_string();
    let reply = env
        .send(&intercept(t, "search", Some(rid), Some("ok-3"), input))
        .await;
    assert_ready(&reply, "ok-3", "EVIDENCE_FOUND");
    let reply = env
        .send(&intercept(t, "tiny", Some(rid), Some("ok-4"), "{}"))
        .await;
    assert_ready(&reply, "ok-4", "EVIDENCE_FOUND");
    let reply = env
        .send(&intercept(
            Some(&only_search.token),
            "search",
            Some(&only_search.id),
            Some("ok-5"),
            q().to_string(),
        ))
        .await;
    assert_ready(&reply, "ok-5", "EVIDENCE_FOUND");
    assert_eq!(env.fake.total_calls(), 5);
    assert_eq!(env.view(rid).await["calls_used"], 4);
}

impl Req {
    fn with_token(mut self, token: Option<&str>) -> Req {
        self.token = token.map(str::to_string);
        self
    }
}

/// Step 10: the atomic reservation. Rejections spend nothing and create no record; a duplicate
/// leaves the first record untouched.
pub async fn reservation_checks(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let q = json!({"q": "redis"});

    // A genuine token for a run that was never created.
    let ghost_id = unique("ghost");
    let ghost = Run {
        token: token_for(&ghost_id),
        id: ghost_id,
    };
    let reply = env.call(&ghost, "g1", "search", q.clone()).await;
    assert_error(&reply, 409, "RUN_INACTIVE", Some("g1"));
    let reply = env.intercept(&ghost, "g2", "search", q.to_string()).await;
    assert_error(&reply, 409, "RUN_INACTIVE", Some("g2"));
    assert_admin_error(
        &env.sc
            .admin("GET", &format!("/v1/runs/{}", ghost.id), None)
            .await,
        404,
        "NOT_FOUND",
    );
    env.no_record(&ghost.id, "g1").await;

    // Ended and cancelled runs.
    for (action, state) in [("end", "ENDED"), ("cancel", "CANCELLED")] {
        let run = env.run(json!({})).await;
        let r = env
            .admin_post(&format!("/v1/runs/{}/{action}", run.id))
            .await;
        assert_eq!(r.status, 200, "{action}: {}", r.raw);
        let reply = env.call(&run, "c1", "search", q.clone()).await;
        assert_error(&reply, 409, "RUN_INACTIVE", Some("c1"));
        let reply = env.intercept(&run, "c2", "search", q.to_string()).await;
        assert_error(&reply, 409, "RUN_INACTIVE", Some("c2"));
        let view = env.view(&run.id).await;
        assert_eq!(
            (view["state"].as_str(), view["calls_used"].as_u64()),
            (Some(state), Some(0))
        );
        env.no_record(&run.id, "c1").await;
        env.no_record(&run.id, "c2").await;
        assert_eq!(env.facts(&run.id).await["excluded"], 0);
    }

    // The deadline passed before the call.
    let late = env.run(json!({"timeout_ms": 50})).await;
    wait_past(clock::now_ms() + 50).await;
    let reply = env.call(&late, "c1", "search", q.clone()).await;
    assert_error(&reply, 409, "RUN_DEADLINE_EXCEEDED", Some("c1"));
    assert_eq!(env.view(&late.id).await["calls_used"], 0);
    env.no_record(&late.id, "c1").await;
    assert_eq!(
        env.fake.total_calls(),
        0,
        "an inactive or late run reached the tool"
    );

    // A duplicate id: the first record is left as it was.
    let run = env.run(json!({})).await;
    assert_ready(
        &env.call(&run, "dup", "search", q.clone()).await,
        "dup",
        "EVIDENCE_FOUND",
    );
    let mut first = env.record_ok(&run.id, "dup").await;
    let used = env.view(&run.id).await;
    for reply in [
        env.call(&run, "dup", "search", json!({"q": "other"})).await,
        env.call(&run, "dup", "empty", json!({})).await,
        env.intercept(&run, "dup", "object", "{}").await,
    ] {
        assert_error(&reply, 409, "DUPLICATE_TOOL_CALL", Some("dup"));
    }
    let mut again = env.record_ok(&run.id, "dup").await;
    first.as_object_mut().expect("record").remove("ttl_ms");
    again.as_object_mut().expect("record").remove("ttl_ms");
    assert_eq!(first, again, "a duplicate touched the first record");
    assert_eq!(env.view(&run.id).await, used, "a duplicate spent budget");
    assert_eq!(env.fake.calls("search").len(), 1);
    assert_eq!(
        env.facts(&run.id).await["facts"].as_array().map(Vec::len),
        Some(1)
    );

    // The run's call budget.
    let run = env.run(json!({"budget": {"max_calls": 2}})).await;
    for id in ["b1", "b2"] {
        assert_ready(
            &env.call(&run, id, "search", q.clone()).await,
            id,
            "EVIDENCE_FOUND",
        );
    }
    let tool_calls = env.fake.total_calls();
    assert_error(
        &env.call(&run, "b3", "search", q.clone()).await,
        429,
        "BUDGET_EXHAUSTED",
        Some("b3"),
    );
    assert_error(
        &env.intercept(&run, "b4", "empty", "{}").await,
        429,
        "BUDGET_EXHAUSTED",
        Some("b4"),
    );
    assert_eq!(env.fake.total_calls(), tool_calls);
    assert_eq!(env.view(&run.id).await["calls_used"], 2);
    env.no_record(&run.id, "b3").await;
    env.no_record(&run.id, "b4").await;

    // The per-tool budget caps one tool only.
    let run = env
        .run(json!({"budget": {"max_calls_per_tool": {"search": 1}}}))
        .await;
    assert_ready(
        &env.call(&run, "p1", "search", q.clone()).await,
        "p1",
        "EVIDENCE_FOUND",
    );
    assert_error(
        &env.call(&run, "p2", "search", q.clone()).await,
        429,
        "BUDGET_EXHAUSTED",
        Some("p2"),
    );
    env.no_record(&run.id, "p2").await;
    assert_ready(
        &env.call(&run, "p3", "empty", json!({})).await,
        "p3",
        "NO_EVIDENCE",
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 2);
    assert_eq!(
        env.fake.total_calls(),
        tool_calls + 2,
        "a call over the per-tool budget ran"
    );
}

/// When a request fails several checks, the first one in contract order answers.
pub async fn first_failing_check_wins(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let r = env.run(json!({})).await;
    let only_search = env.run(json!({"tools": ["search"]})).await;
    let other = env.run(json!({})).await;
    let t = Some(r.token.as_str());
    let rid = r.id.as_str();

    // 1 before 2: oversize and no token.
    let reply = env
        .send(&envelope(None, padded(rid, "c", "search", 5000)))
        .await;
    assert_error(&reply, 413, "REQUEST_TOO_LARGE", None);
    let reply = env
        .send(&envelope(Some("garbage"), padded(rid, "c", "tiny", 300)))
        .await;
    assert_error(&reply, 413, "REQUEST_TOO_LARGE", Some("c"));
    // 1 before 4: oversize and an unsafe id.
    let reply = env
        .send(&envelope(t, padded(rid, "bad id", "tiny", 300)))
        .await;
    assert_error(&reply, 413, "REQUEST_TOO_LARGE", None);
    // 2 before 3: bad token and bad JSON.
    let reply = env.send(&envelope(Some("garbage"), "{not json")).await;
    assert_error(&reply, 401, "UNAUTHENTICATED", None);
    let reply = env.send(&envelope(None, "")).await;
    assert_error(&reply, 401, "UNAUTHENTICATED", None);
    // 2 before 5 and 6.
    let body = json!({"run_id": other.id, "tool_call_id": "c", "tool": "nope", "input": 1});
    let reply = env.send(&envelope_json(Some("garbage"), body)).await;
    assert_error(&reply, 401, "UNAUTHENTICATED", Some("c"));
    // 3 before 4: bad JSON carries no id.
    let reply = env.send(&envelope(t, r#"{"tool_call_id": "#)).await;
    assert_error(&reply, 400, "INVALID_INPUT", None);
    // 4 before 5: unsafe id and another run.
    let body = json!({"run_id": other.id, "tool_call_id": "bad id", "tool": "search", "input": {}});
    let reply = env.send(&envelope_json(t, body)).await;
    assert_error(&reply, 400, "INVALID_TOOL_CALL_ID", None);
    // 5 before 6: another run and an unknown tool.
    let body = json!({"run_id": other.id, "tool_call_id": "c", "tool": "nope", "input": {}});
    let reply = env.send(&envelope_json(t, body)).await;
    assert_error(&reply, 403, "RUN_MISMATCH", Some("c"));
    // 6 before 9: unknown tool and bad input.
    let body = json!({"run_id": rid, "tool_call_id": "c", "tool": "nope", "input": 5});
    let reply = env.send(&envelope_json(t, body)).await;
    assert_error(&reply, 404, "UNKNOWN_TOOL", Some("c"));
    // 7 before 8: not allowed and not read-only.
    let reply = env
        .send(&intercept(
            Some(&only_search.token),
            "writer",
            Some(&only_search.id),
            Some("c"),
            "{}",
        ))
        .await;
    assert_error(&reply, 403, "UNAUTHORIZED", Some("c"));
    // 8 before 9: not read-only and bad input.
    let reply = env
        .send(&intercept(t, "writer", Some(rid), Some("c"), "{oops"))
        .await;
    assert_error(&reply, 403, "TOOL_NOT_READ_ONLY", Some("c"));
    // 9 before 10: bad input on an ended run.
    let ended = env.run(json!({})).await;
    env.admin_post(&format!("/v1/runs/{}/end", ended.id)).await;
    let reply = env.call(&ended, "c", "search", json!({"q": 5})).await;
    assert_error(&reply, 400, "INVALID_INPUT", Some("c"));
    // Inside 10: inactive before deadline, deadline before duplicate, duplicate before budget.
    let run = env
        .run(json!({"timeout_ms": 2000, "budget": {"max_calls": 1}}))
        .await;
    let started = clock::now_ms();
    assert_ready(
        &env.call(&run, "d", "search", json!({"q": "x"})).await,
        "d",
        "EVIDENCE_FOUND",
    );
    let reply = env.call(&run, "d", "search", json!({"q": "x"})).await;
    assert_error(&reply, 409, "DUPLICATE_TOOL_CALL", Some("d"));
    let reply = env.call(&run, "e", "search", json!({"q": "x"})).await;
    assert_error(&reply, 429, "BUDGET_EXHAUSTED", Some("e"));
    wait_past(started + 2000).await;
    let reply = env.call(&run, "d", "search", json!({"q": "x"})).await;
    assert_error(&reply, 409, "RUN_DEADLINE_EXCEEDED", Some("d"));
    env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    let reply = env.call(&run, "d", "search", json!({"q": "x"})).await;
    assert_error(&reply, 409, "RUN_INACTIVE", Some("d"));
    assert_eq!(env.fake.total_calls(), 1);
}

/// Envelope and intercept run the same checks and give the same answers: the same call in two
/// twin runs (same tool_call_id) answers byte for byte alike.
pub async fn call_forms_answer_identically(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let a = env
        .run(json!({"tools": ["search", "empty", "fail", "writer", "object"]}))
        .await;
    let b = env
        .run(json!({"tools": ["search", "empty", "fail", "writer", "object"]}))
        .await;
    let cases: Vec<(&str, &str, &str, u16)> = vec![
        ("same-1", "search", r#"{"q":"redis"}"#, 200),
        ("same-2", "empty", r#"{"q":"nothing"}"#, 200),
        ("same-3", "object", "{}", 200),
        ("same-4", "fail", "{}", 502),
        ("same-5", "search", r#"{"q":5}"#, 400),
        ("same-6", "search", "[1]", 400),
        ("same-7", "nope", "{}", 404),
        ("same-8", "writer", "{}", 403),
        ("same-9", "scalar", "{}", 403),
    ];
    for (id, tool, input, status) in cases {
        let input_value: Value = serde_json::from_str(input).expect("test input");
        let via_envelope = env.call(&a, id, tool, input_value).await;
        let via_intercept = env.intercept(&b, id, tool, input).await;
        assert_eq!(via_envelope.status, status, "{tool}: {}", via_envelope.raw);
        assert_eq!(
            (via_envelope.status, &via_envelope.body),
            (via_intercept.status, &via_intercept.body),
            "{tool}: the two forms answered differently"
        );
        if status != 200 {
            assert_no_leak(&via_envelope);
        }
        if status == 200 || status == 502 {
            let ra = env.record_ok(&a.id, id).await;
            let rb = env.record_ok(&b.id, id).await;
            for field in [
                "tool",
                "status",
                "evidence_status",
                "request",
                "raw_response",
                "agent_result",
                "error_code",
                "upstream_status",
            ] {
                assert_eq!(ra[field], rb[field], "{tool}: records differ in {field}");
            }
        }
    }
    // Both forms also agree on a missing id and on the run binding.
    let e = env
        .send(&envelope_json(
            Some(&a.token),
            json!({"run_id": a.id, "tool": "search", "input": {"q": "x"}}),
        ))
        .await;
    let i = env
        .send(&intercept(
            Some(&b.token),
            "search",
            Some(&b.id),
            None,
            r#"{"q":"x"}"#,
        ))
        .await;
    assert_error(&e, 400, "INVALID_TOOL_CALL_ID", None);
    assert_eq!(e.body, i.body);
    let e = env
        .send(&envelope_json(
            Some(&a.token),
            json!({"run_id": b.id, "tool_call_id": "x", "tool": "search", "input": {"q": "x"}}),
        ))
        .await;
    let i = env
        .send(&intercept(
            Some(&b.token),
            "search",
            Some(&a.id),
            Some("x"),
            r#"{"q":"x"}"#,
        ))
        .await;
    assert_error(&e, 403, "RUN_MISMATCH", Some("x"));
    assert_eq!(e.body, i.body);
}

// ---------------------------------------------------------------------------------------------
// Execution and projection.

/// READY answers: arrays cut to max_items with total_items and fields, NO_EVIDENCE with its
/// scope for empty and null, objects and scalars as an item; the record holds the same result.
pub async fn ready_results_are_bounded_projections(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    let result = assert_ready(
        &env.call(&run, "s1", "search", json!({"q": "redis"})).await,
        "s1",
        "EVIDENCE_FOUND",
    );
    let items = result["items"].as_array().expect("items");
    assert_eq!(items.len(), 5, "max_items");
    assert_eq!(
        result["total_items"], 7,
        "total_items counts before max_items"
    );
    for (i, item) in items.iter().enumerate() {
        assert_eq!(
            item,
            &json!({"title": format!("t{i}"), "url": format!("https://e.x/{i}"), "snippet": "s"})
        );
    }
    assert_eq!(result.as_object().map(|o| o.len()), Some(2));
    let rec = env.record_ok(&run.id, "s1").await;
    assert_eq!(rec["agent_result"], result);
    assert_eq!(rec["evidence_status"], "EVIDENCE_FOUND");
    assert_eq!(
        rec["raw_response"]["results"].as_array().map(Vec::len),
        Some(7)
    );
    assert_eq!(rec["raw_response"]["results"][6]["extra"], RAW_MARKER);

    for tool in ["empty", "null"] {
        let input = json!({"q": "nothing here", "n": 1});
        let id = format!("{tool}-1");
        let result = assert_ready(
            &env.call(&run, &id, tool, input.clone()).await,
            &id,
            "NO_EVIDENCE",
        );
        assert_eq!(result, json!({"scope": {"tool": tool, "input": input}}));
        let rec = env.record_ok(&run.id, &id).await;
        assert_eq!(
            (rec["status"].as_str(), rec["evidence_status"].as_str()),
            (Some("READY"), Some("NO_EVIDENCE"))
        );
        assert_eq!(rec["agent_result"], result);
    }
    // Intercept gives the same scope.
    let reply = env
        .intercept(&run, "empty-2", "empty", r#"{"q":"x"}"#)
        .await;
    let result = assert_ready(&reply, "empty-2", "NO_EVIDENCE");
    assert_eq!(
        result,
        json!({"scope": {"tool": "empty", "input": {"q": "x"}}})
    );

    let result = assert_ready(
        &env.call(&run, "o1", "object", json!({})).await,
        "o1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(
        result,
        json!({"item": {"title": "t0", "url": "https://e.x/0"}})
    );
    let result = assert_ready(
        &env.call(&run, "n1", "scalar", json!({})).await,
        "n1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(result, json!({"item": 42}));
    let input = json!({"k": "v"});
    let result = assert_ready(
        &env.call(&run, "e1", "echo", input.clone()).await,
        "e1",
        "EVIDENCE_FOUND",
    );
    assert_eq!(result, json!({"item": {"input": input}}));
}

/// Non-2xx, non-JSON 2xx and an unreachable tool fail as TOOL_EXECUTION_FAILED; the diagnosis
/// stays in the record for the harness only.
pub async fn tool_failures_keep_a_diagnosis(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    let reply = env.call(&run, "f1", "fail", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f1"));
    let rec = env.record_ok(&run.id, "f1").await;
    assert_error_record(
        &rec,
        "TOOL_EXECUTION_FAILED",
        Some(&json!({"error": RAW_MARKER})),
    );
    assert_eq!(rec["upstream_status"], 500);

    let reply = env.call(&run, "f2", "notjson", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f2"));
    let rec = env.record_ok(&run.id, "f2").await;
    let diagnosis = json!(format!("<html>{RAW_MARKER}</html>"));
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", Some(&diagnosis));
    assert_eq!(rec["upstream_status"], 200);

    let reply = env.call(&run, "f3", "unreachable", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f3"));
    let rec = env.record_ok(&run.id, "f3").await;
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", None);
    assert_eq!(rec["upstream_status"], Value::Null);

    // A non-2xx is a tool failure whatever its size; the oversized body is not kept.
    let reply = env.call(&run, "f4", "bigfail", json!({})).await;
    assert_error(&reply, 502, "TOOL_EXECUTION_FAILED", Some("f4"));
    let rec = env.record_ok(&run.id, "f4").await;
    assert_error_record(&rec, "TOOL_EXECUTION_FAILED", None);
    assert_eq!(rec["upstream_status"], 503);

    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(4))
    );
}

/// A tool slower than its timeout_ms: 504 TOOL_TIMEOUT, promptly.
pub async fn tool_timeout(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let started = Instant::now();
    let reply = env
        .call(&run, "t1", "slowtimeout", json!({"sleep_ms": 5000}))
        .await;
    let took = started.elapsed();
    assert_error(&reply, 504, "TOOL_TIMEOUT", Some("t1"));
    assert!(
        took >= Duration::from_millis(300),
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3000),
        "did not cut the call at timeout_ms: {took:?}"
    );
    let rec = env.record_ok(&run.id, "t1").await;
    assert_error_record(&rec, "TOOL_TIMEOUT", None);
}

/// RESULT_TOO_LARGE at the raw, agent and record stages. The record keeps what fits: nothing
/// of a raw body over raw_bytes, the raw but no agent result when the projection is over
/// agent_bytes, neither when the whole record is over record_bytes.
pub async fn result_too_large_at_every_stage(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    // raw: the 2 MiB body is over raw_bytes (1 MiB); nothing of it is kept.
    let reply = env.call(&run, "raw", "big", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("raw"));
    let rec = env.record_ok(&run.id, "raw").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);

    // agent: the projection is over agent_bytes; the raw is kept, no agent result.
    let reply = env.call(&run, "agent", "wide", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("agent"));
    let rec = env.record_ok(&run.id, "agent").await;
    assert_eq!(rec["status"], "ERROR");
    assert_eq!(rec["error_code"], "RESULT_TOO_LARGE");
    assert_eq!(
        rec["raw_response"]["results"].as_array().map(Vec::len),
        Some(200)
    );
    assert_eq!(rec["agent_result"], Value::Null);

    // record: the whole record is over record_bytes; neither raw nor result is kept.
    let reply = env
        .call(&run, "record", "tinyrecord", json!({"q": "x"}))
        .await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("record"));
    let rec = env.record_ok(&run.id, "record").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
    assert_eq!(rec["request"], json!({"q": "x"}));

    let m = env.sc.metrics().await;
    for (tool, stage) in [("big", "raw"), ("wide", "agent"), ("tinyrecord", "record")] {
        assert_eq!(
            metric(
                &m,
                "toolgate_result_too_large_total",
                &[("tool", tool), ("stage", stage)]
            ),
            Some(1.0),
            "{tool}/{stage}"
        );
    }
    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(3))
    );
}

/// The run's max_record_bytes: a record that would take the run's total past it fails as
/// RESULT_TOO_LARGE and the total never goes past the max.
pub async fn run_record_bytes_budget(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let probe = env.run(json!({})).await;
    assert_ready(
        &env.call(&probe, "call-1", "search", json!({"q": "redis"}))
            .await,
        "call-1",
        "EVIDENCE_FOUND",
    );
    let one = env.view(&probe.id).await["record_bytes_used"]
        .as_u64()
        .expect("bytes");
    assert!(one > 500, "a search record is larger than 500 bytes: {one}");

    // Room for one such record, not two.
    let max = one + one / 2;
    let run = env.run(json!({"budget": {"max_record_bytes": max}})).await;
    assert_ready(
        &env.call(&run, "call-1", "search", json!({"q": "redis"}))
            .await,
        "call-1",
        "EVIDENCE_FOUND",
    );
    let used = env.view(&run.id).await["record_bytes_used"]
        .as_u64()
        .expect("bytes");
    assert!(used > 0 && used <= max);
    let reply = env
        .call(&run, "call-2", "search", json!({"q": "redis"}))
        .await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("call-2"));
    let rec = env.record_ok(&run.id, "call-2").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
    let view = env.view(&run.id).await;
    let after = view["record_bytes_used"].as_u64().expect("bytes");
    assert!(
        after <= max,
        "record_bytes_used {after} went past max_record_bytes {max}"
    );
    assert_eq!(after, used, "the refused record was counted");
    assert_eq!(view["calls_used"], 2);
    let facts = env.facts(&run.id).await;
    assert_eq!(facts["facts"].as_array().map(Vec::len), Some(1));
    assert_eq!(facts["excluded"], 1);
    assert_eq!(
        env.sc
            .metric(
                "toolgate_result_too_large_total",
                &[("tool", "search"), ("stage", "run")]
            )
            .await,
        Some(1.0)
    );
    assert_eq!(
        env.sc
            .metric(
                "toolgate_failures_total",
                &[("layer", "WORKFLOW"), ("code", "RESULT_TOO_LARGE")]
            )
            .await,
        Some(1.0)
    );
}

/// A pointer that does not resolve: PROJECTION_FAILED, raw kept for the harness.
pub async fn projection_failed(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let reply = env.call(&run, "p1", "unresolved", json!({})).await;
    assert_error(&reply, 502, "PROJECTION_FAILED", Some("p1"));
    let rec = env.record_ok(&run.id, "p1").await;
    assert_error_record(
        &rec,
        "PROJECTION_FAILED",
        Some(&json!({"other": RAW_MARKER})),
    );
    assert_eq!(rec["upstream_status"], 200);
}

/// A body that never ends: RESULT_TOO_LARGE, and toolgate stops reading, so the tool stops
/// sending far below its 200 MiB safety stop.
pub async fn endless_body_stops_reading(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let reply = env.call(&run, "e1", "endless", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("e1"));
    let d = Deadline::after(Duration::from_secs(10), "the endless body to be dropped");
    while !env
        .fake
        .endless_closed
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        d.tick().await;
    }
    let sent = env
        .fake
        .endless_sent
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        sent < 32 << 20,
        "the tool pushed {sent} bytes: reading did not stop"
    );
    let rec = env.record_ok(&run.id, "e1").await;
    assert_error_record(&rec, "RESULT_TOO_LARGE", None);
}

/// Limits count UTF-8 bytes, not characters.
pub async fn utf8_limits_count_bytes(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let text = "é".repeat(6000);
    let expected = json!({"item": {"text": text}});
    let serialized = serde_json::to_string(&expected).expect("json");
    assert!(serialized.chars().count() < 8000 && serialized.len() > 8000);

    // Under agent_bytes (8000) by characters, over it by bytes.
    let reply = env.call(&run, "u1", "utf8small", json!({})).await;
    assert_error(&reply, 502, "RESULT_TOO_LARGE", Some("u1"));
    // Under the default agent_bytes (16384) both ways: returned whole, unescaped.
    let reply = env.call(&run, "u2", "utf8", json!({})).await;
    assert_eq!(assert_ready(&reply, "u2", "EVIDENCE_FOUND"), expected);
    assert!(reply.raw.contains(&text), "non-ASCII must not be escaped");
}

/// The tool receives the input exactly, with the contract's headers; the record's request is it.
pub async fn forwarding_headers_and_input(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let input = json!({"z": 1, "a": {"é": [1, 2.5, null, true, "ü"]}, "q": "redis", "n": -7});
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body =
        json!({"run_id": run.id, "tool_call_id": "call_fwd-1", "tool": "echo", "input": input});
    let reply = env
        .sc
        .invoke_raw(
            Some(&run.token),
            body.to_string(),
            &[("traceparent", traceparent)],
        )
        .await;
    let result = assert_ready(&reply, "call_fwd-1", "EVIDENCE_FOUND");
    assert_eq!(result, json!({"item": {"input": input}}));

    let seen = env.fake.calls("echo");
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(
        h.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(h.get("x-run-id"), Some(&run.id));
    assert_eq!(
        h.get("x-tool-call-id").map(String::as_str),
        Some("call_fwd-1")
    );
    assert_eq!(h.get("traceparent").map(String::as_str), Some(traceparent));
    assert_eq!(seen[0].body, input);
    assert_eq!(
        seen[0].body_text,
        serde_json::to_string(&input).expect("json"),
        "key order and values kept"
    );
    assert!(
        !h.contains_key("authorization"),
        "the run token must not reach the tool"
    );
    let rec = env.record_ok(&run.id, "call_fwd-1").await;
    assert_eq!(rec["request"], input);
    assert_eq!(
        serde_json::to_string(&rec["request"]).expect("json"),
        seen[0].body_text
    );

    // No traceparent when the agent sent none; the intercept form forwards the same way.
    let reply = env
        .intercept(
            &run,
            "toolu_01:fwd",
            "echo",
            serde_json::to_vec(&input).expect("json"),
        )
        .await;
    assert_ready(&reply, "toolu_01:fwd", "EVIDENCE_FOUND");
    let seen = env.fake.calls("echo");
    let h = &seen[1].headers;
    assert!(!h.contains_key("traceparent"));
    assert_eq!(
        h.get("x-tool-call-id").map(String::as_str),
        Some("toolu_01:fwd")
    );
    assert_eq!(h.get("x-run-id"), Some(&run.id));
    assert_eq!(seen[1].body, input);
    assert_eq!(
        env.record_ok(&run.id, "toolu_01:fwd").await["request"],
        input
    );
}

// ---------------------------------------------------------------------------------------------
// Calls in flight.

/// The run deadline cuts a call in flight: 409 RUN_DEADLINE_EXCEEDED, recorded as such.
pub async fn deadline_during_call(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({"timeout_ms": 800})).await;
    let started = Instant::now();
    let reply = env
        .call(&run, "d1", "slow", json!({"sleep_ms": 10000}))
        .await;
    assert_error(&reply, 409, "RUN_DEADLINE_EXCEEDED", Some("d1"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the deadline did not cut the call"
    );
    assert_eq!(
        env.fake.calls("slow").len(),
        1,
        "the call was forwarded before the deadline"
    );
    let rec = env.record_ok(&run.id, "d1").await;
    assert_error_record(&rec, "RUN_DEADLINE_EXCEEDED", None);
}

/// Cancelling a run aborts its call in flight: 409 RUN_CANCELLED, promptly, recorded as such.
pub async fn cancel_during_call(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let sc = env.sc.clone();
    let (token, run_id) = (run.token.clone(), run.id.clone());
    let call = tokio::spawn(async move {
        sc.invoke(&token, &run_id, "c1", "slow", json!({"sleep_ms": 15000}))
            .await
    });
    wait_calls(&env.fake, "slow", 1).await;
    let cancelled_at = Instant::now();
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", run.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["state"], "CANCELLED");
    let reply = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the cancelled call answered promptly")
        .expect("call task");
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert_error(&reply, 409, "RUN_CANCELLED", Some("c1"));
    let rec = env.record_ok(&run.id, "c1").await;
    assert_error_record(&rec, "RUN_CANCELLED", None);
    assert_eq!(env.view(&run.id).await["state"], "CANCELLED");
    let facts = env.facts(&run.id).await;
    assert_eq!(
        (
            facts["facts"].as_array().map(Vec::len),
            facts["excluded"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(
        env.sc
            .metric(
                "toolgate_failures_total",
                &[("layer", "OPERATOR"), ("code", "RUN_CANCELLED")]
            )
            .await,
        Some(1.0)
    );
}

/// Ending a run lets its calls in flight finish normally; a cancel of the already ended run
/// changes nothing and aborts nothing.
pub async fn end_during_call_lets_it_finish(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let sc = env.sc.clone();
    let (token, run_id) = (run.token.clone(), run.id.clone());
    let call = tokio::spawn(async move {
        sc.invoke(&token, &run_id, "c1", "slow", json!({"sleep_ms": 1500}))
            .await
    });
    wait_calls(&env.fake, "slow", 1).await;
    let r = env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let r = env.admin_post(&format!("/v1/runs/{}/cancel", run.id)).await;
    assert_eq!(
        (r.status, r.body["state"].as_str()),
        (200, Some("ENDED")),
        "{}",
        r.raw
    );
    let reply = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call answered")
        .expect("call task");
    let result = assert_ready(&reply, "c1", "EVIDENCE_FOUND");
    assert_eq!(
        result,
        json!({"items": [{"title": "t0"}], "total_items": 7})
    );
    assert_eq!(env.record_ok(&run.id, "c1").await["status"], "READY");
    assert_eq!(env.view(&run.id).await["state"], "ENDED");
    let facts = env.facts(&run.id).await;
    assert_eq!(facts["facts"][0]["tool_call_id"], "c1");
}

/// 16 concurrent calls with one tool_call_id: one wins, 15 are duplicates, the tool runs once.
pub async fn concurrent_duplicate_ids_have_one_winner(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            sc.invoke(
                &run.token,
                &run.id,
                "same",
                "slow",
                json!({"sleep_ms": 300}),
            )
            .await
        }));
    }
    let (mut ok, mut dup) = (0, 0);
    for t in tasks {
        let reply = t.await.expect("task");
        match reply.status {
            200 => ok += 1,
            _ => {
                assert_error(&reply, 409, "DUPLICATE_TOOL_CALL", Some("same"));
                dup += 1;
            }
        }
    }
    assert_eq!((ok, dup), (1, 15));
    assert_eq!(
        env.fake.calls("slow").len(),
        1,
        "the tool ran more than once"
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 1);
    assert_eq!(env.record_ok(&run.id, "same").await["status"], "READY");
}

/// 20 concurrent distinct calls against max_calls 5: exactly 5 run, 15 are refused.
pub async fn concurrent_calls_never_overspend(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({"budget": {"max_calls": 5}})).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let sc = env.sc.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("c{i}");
            let reply = sc
                .invoke(&run.token, &run.id, &id, "slow", json!({"sleep_ms": 200}))
                .await;
            (id, reply)
        }));
    }
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for t in tasks {
        let (id, reply) = t.await.expect("task");
        if reply.status == 200 {
            ok.push(id);
        } else {
            assert_error(&reply, 429, "BUDGET_EXHAUSTED", Some(&id));
            refused.push(id);
        }
    }
    assert_eq!((ok.len(), refused.len()), (5, 15));
    assert_eq!(
        env.fake.calls("slow").len(),
        5,
        "the tool ran a call over budget"
    );
    assert_eq!(env.view(&run.id).await["calls_used"], 5);
    for id in &refused {
        env.no_record(&run.id, id).await;
    }
    assert_eq!(
        env.facts(&run.id).await["facts"].as_array().map(Vec::len),
        Some(5)
    );
}

// ---------------------------------------------------------------------------------------------
// Admin API.

/// Runs: create, conflicts, validation, auth, get, end and cancel.
pub async fn admin_runs_api(store_yaml: String) {
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
            "record_bytes_used",
            "run_id",
            "state",
            "tools"
        ]
    );
    assert_eq!(view["state"], "ACTIVE");
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
pub async fn facts_in_completion_order(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;

    // A slow call started first completes after a fast one started later.
    let sc = env.sc.clone();
    let r = run.clone();
    let slow = tokio::spawn(async move {
        sc.invoke(&r.token, &r.id, "f-slow", "slow", json!({"sleep_ms": 1000}))
            .await
    });
    wait_calls(&env.fake, "slow", 1).await;
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
    assert_eq!(keys, ["excluded", "facts", "run_id"]);
    assert_eq!(facts["run_id"], run.id);
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
        json!({"run_id": other.id, "facts": [], "excluded": 0})
    );
}

/// The canonical record: every field, RFC 3339 times, the request as forwarded, and a TTL that
/// a read never renews.
pub async fn invocation_record_shape(store_yaml: String) {
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
            "raw_response",
            "agent_result",
            "error_code",
            "upstream_status",
            "created_at",
            "updated_at",
            "duration_ms",
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
    assert_eq!(rec.as_object().map(|o| o.len()), Some(15));
    assert_eq!(rec["request"], json!({}));
    assert!(is_rfc3339_millis(
        rec["updated_at"].as_str().expect("updated_at")
    ));
}

/// Failure attribution counts preflight rejections and execution errors by layer and code.
pub async fn failure_attribution(store_yaml: String) {
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
        let status = Code::parse(code).expect("code").status().as_u16();
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

// ---------------------------------------------------------------------------------------------
// Metrics.

/// Every metric of the contract, with the labels a scenario provokes, and no id anywhere.
pub async fn metrics_exposition(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    assert_ready(
        &env.call(&run, "call_m1", "search", json!({"q": "x"})).await,
        "call_m1",
        "EVIDENCE_FOUND",
    );
    assert_ready(
        &env.call(&run, "call_m2", "empty", json!({})).await,
        "call_m2",
        "NO_EVIDENCE",
    );
    env.call(&run, "call_m3", "big", json!({})).await;
    env.call(&run, "call_m4", "wide", json!({})).await;
    env.call(&run, "call_m5", "no-such-tool-zz9", json!({}))
        .await;
    env.call(&run, "call_m6", "fail", json!({})).await;
    env.call(&run, "call_m1", "search", json!({"q": "x"})).await;

    let text = env.sc.metrics().await;
    let m = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels);
    let found = [
        ("tool", "search"),
        ("status", "READY"),
        ("evidence_status", "EVIDENCE_FOUND"),
    ];
    assert_eq!(m("toolgate_invocations_total", &found), Some(1.0));
    let none = [
        ("tool", "empty"),
        ("status", "READY"),
        ("evidence_status", "NO_EVIDENCE"),
    ];
    assert_eq!(m("toolgate_invocations_total", &none), Some(1.0));
    let err = [
        ("tool", "big"),
        ("status", "ERROR"),
        ("evidence_status", "ERROR"),
    ];
    assert_eq!(m("toolgate_invocations_total", &err), Some(1.0));
    let unknown = [("tool", "_unknown"), ("code", "UNKNOWN_TOOL")];
    assert_eq!(
        m("toolgate_preflight_rejections_total", &unknown),
        Some(1.0)
    );
    let dup = [("tool", "search"), ("code", "DUPLICATE_TOOL_CALL")];
    assert_eq!(m("toolgate_preflight_rejections_total", &dup), Some(1.0));
    assert_eq!(
        m(
            "toolgate_result_too_large_total",
            &[("tool", "big"), ("stage", "raw")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_result_too_large_total",
            &[("tool", "wide"), ("stage", "agent")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "PROVIDER"), ("code", "RESULT_TOO_LARGE")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "HARNESS"), ("code", "RESULT_TOO_LARGE")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "PROVIDER"), ("code", "TOOL_EXECUTION_FAILED")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "AGENT"), ("code", "UNKNOWN_TOOL")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_failures_total",
            &[("layer", "AGENT"), ("code", "DUPLICATE_TOOL_CALL")]
        ),
        Some(1.0)
    );
    let ready = [("tool", "search"), ("status", "READY")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_count", &ready),
        Some(1.0)
    );
    let bucket = [("tool", "search"), ("status", "READY"), ("le", "+Inf")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_bucket", &bucket),
        Some(1.0)
    );
    let errors = [("tool", "fail"), ("status", "ERROR")];
    assert_eq!(
        m("toolgate_invocation_duration_seconds_count", &errors),
        Some(1.0)
    );
    assert_eq!(
        m(
            "toolgate_upstream_duration_seconds_count",
            &[("tool", "search")]
        ),
        Some(1.0)
    );
    // Five calls reserved and finalized (the unknown tool and the duplicate never reached it).
    assert_eq!(
        m(
            "toolgate_store_operation_duration_seconds_count",
            &[("op", "finalize")]
        ),
        Some(5.0)
    );
    assert_eq!(
        m(
            "toolgate_store_operation_duration_seconds_count",
            &[("op", "reserve")]
        ),
        Some(6.0)
    );
    assert_eq!(
        m("toolgate_invocations_in_flight", &[("tool", "search")]),
        Some(0.0)
    );
    // Counters no step here provokes are exported at 0 for their whole closed label set.
    for op in [
        "create_run",
        "get_run",
        "end_run",
        "cancel_run",
        "reserve",
        "finalize",
        "get_record",
        "facts",
        "ping",
    ] {
        assert_eq!(
            m("toolgate_store_errors_total", &[("op", op)]),
            Some(0.0),
            "store errors {op}"
        );
    }
    for result in ["ok", "error"] {
        assert_eq!(
            m("toolgate_config_reloads_total", &[("result", result)]),
            Some(0.0),
            "reloads {result}"
        );
    }
    for name in [
        "toolgate_store_errors_total",
        "toolgate_config_reloads_total",
        "toolgate_invocations_total",
        "toolgate_preflight_rejections_total",
        "toolgate_result_too_large_total",
        "toolgate_failures_total",
        "toolgate_invocation_duration_seconds",
        "toolgate_upstream_duration_seconds",
        "toolgate_store_operation_duration_seconds",
        "toolgate_invocations_in_flight",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
    // Bounded labels: no run id, call id or unconfigured tool name.
    for id in [run.id.as_str(), "call_m", "no-such-tool-zz9"] {
        assert!(!text.contains(id), "{id} appears in the metrics");
    }

    // The in-flight gauge counts a call while it runs.
    let sc = env.sc.clone();
    let r = run.clone();
    let call = tokio::spawn(async move {
        sc.invoke(&r.token, &r.id, "call_m7", "slow", json!({"sleep_ms": 800}))
            .await
    });
    wait_calls(&env.fake, "slow", 1).await;
    assert_eq!(
        env.sc
            .metric("toolgate_invocations_in_flight", &[("tool", "slow")])
            .await,
        Some(1.0)
    );
    assert_eq!(call.await.expect("task").status, 200);
    assert_eq!(
        env.sc
            .metric("toolgate_invocations_in_flight", &[("tool", "slow")])
            .await,
        Some(0.0)
    );
}

// ---------------------------------------------------------------------------------------------
// Operations.

/// Hot reload: a valid new file applies within 5 s; an invalid one, or one that changes
/// `listen`, is refused and the old tools keep working.
pub async fn hot_reload(store_yaml: String) {
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

/// Graceful shutdown: /readyz turns 503 at once, new calls get 503 SHUTTING_DOWN, the call in
/// flight finishes, then the sidecar's run task ends cleanly.
pub async fn graceful_shutdown(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let run = env.run(json!({})).await;
    let sc = env.sc.clone();
    let r = run.clone();
    let in_flight = tokio::spawn(async move {
        sc.invoke(&r.token, &r.id, "s1", "slow", json!({"sleep_ms": 2000}))
            .await
    });
    wait_calls(&env.fake, "slow", 1).await;
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
