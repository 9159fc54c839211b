//! Preflight: what every call passes before it reaches a tool. The checks run in contract order:
//! 1 request size, 2 run token, 3 envelope JSON, 4 tool_call_id, 5 run_id, 6 tool configured,
//! 7 tool allowed for the run, 8 read-only, 9 input, 10 the atomic reservation (run active,
//! deadline, duplicate id, budgets). A refused call reaches no tool, leaves no record and spends
//! nothing, and both call forms (envelope and intercept) answer alike.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate::auth::Tokens;
use toolgate::clock;
use toolgate::ids::RunId;

use crate::boundary::{
    Env, Req, Run, assert_admin_error, assert_error, assert_no_leak, assert_ready, envelope,
    envelope_json, intercept, on_both_stores,
};
use crate::support::sidecar::ADMIN_TOKEN;
use crate::support::{Deadline, unique};

on_both_stores!(
    preflight_checks_in_order,
    reservation_checks,
    first_failing_check_wins,
    call_forms_answer_identically,
);

/// What a run has spent so far, to prove a rejection spent nothing.
#[derive(Debug, Clone, PartialEq)]
struct Spent {
    tool_calls: usize,
    calls_used: Value,
    record_bytes_used: Value,
    progress: u64,
}

async fn spent(env: &Env, run: &Run) -> Spent {
    let v = env.view(&run.id).await;
    let f = env.facts(&run.id).await;
    Spent {
        tool_calls: env.fake.total_calls(),
        calls_used: v["calls_used"].clone(),
        record_bytes_used: v["record_bytes_used"].clone(),
        progress: f["facts"].as_array().expect("facts").len() as u64
            + f["excluded"].as_u64().expect("excluded"),
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

/// Waits (polling the wall clock) until epoch millisecond `ms` has passed.
async fn wait_past(ms: u64) {
    let d = Deadline::after(Duration::from_secs(10), "the wall clock");
    while clock::now_ms() <= ms {
        d.tick().await;
    }
}

/// A run token for `run_id` as the sidecar would issue it (same admin token, same derivation).
fn token_for(run_id: &str) -> String {
    Tokens::new(ADMIN_TOKEN, None)
        .expect("tokens")
        .issue(&RunId::parse(run_id).expect("a safe run id"))
}

// ---------------------------------------------------------------------------------------------
// Checks 1–9, as a table.

/// The runs the preflight table is written against: `r` may call every tool, `only_search` only
/// `search`, and `other` is a second run whose id and token must not pass for `r`'s.
struct Runs {
    r: Run,
    only_search: Run,
    other: Run,
}

impl Runs {
    async fn create(env: &Env) -> Runs {
        Runs {
            r: env.run(json!({})).await,
            only_search: env.run(json!({"tools": ["search"]})).await,
            other: env.run(json!({})).await,
        }
    }

    fn all(&self) -> [&Run; 3] {
        [&self.r, &self.only_search, &self.other]
    }

    fn token(&self) -> Option<&str> {
        Some(self.r.token.as_str())
    }

    /// A well-formed envelope call on `r`.
    fn good(&self, id: &str, tool: &str, input: Value) -> Req {
        envelope_json(
            self.token(),
            json!({"run_id": self.r.id, "tool_call_id": id, "tool": tool, "input": input}),
        )
    }

    /// An envelope call on `r`'s token with any JSON body.
    fn envelope(&self, body: Value) -> Req {
        envelope_json(self.token(), body)
    }

    /// An intercept call on `r`'s token and id.
    fn intercept(&self, tool: &str, id: &str, body: impl Into<Vec<u8>>) -> Req {
        intercept(self.token(), tool, Some(&self.r.id), Some(id), body)
    }
}

/// One check of steps 1–9, the answer it gives, and requests that fail it and nothing before it:
/// `(what, request, the tool_call_id the answer echoes)`.
struct Check {
    step: &'static str,
    status: u16,
    code: &'static str,
    refused: Vec<(&'static str, Req, Option<&'static str>)>,
}

/// Steps 1–9, one request per fault, in both forms where the form matters.
fn preflight_table(runs: &Runs) -> Vec<Check> {
    let (t, rid) = (runs.token(), runs.r.id.as_str());
    let q = || json!({"q": "redis"});
    let foreign_key = Tokens::new("another-admin-token", None)
        .expect("tokens")
        .issue(&RunId::parse(rid).expect("a safe run id"));
    let other_mac = format!(
        "{rid}.{}",
        runs.other.token.split_once('.').expect("token shape").1
    );
    let mut bad_mac = runs.r.token.clone();
    bad_mac.push('A');
    let (only_search, other) = (&runs.only_search, &runs.other);

    vec![
        Check {
            step: "1. request size: the tool's own limit once known, the global one before",
            status: 413,
            code: "REQUEST_TOO_LARGE",
            refused: vec![
                (
                    "envelope over every limit (body unread)",
                    envelope(t, padded(rid, "c-big", "search", 5000)),
                    None,
                ),
                (
                    "envelope over the tool's smaller request_bytes",
                    envelope(t, padded(rid, "c-tiny", "tiny", 300)),
                    Some("c-tiny"),
                ),
                (
                    "envelope over the global limit, tool unknown",
                    envelope(t, padded(rid, "c-unk", "nope", 2000)),
                    Some("c-unk"),
                ),
                (
                    "envelope over the global limit, tool without override",
                    envelope(t, padded(rid, "c-w", "writer", 2000)),
                    Some("c-w"),
                ),
                (
                    "intercept over the tool's request_bytes",
                    runs.intercept("search", "i-big", padded_input(5000).to_string()),
                    Some("i-big"),
                ),
                (
                    "intercept over the tool's smaller request_bytes",
                    runs.intercept("tiny", "i-tiny", padded_input(300).to_string()),
                    Some("i-tiny"),
                ),
                (
                    "intercept over the global limit, tool unknown",
                    runs.intercept("nope", "i-unk", padded_input(2000).to_string()),
                    Some("i-unk"),
                ),
            ],
        },
        Check {
            step: "2. the run token",
            status: 401,
            code: "UNAUTHENTICATED",
            refused: vec![
                (
                    "no token",
                    runs.good("c2", "search", q()).with_token(None),
                    Some("c2"),
                ),
                (
                    "garbage token",
                    runs.good("c2", "search", q()).with_token(Some("garbage")),
                    Some("c2"),
                ),
                (
                    "forged mac",
                    runs.good("c2", "search", q()).with_token(Some(&bad_mac)),
                    Some("c2"),
                ),
                (
                    "token signed with another key",
                    runs.good("c2", "search", q()).with_token(Some(&foreign_key)),
                    Some("c2"),
                ),
                (
                    "another run's mac on this run's id",
                    runs.good("c2", "search", q()).with_token(Some(&other_mac)),
                    Some("c2"),
                ),
                (
                    "admin token as run token",
                    runs.good("c2", "search", q()).with_token(Some(ADMIN_TOKEN)),
                    Some("c2"),
                ),
                (
                    "intercept without token",
                    intercept(None, "search", Some(rid), Some("i2"), q().to_string()),
                    Some("i2"),
                ),
            ],
        },
        Check {
            step: "3. the envelope is JSON",
            status: 400,
            code: "INVALID_INPUT",
            refused: vec![
                ("envelope not JSON", envelope(t, "{not json"), None),
                ("envelope empty", envelope(t, ""), None),
                ("envelope not an object", envelope(t, "[1,2]"), None),
            ],
        },
        Check {
            step: "4. tool_call_id",
            status: 400,
            code: "INVALID_TOOL_CALL_ID",
            refused: vec![
                (
                    "tool_call_id missing",
                    runs.envelope(json!({"run_id": rid, "tool": "search", "input": q()})),
                    None,
                ),
                ("tool_call_id empty", runs.good("", "search", q()), None),
                ("tool_call_id blank", runs.good("   ", "search", q()), None),
                (
                    "tool_call_id with a space",
                    runs.good("call abc", "search", q()),
                    None,
                ),
                (
                    "tool_call_id with a leading dash",
                    runs.good("-call", "search", q()),
                    None,
                ),
                (
                    "tool_call_id with a slash",
                    runs.good("call/../x", "search", q()),
                    None,
                ),
                // The run's own keys sit beside its records: `…:{run}:run`, `…:{run}:progress`.
                ("tool_call_id run", runs.good("run", "search", q()), None),
                ("tool_call_id progress", runs.good("progress", "search", q()), None),
                (
                    "intercept with X-Tool-Call-Id progress",
                    intercept(t, "search", Some(rid), Some("progress"), q().to_string()),
                    None,
                ),
                (
                    "tool_call_id too long",
                    runs.good(&"a".repeat(129), "search", q()),
                    None,
                ),
                (
                    "tool_call_id not a string",
                    runs.envelope(
                        json!({"run_id": rid, "tool_call_id": 123, "tool": "search", "input": q()}),
                    ),
                    None,
                ),
                (
                    "intercept without X-Tool-Call-Id",
                    intercept(t, "search", Some(rid), None, q().to_string()),
                    None,
                ),
                (
                    "intercept with an unsafe X-Tool-Call-Id",
                    runs.intercept("search", "bad id", q().to_string()),
                    None,
                ),
            ],
        },
        Check {
            step: "5. run_id",
            status: 403,
            code: "RUN_MISMATCH",
            refused: vec![
                (
                    "run_id missing",
                    runs.envelope(json!({"tool_call_id": "c5", "tool": "search", "input": q()})),
                    Some("c5"),
                ),
                (
                    "run_id of another run",
                    runs.envelope(
                        json!({"run_id": other.id, "tool_call_id": "c5", "tool": "search", "input": q()}),
                    ),
                    Some("c5"),
                ),
                (
                    "run_id unsafe",
                    runs.envelope(
                        json!({"run_id": "run 1", "tool_call_id": "c5", "tool": "search", "input": q()}),
                    ),
                    Some("c5"),
                ),
                (
                    "intercept with another run",
                    intercept(t, "search", Some(&other.id), Some("i5"), q().to_string()),
                    Some("i5"),
                ),
                (
                    "intercept without X-Run-Id",
                    intercept(t, "search", None, Some("i5"), q().to_string()),
                    Some("i5"),
                ),
            ],
        },
        Check {
            step: "6. the tool is configured",
            status: 404,
            code: "UNKNOWN_TOOL",
            refused: vec![
                ("unknown tool", runs.good("c6", "nope", q()), Some("c6")),
                (
                    "tool missing",
                    runs.envelope(json!({"run_id": rid, "tool_call_id": "c6", "input": q()})),
                    Some("c6"),
                ),
                (
                    "intercept unknown tool",
                    runs.intercept("nope", "i6", q().to_string()),
                    Some("i6"),
                ),
            ],
        },
        Check {
            step: "7. the tool is allowed for the run",
            status: 403,
            code: "UNAUTHORIZED",
            refused: vec![
                (
                    "tool outside the run's tools",
                    envelope_json(
                        Some(&only_search.token),
                        json!({"run_id": only_search.id, "tool_call_id": "c7", "tool": "object", "input": {}}),
                    ),
                    Some("c7"),
                ),
                (
                    "intercept tool outside the run's tools",
                    intercept(
                        Some(&only_search.token),
                        "object",
                        Some(&only_search.id),
                        Some("i7"),
                        "{}",
                    ),
                    Some("i7"),
                ),
            ],
        },
        Check {
            step: "8. the tool is read-only",
            status: 403,
            code: "TOOL_NOT_READ_ONLY",
            refused: vec![
                ("tool not read-only", runs.good("c8", "writer", q()), Some("c8")),
                (
                    "intercept tool not read-only",
                    runs.intercept("writer", "i8", q().to_string()),
                    Some("i8"),
                ),
            ],
        },
        Check {
            step: "9. the input",
            status: 400,
            code: "INVALID_INPUT",
            refused: vec![
                (
                    "input missing",
                    runs.envelope(json!({"run_id": rid, "tool_call_id": "c9", "tool": "object"})),
                    Some("c9"),
                ),
                ("input an array", runs.good("c9", "object", json!([1])), Some("c9")),
                ("input a string", runs.good("c9", "object", json!("q")), Some("c9")),
                ("input null", runs.good("c9", "object", Value::Null), Some("c9")),
                ("schema: q missing", runs.good("c9", "search", json!({})), Some("c9")),
                (
                    "schema: q not a string",
                    runs.good("c9", "search", json!({"q": 5})),
                    Some("c9"),
                ),
                (
                    "schema: q too long",
                    runs.good("c9", "search", json!({"q": "x".repeat(513)})),
                    Some("c9"),
                ),
                (
                    "intercept body not JSON",
                    runs.intercept("object", "i9", "{oops"),
                    Some("i9"),
                ),
                (
                    "intercept body empty",
                    runs.intercept("object", "i9", ""),
                    Some("i9"),
                ),
                (
                    "intercept body an array",
                    runs.intercept("object", "i9", "[1]"),
                    Some("i9"),
                ),
                (
                    "intercept schema failure",
                    runs.intercept("search", "i9", r#"{"q": 5}"#),
                    Some("i9"),
                ),
            ],
        },
    ]
}

/// Steps 1–9, one request per fault ([`preflight_table`]). No refused request reaches the tool,
/// creates a record or spends budget; the same runs then work when nothing is wrong.
async fn preflight_checks_in_order(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let runs = Runs::create(&env).await;
    for check in preflight_table(&runs) {
        for (what, req, echo) in check.refused {
            let what = format!("{} / {what}", check.step);
            let mut before = Vec::new();
            for run in runs.all() {
                before.push(spent(&env, run).await);
            }
            let reply = env.send(&req).await;
            assert_eq!(
                (reply.status, reply.body["error"]["code"].as_str()),
                (check.status, Some(check.code)),
                "{what}: {}",
                reply.raw
            );
            assert_error(&reply, check.status, check.code, echo);
            let mut after = Vec::new();
            for run in runs.all() {
                after.push(spent(&env, run).await);
            }
            assert_eq!(before, after, "{what}: a rejection spent something");
            if let Some(id) = echo {
                for run in runs.all() {
                    env.no_record(&run.id, id).await;
                }
            }
        }
    }
    assert_eq!(
        env.fake.total_calls(),
        0,
        "a rejected call reached the tool"
    );

    // The same runs and tokens work when nothing is wrong, so each request failed on its own fault.
    let (t, rid) = (runs.token(), runs.r.id.as_str());
    let q = || json!({"q": "redis"});
    assert_ready(
        &env.send(&runs.good("ok-1", "search", q())).await,
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
    let reply = env.send(&runs.intercept("search", "ok-3", input)).await;
    assert_ready(&reply, "ok-3", "EVIDENCE_FOUND");
    let reply = env.send(&runs.intercept("tiny", "ok-4", "{}")).await;
    assert_ready(&reply, "ok-4", "EVIDENCE_FOUND");
    let only_search = &runs.only_search;
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

// ---------------------------------------------------------------------------------------------
// Step 10 and the order of the checks.

/// Step 10: the atomic reservation. Rejections spend nothing and create no record; a duplicate
/// leaves the first record untouched.
async fn reservation_checks(store_yaml: String) {
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
async fn first_failing_check_wins(store_yaml: String) {
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
async fn call_forms_answer_identically(store_yaml: String) {
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
