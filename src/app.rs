//! Builds the shared state, serves the three listeners, watches the config file, and drains on
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::Tokens;
use crate::boundary::{Calls, RunCache, RunSpec};
use crate::config::{Config, ListenConfig, LivePolicy, Reload, StoreKind};
use crate::error::{Code, Error, Result};
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::telemetry::Metrics;
use crate::upstream::Upstream;
use crate::{admin, agent, http};

/// Everything a request handler needs, shared by all listeners.
pub struct State {
    pub policy: Arc<LivePolicy>,
    pub tokens: Tokens,
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub upstream: Upstream,
    pub runs: RunCache,
    pub calls: Arc<Calls>,
    store_timeout: Duration,
    draining: AtomicBool,
}

impl State {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The immutable part of a run, from this sidecar's cache or else the store.
    pub async fn run_spec(&self, run_id: &str) -> Result<Option<Arc<RunSpec>>> {
        if let Some(spec) = self.runs.get(run_id) {
            return Ok(Some(spec));
        }
        let run = self
            .metrics
            .store_op("get_run", self.store.get_run(run_id))
            .await?;
        Ok(run.map(|r| self.runs.put(&r)))
    }

    /// `/readyz`: not draining, and the store answers within its timeout.
    async fn ready(&self) -> bool {
        if self.is_draining() {
            return false;
        }
        let ping = self.metrics.store_op("ping", self.store.ping());
        matches!(
            tokio::time::timeout(self.store_timeout, ping).await,
            Ok(Ok(()))
        )
    }
}

/// The three bound listeners. Tests bind port 0 and read the addresses back.
pub struct Listeners {
    pub agent: TcpListener,
    pub admin: TcpListener,
    pub telemetry: TcpListener,
}

impl Listeners {
    pub async fn bind(cfg: &ListenConfig) -> std::io::Result<Listeners> {
        Ok(Listeners {
            agent: TcpListener::bind(cfg.agent).await?,
            admin: TcpListener::bind(cfg.admin).await?,
            telemetry: TcpListener::bind(cfg.telemetry).await?,
        })
    }

    /// (agent, admin, telemetry) local addresses.
    pub fn addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr, SocketAddr)> {
        Ok((
            self.agent.local_addr()?,
            self.admin.local_addr()?,
            self.telemetry.local_addr()?,
        ))
    }
}

/// Options that are not part of the config file.
#[derive(Debug, Clone)]
pub struct Options {
    /// The file to watch for hot reload, if any.
    pub config_path: Option<PathBuf>,
    pub reload_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config_path: None,
            reload_interval: Duration::from_secs(1),
        }
    }
}

/// Opens the configured store.
pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>> {
    Ok(match config.store.kind {
        StoreKind::Memory => Arc::new(MemoryStore::new(config.store.record_ttl_ms)),
        StoreKind::RedisCluster => Arc::new(RedisStore::connect(&config.store).await?),
    })
}

/// Runs the sidecar until `shutdown` resolves, then drains: `/readyz` turns 503 at once, new
/// calls get `SHUTTING_DOWN`, calls in flight finish, and `run` returns.
pub async fn run(
    config: Config,
    tokens: Tokens,
    listeners: Listeners,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let store = open_store(&config).await?;
    let upstream = Upstream::new().map_err(Error::internal)?;
    let state = Arc::new(State {
        policy: Arc::new(LivePolicy::new(config.policy.clone())),
        tokens,
        store,
        metrics: Arc::new(Metrics::new()),
        upstream,
        runs: RunCache::default(),
        calls: Arc::new(Calls::default()),
        store_timeout: config.store.timeout,
        draining: AtomicBool::new(false),
    });

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(path) = options.config_path.clone() {
        let metrics = state.metrics.clone();
        tasks.spawn(crate::config::watch(
            path,
            config.clone(),
            state.policy.clone(),
            options.reload_interval,
            move |outcome| match outcome {
                Reload::Unchanged => {}
                Reload::Applied => {
                    tracing::info!("config reloaded");
                    metrics.config_reload(true);
                }
                Reload::Refused(why) => {
                    tracing::warn!(reason = %why, "config reload refused; keeping the current one");
                    metrics.config_reload(false);
                }
            },
        ));
    }
    let (stop, stopped) = watch::channel(false);
    let mut listening = tokio::task::JoinSet::new();
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.agent,
        move |req| agent::handle(s.clone(), req),
        stopped.clone(),
    ));
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.admin,
        move |req| admin::handle(s.clone(), req),
        stopped.clone(),
    ));
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.telemetry,
        move |req| telemetry(s.clone(), req),
        stopped,
    ));

    shutdown.await;
    state.draining.store(true, Ordering::SeqCst);
    tracing::info!("draining: waiting for calls in flight");
    state.calls.drained().await;
    // Listeners kept answering during the drain (SHUTTING_DOWN, /readyz 503); now they stop
    // and let the last responses reach their clients.
    stop.send_replace(true);
    listening.join_all().await;
    tasks.shutdown().await;
    tracing::info!("drained");
    Ok(())
}

async fn telemetry(state: Arc<State>, req: Request<Incoming>) -> Response<http::Body> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => http::text(
            StatusCode::OK,
            state.metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        (&Method::GET, "/healthz") => http::text(StatusCode::OK, "ok\n", TEXT),
        (&Method::GET, "/readyz") => {
            if state.ready().await {
                http::text(StatusCode::OK, "ready\n", TEXT)
            } else {
                http::text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", TEXT)
            }
        }
        _ => http::text(StatusCode::NOT_FOUND, Code::NotFound.message(), TEXT),
    }
}
