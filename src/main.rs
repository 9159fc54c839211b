//! The `toolgate` command: parses the command line and hands over to the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use toolgate::auth::{self, Tokens};
use toolgate::config::Config;
use toolgate::injector::{self, InjectorArgs, InjectorError, InjectorSettings};
use toolgate::listen::{self, Listeners, Options};

/// mimalloc instead of glibc malloc: the allocator was the largest single cost on the call
/// path (a third of the instructions per call under callgrind, plus lock contention). It is
/// called the way the system allocator is (`toolgate-alloc`, in `alloc/`).
#[global_allocator]
static GLOBAL: toolgate_alloc::Mimalloc = toolgate_alloc::Mimalloc;

/// Turns transparent huge pages off for this process, before its heap grows.
///
/// With huge pages the heap's resident size moves in 2 MiB steps: a 2 MiB page is kept while
/// any of it is in use, the allocator's page purges cannot give its parts back, and the kernel's
/// background collapse (`khugepaged`) raises the RSS minutes after start for no new data. A
/// sidecar with a heap of tens of MiB under a small memory limit gains nothing from them and
/// loses a steady RSS. (mimalloc is also built without its huge-page advice, `no_thp`; this call
/// covers nodes whose THP setting is `always`.)
#[cfg(target_os = "linux")]
fn no_huge_pages() {
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

#[cfg(not(target_os = "linux"))]
fn no_huge_pages() {}

/// Exit code for a bad config, bad usage or an empty admin token.
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "toolgate",
    version,
    about = "A tool-call boundary sidecar for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar.
    Serve {
        /// Config file (YAML).
        #[arg(long, env = "TOOLGATE_CONFIG")]
        config: PathBuf,
    },
    /// Validate a config file and exit 0 (valid) or 64 (invalid).
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// A self-contained walk-through on the memory store, then keeps serving.
    Demo,
    /// Check an evidence bundle offline against a JWK Set (and, with --records, the records).
    Verify {
        /// The bundle: the body of `GET /v1/runs/{run_id}/evidence`.
        #[arg(long)]
        bundle: PathBuf,
        /// The JWK Set: the body of `GET /.well-known/jwks.json`.
        #[arg(long)]
        jwks: PathBuf,
        /// A directory of invocation bodies, `<tool_call_id>.json`, to check the digests against.
        #[arg(long)]
        records: Option<PathBuf>,
    },
    /// The Kubernetes admission webhook that injects the sidecar.
    Injector {
        /// Address to serve HTTPS on.
        #[arg(long, default_value = "0.0.0.0:8443")]
        listen: SocketAddr,
        #[arg(long)]
        tls_cert: PathBuf,
        #[arg(long)]
        tls_key: PathBuf,
        /// The sidecar image to inject.
        #[arg(long)]
        image: String,
        /// Default ConfigMap holding toolgate.yaml.
        #[arg(long)]
        config_map: String,
        /// Secret holding the admin token (key `token`).
        #[arg(long)]
        admin_secret: String,
        /// Secret holding the evidence signing key, mounted read-only at
        /// /var/run/secrets/toolgate/evidence.
        #[arg(long)]
        evidence_secret: Option<String>,
    },
}

fn main() -> ExitCode {
    no_huge_pages();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Verify {
            bundle,
            jwks,
            records,
        } => verify(&bundle, &jwks, records.as_deref()),
        Command::Check { config } => match Config::load(&config)
            .and_then(|c| toolgate::evidence::KeyFiles::load(&c.evidence).map(|_| c))
        {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Serve { config } => serve(config),
        Command::Demo => {
            runtime().map_or(ExitCode::FAILURE, |rt| rt.block_on(toolgate::demo::run()))
        }
        Command::Injector {
            listen,
            tls_cert,
            tls_key,
            image,
            config_map,
            admin_secret,
            evidence_secret,
        } => {
            init_logs();
            let args = InjectorArgs {
                listen,
                tls_cert,
                tls_key,
                settings: InjectorSettings {
                    image,
                    config_map,
                    admin_secret,
                    evidence_secret,
                },
            };
            let Some(rt) = runtime() else {
                return ExitCode::FAILURE;
            };
            match rt.block_on(injector::serve(args, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e @ InjectorError::Settings { .. }) => {
                    tracing::error!(error = %e, "invalid injector settings");
                    ExitCode::from(EXIT_CONFIG)
                }
                Err(e) => {
                    tracing::error!(error = %e, "injector stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `toolgate verify`: exit 0 and `valid: …`, or exit 1 and the first failure, on one line.
fn verify(
    bundle: &std::path::Path,
    jwks: &std::path::Path,
    records: Option<&std::path::Path>,
) -> ExitCode {
    use toolgate::evidence::jws;
    let checked = jws::read(bundle)
        .and_then(|b| Ok((b, jws::read(jwks)?)))
        .and_then(|(b, k)| jws::verify(&b, &k, records));
    match checked {
        Ok(v) => {
            println!("valid: run {}, {} facts, key {}", v.run_id, v.facts, v.kid);
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("invalid: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            None
        }
    }
}

fn serve(path: PathBuf) -> ExitCode {
    init_logs();
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(config = %path.display(), error = %e, "invalid config");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let tokens = auth::admin_token(&config.admin).and_then(|admin| {
        let key = auth::token_key(&config.admin)?;
        let files = toolgate::evidence::KeyFiles::load(&config.evidence)?;
        Ok(Tokens::new(&admin, key.as_deref())?.with_evidence(&files))
    });
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot load tokens");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    rt.block_on(async move {
        let listeners = match Listeners::bind(&config.listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot bind listeners");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            agent = %config.listen.agent,
            admin = %config.listen.admin,
            telemetry = %config.listen.telemetry,
            "toolgate serving"
        );
        let options = Options {
            config_path: Some(path),
            workers: toolgate::workers::count(),
            ..Options::default()
        };
        match listen::run(config, tokens, listeners, options, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "toolgate stopped");
                ExitCode::FAILURE
            }
        }
    })
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    toolgate::log::init(filter);
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}
