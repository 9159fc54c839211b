//! The tool-service client (https through rustls with the ring provider), reading response
//! bodies with a hard cap, for both protocols a tool may speak: plain HTTP ([`http`], on each
//! tool's own kept connections: [`pool`], [`h1`]) and MCP ([`mcp`], through a shared pooled
//! hyper client). Both give the same [`Reply`].

pub mod h1;
mod http;
mod mcp;
pub mod pool;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::HeaderMap;
use hyper::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::body::{ReadError, read_capped};
use crate::compact;
use crate::config::Protocol;
use mcp::McpSessions;

/// One request to a tool service.
pub struct ToolRequest<'a> {
    pub uri: &'a Uri,
    /// The connections kept to `uri` (plain HTTP).
    pub connections: &'a pool::Connections,
    /// The `Host` header for `uri` (the tool's, made at config load).
    pub host: &'a HeaderValue,
    /// The input object exactly as recorded.
    pub input: &'a Value,
    /// `input`'s compact JSON as the record holds it, when kept: the plain-HTTP body.
    pub input_json: Option<&'a str>,
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub traceparent: Option<&'a HeaderValue>,
    /// The trace span of this request (empty when tracing is off).
    pub span: &'a super::trace::UpstreamSpan,
    /// `Authorization` for this tool's upstream only.
    pub auth: Option<&'a HeaderValue>,
    /// Reading stops once the body exceeds this many bytes.
    pub raw_bytes: u64,
    /// A raw response nested deeper than this is a failure, and is not kept.
    pub json_depth: usize,
    /// What the projection selects, found while the answer is compacted.
    pub select: Option<&'a compact::Select>,
}

/// A tool's answer, read completely and within the cap.
pub struct Reply {
    pub status: u16,
    /// The raw response, or why it is a failure (with what is kept for the harness).
    pub raw: Result<Answer, Failed>,
}

/// A usable raw response in the one form the call path carries it: compact JSON text, which
/// the record keeps as it is.
pub struct Answer {
    pub json: String,
    /// Where `json` holds what the request's `select` selects, when the compacting pass found
    /// it.
    pub selected: Option<compact::Selected>,
}

impl Answer {
    /// An answer decoded as a tree (an MCP result, or a body the one-pass compaction left to
    /// serde_json), serialized once: the text the store would have written for it.
    pub fn from_tree(raw: &Value) -> Answer {
        Answer {
            json: raw.to_string(),
            selected: None,
        }
    }
}

/// A tool that answered, but with a failure: a non-2xx status, a body that is not JSON, an MCP
/// error or `isError` result. `raw` is kept for the harness only.
pub struct Failed {
    pub raw: Value,
    pub why: String,
}

/// Why a tool call produced no usable answer. Details are for logs only.
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
    pub(super) client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// One MCP session per upstream URL.
    pub(super) sessions: Arc<McpSessions>,
    /// The connector under `client`; the OTLP exporter shares it.
    pub connector: HttpsConnector<HttpConnector>,
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
            .build(https.clone());
        Ok(Upstream {
            client,
            sessions: Arc::default(),
            connector: https,
        })
    }

    /// Calls the tool in its protocol. The caller bounds the whole call with its timeout;
    /// dropping the future aborts the request.
    pub async fn call(
        &self,
        protocol: &Protocol,
        req: ToolRequest<'_>,
    ) -> Result<Reply, UpstreamError> {
        match protocol {
            Protocol::Http => self.http(req).await,
            // Boxed, so a plain HTTP call's future is not the size of an MCP exchange.
            Protocol::Mcp { remote_name } => Box::pin(self.mcp(remote_name, req)).await,
        }
    }

    /// A `POST` of `body` to `target` for the shared client (MCP), with [`each_header`].
    pub(super) fn request(
        req: &ToolRequest<'_>,
        target: &Uri,
        body: Vec<u8>,
    ) -> Result<Request<Full<Bytes>>, UpstreamError> {
        let mut headers = HeaderMap::with_capacity(8);
        let mut invalid = false;
        each_header(req, |name, value| match HeaderValue::from_bytes(value) {
            Ok(value) => {
                headers.insert(HeaderName::from_static(name), value);
            }
            Err(_) => invalid = true,
        })?;
        if invalid {
            return Err(not_a_header_value());
        }
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = target.clone();
        *request.headers_mut() = headers;
        Ok(request)
    }
}

/// What the request's span records of how it ended (`Err`: the tool did not answer in time): the
/// tool's HTTP status, if it answered, and the `error.type` of a failure.
pub fn span_outcome<E>(
    answered: &Result<Result<Reply, UpstreamError>, E>,
) -> (Option<u16>, Option<Cow<'static, str>>) {
    let status = match answered {
        Ok(Ok(reply)) => Some(reply.status),
        Ok(Err(UpstreamError::TooLarge { status })) => Some(*status),
        _ => None,
    };
    let error_type = match answered {
        Err(_) => Some("timeout".into()),
        Ok(Err(UpstreamError::Unreachable(_))) => Some("unreachable".into()),
        Ok(Err(UpstreamError::Body(_))) => Some("body_read".into()),
        Ok(Err(UpstreamError::TooLarge { .. })) => Some("result_too_large".into()),
        Ok(Ok(reply)) if reply.status >= 400 => Some(reply.status.to_string().into()),
        Ok(Ok(Reply { raw: Err(_), .. })) => Some("tool_error".into()),
        Ok(Ok(_)) => None,
    };
    (status, error_type)
}

/// Gives `header` every header a request to a tool carries, in order: `Host`, the content type,
/// the call's ids, the trace context, and the tool's own credentials. The one place they are
/// chosen (by lowercase name): the plain-HTTP client writes them as bytes ([`http`]), the MCP client puts them in a
/// header map ([`Upstream::request`]).
fn each_header(
    req: &ToolRequest<'_>,
    mut header: impl FnMut(&'static str, &[u8]),
) -> Result<(), UpstreamError> {
    // The ids are safe ids already; a field value is checked all the same, as a header map
    // would check it, so that nothing can end a line early.
    fn field_value(v: &str) -> Result<&[u8], UpstreamError> {
        if v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
            Ok(v.as_bytes())
        } else {
            Err(not_a_header_value())
        }
    }
    // Names in lowercase, as HTTP/1.1 writes them and a header map holds them.
    header("host", req.host.as_bytes());
    header("content-type", b"application/json");
    header("x-run-id", field_value(req.run_id)?);
    header("x-tool-call-id", field_value(req.tool_call_id)?);
    if let Some(tp) = req.traceparent {
        header("traceparent", tp.as_bytes());
    }
    if let Some(auth) = req.auth {
        header("authorization", auth.as_bytes());
    }
    Ok(())
}

fn not_a_header_value() -> UpstreamError {
    UpstreamError::Unreachable("an id is not a header value".into())
}

/// A raw response nested deeper than `limits.json_depth`: nothing of it is kept, so every
/// record stays readable.
pub(super) fn too_deep() -> Failed {
    Failed {
        raw: Value::Null,
        why: "tool answer nested deeper than limits.json_depth".into(),
    }
}

/// Reads a tool's response body with the raw cap; a declared length over it is refused first.
pub(super) async fn read_body(
    response: hyper::Response<hyper::body::Incoming>,
    raw_bytes: u64,
) -> Result<Bytes, UpstreamError> {
    let status = response.status().as_u16();
    let declared = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > raw_bytes) {
        return Err(UpstreamError::TooLarge { status });
    }
    read_capped(response.into_body(), raw_bytes)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge => UpstreamError::TooLarge { status },
            ReadError::Body(e) => UpstreamError::Body(e),
        })
}
