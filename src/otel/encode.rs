//! The OTLP protobuf encoding of a batch of finished spans: an `ExportTraceServiceRequest`
//! (`opentelemetry/proto/collector/trace/v1`) written straight from the SDK's [`SpanData`] into
//! one buffer, with one `ResourceSpans` for toolgate's resource and one `ScopeSpans` for each
//! instrumentation scope, in the order the scopes first appear.
//!
//! Fields that hold their default value are left out, as every protobuf encoder does, except
//! where the message says a value is present (an attribute's value, a span's status). The
//! field numbers are those of the OTLP `.proto` files, named in the constants below.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SpanData;

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `ExportTraceServiceRequest.resource_spans`.
const REQUEST_RESOURCE_SPANS: u32 = 1;
/// `ResourceSpans`.
const RESOURCE_SPANS_RESOURCE: u32 = 1;
const RESOURCE_SPANS_SCOPE_SPANS: u32 = 2;
const RESOURCE_SPANS_SCHEMA_URL: u32 = 3;
/// `Resource.attributes`.
const RESOURCE_ATTRIBUTES: u32 = 1;
/// `ScopeSpans`.
const SCOPE_SPANS_SCOPE: u32 = 1;
const SCOPE_SPANS_SPANS: u32 = 2;
const SCOPE_SPANS_SCHEMA_URL: u32 = 3;
/// `InstrumentationScope`.
const SCOPE_NAME: u32 = 1;
const SCOPE_VERSION: u32 = 2;
const SCOPE_ATTRIBUTES: u32 = 3;
/// `Span`.
const SPAN_TRACE_ID: u32 = 1;
const SPAN_SPAN_ID: u32 = 2;
const SPAN_TRACE_STATE: u32 = 3;
const SPAN_PARENT_SPAN_ID: u32 = 4;
const SPAN_NAME: u32 = 5;
const SPAN_KIND: u32 = 6;
const SPAN_START_TIME: u32 = 7;
const SPAN_END_TIME: u32 = 8;
const SPAN_ATTRIBUTES: u32 = 9;
const SPAN_DROPPED_ATTRIBUTES: u32 = 10;
const SPAN_EVENTS: u32 = 11;
const SPAN_DROPPED_EVENTS: u32 = 12;
const SPAN_LINKS: u32 = 13;
const SPAN_DROPPED_LINKS: u32 = 14;
const SPAN_STATUS: u32 = 15;
const SPAN_FLAGS: u32 = 16;
/// `Span.Event`.
const EVENT_TIME: u32 = 1;
const EVENT_NAME: u32 = 2;
const EVENT_ATTRIBUTES: u32 = 3;
const EVENT_DROPPED_ATTRIBUTES: u32 = 4;
/// `Span.Link`.
const LINK_TRACE_ID: u32 = 1;
const LINK_SPAN_ID: u32 = 2;
const LINK_TRACE_STATE: u32 = 3;
const LINK_ATTRIBUTES: u32 = 4;
const LINK_DROPPED_ATTRIBUTES: u32 = 5;
const LINK_FLAGS: u32 = 6;
/// `Status`.
const STATUS_MESSAGE: u32 = 2;
const STATUS_CODE: u32 = 3;
/// `KeyValue`.
const KEY_VALUE_KEY: u32 = 1;
const KEY_VALUE_VALUE: u32 = 2;
/// `AnyValue`, a oneof.
const ANY_STRING: u32 = 1;
const ANY_BOOL: u32 = 2;
const ANY_INT: u32 = 3;
const ANY_DOUBLE: u32 = 4;
const ANY_ARRAY: u32 = 5;
/// `ArrayValue.values`.
const ARRAY_VALUES: u32 = 1;

/// `SpanFlags`: the flags say whether the parent is remote, and whether it is.
const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
const FLAGS_IS_REMOTE: u32 = 0x200;

/// Encodes export requests for one resource.
#[derive(Debug)]
pub struct Encoder {
    /// The `ResourceSpans.resource` field, encoded once.
    resource: Vec<u8>,
    schema_url: Option<String>,
}

impl Encoder {
    pub fn new(resource: &Resource) -> Encoder {
        let mut out = Vec::new();
        message(&mut out, RESOURCE_SPANS_RESOURCE, |out| {
            for (key, value) in resource.iter() {
                key_value(out, RESOURCE_ATTRIBUTES, key.as_str(), value);
            }
        });
        Encoder {
            resource: out,
            schema_url: resource.schema_url().map(str::to_string),
        }
    }

    /// Appends the `ExportTraceServiceRequest` of `spans` to `out`.
    pub fn request(&self, spans: &[SpanData], out: &mut Vec<u8>) {
        message(out, REQUEST_RESOURCE_SPANS, |out| {
            out.extend_from_slice(&self.resource);
            // Nearly always one scope: each further one costs a pass over the batch.
            let mut done: Vec<&InstrumentationScope> = Vec::new();
            for (i, first) in spans.iter().enumerate() {
                let scope = &first.instrumentation_scope;
                if done.iter().any(|d| same_scope(d, scope)) {
                    continue;
                }
                done.push(scope);
                message(out, RESOURCE_SPANS_SCOPE_SPANS, |out| {
                    message(out, SCOPE_SPANS_SCOPE, |out| {
                        string(out, SCOPE_NAME, scope.name());
                        string(out, SCOPE_VERSION, scope.version().unwrap_or_default());
                        for kv in scope.attributes() {
                            key_value(out, SCOPE_ATTRIBUTES, kv.key.as_str(), &kv.value);
                        }
                    });
                    for span in &spans[i..] {
                        if same_scope(&span.instrumentation_scope, scope) {
                            message(out, SCOPE_SPANS_SPANS, |out| self::span(out, span));
                        }
                    }
                    string(
                        out,
                        SCOPE_SPANS_SCHEMA_URL,
                        scope.schema_url().unwrap_or_default(),
                    );
                });
            }
            if let Some(url) = &self.schema_url {
                string(out, RESOURCE_SPANS_SCHEMA_URL, url);
            }
        });
    }
}

/// Whether two spans have the same scope. The spans of one tracer share its scope's texts, so
/// texts at the same address settle it without comparing them.
fn same_scope(a: &InstrumentationScope, b: &InstrumentationScope) -> bool {
    fn at(s: Option<&str>) -> Option<(*const u8, usize)> {
        s.map(|s| (s.as_ptr(), s.len()))
    }
    let shared = at(Some(a.name())) == at(Some(b.name()))
        && at(a.version()) == at(b.version())
        && at(a.schema_url()) == at(b.schema_url())
        && a.attributes().next().is_none()
        && b.attributes().next().is_none();
    shared || a == b
}

fn span(out: &mut Vec<u8>, span: &SpanData) {
    let sc = &span.span_context;
    bytes(out, SPAN_TRACE_ID, &sc.trace_id().to_bytes());
    bytes(out, SPAN_SPAN_ID, &sc.span_id().to_bytes());
    trace_state(out, SPAN_TRACE_STATE, sc);
    if span.parent_span_id != SpanId::INVALID {
        bytes(out, SPAN_PARENT_SPAN_ID, &span.parent_span_id.to_bytes());
    }
    string(out, SPAN_NAME, &span.name);
    let kind = match span.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    uint(out, SPAN_KIND, kind);
    fixed64(out, SPAN_START_TIME, nanos(span.start_time));
    fixed64(out, SPAN_END_TIME, nanos(span.end_time));
    for kv in &span.attributes {
        key_value(out, SPAN_ATTRIBUTES, kv.key.as_str(), &kv.value);
    }
    uint(
        out,
        SPAN_DROPPED_ATTRIBUTES,
        u64::from(span.dropped_attributes_count),
    );
    for event in &span.events.events {
        message(out, SPAN_EVENTS, |out| {
            fixed64(out, EVENT_TIME, nanos(event.timestamp));
            string(out, EVENT_NAME, &event.name);
            attributes(out, EVENT_ATTRIBUTES, &event.attributes);
            uint(
                out,
                EVENT_DROPPED_ATTRIBUTES,
                u64::from(event.dropped_attributes_count),
            );
        });
    }
    uint(
        out,
        SPAN_DROPPED_EVENTS,
        u64::from(span.events.dropped_count),
    );
    for link in &span.links.links {
        message(out, SPAN_LINKS, |out| {
            let sc = &link.span_context;
            bytes(out, LINK_TRACE_ID, &sc.trace_id().to_bytes());
            bytes(out, LINK_SPAN_ID, &sc.span_id().to_bytes());
            trace_state(out, LINK_TRACE_STATE, sc);
            attributes(out, LINK_ATTRIBUTES, &link.attributes);
            uint(
                out,
                LINK_DROPPED_ATTRIBUTES,
                u64::from(link.dropped_attributes_count),
            );
            fixed32(out, LINK_FLAGS, flags(sc, sc.is_remote()));
        });
    }
    uint(out, SPAN_DROPPED_LINKS, u64::from(span.links.dropped_count));
    // Always present, even when unset.
    message(out, SPAN_STATUS, |out| {
        let (code, message) = match &span.status {
            Status::Unset => (0, ""),
            Status::Ok => (1, ""),
            Status::Error { description } => (2, description.as_ref()),
        };
        string(out, STATUS_MESSAGE, message);
        uint(out, STATUS_CODE, code);
    });
    fixed32(out, SPAN_FLAGS, flags(sc, span.parent_span_is_remote));
}

/// The W3C trace flags, plus whether the parent (or linked span) is remote.
fn flags(sc: &SpanContext, remote: bool) -> u32 {
    let remote = if remote { FLAGS_IS_REMOTE } else { 0 };
    u32::from(sc.trace_flags().to_u8()) | FLAGS_HAS_IS_REMOTE | remote
}

fn trace_state(out: &mut Vec<u8>, field: u32, sc: &SpanContext) {
    string(out, field, &sc.trace_state().header());
}

/// Nanoseconds since the Unix epoch; 0 for a time before it.
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn attributes(out: &mut Vec<u8>, field: u32, attributes: &[KeyValue]) {
    for kv in attributes {
        key_value(out, field, kv.key.as_str(), &kv.value);
    }
}

fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    message(out, field, |out| {
        string(out, KEY_VALUE_KEY, key);
        message(out, KEY_VALUE_VALUE, |out| any_value(out, value));
    });
}

/// The fields of an `AnyValue`: one member of its oneof, written even when it is the default.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => {
            tag(out, ANY_BOOL, VARINT);
            varint(out, u64::from(*b));
        }
        Value::I64(i) => {
            tag(out, ANY_INT, VARINT);
            varint(out, *i as u64);
        }
        Value::F64(f) => {
            tag(out, ANY_DOUBLE, FIXED64);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::String(s) => {
            tag(out, ANY_STRING, LEN);
            varint(out, s.as_str().len() as u64);
            out.extend_from_slice(s.as_str().as_bytes());
        }
        Value::Array(array) => message(out, ANY_ARRAY, |out| match array {
            Array::Bool(values) => elements(out, values, |v| Value::Bool(*v)),
            Array::I64(values) => elements(out, values, |v| Value::I64(*v)),
            Array::F64(values) => elements(out, values, |v| Value::F64(*v)),
            Array::String(values) => {
                for v in values {
                    message(out, ARRAY_VALUES, |out| {
                        tag(out, ANY_STRING, LEN);
                        varint(out, v.as_str().len() as u64);
                        out.extend_from_slice(v.as_str().as_bytes());
                    });
                }
            }
            // A kind of array newer than this encoder: no values.
            _ => {}
        }),
        // A kind of value newer than this encoder: an empty value.
        _ => {}
    }
}

fn elements<T>(out: &mut Vec<u8>, values: &[T], value: impl Fn(&T) -> Value) {
    for v in values {
        message(out, ARRAY_VALUES, |out| any_value(out, &value(v)));
    }
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A `uint32`, `int64` or enum field; left out when 0.
fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, VARINT);
        varint(out, v);
    }
}

/// A `fixed64` field; left out when 0.
fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, FIXED64);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A `fixed32` field; left out when 0.
fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        tag(out, field, FIXED32);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A `bytes` field; left out when empty.
fn bytes(out: &mut Vec<u8>, field: u32, v: &[u8]) {
    if !v.is_empty() {
        tag(out, field, LEN);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }
}

/// A `string` field; left out when empty.
fn string(out: &mut Vec<u8>, field: u32, v: &str) {
    bytes(out, field, v.as_bytes());
}

/// A message field, present even when empty: `body` writes its fields after a one-byte length,
/// which is widened afterwards when the message is 128 bytes or more.
fn message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, LEN);
    let at = out.len();
    out.push(0);
    body(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
        return;
    }
    let mut prefix = [0u8; 10];
    let mut n = 0;
    let mut v = len as u64;
    while v >= 0x80 {
        prefix[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    prefix[n] = v as u8;
    n += 1;
    out.resize(out.len() + n - 1, 0);
    out.copy_within(at + 1..at + 1 + len, at + n);
    out[at..at + n].copy_from_slice(&prefix[..n]);
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link, TraceFlags, TraceId, TraceState};
    use opentelemetry::{KeyValue, StringValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message as _;

    use super::*;

    /// Every kind of attribute value, empty and long texts, and negative and zero numbers.
    fn all_values() -> Vec<KeyValue> {
        vec![
            KeyValue::new("bool.true", true),
            KeyValue::new("bool.false", false),
            KeyValue::new("int.zero", 0i64),
            KeyValue::new("int.negative", -42i64),
            KeyValue::new("int.max", i64::MAX),
            KeyValue::new("int.min", i64::MIN),
            KeyValue::new("double.zero", 0.0),
            KeyValue::new("double", -1.5e300),
            KeyValue::new("string.static", "POST"),
            KeyValue::new("string.empty", ""),
            KeyValue::new("string.owned", "grüße, 世界 🚀".to_string()),
            KeyValue::new("string.shared", Arc::<str>::from("shared")),
            KeyValue::new("string.long", "x".repeat(20_000)),
            KeyValue::new(String::from("ключ"), "значение"),
            KeyValue::new("", "an empty key"),
            KeyValue::new(
                "array.bool",
                Value::Array(Array::Bool(vec![true, false, true])),
            ),
            KeyValue::new("array.int", Value::Array(Array::I64(vec![0, -1, 1 << 40]))),
            KeyValue::new("array.double", Value::Array(Array::F64(vec![0.0, 2.25]))),
            KeyValue::new(
                "array.string",
                Value::Array(Array::String(vec![
                    StringValue::from(""),
                    StringValue::from("ünïcode"),
                    StringValue::from("y".repeat(300)),
                ])),
            ),
            KeyValue::new("array.empty", Value::Array(Array::I64(Vec::new()))),
        ]
    }

    fn context(
        trace: u128,
        span: u64,
        flags: TraceFlags,
        remote: bool,
        state: &str,
    ) -> SpanContext {
        let state = if state.is_empty() {
            TraceState::default()
        } else {
            state.parse().expect("a valid tracestate")
        };
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            flags,
            remote,
            state,
        )
    }

    fn span(n: u64, scope: &InstrumentationScope) -> SpanData {
        let at = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        SpanData {
            span_context: context(
                0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736 + u128::from(n),
                0x00f0_67aa_0ba9_02b7 + n,
                TraceFlags::SAMPLED,
                false,
                "",
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("reserve"),
            start_time: at,
            end_time: at + Duration::from_micros(250),
            attributes: vec![KeyValue::new("toolgate.status", "READY")],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        }
    }

    /// Spans with every field set and unset: kinds, parents local and remote, trace state,
    /// flags, events, links, statuses, dropped counts, times at and before the epoch.
    fn varied(scope: &InstrumentationScope, other: &InstrumentationScope) -> Vec<SpanData> {
        let kinds = [
            SpanKind::Internal,
            SpanKind::Server,
            SpanKind::Client,
            SpanKind::Producer,
            SpanKind::Consumer,
        ];
        let statuses = [
            Status::Unset,
            Status::Ok,
            Status::error("the tool call failed"),
            Status::error(""),
            Status::error("échec: ツール"),
        ];
        let mut spans = Vec::new();
        for (n, kind) in kinds.into_iter().enumerate() {
            for (m, status) in statuses.iter().enumerate() {
                let i = (n * statuses.len() + m) as u64;
                let mut s = span(i, if i % 3 == 2 { other } else { scope });
                s.span_kind = kind.clone();
                s.status = status.clone();
                if i % 2 == 1 {
                    s.parent_span_id = SpanId::from(0x1234 + i);
                    s.parent_span_is_remote = i % 4 == 1;
                }
                if i.is_multiple_of(5) {
                    s.span_context = context(
                        7 + u128::from(i),
                        9 + i,
                        TraceFlags::default(),
                        true,
                        "a=1,b=two",
                    );
                }
                s.name = match i % 4 {
                    0 => Cow::Borrowed("execute_tool read_file"),
                    1 => Cow::Owned(format!("tools/call ファイル-{i}")),
                    2 => Cow::Borrowed(""),
                    _ => Cow::Owned("n".repeat(200)),
                };
                s.dropped_attributes_count = (i % 3) as u32;
                if i.is_multiple_of(2) {
                    s.attributes = all_values();
                }
                if i.is_multiple_of(3) {
                    s.events.events.push(Event::new(
                        "exception",
                        UNIX_EPOCH + Duration::from_secs(i),
                        all_values(),
                        3,
                    ));
                    s.events.events.push(Event::new(
                        String::from("événement"),
                        UNIX_EPOCH,
                        Vec::new(),
                        0,
                    ));
                    s.events.dropped_count = 2;
                }
                if i.is_multiple_of(4) {
                    s.links.links.push(Link::new(
                        context(99, 100, TraceFlags::SAMPLED, true, "vendor=x"),
                        vec![KeyValue::new("link.kind", "follows")],
                        1,
                    ));
                    s.links.links.push(Link::new(
                        context(101, 102, TraceFlags::default(), false, ""),
                        Vec::new(),
                        0,
                    ));
                    s.links.dropped_count = 5;
                }
                if i == 7 {
                    s.start_time = UNIX_EPOCH - Duration::from_secs(1);
                    s.end_time = UNIX_EPOCH;
                }
                spans.push(s);
            }
        }
        spans
    }

    /// What the OTLP reference conversion makes of `spans`, and what toolgate's encoding of
    /// them decodes to.
    fn both(
        resource: &Resource,
        spans: &[SpanData],
    ) -> (ExportTraceServiceRequest, ExportTraceServiceRequest) {
        let mut bytes = Vec::new();
        Encoder::new(resource).request(spans, &mut bytes);
        let ours = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        let reference = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans.to_vec(),
                &ResourceAttributesWithSchema::from(resource),
            ),
        };
        (ours, reference)
    }

    fn toolgate_scope() -> InstrumentationScope {
        InstrumentationScope::builder("toolgate")
            .with_version("0.1.0")
            .build()
    }

    #[test]
    fn otel_encoding_decodes_to_what_the_reference_conversion_makes() {
        let scope = toolgate_scope();
        let other = InstrumentationScope::builder("other-library")
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .with_attributes([KeyValue::new("scope.attr", 3i64)])
            .build();
        let resource = Resource::builder()
            .with_service_name("toolgate")
            .with_attribute(KeyValue::new("service.version", "0.1.0"))
            .with_attribute(KeyValue::new("deployment.region", "eu-west-1"))
            .build();
        let mut spans = varied(&scope, &other);
        // The same scope with texts of its own: grouped with the first.
        let copy = InstrumentationScope::builder(String::from("toolgate"))
            .with_version(String::from("0.1.0"))
            .build();
        spans.push(span(1000, &copy));
        spans.insert(3, span(1001, &copy));
        let (ours, reference) = both(&resource, &spans);
        assert_eq!(ours.resource_spans[0].scope_spans.len(), 2);
        assert_eq!(ours, reference);
    }

    #[test]
    fn otel_encoding_of_a_full_batch_a_schema_url_and_an_empty_batch() {
        let scope = toolgate_scope();
        let resource = Resource::builder_empty()
            .with_schema_url(
                [KeyValue::new("service.name", "agent-sidecar")],
                "https://opentelemetry.io/schemas/1.30.0",
            )
            .build();
        let full: Vec<SpanData> = (0..512).map(|n| span(n, &scope)).collect();
        let (ours, reference) = both(&resource, &full);
        assert_eq!(ours.resource_spans[0].scope_spans[0].spans.len(), 512);
        assert_eq!(ours, reference);
        let (ours, reference) = both(&resource, &[]);
        assert_eq!(ours, reference);
    }

    #[test]
    fn otel_encoding_widens_lengths_at_every_size() {
        // Message lengths on both sides of each varint width.
        let scope = toolgate_scope();
        let resource = Resource::builder_empty().build();
        for len in [0, 1, 100, 127, 128, 129, 16_383, 16_384, 70_000] {
            let mut s = span(1, &scope);
            s.attributes = vec![KeyValue::new("k", "v".repeat(len))];
            let (ours, reference) = both(&resource, &[s]);
            assert_eq!(ours, reference, "{len}");
        }
    }
}
