//! An upstream stream that never ends: toolgate stops reading at its byte limit or its timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

use super::{assert_mcp_error, assert_mcp_ready, mcp_call, mcp_env, rpc_id};
use crate::support::fake_tool::serve_http1;
use crate::support::{Deadline, store_yaml};

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
