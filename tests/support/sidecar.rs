//! The real sidecar, started in-process on port 0 with a config file in a temp dir, and a small
//! HTTP client for its three listeners.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolgate::auth::Tokens;
use toolgate::config::Config;
use toolgate::error::Result;
use toolgate::listen::{self, Listeners, Options};

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A running sidecar.
pub struct Sidecar {
    pub agent: SocketAddr,
    pub admin: SocketAddr,
    pub telemetry: SocketAddr,
    pub config_path: PathBuf,
    http: Client<HttpConnector, Full<Bytes>>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<Result<()>>>>,
}

/// An HTTP answer: status and JSON body (`Value::String` when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub raw: String,
}

impl Sidecar {
    /// Starts a sidecar with this config text (listen addresses are forced to port 0).
    pub async fn start(config_yaml: &str) -> Sidecar {
        let dir = super::temp_dir("sidecar");
        let config_path = dir.join("toolgate.yaml");
        std::fs::write(&config_path, config_yaml).expect("write config");
        let config = Config::load(&config_path).expect("test config is valid");
        let localhost: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let listeners = Listeners {
            agent: tokio::net::TcpListener::bind(localhost)
                .await
                .expect("bind"),
            admin: tokio::net::TcpListener::bind(localhost)
                .await
                .expect("bind"),
            telemetry: tokio::net::TcpListener::bind(localhost)
                .await
                .expect("bind"),
        };
        let (agent, admin, telemetry) = listeners.addrs().expect("addrs");
        let tokens = Tokens::new(ADMIN_TOKEN, None).expect("tokens");
        let (stop, stopped) = oneshot::channel::<()>();
        let options = Options {
            config_path: Some(config_path.clone()),
            reload_interval: Duration::from_millis(100),
            // As `toolgate serve` does: connections are served on threads of their own.
            workers: 2,
        };
        let task = tokio::spawn(listen::run(
            config,
            tokens,
            listeners,
            options,
            async move {
                let _ = stopped.await;
            },
        ));
        let sidecar = Sidecar {
            agent,
            admin,
            telemetry,
            config_path,
            http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
        };
        sidecar.wait_ready().await;
        sidecar
    }

    /// Polls `/readyz` until it answers 200 (10 s deadline).
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if self.get_telemetry("/readyz").await.0 == 200 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sidecar never became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Begins the drain (as SIGTERM does) and returns the run task.
    pub fn begin_shutdown(&self) -> JoinHandle<Result<()>> {
        if let Some(stop) = self.stop.lock().expect("lock").take() {
            let _ = stop.send(());
        }
        self.task
            .lock()
            .expect("lock")
            .take()
            .expect("sidecar already shut down")
    }

    /// Replaces the config file atomically (write + rename), so the watcher never reads half a file.
    pub fn rewrite_config(&self, config_yaml: &str) {
        let tmp = self.config_path.with_extension("yaml.tmp");
        std::fs::write(&tmp, config_yaml).expect("write config");
        std::fs::rename(&tmp, &self.config_path).expect("replace config");
    }

    /// Sends any request. `token` becomes `Authorization: Bearer <token>`.
    pub async fn send(
        &self,
        method: &str,
        url: String,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        self.send_with_headers(method, url, token, headers, body)
            .await
            .0
    }

    /// [`Self::send`], also returning the response headers.
    pub async fn send_with_headers(
        &self,
        method: &str,
        url: String,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> (Reply, hyper::HeaderMap) {
        let mut req = Request::builder().method(method).uri(url);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body.into())).expect("request");
        let resp = self.http.request(req).await.expect("sidecar answered");
        let status = resp.status().as_u16();
        let response_headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let raw = String::from_utf8_lossy(&bytes).to_string();
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(raw.clone()));
        (Reply { status, body, raw }, response_headers)
    }

    /// An admin request with the admin token.
    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.send(
            method,
            format!("http://{}{path}", self.admin),
            Some(ADMIN_TOKEN),
            &[],
            body,
        )
        .await
    }

    /// Creates a run; returns its token. Panics unless the answer is 201.
    pub async fn create_run(&self, body: Value) -> String {
        let r = self.admin("POST", "/v1/runs", Some(body)).await;
        assert_eq!(r.status, 201, "create run: {}", r.raw);
        r.body["run_token"].as_str().expect("run_token").to_string()
    }

    /// An envelope call.
    pub async fn invoke(
        &self,
        token: &str,
        run_id: &str,
        id: &str,
        tool: &str,
        input: Value,
    ) -> Reply {
        let body = json!({"run_id": run_id, "tool_call_id": id, "tool": tool, "input": input});
        self.invoke_raw(Some(token), body.to_string(), &[]).await
    }

    /// An envelope call with any body and headers.
    pub async fn invoke_raw(
        &self,
        token: Option<&str>,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> Reply {
        self.send(
            "POST",
            format!("http://{}/v1/invoke", self.agent),
            token,
            headers,
            body,
        )
        .await
    }

    /// An intercept call: `POST /tools/{tool}` with the ids as headers.
    pub async fn intercept(
        &self,
        token: &str,
        run_id: &str,
        id: &str,
        tool: &str,
        body: impl Into<Bytes>,
    ) -> Reply {
        self.send(
            "POST",
            format!("http://{}/tools/{tool}", self.agent),
            Some(token),
            &[("x-run-id", run_id), ("x-tool-call-id", id)],
            body,
        )
        .await
    }

    /// GET on the telemetry listener: (status, body text).
    pub async fn get_telemetry(&self, path: &str) -> (u16, String) {
        let req = Request::get(format!("http://{}{path}", self.telemetry))
            .body(Full::new(Bytes::new()))
            .expect("request");
        match self.http.request(req).await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let bytes = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                (status, String::from_utf8_lossy(&bytes).to_string())
            }
            Err(_) => (0, String::new()),
        }
    }

    pub async fn metrics(&self) -> String {
        self.get_telemetry("/metrics").await.1
    }

    /// The sum of the `/metrics` samples named `name` whose labels include `labels`.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        metric(&self.metrics().await, name, labels)
    }
}

/// The sum of the samples of a Prometheus text exposition named `name` whose labels include
/// every pair of `labels`; `None` when no sample matches.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (sample_name, label_text) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if sample_name != name {
            continue;
        }
        let found: Vec<(&str, &str)> = label_text
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|l| found.contains(l)) {
            let v: f64 = value.parse().expect("sample value");
            sum = Some(sum.unwrap_or(0.0) + v);
        }
    }
    sum
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}
