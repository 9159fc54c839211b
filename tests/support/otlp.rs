//! An OTLP/HTTP trace receiver served by hyper: `POST /v1/traces` with an
//! `application/x-protobuf` body is decoded with the official protobuf definitions
//! (`opentelemetry-proto`) and its spans kept. A request it cannot decode is answered 400 and
//! counted in [`Collector::rejected`], so a test sees a malformed export. It can also be slow:
//! every answer waits [`Collector::delay`] first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

use super::fake_tool::serve_http1;

/// One received span, with the resource it came with.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
    pub scope: String,
}

impl Received {
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A span attribute rendered as a string (ints and bools too); `None` when absent.
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }

    /// How many times `key` is set: an attribute must be set once.
    pub fn attr_count(&self, key: &str) -> usize {
        self.span
            .attributes
            .iter()
            .filter(|kv| kv.key == key)
            .count()
    }

    pub fn resource_attr(&self, key: &str) -> Option<String> {
        attr(&self.resource, key)
    }

    /// The status code: 0 unset, 1 ok, 2 error.
    pub fn status_code(&self) -> i32 {
        self.span.status.as_ref().map_or(0, |s| s.code)
    }
}

fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    let kv = attributes.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        AnyValue::BoolValue(b) => Some(b.to_string()),
        AnyValue::DoubleValue(d) => Some(d.to_string()),
        other => Some(format!("{other:?}")),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A running receiver.
#[derive(Clone)]
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    /// Export requests that were not a decodable OTLP/HTTP protobuf request.
    pub rejected: Arc<AtomicU64>,
    /// Export requests received (answered or not yet).
    pub requests: Arc<AtomicU64>,
    delay: Duration,
}

impl Collector {
    pub async fn start() -> Collector {
        Collector::start_slow(Duration::ZERO).await
    }

    /// A receiver that waits `delay` before answering each export request.
    pub async fn start_slow(delay: Duration) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let collector = Collector {
            addr: listener.local_addr().expect("addr"),
            spans: Arc::default(),
            rejected: Arc::default(),
            requests: Arc::default(),
            delay,
        };
        let c = collector.clone();
        serve_http1(listener, move |req| {
            let c = c.clone();
            async move { c.answer(req).await }
        });
        collector
    }

    /// The `otel.endpoint` of this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("lock").clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Received> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id() == trace_id)
            .collect()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let path_ok = req.method() == hyper::Method::POST && req.uri().path() == "/v1/traces";
        let type_ok = req
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "application/x-protobuf");
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let decoded = ExportTraceServiceRequest::decode(body);
        let Ok(request) = decoded.ok().filter(|_| path_ok && type_ok).ok_or(()) else {
            self.rejected.fetch_add(1, Ordering::SeqCst);
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
            return r;
        };
        let mut received = Vec::new();
        for rs in request.resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| s.name).unwrap_or_default();
                for span in ss.spans {
                    received.push(Received {
                        span,
                        resource: resource.clone(),
                        scope: scope.clone(),
                    });
                }
            }
        }
        self.spans.lock().expect("lock").extend(received);
        let body = ExportTraceServiceResponse::default().encode_to_vec();
        let mut r = Response::new(Full::new(Bytes::from(body)));
        r.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("application/x-protobuf"),
        );
        r
    }
}
