//! The OpenTelemetry pipeline: a tracer whose finished spans go through a bounded queue to one
//! background task that exports them in batches as OTLP/HTTP protobuf ([`encode`] writes the
//! requests). Nothing on the call path waits for it: when the queue is full a finished span is
//! dropped and counted, and a batch the collector refuses or does not answer in time is dropped
//! and counted too.
//!
//! The spans themselves are made by `call::trace`; their names and attributes are listed in
//! `docs/tracing.md`. Without an `otel` config key there is no [`Tracing`] at all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use hyper::{Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanProcessor,
};
use tokio::sync::{Notify, mpsc, watch};

use crate::body::read_capped;
use crate::config::OtelConfig;
use crate::metrics::{Metrics, SpanDrop};

pub mod encode;

/// The most spans one export request carries.
const MAX_BATCH: usize = 512;
/// How long the exporter waits for more spans after the first one of a batch.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// How long shutdown waits for the last export.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// A collector's answer to an export is a small status message; more is not read.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// The tracer and its export task.
pub struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Tracing {
    /// Builds the exporter on `connector` (the tool-service client's, so https goes through
    /// rustls with ring) and spawns the export task. Needs a Tokio runtime.
    pub fn start(
        config: &OtelConfig,
        connector: HttpsConnector<HttpConnector>,
        metrics: Arc<Metrics>,
    ) -> Result<Tracing, String> {
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let env_headers = std::env::var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_HEADERS"))
            .ok();
        // No retries: a failed batch is dropped and counted, so a collector that is down costs
        // one attempt per batch and the queue keeps moving.
        let exporter = Exporter {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            url: config.traces_url.clone(),
            headers: export_headers(&config.headers, env_headers.as_deref()),
            encoder: encode::Encoder::new(&resource),
        };
        let (queue, spans) = mpsc::channel(config.max_queue_spans);
        let (stop, stopped) = watch::channel(false);
        let full = Arc::new(Notify::new());
        let task = tokio::spawn(export(
            Export {
                spans,
                full: full.clone(),
                stopped,
            },
            exporter,
            metrics.clone(),
            config.timeout,
        ));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Queue {
                queue,
                full,
                metrics,
            })
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let scope = InstrumentationScope::builder("toolgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Ok(Tracing {
            tracer: provider.tracer_with_scope(scope),
            provider,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// The W3C trace context a request carried (`Context::new()` when it carried none, or an
    /// invalid one).
    pub fn parent(traceparent: Option<&str>, tracestate: Option<&str>) -> Context {
        let carrier = Carrier {
            traceparent,
            tracestate,
        };
        TraceContextPropagator::new().extract_with_context(&Context::new(), &carrier)
    }

    /// Exports what is queued (within a short grace period) and stops the export task.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task
            && tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err()
        {
            tracing::warn!("span export did not finish before shutdown");
        }
        let _ = self.provider.shutdown();
    }
}

/// The exporter: http/1 on the tool-service connector, so no second TLS stack or HTTP client is
/// built into toolgate for it.
struct Exporter {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: Uri,
    /// Every header of an export request, content type included.
    headers: HeaderMap,
    encoder: encode::Encoder,
}

impl Exporter {
    /// One export request with `spans`; `Err` says why the collector did not accept it.
    async fn export(&self, spans: &[SpanData]) -> Result<(), String> {
        let mut body = Vec::with_capacity(256 * spans.len());
        self.encoder.request(spans, &mut body);
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.url.clone();
        *request.headers_mut() = self.headers.clone();
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("HTTP export failed: {e}"))?;
        let status = response.status();
        // A collector's answer is read (within a bound) so the connection can be used again.
        read_capped(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|_| "the collector's answer could not be read".to_string())?;
        if !status.is_success() {
            return Err(format!(
                "HTTP export failed with status code: {}",
                status.as_u16()
            ));
        }
        Ok(())
    }
}

/// The headers of every export request: the protobuf content type, toolgate's user agent, the
/// headers of `otel.headers_file`, then those of `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (else
/// `OTEL_EXPORTER_OTLP_HEADERS`), a later one replacing an earlier one of the same name. Values
/// are percent-decoded when they decode to UTF-8; a header that is not a valid name and value is
/// left out.
fn export_headers(file: &[(String, String)], env: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("toolgate/", env!("CARGO_PKG_VERSION"))),
    );
    let from_env = env.into_iter().flat_map(|list| {
        list.split_terminator(',').filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            let (name, value) = (name.trim(), value.trim());
            let value = percent_decoded(value).unwrap_or_else(|| value.to_string());
            (!name.is_empty() && !value.is_empty()).then(|| (name.to_string(), value))
        })
    });
    let from_file = file.iter().map(|(name, value)| {
        let value = percent_decoded(value).unwrap_or_else(|| value.clone());
        (name.clone(), value)
    });
    for (name, value) in from_file.chain(from_env) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
    headers
}

/// `value` with each `%XX` replaced by its byte; `None` when a `%` is not followed by two hex
/// digits or the result is not UTF-8.
fn percent_decoded(value: &str) -> Option<String> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = char::from(bytes.next()?).to_digit(16)?;
            let lo = char::from(bytes.next()?).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// A request's `traceparent` and `tracestate`, for the W3C propagator.
struct Carrier<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent,
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The span processor: hands each finished span to the export task, or drops it at once when
/// the queue is full.
struct Queue {
    queue: mpsc::Sender<SpanData>,
    /// Told when the queue holds a whole batch, so the export task need not wait out the batch
    /// delay (and is not woken for every span before that).
    full: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("capacity", &self.queue.max_capacity())
            .finish_non_exhaustive()
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.metrics.spans_dropped(SpanDrop::QueueFull, 1);
        } else if self.queue.max_capacity() - self.queue.capacity() >= MAX_BATCH {
            self.full.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// What the export task listens to: the queue, the processor's word that a whole batch is
/// queued, and the stop signal.
struct Export {
    spans: mpsc::Receiver<SpanData>,
    full: Arc<Notify>,
    stopped: watch::Receiver<bool>,
}

/// The export task: a batch is up to [`MAX_BATCH`] spans, gathered for at most [`BATCH_DELAY`]
/// after its first. The task wakes for the first span of a batch, then sleeps until the delay
/// is over or the queue holds a whole batch, and takes what is queued then. One request at a
/// time, each bounded by `timeout`. Once stopped, it exports what is still queued and returns.
async fn export(mut from: Export, exporter: Exporter, metrics: Arc<Metrics>, timeout: Duration) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let open = tokio::select! {
            n = from.spans.recv_many(&mut batch, MAX_BATCH) => n > 0,
            _ = from.stopped.changed() => false,
        };
        if !open {
            break;
        }
        if batch.len() < MAX_BATCH {
            tokio::select! {
                () = tokio::time::sleep(BATCH_DELAY) => {}
                () = from.full.notified() => {}
                _ = from.stopped.changed() => {}
            }
            take_queued(&mut from.spans, &mut batch).await;
        }
        send(&exporter, &mut batch, &metrics, timeout).await;
        if *from.stopped.borrow() {
            break;
        }
    }
    loop {
        take_queued(&mut from.spans, &mut batch).await;
        if batch.is_empty() {
            return;
        }
        send(&exporter, &mut batch, &metrics, timeout).await;
    }
}

/// Moves queued spans into `batch` until it holds [`MAX_BATCH`] or the queue is empty, without
/// waiting: this task is the queue's only reader, so spans it sees queued are there to take, and
/// they are taken in one go.
async fn take_queued(spans: &mut mpsc::Receiver<SpanData>, batch: &mut Vec<SpanData>) {
    let room = MAX_BATCH.saturating_sub(batch.len());
    if room > 0 && !spans.is_empty() {
        spans.recv_many(batch, room).await;
    }
}

/// One export request with the spans of `batch`, which it leaves empty.
async fn send(
    exporter: &Exporter,
    batch: &mut Vec<SpanData>,
    metrics: &Metrics,
    timeout: Duration,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let failed = match tokio::time::timeout(timeout, exporter.export(batch)).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some("timed out".to_string()),
    };
    batch.clear();
    match failed {
        None => metrics.spans_exported(n),
        Some(why) => {
            tracing::debug!(error = %why, spans = n, "span export failed; spans dropped");
            metrics.export_error();
            metrics.spans_dropped(SpanDrop::ExportFailed, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };

    use super::*;

    fn finished(flags: TraceFlags) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(7u128),
                SpanId::from(9u64),
                flags,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "reserve".into(),
            start_time: std::time::UNIX_EPOCH,
            end_time: std::time::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::default(),
        }
    }

    #[test]
    fn the_queue_holds_at_most_its_capacity_and_counts_the_rest() {
        let metrics = Arc::new(Metrics::new());
        let (queue, mut spans) = mpsc::channel(3);
        let processor = Queue {
            queue,
            full: Arc::new(Notify::new()),
            metrics: metrics.clone(),
        };
        for _ in 0..10 {
            processor.on_end(finished(TraceFlags::SAMPLED));
        }
        processor.on_end(finished(TraceFlags::default()));
        let mut held = 0;
        while spans.try_recv().is_ok() {
            held += 1;
        }
        assert_eq!(held, 3);
        let text = metrics.encode();
        assert!(
            text.contains(r#"toolgate_otel_spans_dropped_total{reason="queue_full"} 7"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_whole_batch_in_the_queue_wakes_the_export_task() {
        let (queue, _spans) = mpsc::channel(4 * MAX_BATCH);
        let full = Arc::new(Notify::new());
        let processor = Queue {
            queue,
            full: full.clone(),
            metrics: Arc::new(Metrics::new()),
        };
        for _ in 0..MAX_BATCH - 1 {
            processor.on_end(finished(TraceFlags::SAMPLED));
        }
        let early = tokio::time::timeout(Duration::from_millis(50), full.notified()).await;
        assert!(early.is_err(), "told before a whole batch was queued");
        processor.on_end(finished(TraceFlags::SAMPLED));
        tokio::time::timeout(Duration::from_secs(5), full.notified())
            .await
            .expect("told once a whole batch was queued");
    }

    #[test]
    fn otel_export_headers_take_the_file_then_the_environment() {
        let file = [
            ("Authorization".to_string(), "Bearer a%20b".to_string()),
            ("x-tenant".to_string(), "from-file".to_string()),
            ("x-raw".to_string(), "100%".to_string()),
            ("bad name".to_string(), "dropped".to_string()),
        ];
        let headers = export_headers(&file, Some(" X-Tenant = from%2Denv ,empty=, =x,x-new=1"));
        let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(
            get("content-type").as_deref(),
            Some("application/x-protobuf")
        );
        assert_eq!(get("authorization").as_deref(), Some("Bearer a b"));
        assert_eq!(get("x-tenant").as_deref(), Some("from-env"));
        assert_eq!(get("x-raw").as_deref(), Some("100%"));
        assert_eq!(get("x-new").as_deref(), Some("1"));
        assert!(get("empty").is_none());
        assert_eq!(headers.len(), 6, "{headers:?}");
        assert!(get("user-agent").unwrap().starts_with("toolgate/"));
        assert_eq!(export_headers(&[], None).len(), 2);
    }

    #[test]
    fn parents_come_from_valid_trace_context_only() {
        use opentelemetry::trace::TraceContextExt as _;
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = Tracing::parent(Some(tp), Some("vendor=1"));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.trace_state().header(), "vendor=1");
        for bad in [
            "",
            "00-0000-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let cx = Tracing::parent(Some(bad), None);
            assert!(!cx.span().span_context().is_valid(), "{bad:?}");
        }
    }
}
