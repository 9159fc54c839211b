//! The tool-service client: a pooled HTTP/1 client (https through rustls with the ring provider)
//! that reads response bodies with a hard cap.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::body::{ReadError, read_capped};

/// One request to a tool service.
pub struct ToolRequest<'a> {
    pub uri: &'a Uri,
    pub body: Bytes,
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub traceparent: Option<&'a HeaderValue>,
    /// Reading stops once the body exceeds this many bytes.
    pub raw_bytes: u64,
}

/// A tool's answer, its body complete and within the cap.
pub struct ToolResponse {
    pub status: u16,
    pub body: Bytes,
}

/// Why a tool call produced no usable body. Details are for logs only.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("tool unreachable: {0}")]
    Unreachable(String),
    #[error("tool body over the raw limit (status {status})")]
    TooLarge { status: u16 },
    #[error("tool body read failed: {0}")]
    Body(String),
}

/// The shared client; cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Upstream {
    /// Trusts the Mozilla roots and the system's (which include `SSL_CERT_FILE` and
    /// `SSL_CERT_DIR`), so tool services behind a private CA work when it is mounted.
    pub fn new() -> Result<Upstream, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "skipping unreadable system certificates");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "system root certificates loaded");
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup failed: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(https);
        Ok(Upstream { client })
    }

    /// POSTs the input and reads the answer, stopping at `raw_bytes + 1`. The caller bounds the
    /// whole call with its timeout; dropping the future aborts the request.
    pub async fn call(&self, req: ToolRequest<'_>) -> Result<ToolResponse, UpstreamError> {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(req.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("x-run-id", req.run_id)
            .header("x-tool-call-id", req.tool_call_id);
        if let Some(tp) = req.traceparent {
            builder = builder.header("traceparent", tp);
        }
        let request = builder
            .body(Full::new(req.body))
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > req.raw_bytes) {
            return Err(UpstreamError::TooLarge { status });
        }
        let body = read_capped(response.into_body(), req.raw_bytes)
            .await
            .map_err(|e| match e {
                ReadError::TooLarge => UpstreamError::TooLarge { status },
                ReadError::Body(e) => UpstreamError::Body(e),
            })?;
        Ok(ToolResponse { status, body })
    }
}
