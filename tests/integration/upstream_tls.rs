//! The real `toolgate` binary against an https tool service: trusted through `SSL_CERT_FILE`
//! it answers READY; untrusted, the call fails closed without leaking why. Also checks the
//! binary drains and exits 0 on SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const ADMIN: &str = "tls-test-admin";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// An https tool on 127.0.0.1 presenting the test certificate (SAN IP 127.0.0.1).
async fn tls_tool() -> SocketAddr {
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(fixture("server.pem")).expect("cert"),
    ))
    .collect::<Result<_, _>>()
    .expect("parse cert");
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(fixture("server.key")).expect("key"),
    ))
    .expect("parse key")
    .expect("a key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|_req: Request<hyper::body::Incoming>| async {
                    let body =
                        json!({"results": [{"title": "over tls", "secret": "RAW-TLS-MARKER"}]});
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                        body.to_string(),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The real binary with a config in a temp dir; killed on drop unless it already exited.
struct Toolgate {
    child: Child,
    agent: u16,
    admin: u16,
    telemetry: u16,
}

impl Toolgate {
    fn spawn(tool: SocketAddr, trust_test_ca: bool) -> Toolgate {
        let (agent, admin, telemetry) = (free_port(), free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("toolgate-tls-{}-{agent}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = dir.join("toolgate.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {{agent: '127.0.0.1:{agent}', admin: '127.0.0.1:{admin}', telemetry: '127.0.0.1:{telemetry}'}}\n\
                 tools:\n  - {{name: search, upstream: 'https://{tool}/search', read_only: true, timeout_ms: 5000,\n     projection: {{select: /results, fields: [title]}}}}\n"
            ),
        )
        .expect("config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        cmd.args(["serve", "--config"])
            .arg(&config)
            .env("TOOLGATE_ADMIN_TOKEN", ADMIN)
            .env("TOOLGATE_LOG", "warn")
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if trust_test_ca {
            cmd.env("SSL_CERT_FILE", fixture("server.pem"));
        }
        Toolgate {
            child: cmd.spawn().expect("spawn toolgate"),
            agent,
            admin,
            telemetry,
        }
    }
}

impl Drop for Toolgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn send(
    http: &Client<HttpConnector, Full<Bytes>>,
    url: String,
    token: &str,
    body: Value,
) -> Option<(u16, String)> {
    let req = Request::post(url)
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = http.request(req).await.ok()?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&bytes).to_string()))
}

/// Creates a run (polling until the binary listens) and makes one call.
async fn one_call(tg: &Toolgate) -> (u16, Value) {
    let http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let created = loop {
        let url = format!("http://127.0.0.1:{}/v1/runs", tg.admin);
        if let Some((201, body)) = send(&http, url, ADMIN, json!({"run_id": "tls-run"})).await {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "toolgate never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let created: Value = serde_json::from_str(&created).expect("json");
    let token = created["run_token"].as_str().expect("token");
    let call = json!({"run_id": "tls-run", "tool_call_id": "call_tls", "tool": "search", "input": {"q": "x"}});
    let (status, body) = send(
        &http,
        format!("http://127.0.0.1:{}/v1/invoke", tg.agent),
        token,
        call,
    )
    .await
    .expect("agent answered");
    assert!(!body.contains("RAW-TLS-MARKER"), "{body}");
    (status, serde_json::from_str(&body).expect("json body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_tool_trusted_through_ssl_cert_file() {
    let tool = tls_tool().await;
    let mut tg = Toolgate::spawn(tool, true);
    let (status, body) = one_call(&tg).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"],
        json!({"items": [{"title": "over tls"}], "total_items": 1})
    );

    // SIGTERM: the binary drains and exits 0.
    let term = Command::new("kill")
        .args(["-TERM", &tg.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let code = loop {
        if let Some(status) = tg.child.try_wait().expect("wait") {
            break status.code();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "toolgate did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(code, Some(0), "exit code after SIGTERM");
    let _ = tg.telemetry;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_https_tool_fails_closed() {
    let tool = tls_tool().await;
    let tg = Toolgate::spawn(tool, false);
    let (status, body) = one_call(&tg).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "TOOL_EXECUTION_FAILED");
    let text = body.to_string();
    for leak in [
        "127.0.0.1",
        "certificate",
        "UnknownIssuer",
        "rustls",
        "Connect",
    ] {
        assert!(!text.contains(leak), "error body leaks {leak:?}: {text}");
    }
}
