//! Preflight steps 1–9 (`identify`, then `authorize`) on requests derived from the fuzz bytes:
//! any of the three call forms, genuine, tampered or garbage run tokens, claimed ids that are
//! safe or not, and bodies that are structured envelopes or arbitrary bytes.
//!
//! Never panics; an echoed id is always safe and an echoed tool always configured; a call
//! that passes `identify` carries a genuine token for the run it claims, safe ids and a
//! configured tool; a call that passes `authorize` is allowed, read-only, and has an object
//! input within the tool's depth limit that satisfies its schema.
#![no_main]

mod common;

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, HeaderValue};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use toolgate::auth::Tokens;
use toolgate::body::value_depth;
use toolgate::call::live::LivePolicy;
use toolgate::call::preflight::{Identified, identify};
use toolgate::call::{Form, Incoming, McpCall, Received};
use toolgate::config::Config;
use toolgate::ids::{RunId, ToolCallId};

const CONFIG: &str = r#"
limits: {request_bytes: 2048, json_depth: 6}
tools:
  - name: search
    upstream: http://127.0.0.1:9/search
    read_only: true
    input_schema:
      type: object
      required: [q]
      properties: {q: {type: string, maxLength: 16}, n: {type: integer, minimum: 0, maximum: 9}}
      additionalProperties: false
  - name: read_file
    upstream: http://127.0.0.1:9/read
    read_only: true
    limits: {request_bytes: 256, json_depth: 3}
    input_schema: {type: object, required: [path], properties: {path: {type: string}}}
    params: {/path: path, /files/*/src: source_path}
    read_roots: [/usr/share/doc]
  - name: fetch
    upstream: http://127.0.0.1:9/mcp
    protocol: mcp
    read_only: true
    limits: {request_bytes: 4096}
    params: {/url: network_target}
    network: {allow_hosts: ['*.example.com']}
  - name: free
    upstream: http://127.0.0.1:9/free
    read_only: true
  - name: write_file
    upstream: http://127.0.0.1:9/write
    read_only: false
"#;

const TOOLS: &[&str] = &[
    "search",
    "read_file",
    "fetch",
    "free",
    "write_file",
    "nope",
    "",
];
const RUNS: &[&str] = &["r1", "r2", "r1 ", "R1", "r1.x", ""];
const IDS: &[&str] = &["call_1", "toolu_01:abc", "c", "-c", "call 1", "", "c\u{e9}"];

struct Setup {
    policy: Arc<LivePolicy>,
    tokens: Tokens,
    /// The genuine run tokens of `r1` and `r2`.
    genuine: [(RunId, String); 2],
}

static SETUP: LazyLock<Setup> = LazyLock::new(|| {
    let config = Config::parse(CONFIG).expect("the fixed config is valid");
    let tokens = Tokens::new("admin", None).expect("tokens");
    let genuine = ["r1", "r2"].map(|r| {
        let run = RunId::parse(r).expect("a safe run id");
        let token = tokens.issue(&run);
        (run, token)
    });
    Setup {
        policy: Arc::new(LivePolicy::new(config.policy)),
        tokens,
        genuine,
    }
});

/// The run a header value's bearer token is genuinely bound to, judged without the library:
/// only exactly the two issued tokens count.
fn genuine_run(setup: &Setup, value: &[u8]) -> Option<RunId> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    setup
        .genuine
        .iter()
        .find(|(_, t)| t == token)
        .map(|(run, _)| run.clone())
}

/// An `Authorization` header value.
fn authorization(u: &mut Unstructured<'_>, setup: &Setup) -> Result<Option<Vec<u8>>> {
    let [(_, r1), (_, r2)] = &setup.genuine;
    Ok(Some(match u.int_in_range(0..=8)? {
        0 => return Ok(None),
        1 | 2 => format!("Bearer {r1}").into_bytes(),
        3 => format!("bearer \t{r1}  ").into_bytes(),
        4 => format!("Bearer {r2}").into_bytes(),
        5 => "Bearer admin".into(),
        6 => format!("Basic {r1}").into_bytes(),
        7 => {
            // A genuine token with one byte changed.
            let mut t = format!("Bearer {r1}").into_bytes();
            let i = u.choose_index(t.len())?;
            t[i] = u.arbitrary()?;
            t
        }
        _ => u.arbitrary::<Vec<u8>>()?,
    }))
}

fn opt_str(u: &mut Unstructured<'_>, known: &[&str]) -> Result<Option<String>> {
    if u.ratio(1, 8)? {
        return Ok(None);
    }
    common::pick_str(u, known).map(Some)
}

/// A JSON value for an envelope field: usually a string, sometimes another type.
fn field(u: &mut Unstructured<'_>, known: &[&str]) -> Result<Option<Value>> {
    if u.ratio(1, 10)? {
        return Ok(Some(common::json_value(u, 1)?));
    }
    Ok(opt_str(u, known)?.map(Value::String))
}

/// The tool input: usually an object, sometimes anything.
fn input(u: &mut Unstructured<'_>) -> Result<Value> {
    if u.ratio(1, 8)? {
        return common::json_value(u, 8);
    }
    let depth = u.int_in_range(0..=7)?;
    let mut obj = common::json_object(u, depth)?;
    if u.ratio(2, 3)? {
        let q = common::pick_str(u, &["x", "a query", "0123456789abcdefX"])?;
        obj.insert("q".into(), Value::String(q));
    }
    if u.ratio(1, 2)? {
        let path = common::pick_str(u, &["/workspace/a", "../etc/passwd", "~/x"])?;
        obj.insert("path".into(), Value::String(path));
    }
    Ok(Value::Object(obj))
}

/// What the request claims, when it is known to the target (a structured body).
#[derive(Default)]
struct Claimed {
    run_id: Option<String>,
    tool_call_id: Option<String>,
    tool: Option<String>,
    /// The input as sent.
    input: Option<Value>,
}

fn run(data: &[u8]) -> Result<()> {
    let setup = &*SETUP;
    let policy = &*setup.policy;
    let mut u = Unstructured::new(data);

    let mut headers = HeaderMap::new();
    let mut expected_run = None;
    if let Some(value) = authorization(&mut u, setup)?
        && let Ok(v) = HeaderValue::from_bytes(&value)
    {
        expected_run = genuine_run(setup, &value);
        headers.insert(AUTHORIZATION, v);
    }
    let mut claimed = Claimed::default();
    let body_raw = u.ratio(1, 5)?;
    let received = u.int_in_range(0..=15)?;
    let run_tools: Option<Vec<String>> = match u.int_in_range(0..=3)? {
        0 => None,
        1 => Some(vec![]),
        2 => Some(vec!["search".into(), "fetch".into()]),
        _ => Some(TOOLS.iter().map(|t| t.to_string()).collect()),
    };

    let (form, body) = match u.int_in_range(0..=2)? {
        0 => {
            let mut env = Map::new();
            let run_id = field(&mut u, RUNS)?;
            let id = field(&mut u, IDS)?;
            let tool = field(&mut u, TOOLS)?;
            claimed.run_id = run_id.as_ref().and_then(Value::as_str).map(str::to_string);
            claimed.tool_call_id = id.as_ref().and_then(Value::as_str).map(str::to_string);
            claimed.tool = tool.as_ref().and_then(Value::as_str).map(str::to_string);
            for (k, v) in [("run_id", run_id), ("tool_call_id", id), ("tool", tool)] {
                if let Some(v) = v {
                    env.insert(k.into(), v);
                }
            }
            if u.ratio(7, 8)? {
                let input = input(&mut u)?;
                claimed.input = Some(input.clone());
                env.insert("input".into(), input);
            }
            let body = if body_raw {
                claimed = Claimed::default();
                u.take_rest().to_vec()
            } else {
                serde_json::to_vec(&Value::Object(env)).expect("serializable")
            };
            (Form::Envelope, body)
        }
        1 => {
            let tool = common::pick_str(&mut u, TOOLS)?;
            claimed.tool = Some(tool.clone());
            for (name, known, slot) in [
                ("x-run-id", RUNS, &mut claimed.run_id),
                ("x-tool-call-id", IDS, &mut claimed.tool_call_id),
            ] {
                if let Some(v) = opt_str(&mut u, known)?
                    && let Ok(hv) = HeaderValue::from_str(&v)
                {
                    headers.insert(name, hv);
                    // What the library reads back: the header as visible ASCII.
                    *slot = hv_text(&headers, name);
                }
            }
            let body = if body_raw {
                u.take_rest().to_vec()
            } else {
                let input = input(&mut u)?;
                let body = serde_json::to_vec(&input).expect("serializable");
                claimed.input = Some(input);
                body
            };
            (Form::Intercept { tool }, body)
        }
        _ => {
            let call = McpCall {
                tool: common::pick_str(&mut u, TOOLS)?,
                run_id: opt_str(&mut u, RUNS)?,
                tool_call_id: opt_str(&mut u, IDS)?,
                input: match input(&mut u)? {
                    v @ Value::Object(_) => Some(v),
                    _ => None,
                },
                traceparent: None,
                request_id: None,
            };
            claimed = Claimed {
                run_id: call.run_id.clone(),
                tool_call_id: call.tool_call_id.clone(),
                tool: Some(call.tool.clone()),
                input: call.input.clone(),
            };
            let body = serde_json::to_vec(&call.input).expect("serializable");
            (Form::Mcp(call), body)
        }
    };
    let body_len = body.len() as u64;
    let received = match received {
        0 => Received::TooLarge,
        1 => Received::Broken,
        _ => Received::Complete(Bytes::from(body)),
    };
    let complete = matches!(received, Received::Complete(_));
    let broken = matches!(received, Received::Broken);
    let mut incoming = Incoming {
        form,
        headers,
        body: received,
    };

    let identified = match identify(policy, &setup.tokens, &mut incoming) {
        Err(rejection) => {
            if let Some(id) = &rejection.tool_call_id {
                assert!(
                    ToolCallId::parse(id.as_str()).is_some(),
                    "unsafe id echoed: {id:?}"
                );
            }
            if let Some(tool) = &rejection.tool {
                assert!(
                    policy.tool(tool).is_some(),
                    "unconfigured tool echoed: {tool:?}"
                );
            }
            if broken {
                assert!(
                    rejection.tool_call_id.is_none(),
                    "an id echoed from a broken body"
                );
            }
            return Ok(());
        }
        Ok(identified) => identified,
    };
    check_identified(policy, &identified, &claimed, expected_run.as_ref());
    assert!(complete, "a call passed identify without a complete body");
    assert!(
        body_len <= identified.tool.limits.request_bytes,
        "a body of {body_len} bytes passed a limit of {}",
        identified.tool.limits.request_bytes
    );

    let tool = identified.tool.clone();
    let tool_call_id = identified.tool_call_id.clone();
    match identified.authorize(run_tools.as_deref()) {
        Err(rejection) => {
            assert_eq!(rejection.tool_call_id.as_ref(), Some(&tool_call_id));
            assert_eq!(rejection.tool.as_ref(), Some(&tool.name));
        }
        Ok(admitted) => {
            assert_eq!(admitted.tool_call_id, tool_call_id);
            assert!(Arc::ptr_eq(&admitted.tool, &tool));
            assert!(
                run_tools
                    .as_ref()
                    .is_none_or(|t| t.iter().any(|t| *t == *tool.name)),
                "{} admitted outside the run's tools {run_tools:?}",
                tool.name
            );
            assert!(tool.read_only, "{} is not read-only", tool.name);
            assert!(admitted.input.is_object(), "input {:?}", admitted.input);
            if let Some(sent) = &claimed.input {
                assert!(
                    common::same(&admitted.input, sent),
                    "the input is not the one sent"
                );
            }
            assert!(value_depth(&admitted.input) <= tool.limits.json_depth);
            if let Some(schema) = &tool.schema {
                assert!(schema.is_valid(&admitted.input), "input against the schema");
            }
        }
    }
    Ok(())
}

fn hv_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn check_identified(
    policy: &LivePolicy,
    identified: &Identified,
    claimed: &Claimed,
    expected_run: Option<&RunId>,
) {
    let run = &identified.run_id;
    let id = &identified.tool_call_id;
    assert_eq!(
        RunId::parse(run.as_str()).as_ref(),
        Some(run),
        "unsafe run id {run:?}"
    );
    assert_eq!(
        ToolCallId::parse(id.as_str()).as_ref(),
        Some(id),
        "unsafe id {id:?}"
    );
    assert_eq!(
        expected_run,
        Some(run),
        "identified for run {run:?} with a token for {expected_run:?}"
    );
    let tool = policy
        .tool(&identified.tool.name)
        .expect("a configured tool");
    assert!(Arc::ptr_eq(tool, &identified.tool));
    if let Some(c) = &claimed.run_id {
        assert_eq!(run.as_str(), c);
    }
    if let Some(c) = &claimed.tool_call_id {
        assert_eq!(id.as_str(), c, "the id is not kept exactly");
    }
    if let Some(c) = &claimed.tool {
        assert_eq!(identified.tool.name.as_str(), c);
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
