//! The spans of one tool call: `execute_tool {tool}` for the whole call, in the agent's trace
//! when it sent a `traceparent`, with children for the reservation, the upstream call (whose own
//! `traceparent` is what the tool receives) and the finalize. Names and attributes follow the
//! OpenTelemetry GenAI and MCP conventions plus toolgate's own, listed in `docs/tracing.md`.
//!
//! No input, argument, result or raw response is ever put on a span. With tracing off every
//! value here is empty and each hook is one branch.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex};

use hyper::header::HeaderValue;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, Span};

use super::incoming::{Form, Incoming, Rejection};
use crate::config::Protocol;
use crate::error::Error;
use crate::otel::Tracing;
use crate::store::Evidence;

/// A header's value when it is text; a value that is not is treated as absent.
fn text(v: Option<&HeaderValue>) -> Option<&str> {
    v.and_then(|v| v.to_str().ok())
}

/// The `execute_tool` span of a call, and the parent of its children.
#[derive(Default)]
pub struct CallSpan(Option<Box<Live>>);

struct Live {
    tracer: SdkTracer,
    /// Holds the `execute_tool` span.
    cx: Context,
    /// Whether the tool, call id and run id are already on the span.
    identified: bool,
}

impl CallSpan {
    /// Starts the call's span as a child of the trace context the request carried.
    pub fn start(tracing: Option<&Tracing>, incoming: &Incoming) -> CallSpan {
        let Some(tracing) = tracing else {
            return CallSpan(None);
        };
        let tracestate = match incoming.form {
            Form::Mcp(_) => None,
            Form::Envelope | Form::Intercept { .. } => incoming.headers.get("tracestate"),
        };
        let parent = Tracing::parent(text(incoming.traceparent()), text(tracestate));
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.type", "extension"),
        ];
        if let Form::Mcp(call) = &incoming.form {
            attributes.push(KeyValue::new("mcp.method.name", "tools/call"));
            if let Some(id) = &call.request_id {
                attributes.push(KeyValue::new("jsonrpc.request.id", id.clone()));
            }
            if let Some(v) = text(incoming.headers.get("mcp-protocol-version")) {
                attributes.push(KeyValue::new("mcp.protocol.version", v.to_string()));
            }
            attributes.push(KeyValue::new("network.transport", "tcp"));
        }
        let tracer = tracing.tracer();
        let span = tracer
            .span_builder("execute_tool")
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        CallSpan(Some(Box::new(Live {
            tracer: tracer.clone(),
            cx: parent.with_span(span),
            identified: false,
        })))
    }

    /// The call passed authentication: its run, id and (configured) tool are known.
    pub fn identified(&mut self, run_id: &str, tool_call_id: &str, spans: &ToolSpans) {
        let Some(live) = &mut self.0 else {
            return;
        };
        let named = (spans.call_name.clone(), spans.tool_name.clone());
        live.identify(Some(run_id), Some(tool_call_id), Some(named));
    }

    /// Ends the span of a call refused before it reached the tool.
    pub fn rejected(self, r: &Rejection) {
        let Some(mut live) = self.0 else {
            return;
        };
        let named = r.tool.as_deref().map(|tool| {
            (
                format!("execute_tool {tool}"),
                Value::from(tool.to_string()),
            )
        });
        live.identify(None, r.tool_call_id.as_deref(), named);
        let span = live.cx.span();
        span.set_attribute(KeyValue::new("toolgate.status", "ERROR"));
        failed(&span, &r.error);
        span.end();
    }

    /// Ends the span of a reserved call with its outcome.
    pub fn finish(self, outcome: Result<Evidence, &Error>) {
        let Some(live) = self.0 else {
            return;
        };
        let span = live.cx.span();
        match outcome {
            Ok(evidence) => span.set_attributes([
                KeyValue::new("toolgate.status", "READY"),
                KeyValue::new("toolgate.evidence_status", evidence.as_str()),
            ]),
            Err(error) => {
                span.set_attributes([
                    KeyValue::new("toolgate.status", "ERROR"),
                    KeyValue::new("toolgate.evidence_status", Evidence::Error.as_str()),
                ]);
                failed(&span, error);
            }
        }
        span.end();
    }

    /// Runs the store's reservation in a `reserve` span.
    pub async fn reservation<T>(
        &self,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.store_step("reserve", step).await
    }

    /// Runs the store's finalize in a `finalize` span.
    pub async fn finalize<T>(
        &self,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.store_step("finalize", step).await
    }

    async fn store_step<T>(
        &self,
        name: &'static str,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let Some(live) = &self.0 else {
            return step.await;
        };
        let mut span = live.child(name, SpanKind::Internal, Vec::new());
        let result = step.await;
        if let Err(error) = &result {
            span.set_attributes([
                KeyValue::new("error.type", error.code.as_str()),
                KeyValue::new("toolgate.error.code", error.code.as_str()),
            ]);
            span.set_status(Status::error(error.code.message()));
        }
        span.end();
        result
    }

    /// Starts the span of the request to the tool service.
    pub fn upstream(&self, spans: &ToolSpans) -> UpstreamSpan {
        let Some(live) = &self.0 else {
            return UpstreamSpan(None);
        };
        let span = live.child(
            spans.upstream_name.clone(),
            SpanKind::Client,
            spans.upstream_attributes.clone(),
        );
        let sc = span.span_context();
        let traceparent = traceparent(
            &sc.trace_id().to_bytes(),
            &sc.span_id().to_bytes(),
            sc.trace_flags().to_u8(),
        );
        UpstreamSpan(Some(Box::new(UpstreamLive {
            traceparent: HeaderValue::from_bytes(&traceparent).ok(),
            span: Mutex::new(span),
            mcp: Mutex::new(None),
        })))
    }
}

/// The W3C `traceparent` of a span: `00-{trace id}-{span id}-{flags}` in lowercase hex.
fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], flags: u8) -> [u8; 55] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 55];
    out[0] = b'0';
    out[1] = b'0';
    let digits = trace_id
        .iter()
        .chain(span_id)
        .chain(std::iter::once(&flags));
    // Positions of the hex digits: 3..35 (trace id), 36..52 (span id), 53..55 (flags).
    let at = (3..35).step_by(2).chain((36..52).step_by(2)).chain([53]);
    for (byte, i) in digits.zip(at) {
        out[i] = HEX[usize::from(byte >> 4)];
        out[i + 1] = HEX[usize::from(byte & 0xf)];
    }
    out
}

/// The names and attributes of a tool's spans that are the same for every call, made once when
/// the tool is configured: a call clones them (a reference count for each text) instead of
/// formatting them again.
pub struct ToolSpans {
    /// `execute_tool {tool}`, the call span's name once the tool is known.
    call_name: String,
    /// `gen_ai.tool.name` of the call span.
    tool_name: Value,
    /// The upstream span's name: `POST`, or `tools/call {remote name}` for MCP.
    upstream_name: Cow<'static, str>,
    /// The upstream span's attributes known before the request is sent.
    upstream_attributes: Vec<KeyValue>,
}

impl ToolSpans {
    pub fn new(tool: &str, uri: &hyper::Uri, protocol: &Protocol) -> ToolSpans {
        let host = uri.host().unwrap_or_default();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // Without user info or query: only the address of the tool is kept.
        let url = format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority()
                .map_or(host, |a| a.as_str().rsplit('@').next().unwrap_or("")),
            uri.path()
        );
        let mut upstream_attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("server.address", Arc::<str>::from(host)),
            KeyValue::new("server.port", i64::from(port)),
            KeyValue::new("url.full", Arc::<str>::from(url)),
        ];
        let upstream_name = match protocol {
            Protocol::Http => Cow::Borrowed("POST"),
            Protocol::Mcp { remote_name } => {
                upstream_attributes.extend([
                    KeyValue::new("mcp.method.name", "tools/call"),
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("gen_ai.tool.name", Arc::<str>::from(remote_name.as_str())),
                    KeyValue::new("network.transport", "tcp"),
                ]);
                Cow::Owned(format!("tools/call {remote_name}"))
            }
        };
        ToolSpans {
            call_name: format!("execute_tool {tool}"),
            tool_name: Value::from(Arc::<str>::from(tool)),
            upstream_name,
            upstream_attributes,
        }
    }
}

impl Live {
    /// `tool`: the span's name with the tool, and the tool's name.
    fn identify(
        &mut self,
        run_id: Option<&str>,
        tool_call_id: Option<&str>,
        tool: Option<(String, Value)>,
    ) {
        if self.identified {
            return;
        }
        self.identified = true;
        let span = self.cx.span();
        if let Some((name, tool)) = tool {
            span.update_name(name);
            span.set_attribute(KeyValue::new("gen_ai.tool.name", tool));
        }
        if let Some(id) = tool_call_id {
            span.set_attribute(KeyValue::new("gen_ai.tool.call.id", id.to_string()));
        }
        if let Some(run) = run_id {
            span.set_attribute(KeyValue::new("toolgate.run.id", run.to_string()));
        }
    }

    fn child(
        &self,
        name: impl Into<std::borrow::Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        self.tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx)
    }
}

/// The error attributes and status of a span that ended in `error`.
fn failed(span: &opentelemetry::trace::SpanRef<'_>, error: &Error) {
    span.set_attributes([
        KeyValue::new("error.type", error.code.as_str()),
        KeyValue::new("toolgate.error.code", error.code.as_str()),
        KeyValue::new("toolgate.failure.layer", error.layer().as_str()),
    ]);
    span.set_status(Status::error(error.code.message()));
}

/// The span of the request to the tool service: a CLIENT child of the call's span.
#[derive(Default)]
pub struct UpstreamSpan(Option<Box<UpstreamLive>>);

struct UpstreamLive {
    traceparent: Option<HeaderValue>,
    span: Mutex<Span>,
    /// The last `tools/call` sent to an MCP upstream: its JSON-RPC id and protocol revision.
    mcp: Mutex<Option<(u64, String)>>,
}

impl UpstreamSpan {
    /// The `traceparent` naming this span, sent to the tool in place of the agent's.
    pub fn traceparent(&self) -> Option<&HeaderValue> {
        self.0.as_ref().and_then(|l| l.traceparent.as_ref())
    }

    /// An MCP upstream was sent `tools/call` with JSON-RPC id `id` in protocol `version`.
    pub fn mcp_request(&self, id: u64, version: &HeaderValue) {
        if let Some(live) = &self.0 {
            let version = version.to_str().unwrap_or_default().to_string();
            *live.mcp.lock().unwrap_or_else(|p| p.into_inner()) = Some((id, version));
        }
    }

    /// Ends the span with `outcome`'s tool HTTP status, if it answered, and `error.type` of a
    /// failure (`upstream::span_outcome`), asked for only when the span is recorded.
    pub fn end(self, outcome: impl FnOnce() -> (Option<u16>, Option<Cow<'static, str>>)) {
        let Some(live) = self.0 else {
            return;
        };
        let (status, error_type) = outcome();
        let mut span = live.span.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some((id, version)) = live.mcp.into_inner().unwrap_or_else(|p| p.into_inner()) {
            span.set_attribute(KeyValue::new("jsonrpc.request.id", id.to_string()));
            if !version.is_empty() {
                span.set_attribute(KeyValue::new("mcp.protocol.version", version));
            }
        }
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        let error_type = error_type.map(|t| match t {
            Cow::Borrowed(t) => Value::from(t),
            Cow::Owned(t) => Value::from(t),
        });
        if let Some(error_type) = error_type {
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error("the tool call failed"));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceId};

    use super::*;

    #[test]
    fn trace_the_traceparent_is_the_w3c_form_of_the_span_context() {
        for (trace, span, flags) in [
            (
                0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736u128,
                0x00f0_67aa_0ba9_02b7u64,
                1u8,
            ),
            (1, 1, 0),
            (u128::MAX, u64::MAX, 0xff),
        ] {
            let (trace, span) = (TraceId::from(trace), SpanId::from(span));
            let made = traceparent(&trace.to_bytes(), &span.to_bytes(), flags);
            assert_eq!(
                std::str::from_utf8(&made).unwrap(),
                format!("00-{trace}-{span}-{flags:02x}")
            );
        }
    }

    #[test]
    fn trace_a_tools_upstream_attributes_carry_its_address_only() {
        let uri: hyper::Uri = "https://user:secret@tools.example/v1/call?key=secret"
            .parse()
            .unwrap();
        let spans = ToolSpans::new("read_file", &uri, &Protocol::Http);
        let attribute = |key: &str| {
            spans
                .upstream_attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(
            attribute("server.address").as_deref(),
            Some("tools.example")
        );
        assert_eq!(attribute("server.port").as_deref(), Some("443"));
        assert_eq!(
            attribute("url.full").as_deref(),
            Some("https://tools.example/v1/call")
        );
        assert_eq!(spans.upstream_name, "POST");
        assert_eq!(spans.call_name, "execute_tool read_file");
        let mcp = ToolSpans::new(
            "search",
            &"http://127.0.0.1:9000/mcp".parse().unwrap(),
            &Protocol::Mcp {
                remote_name: "web_search".to_string(),
            },
        );
        assert_eq!(mcp.upstream_name, "tools/call web_search");
        assert!(
            mcp.upstream_attributes
                .iter()
                .any(|kv| kv.key.as_str() == "server.port" && kv.value == Value::I64(9000))
        );
    }
}
