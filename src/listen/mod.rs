//! The sidecar's three listeners: [`run`] serves them on already bound sockets, watches the
//! config file, and drains on shutdown. Each listener module only translates HTTP to calls on
//! [`crate::call`] and back.

pub mod admin;
pub mod agent;
mod framing;
pub mod http;
pub mod mcp;
pub mod slots;
pub mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::Tokens;
use crate::call::State;
use crate::config::{Config, ListenConfig, Reload};
use crate::error::Result;
use crate::metrics::{Listener, ReloadResult};
use crate::workers::Workers;
use http::Serving;

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
    /// Serving threads for the agent listener (`crate::workers`); 0 serves its connections
    /// on the runtime `run` is called on.
    pub workers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config_path: None,
            reload_interval: Duration::from_secs(1),
            workers: 0,
        }
    }
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
    let state = Arc::new(State::new(&config, tokens).await?);

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(path) = options.config_path.clone() {
        let metrics = state.metrics.clone();
        let policy = state.policy.clone();
        tasks.spawn(crate::config::watch::watch(
            path,
            config.clone(),
            options.reload_interval,
            move |next| policy.install(next),
            move |outcome| match outcome {
                Reload::Unchanged => {}
                Reload::Applied => {
                    tracing::info!("config reloaded");
                    metrics.config_reload(ReloadResult::Ok);
                }
                Reload::Refused(why) => {
                    tracing::warn!(reason = %why, "config reload refused; keeping the current one");
                    metrics.config_reload(ReloadResult::Error);
                }
            },
        ));
    }
    let workers = match options.workers {
        0 => None,
        n => Some(Arc::new(Workers::start(n).map_err(|e| {
            crate::error::Error::internal(format_args!("cannot start the serving threads: {e}"))
        })?)),
    };
    let (stop, stopped) = watch::channel(false);
    let mut listening = tokio::task::JoinSet::new();
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.agent,
        Serving {
            workers,
            idle_timeout: config.listen.idle_timeout,
            counts: state.metrics.connections(Listener::Agent),
            ..Serving::plain(config.listen.max_connections.agent)
        },
        move |req| agent::handle(s.clone(), req),
        stopped.clone(),
    ));
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.admin,
        Serving {
            idle_timeout: config.listen.idle_timeout,
            counts: state.metrics.connections(Listener::Admin),
            ..Serving::plain(config.listen.max_connections.admin)
        },
        move |req| admin::handle(s.clone(), req),
        stopped.clone(),
    ));
    let s = state.clone();
    listening.spawn(http::serve(
        listeners.telemetry,
        Serving {
            idle_timeout: config.listen.idle_timeout,
            counts: state.metrics.connections(Listener::Telemetry),
            ..Serving::telemetry(config.listen.max_connections.telemetry)
        },
        move |req| telemetry::handle(s.clone(), req),
        stopped,
    ));

    shutdown.await;
    state.begin_drain();
    tracing::info!("draining: waiting for calls in flight");
    state.calls.drained().await;
    // Listeners kept answering during the drain (SHUTTING_DOWN, /readyz 503); now they stop
    // and let the last responses reach their clients.
    stop.send_replace(true);
    listening.join_all().await;
    tasks.shutdown().await;
    if let Some(otel) = &state.otel {
        otel.shutdown().await;
    }
    tracing::info!("drained");
    Ok(())
}
