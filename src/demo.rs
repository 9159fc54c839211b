//! `toolgate demo`: the sidecar on the memory store with a built-in sample tool, a scripted
//! walk-through of one run printed to the terminal, then serving until Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ring::rand::SecureRandom;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::auth::Tokens;
use crate::config::Config;
use crate::listen::http::{self, Serving};
use crate::listen::{self, Listeners, Options};

const DEMO_CONFIG: &str = r#"
store: {kind: memory, record_ttl_ms: 3600000}
limits: {raw_bytes: 65536, agent_bytes: 4096}
tools:
  - name: search
    upstream: "http://TOOL/search"
    read_only: true
    timeout_ms: 2000
    input_schema: {type: object, required: [q], properties: {q: {type: string, maxLength: 200}}}
    projection: {select: /results, max_items: 3, fields: [title, url]}
  - name: fetch_log
    upstream: "http://TOOL/log"
    read_only: true
    projection: {select: /lines}
"#;

/// Runs the demo. Exit 0 on Ctrl-C, 1 when it cannot start.
pub async fn run() -> ExitCode {
    match demo().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toolgate demo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> Result<(), String> {
    let tool = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot bind the sample tool: {e}"))?;
    let tool_addr = tool.local_addr().map_err(|e| e.to_string())?;
    // The sample tool lives as long as the process: its stop signal never fires.
    let (_keep, never) = tokio::sync::watch::channel(false);
    tokio::spawn(http::serve(tool, Serving::plain(64), sample_tool, never));

    let config = Config::parse(&DEMO_CONFIG.replace("TOOL", &tool_addr.to_string()))
        .map_err(|e| e.to_string())?;
    let admin_token = match std::env::var("TOOLGATE_ADMIN_TOKEN") {
        Ok(t) if !t.is_empty() => t,
        _ => random_token()?,
    };
    let tokens = Tokens::new(&admin_token, None).map_err(|e| e.to_string())?;
    let listeners = Listeners::bind(&config.listen).await.map_err(|e| {
        format!("cannot bind 127.0.0.1:15001/15002 and 0.0.0.0:15090 ({e}); is another toolgate running?")
    })?;
    let (agent, admin, telemetry) = listeners.addrs().map_err(|e| e.to_string())?;
    let server = tokio::spawn(listen::run(
        config,
        tokens,
        listeners,
        Options::default(),
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    ));

    let c = DemoClient {
        http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        agent,
        admin,
        admin_token: admin_token.clone(),
    };
    walk_through(&c, telemetry).await?;
    println!("\nStill serving. Try it yourself (Ctrl-C to stop):\n");
    println!("  export ADMIN={admin_token}");
    println!(
        "  export RUN_TOKEN=$(curl -s -XPOST http://{admin}/v1/runs -H \"Authorization: Bearer $ADMIN\" -d '{{\"run_id\":\"my-run\"}}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"run_token\"])')"
    );
    println!(
        "  curl -s -XPOST http://{agent}/v1/invoke -H \"Authorization: Bearer $RUN_TOKEN\" -d '{{\"run_id\":\"my-run\",\"tool_call_id\":\"call_1\",\"tool\":\"search\",\"input\":{{\"q\":\"redis\"}}}}'"
    );
    println!(
        "  curl -s -XPOST http://{agent}/tools/search -H \"Authorization: Bearer $RUN_TOKEN\" -H 'X-Run-Id: my-run' -H 'X-Tool-Call-Id: call_2' -d '{{\"q\":\"rust\"}}'"
    );
    println!("  curl -s http://{admin}/v1/runs/my-run/facts -H \"Authorization: Bearer $ADMIN\"");
    println!(
        "  curl -s http://{admin}/v1/runs/my-run/invocations/call_1 -H \"Authorization: Bearer $ADMIN\""
    );
    println!("  curl -s http://{telemetry}/metrics");
    print!("{}", mcp_snippet(agent));
    match server.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

async fn walk_through(c: &DemoClient, telemetry: SocketAddr) -> Result<(), String> {
    println!(
        "toolgate demo: agent http://{}  admin http://{}  telemetry http://{telemetry}\n",
        c.agent, c.admin
    );
    let run_id = format!("demo-{}", crate::clock::now_ms());
    let (_, created) = c
        .admin(
            "POST",
            "/v1/runs",
            Some(json!({"run_id": run_id, "budget": {"max_calls": 10}})),
        )
        .await?;
    let token = created["run_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    println!("1. The harness creates run {run_id} and gets its run token.");
    let steps = [
        (
            "2. A search with results: the agent sees at most 3 items, title and url only.",
            "call_1",
            "search",
            json!({"q": "redis"}),
        ),
        (
            "3. A search with no results: a scoped NO_EVIDENCE, not an error.",
            "call_2",
            "search",
            json!({"q": "nothing"}),
        ),
        (
            "4. The same tool_call_id again: refused, the first record is untouched.",
            "call_1",
            "search",
            json!({"q": "other"}),
        ),
        (
            "5. A log fetch whose raw output is 200 KiB: over raw_bytes, fails closed.",
            "call_3",
            "fetch_log",
            json!({}),
        ),
    ];
    for (title, id, tool, input) in steps {
        let (status, body) = c
            .invoke(
                &token,
                json!({"run_id": run_id, "tool_call_id": id, "tool": tool, "input": input}),
            )
            .await?;
        println!("\n{title}\n   -> {status} {body}");
    }
    let (_, facts) = c
        .admin("POST", &format!("/v1/runs/{run_id}/end"), None)
        .await?;
    println!(
        "\n6. The harness ends the run; its facts are the READY records, in order:\n   -> {facts}"
    );
    let (_, bundle) = c
        .admin("GET", &format!("/v1/runs/{run_id}/evidence"), None)
        .await?;
    let (_, jwks) = c.admin("GET", "/.well-known/jwks.json", None).await?;
    let dir = std::env::temp_dir().join(format!("toolgate-demo-{}", std::process::id()));
    let write = |name: &str, value: &Value| {
        let path = dir.join(name);
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, value.to_string()))
            .map(|()| path)
            .map_err(|e| format!("cannot write {name}: {e}"))
    };
    let bundle_file = write("bundle.json", &bundle)?;
    let jwks_file = write("jwks.json", &jwks)?;
    println!(
        "\n7. The facts, signed (Ed25519): anyone with the public key checks them offline.\n   -> {bundle}\n   toolgate verify --bundle {} --jwks {}",
        bundle_file.display(),
        jwks_file.display()
    );
    Ok(())
}

struct DemoClient {
    http: Client<HttpConnector, Full<Bytes>>,
    agent: SocketAddr,
    admin: SocketAddr,
    admin_token: String,
}

impl DemoClient {
    async fn send(
        &self,
        method: &str,
        url: String,
        token: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        self.send(
            method,
            format!("http://{}{path}", self.admin),
            &self.admin_token,
            body,
        )
        .await
    }

    async fn invoke(&self, token: &str, body: Value) -> Result<(u16, Value), String> {
        self.send(
            "POST",
            format!("http://{}/v1/invoke", self.agent),
            token,
            Some(body),
        )
        .await
    }
}

/// The built-in sample tool: a tiny search corpus and a log that is too large.
async fn sample_tool(req: Request<Incoming>) -> Response<http::Body> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let input: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match (path.as_str(), input["q"].as_str()) {
        ("/search", Some("nothing")) => http::json(StatusCode::OK, &json!({"results": []})),
        ("/search", Some(q)) => {
            let results: Vec<Value> = (1..=5)
                .map(|i| json!({"title": format!("{q} result {i}"), "url": format!("https://example.com/{q}/{i}"), "internal_score": i}))
                .collect();
            http::json(StatusCode::OK, &json!({"results": results}))
        }
        ("/log", _) => {
            let lines: Vec<String> = (0..4000)
                .map(|i| format!("line {i:05} {}", "x".repeat(40)))
                .collect();
            http::json(StatusCode::OK, &json!({"lines": lines}))
        }
        _ => http::json(StatusCode::NOT_FOUND, &json!({"error": "no such tool"})),
    }
}

fn random_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no system randomness".to_string())?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// How to point an MCP client at the demo: the endpoint, and a Python SDK script that passes the
/// two `_meta` ids.
fn mcp_snippet(agent: std::net::SocketAddr) -> String {
    format!(
        r#"
Or connect an MCP client to http://{agent}/mcp (Streamable HTTP, the run token as bearer).
With the Python SDK (pip install mcp):

  import asyncio, os, httpx2
  from mcp import Client
  from mcp.client.streamable_http import streamable_http_client

  async def main():
      auth = {{"Authorization": "Bearer " + os.environ["RUN_TOKEN"]}}
      async with httpx2.AsyncClient(headers=auth) as http:
          async with Client(streamable_http_client("http://{agent}/mcp", http_client=http)) as client:
              print([t.name for t in (await client.list_tools()).tools])
              result = await client.call_tool("search", {{"q": "redis"}}, meta={{
                  "toolgate.dev/run_id": "my-run",          # the run the token belongs to
                  "toolgate.dev/tool_call_id": "call_mcp_1",  # your framework's own call id
              }})
              print(result.structured_content)

  asyncio.run(main())
"#
    )
}
