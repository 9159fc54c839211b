//! The spans of one tool call: `execute_tool {tool}` for the whole call, in the agent's trace
//! when it sent a `traceparent`, with children for the reservation, the upstream call (whose own
//! `traceparent` is what the tool receives) and the finalize. Names and attributes follow the
//! OpenTelemetry GenAI and MCP conventions plus toolgate's own, listed in `docs/tracing.md`.
//!
//! No input, argument, result or raw response is ever put on a span. With tracing off every
//! value here is empty and each hook is one branch.

use std::future::Future;
use std::sync::Mutex;

use hyper::header::HeaderValue;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};

use super::preflight::{Form, Incoming, Rejection};
use super::upstream::{Reply, UpstreamError};
use crate::config::{Protocol, Tool};
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
    pub fn identified(&mut self, run_id: &str, tool_call_id: &str, tool: &str) {
        let Some(live) = &mut self.0 else {
            return;
        };
        live.identify(Some(run_id), Some(tool_call_id), Some(tool));
    }

    /// Ends the span of a call refused before it reached the tool.
    pub fn rejected(self, r: &Rejection) {
        let Some(mut live) = self.0 else {
            return;
        };
        live.identify(None, r.tool_call_id.as_deref(), r.tool.as_deref());
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
    pub fn upstream(&self, tool: &Tool) -> UpstreamSpan {
        let Some(live) = &self.0 else {
            return UpstreamSpan(None);
        };
        let uri = &tool.upstream;
        let host = uri.host().unwrap_or_default().to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // Without user info or query: only the address of the tool is kept.
        let url = format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map_or(host.as_str(), |a| a
                .as_str()
                .rsplit('@')
                .next()
                .unwrap_or("")),
            uri.path()
        );
        let mut attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("server.address", host),
            KeyValue::new("server.port", i64::from(port)),
            KeyValue::new("url.full", url),
        ];
        let name = match &tool.protocol {
            Protocol::Http => "POST".to_string(),
            Protocol::Mcp { remote_name } => {
                attributes.extend([
                    KeyValue::new("mcp.method.name", "tools/call"),
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("gen_ai.tool.name", remote_name.clone()),
                    KeyValue::new("network.transport", "tcp"),
                ]);
                format!("tools/call {remote_name}")
            }
        };
        let span = live.child(name, SpanKind::Client, attributes);
        let sc = span.span_context();
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        UpstreamSpan(Some(Box::new(UpstreamLive {
            traceparent: HeaderValue::from_str(&traceparent).ok(),
            span: Mutex::new(span),
            mcp: Mutex::new(None),
        })))
    }
}

impl Live {
    fn identify(&mut self, run_id: Option<&str>, tool_call_id: Option<&str>, tool: Option<&str>) {
        if self.identified {
            return;
        }
        self.identified = true;
        let span = self.cx.span();
        if let Some(tool) = tool {
            span.update_name(format!("execute_tool {tool}"));
            span.set_attribute(KeyValue::new("gen_ai.tool.name", tool.to_string()));
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

    /// Ends the span with what the tool answered (`Err`: it did not answer in time).
    pub fn end<E>(self, answered: &Result<Result<Reply, UpstreamError>, E>) {
        let Some(live) = self.0 else {
            return;
        };
        let mut span = live.span.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some((id, version)) = live.mcp.into_inner().unwrap_or_else(|p| p.into_inner()) {
            span.set_attribute(KeyValue::new("jsonrpc.request.id", id.to_string()));
            if !version.is_empty() {
                span.set_attribute(KeyValue::new("mcp.protocol.version", version));
            }
        }
        let status = match answered {
            Ok(Ok(reply)) => Some(reply.status),
            Ok(Err(UpstreamError::TooLarge { status })) => Some(*status),
            _ => None,
        };
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        let error_type = match answered {
            Err(_) => Some("timeout".to_string()),
            Ok(Err(UpstreamError::Unreachable(_))) => Some("unreachable".to_string()),
            Ok(Err(UpstreamError::Body(_))) => Some("body_read".to_string()),
            Ok(Err(UpstreamError::TooLarge { .. })) => Some("result_too_large".to_string()),
            Ok(Ok(reply)) if reply.status >= 400 => Some(reply.status.to_string()),
            Ok(Ok(Reply { raw: Err(_), .. })) => Some("tool_error".to_string()),
            Ok(Ok(_)) => None,
        };
        if let Some(error_type) = error_type {
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error("the tool call failed"));
        }
        span.end();
    }
}
