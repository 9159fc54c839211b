//! Fake tool services served by hyper, one route per behaviour a test needs. The integration
//! tests run it in process ([`FakeTool::start`]); `examples/fake_tool.rs` runs it as a process for
//! the scripts: the end-to-end scenario, the monitoring check, the benchmark and the kind test.
//! Every answer that the agent must never see carries [`RAW_MARKER`].
//!
//! Besides the routes the integration tests use, it serves:
//!
//! - `GET /healthz`: 200, for readiness probes;
//! - `/bench`: the same ~1 KiB `{"results": [5 items]}` for every request, not recorded, so a
//!   benchmark measures the proxy in front of it and not the tool; [`FakeTool::start_sized`]
//!   makes it an answer of a given size instead ([`bench_document`]);
//! - `/scenario/*`: the tools of `deploy/scenario/scenario.py` (see [`scenario_answer`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A string that the fake tools put in raw payloads; no agent-facing body may contain it.
pub const RAW_MARKER: &str = "RAW-SECRET-MARKER-7f3a";

/// What one request to a fake tool carried.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    /// The body exactly as received.
    pub body_text: String,
}

/// Serves HTTP/1 on every connection `listener` accepts, in a task of its own, each request
/// answered by `answer`; the test servers (fake tools, the OTLP receiver, hand-made MCP
/// upstreams) share it.
pub fn serve_http1<F, Fut, B>(listener: TcpListener, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// A running fake tool service.
#[derive(Clone)]
pub struct FakeTool {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Bytes the endless route managed to send before the client stopped reading.
    pub endless_sent: Arc<AtomicU64>,
    /// Set once an endless body was dropped: its connection ended and it sends no more.
    pub endless_closed: Arc<AtomicBool>,
    /// What `/bench` answers.
    bench: Bytes,
}

impl FakeTool {
    pub async fn start() -> FakeTool {
        FakeTool::start_on("127.0.0.1:0".parse().expect("loopback address")).await
    }

    /// [`Self::start`] on a given address (port 0: any free port; [`FakeTool::addr`] tells which).
    pub async fn start_on(addr: SocketAddr) -> FakeTool {
        FakeTool::start_sized(addr, None).await
    }

    /// [`Self::start_on`], with `/bench` answering `bench_document(result_bytes)`.
    pub async fn start_sized(addr: SocketAddr, result_bytes: Option<usize>) -> FakeTool {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind fake tool on {addr}: {e}"));
        let tool = FakeTool {
            addr: listener.local_addr().expect("addr"),
            seen: Arc::default(),
            endless_sent: Arc::default(),
            endless_closed: Arc::default(),
            bench: bench_document(result_bytes),
        };
        let t = tool.clone();
        serve_http1(listener, move |req| {
            let t = t.clone();
            async move { t.answer(req).await }
        });
        tool
    }

    /// `http://127.0.0.1:port/<route>`
    pub fn url(&self, route: &str) -> String {
        format!("http://{}/{route}", self.addr)
    }

    /// Requests received so far on `route`.
    pub fn calls(&self, route: &str) -> Vec<Seen> {
        let path = format!("/{route}");
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }

    /// Total requests received on any route.
    pub fn total_calls(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<FakeBody> {
        let path = req.uri().path().to_string();
        if path == "/bench" {
            // Drain the request so keep-alive connections stay usable; its content does not matter.
            let _ = req.into_body().collect().await;
            return bench_answer(&self.bench);
        }
        if path == "/healthz" && req.method() == hyper::Method::GET {
            return json(200, json!({"ok": true}));
        }
        let headers: HashMap<String, String> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let bytes = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let input: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if let Some(route) = path.strip_prefix("/scenario/") {
            let answer = scenario_answer(route, &input, &headers).await;
            self.seen.lock().expect("lock").push(Seen {
                path,
                headers,
                body: input,
                body_text: String::from_utf8_lossy(&bytes).to_string(),
            });
            return answer;
        }
        self.seen.lock().expect("lock").push(Seen {
            path: path.clone(),
            headers,
            body: input.clone(),
            body_text: String::from_utf8_lossy(&bytes).to_string(),
        });
        if let Some(ms) = input.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let item = |i: usize| json!({"title": format!("t{i}"), "url": format!("https://e.x/{i}"), "snippet": "s", "extra": RAW_MARKER});
        match path.as_str() {
            "/search" | "/slow" => json(
                200,
                json!({"results": (0..7).map(item).collect::<Vec<_>>()}),
            ),
            "/empty" => json(200, json!({"results": []})),
            "/null" => json(200, json!({"results": null})),
            "/object" => json(200, json!({"results": item(0)})),
            "/scalar" => json(200, json!({"results": 42})),
            "/unresolved" => json(200, json!({"other": RAW_MARKER})),
            "/fail" => json(500, json!({"error": RAW_MARKER})),
            "/notjson" => text(200, format!("<html>{RAW_MARKER}</html>")),
            "/big" => json(
                200,
                json!({"results": [{"blob": "x".repeat(2 << 20)}], "m": RAW_MARKER}),
            ),
            "/bigfail" => text(503, format!("{RAW_MARKER}{}", "y".repeat(2 << 20))),
            "/wide" => json(
                200,
                json!({"results": (0..200).map(|i| json!({"title": format!("{i}{}", "w".repeat(300))})).collect::<Vec<_>>()}),
            ),
            // Valid JSON nested `depth` arrays deep under `results`.
            "/deep" => {
                let depth = input["depth"].as_u64().unwrap_or(1) as usize;
                let body = format!(
                    r#"{{"results":{}{}}}"#,
                    "[".repeat(depth),
                    "]".repeat(depth)
                );
                let mut resp = text(200, body);
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                resp
            }
            "/echo" => json(
                200,
                json!({"results": {"input": input, "extra": RAW_MARKER}}),
            ),
            // 'é' is 1 char and 2 bytes: 6000 chars fit a 8000 limit by count, not by bytes.
            "/utf8" => json(200, json!({"results": {"text": "é".repeat(6000)}})),
            "/endless" => Response::new(FakeBody::Endless(Endless {
                sent: self.endless_sent.clone(),
                closed: self.endless_closed.clone(),
            })),
            _ => json(404, json!({"error": "no route"})),
        }
    }
}

/// How long `/scenario/slow` takes: over the 1 s timeout the scenario configs give that tool.
pub const SCENARIO_SLOW: Duration = Duration::from_secs(3);

/// The scenario's tools (`deploy/scenario/toolgate-*.yaml`), each answering a POSTed JSON object:
///
/// - `search`: `{"results": [7 items of title, url, snippet, extra]}`, an empty list when `q` is
///   `"nothing"`; each `extra` echoes the forwarded `X-Run-Id`, `X-Tool-Call-Id` and
///   `traceparent`, so the canonical record shows them while the agent's projection drops them;
/// - `big`: about 2 MiB of JSON (over a 1 MiB `raw_bytes`);
/// - `wide`: about 64 KiB of JSON (within `raw_bytes`, over a small `agent_bytes`);
/// - `fail`: HTTP 500 with a body holding [`RAW_MARKER`];
/// - `slow`: answers like `search` after [`SCENARIO_SLOW`].
async fn scenario_answer(
    route: &str,
    input: &Value,
    headers: &HashMap<String, String>,
) -> Response<FakeBody> {
    if !input.is_object() {
        return json(400, json!({"error": "input is not a JSON object"}));
    }
    let search = |input: &Value| {
        let q = input.get("q").and_then(Value::as_str).unwrap_or_default();
        if q == "nothing" {
            return json!({"results": []});
        }
        let echo = json!({
            "run_id": headers.get("x-run-id"),
            "tool_call_id": headers.get("x-tool-call-id"),
            "traceparent": headers.get("traceparent"),
        });
        let items: Vec<Value> = (1..=7)
            .map(|i| {
                json!({
                    "title": format!("Result {i} for {q}"),
                    "url": format!("https://example.com/{i}"),
                    "snippet": format!("Snippet {i} about {q}."),
                    "extra": {"rank": i, "internal_score": 1.0 / f64::from(i), "request": echo},
                })
            })
            .collect();
        json!({ "results": items })
    };
    match route {
        "search" => json(200, search(input)),
        "big" => json(200, json!({"blob": "x".repeat(2 << 20)})),
        "wide" => json(
            200,
            json!({"rows": (0..525).map(|i| json!({"id": i, "text": "w".repeat(100)})).collect::<Vec<_>>()}),
        ),
        "fail" => text(
            500,
            format!("internal error: database password leaked {RAW_MARKER}\n"),
        ),
        "slow" => {
            tokio::time::sleep(SCENARIO_SLOW).await;
            json(200, search(input))
        }
        _ => json(404, json!({"error": "no such tool"})),
    }
}

/// The benchmark's answer: `{"results": [...]}` of search-like items (title, url, snippet,
/// score), compact. `None`: five items, about 1 KiB. `Some(n)`: as many items as fit in `n`
/// bytes, the last one's snippet padded so that the document is exactly `n` bytes (at least
/// one item, so a smaller `n` gets a one-item document, longer than `n`).
pub fn bench_document(result_bytes: Option<usize>) -> Bytes {
    let item = |i: usize| {
        json!({
            "title": format!("Result {i}: toolgate benchmark document"),
            "url": format!("https://docs.example.test/bench/articles/{i:04}"),
            "snippet": format!(
                "Item {i} of a fixed answer used to measure the proxy in front of the tool."
            ),
            "score": 1.0 / i as f64,
        })
    };
    let Some(want) = result_bytes else {
        let items: Vec<Value> = (1..=5).map(item).collect();
        return Bytes::from(json!({ "results": items }).to_string());
    };
    const HEAD: &str = r#"{"results":["#;
    const TAIL: &str = "]}";
    let mut body = String::with_capacity(want.max(1024));
    body.push_str(HEAD);
    let mut last = 0;
    for i in 1.. {
        let text = item(i).to_string();
        let sep = usize::from(i > 1);
        if i > 1 && body.len() + sep + text.len() + TAIL.len() > want {
            break;
        }
        last = body.len() + sep;
        if sep == 1 {
            body.push(',');
        }
        body.push_str(&text);
    }
    let short = want.saturating_sub(body.len() + TAIL.len());
    if short > 0 {
        // Re-made with a longer snippet: ASCII, so each char added is one byte.
        let mut padded = serde_json::from_str::<Value>(&body[last..]).expect("an item");
        let snippet = padded["snippet"].as_str().expect("a snippet").to_string();
        padded["snippet"] = Value::from(snippet + &"x".repeat(short));
        body.truncate(last);
        body.push_str(&padded.to_string());
    }
    body.push_str(TAIL);
    Bytes::from(body)
}

fn bench_answer(body: &Bytes) -> Response<FakeBody> {
    let mut r = Response::new(FakeBody::Full(Some(body.clone())));
    r.headers_mut()
        .insert("content-type", "application/json".parse().expect("ct"));
    r
}

fn json(status: u16, v: Value) -> Response<FakeBody> {
    let mut r = Response::new(FakeBody::Full(Some(Bytes::from(v.to_string()))));
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
    r.headers_mut()
        .insert("content-type", "application/json".parse().expect("ct"));
    r
}

fn text(status: u16, s: String) -> Response<FakeBody> {
    let mut r = Response::new(FakeBody::Full(Some(Bytes::from(s))));
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
    r
}

/// A complete body, or one that never ends (chunked, 64 KiB frames, counted as sent).
pub enum FakeBody {
    Full(Option<Bytes>),
    Endless(Endless),
}

/// The never-ending body: counts what it sent and flags when hyper dropped it.
pub struct Endless {
    sent: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
}

impl Drop for Endless {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FakeBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            FakeBody::Endless(Endless { sent, .. }) => {
                const CHUNK: usize = 64 * 1024;
                // Stop at 200 MiB so a broken client cannot hang the test forever.
                if sent.fetch_add(CHUNK as u64, Ordering::SeqCst) > 200 << 20 {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'['; CHUNK])))))
            }
        }
    }
}
