//! Crowded listeners: idle keep-alive connections never lock the agent out. At the cap the
//! longest-idle connection makes room for a new one; only with a request in progress on every
//! connection is a new one refused, with the `OVERLOADED` error body; an idle connection closes
//! after `listen.idle_timeout_ms`, a busy one does not.
//!
//! The listener's behaviour does not depend on the store: these run on the memory store.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::boundary::{Env, Run, assert_ready};
use crate::support::sidecar::metric;
use crate::support::{Deadline, store_yaml};

/// The standard sidecar with `listen` settings of its own.
async fn env_listening(listen: &str) -> Env {
    Env::start(&format!("listen: {listen}\n{}", store_yaml(None))).await
}

/// A keep-alive connection that has been answered once and now sits idle.
async fn idle_connection(addr: SocketAddr) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /nowhere HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .expect("write");
    let head = read_response(&mut conn).await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    conn
}

/// Reads one response whose body has a `content-length`.
async fn read_response(conn: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if seen.len() >= end + 4 + length {
                return String::from_utf8_lossy(&seen).into_owned();
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .expect("a response within 30 s")
            .expect("read");
        assert!(n > 0, "closed before a whole response: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Whether the listener closed `conn` (end of file or reset), polled until `within`.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, conn.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected bytes on an idle connection: {:?}", &buf[..n]),
        Err(_) => false,
    }
}

/// A `/metrics` read on a connection of its own (a pooled one may have been closed as idle).
async fn metrics(addr: SocketAddr) -> String {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    read_response(&mut conn).await
}

/// A `POST /v1/invoke` of the `slow` tool, sleeping `sleep_ms` at the tool, on `conn`.
async fn send_slow_call(conn: &mut TcpStream, run: &Run, id: &str, sleep_ms: u64) {
    let body = json!({
        "run_id": run.id,
        "tool_call_id": id,
        "tool": "slow",
        "input": {"sleep_ms": sleep_ms},
    })
    .to_string();
    let request = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        run.token,
        body.len()
    );
    conn.write_all(request.as_bytes()).await.expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_make_room_for_a_new_call() {
    let env = env_listening("{max_connections: {agent: 4}}").await;
    let run = env.run(json!({})).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(idle_connection(env.sc.agent).await);
    }
    // The cap is filled by idle connections; the agent's call still gets through.
    let reply = env
        .call(&run, "crowded_1", "search", json!({"q": "x"}))
        .await;
    assert_ready(&reply, "crowded_1", "EVIDENCE_FOUND");
    // The one idle longest (the first) was closed to make room.
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(10)).await,
        "the longest-idle connection was not closed"
    );
    let text = metrics(env.sc.telemetry).await;
    let shed = metric(
        &text,
        "toolgate_connections_shed_total",
        &[("listener", "agent"), ("reason", "cap")],
    );
    assert!(shed >= Some(1.0), "shed: {shed:?}");
    assert_eq!(
        metric(
            &text,
            "toolgate_connections_refused_total",
            &[("listener", "agent")]
        ),
        Some(0.0)
    );
    let open = metric(&text, "toolgate_connections_open", &[("listener", "agent")]);
    assert!(open.is_some_and(|n| n <= 4.0), "open: {open:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_connection_busy_a_new_one_gets_overloaded() {
    let env = env_listening("{max_connections: {agent: 2}}").await;
    let run = env.run(json!({})).await;
    let mut busy = Vec::new();
    for i in 0..2 {
        let mut conn = TcpStream::connect(env.sc.agent).await.expect("connect");
        send_slow_call(&mut conn, &run, &format!("busy_{i}"), 3000).await;
        busy.push(conn);
    }
    // Both calls are at the tool: every slot has a request in progress.
    let d = Deadline::after(Duration::from_secs(20), "both slow calls in flight");
    while env
        .sc
        .metric("toolgate_invocations_in_flight", &[("tool", "slow")])
        .await
        != Some(2.0)
    {
        d.tick().await;
    }
    let mut refused = TcpStream::connect(env.sc.agent).await.expect("connect");
    let answer = read_response(&mut refused).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).expect("a body");
    let body: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(body["status"], "ERROR");
    assert_eq!(body["error"]["code"], "OVERLOADED");
    assert!(
        closed_within(&mut refused, Duration::from_secs(10)).await,
        "the refused connection is closed"
    );
    // The busy connections were not shed: both calls finish READY.
    for conn in &mut busy {
        let answer = read_response(conn).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("\"status\":\"READY\""), "{answer}");
    }
    let refused = env
        .sc
        .metric(
            "toolgate_connections_refused_total",
            &[("listener", "agent")],
        )
        .await;
    assert!(refused >= Some(1.0), "refused: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_closes_an_idle_connection_and_not_a_busy_one() {
    let env = env_listening("{idle_timeout_ms: 300}").await;
    let run = env.run(json!({})).await;
    let mut idle = idle_connection(env.sc.agent).await;
    let mut busy = TcpStream::connect(env.sc.agent).await.expect("connect");
    // In progress for well over the idle timeout.
    send_slow_call(&mut busy, &run, "busy_long", 2000).await;
    assert!(
        closed_within(&mut idle, Duration::from_secs(20)).await,
        "the idle connection was not closed"
    );
    let answer = read_response(&mut busy).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"status\":\"READY\""), "{answer}");
    // Kept alive after its answer, it is idle now, and closes in its turn.
    assert!(
        closed_within(&mut busy, Duration::from_secs(20)).await,
        "the connection stayed open after its call"
    );
    let text = metrics(env.sc.telemetry).await;
    let shed = metric(
        &text,
        "toolgate_connections_shed_total",
        &[("listener", "agent"), ("reason", "idle_timeout")],
    );
    assert!(shed >= Some(2.0), "shed: {shed:?}");
}
