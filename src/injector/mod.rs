//! The Kubernetes mutating admission webhook: injects the toolgate sidecar into pods annotated
//! `toolgate.dev/inject: "true"`.
//!
//! [`review`] is the whole decision (pure), [`pod`] the sidecar's shape; [`serve`] puts the
//! decision behind HTTPS (rustls) as `POST /mutate` next to `GET /healthz`, on the same accept
//! loop as the sidecar's listeners.

pub mod pod;
pub mod review;

use std::future::Future;
use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use hyper::body::Body;
use hyper::header::{ALLOW, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tracing::{debug, info};

use crate::listen::http::{self, Serving};
pub use review::{
    ANNOTATION_CONFIG_MAP, ANNOTATION_CPU, ANNOTATION_INJECT, ANNOTATION_INJECTED,
    ANNOTATION_MEMORY, ANNOTATION_NATIVE_SIDECAR, is_dns_subdomain, is_quantity, review,
};

/// Largest `POST /mutate` body read. A CREATE review carries one object, itself capped well
/// below this by etcd; a bigger body is answered 413 without being read to the end.
pub const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The API server gives a webhook at most 30 s; a body slower than this is not worth waiting for.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish once the webhook stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the webhook puts into every injected pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectorSettings {
    /// Image of the sidecar container.
    pub image: String,
    /// ConfigMap holding `toolgate.yaml`, unless the pod names another one.
    pub config_map: String,
    /// Secret whose key `token` becomes `TOOLGATE_ADMIN_TOKEN`.
    pub admin_secret: String,
    /// Secret holding the evidence signing key, mounted read-only into the sidecar at
    /// [`pod::EVIDENCE_MOUNT_PATH`]; none: no evidence volume.
    pub evidence_secret: Option<String>,
}

impl InjectorSettings {
    /// Refuses settings that would make every injected pod invalid, so the injector can exit
    /// with a bad-usage code before it binds its port.
    pub fn validate(&self) -> Result<(), InjectorError> {
        if self.image.is_empty() || self.image.chars().any(char::is_whitespace) {
            return Err(InjectorError::Settings {
                name: "image",
                reason: "must be a non-empty image reference without whitespace".to_owned(),
            });
        }
        for (name, value) in [
            ("config-map", Some(&self.config_map)),
            ("admin-secret", Some(&self.admin_secret)),
            ("evidence-secret", self.evidence_secret.as_ref()),
        ] {
            let Some(value) = value else {
                continue;
            };
            if !is_dns_subdomain(value) {
                return Err(InjectorError::Settings {
                    name,
                    reason: "must be a Kubernetes object name (lowercase DNS-1123 subdomain)"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Command-line arguments of `toolgate injector`.
#[derive(Clone, Debug)]
pub struct InjectorArgs {
    /// Address of the HTTPS listener.
    pub listen: SocketAddr,
    /// PEM certificate chain served to the API server.
    pub tls_cert: PathBuf,
    /// PEM private key of that certificate.
    pub tls_key: PathBuf,
    /// What gets injected.
    pub settings: InjectorSettings,
}

/// Why the injector could not start.
#[derive(Debug, thiserror::Error)]
pub enum InjectorError {
    /// A command-line setting is unusable.
    #[error("invalid --{name}: {reason}")]
    Settings {
        /// The flag, without dashes.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS file could not be read or holds no usable PEM item.
    #[error("TLS {what} {path}: {reason}")]
    TlsFile {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file named on the command line.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the certificate and key.
    #[error("invalid TLS certificate or key: {0}")]
    Tls(#[from] rustls::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Loads a PEM certificate chain and private key into a rustls server config (ring provider,
/// HTTP/1.1 only).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, InjectorError> {
    let file_error = |what: &'static str, path: &Path, reason: String| InjectorError::TlsFile {
        what,
        path: path.to_owned(),
        reason,
    };
    let cert_pem =
        std::fs::read(cert).map_err(|e| file_error("certificate", cert, e.to_string()))?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(cert_pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error("certificate", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_error(
            "certificate",
            cert,
            "no PEM certificate".to_owned(),
        ));
    }
    let key_pem = std::fs::read(key).map_err(|e| file_error("key", key, e.to_string()))?;
    let private_key = rustls_pemfile::private_key(&mut BufReader::new(key_pem.as_slice()))
        .map_err(|e| file_error("key", key, e.to_string()))?
        .ok_or_else(|| file_error("key", key, "no PEM private key".to_owned()))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Runs `toolgate injector`: validates the settings, loads the TLS files, binds `args.listen`
/// and serves until `shutdown` completes.
pub async fn serve(
    args: InjectorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), InjectorError> {
    args.settings.validate()?;
    let tls = tls_config(&args.tls_cert, &args.tls_key)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| InjectorError::Bind {
            addr: args.listen,
            source,
        })?;
    info!(listen = %args.listen, "toolgate injector listening");
    serve_on(listener, tls, args.settings, shutdown).await;
    Ok(())
}

/// Serves the webhook on an already bound listener until `shutdown` completes, then stops
/// accepting and gives open connections a bounded time to finish their request.
pub async fn serve_on(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    settings: InjectorSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let serving = Serving {
        tls: Some(TlsAcceptor::from(tls)),
        header_read_timeout: HEADER_READ_TIMEOUT,
        close_grace: DRAIN_TIMEOUT,
        // The API server opens a few connections per replica; anything past this is not it.
        ..Serving::plain(256)
    };
    let settings = Arc::new(settings);
    let (stop, stopped) = watch::channel(false);
    let serving = http::serve(
        listener,
        serving,
        move |request| {
            let settings = Arc::clone(&settings);
            async move { handle(request, &settings).await }
        },
        stopped,
    );
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => {}
        () = shutdown => {
            stop.send_replace(true);
            serving.await;
        }
    }
    info!("toolgate injector stopped");
}

/// Routes one request. Generic over the body so tests can drive it without a socket.
async fn handle<B>(request: Request<B>, settings: &InjectorSettings) -> Response<http::Body>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match (request.method(), request.uri().path()) {
        (&Method::POST, "/mutate") => mutate(request.into_body(), settings).await,
        (&Method::GET, "/healthz") => http::text(StatusCode::OK, "ok", "text/plain; charset=utf-8"),
        (_, "/mutate") => not_allowed("POST"),
        (_, "/healthz") => not_allowed("GET"),
        _ => json_error(StatusCode::NOT_FOUND, "not found"),
    }
}

async fn mutate<B>(body: B, settings: &InjectorSettings) -> Response<http::Body>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // A declared length over the cap is refused before reading anything.
    if body.size_hint().lower() > MAX_REVIEW_BYTES as u64 {
        return too_large();
    }
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(body, MAX_REVIEW_BYTES).collect(),
    );
    let bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            debug!(error = %e, "cannot read admission review body");
            return json_error(StatusCode::BAD_REQUEST, "cannot read body");
        }
        Err(_) => return json_error(StatusCode::REQUEST_TIMEOUT, "body read timed out"),
    };
    let (status, body) = review(&bytes, settings);
    http::bytes(status, body)
}

fn too_large() -> Response<http::Body> {
    json_error(StatusCode::PAYLOAD_TOO_LARGE, "body too large")
}

fn not_allowed(allow: &'static str) -> Response<http::Body> {
    let mut response = json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

/// The webhook's own error body, `{"error": "..."}`, which the API server logs.
fn json_error(status: StatusCode, message: &str) -> Response<http::Body> {
    let (status, body) = review::error_body(status, message);
    http::bytes(status, body)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http_body_util::Full;
    use hyper::body::Frame;

    use super::*;

    #[test]
    fn settings_validation() {
        let good = InjectorSettings {
            image: "ghcr.io/example/toolgate:1.0".to_owned(),
            config_map: "toolgate".to_owned(),
            admin_secret: "toolgate-admin".to_owned(),
            evidence_secret: None,
        };
        assert!(good.validate().is_ok());
        let with_evidence = InjectorSettings {
            evidence_secret: Some("toolgate-evidence".to_owned()),
            ..good.clone()
        };
        assert!(with_evidence.validate().is_ok());
        for bad in ["", "Toolgate_Evidence", "-evidence"] {
            let bad_evidence = InjectorSettings {
                evidence_secret: Some(bad.to_owned()),
                ..good.clone()
            };
            assert!(
                matches!(
                    bad_evidence.validate(),
                    Err(InjectorError::Settings {
                        name: "evidence-secret",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let bad_image = InjectorSettings {
            image: String::new(),
            ..good.clone()
        };
        assert!(bad_image.validate().is_err());
        let bad_secret = InjectorSettings {
            admin_secret: "Not_A_Name".to_owned(),
            ..good
        };
        assert!(bad_secret.validate().is_err());
    }

    /// A body of unknown length, like a chunked request.
    struct Chunked(Option<Bytes>);

    impl Body for Chunked {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.take().map(|bytes| Ok(Frame::data(bytes))))
        }
    }

    fn settings() -> InjectorSettings {
        InjectorSettings {
            image: "toolgate:test".to_owned(),
            config_map: "toolgate".to_owned(),
            admin_secret: "toolgate-admin".to_owned(),
            evidence_secret: None,
        }
    }

    fn post(
        body: impl Body<Data = Bytes, Error = Infallible>,
    ) -> Request<impl Body<Data = Bytes, Error = Infallible>> {
        let mut request = Request::new(body);
        *request.method_mut() = Method::POST;
        *request.uri_mut() = hyper::Uri::from_static("/mutate?timeout=10s");
        request
    }

    #[tokio::test]
    async fn body_over_the_cap_is_refused_with_or_without_a_length() {
        let big = Bytes::from(vec![b' '; MAX_REVIEW_BYTES + 1]);
        let declared = handle(post(Full::new(big.clone())), &settings()).await;
        assert_eq!(declared.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let chunked = handle(post(Chunked(Some(big))), &settings()).await;
        assert_eq!(chunked.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let small = handle(post(Chunked(Some(Bytes::from_static(b"{}")))), &settings()).await;
        assert_eq!(small.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn routes() {
        let mut get = Request::new(Full::new(Bytes::new()));
        *get.uri_mut() = hyper::Uri::from_static("/mutate");
        let response = handle(get, &settings()).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[ALLOW], "POST");

        let mut other = Request::new(Full::new(Bytes::new()));
        *other.uri_mut() = hyper::Uri::from_static("/mutate/x");
        assert_eq!(
            handle(other, &settings()).await.status(),
            StatusCode::NOT_FOUND
        );

        let mut health = Request::new(Full::new(Bytes::new()));
        *health.uri_mut() = hyper::Uri::from_static("/healthz");
        let response = handle(health, &settings()).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}
