//! The log line: one JSON object per event, with the fields, names and order of
//! tracing-subscriber's flattened JSON format, without building a serde map for every event
//! (the per-call line is on every call's path). The line is put together in a buffer of its
//! own with plain string pushes, the timestamp from a fixed template, and handed to the writer
//! in one write.
//!
//! An event inside a span, or one forwarded from the `log` crate, is left to that stock
//! format, which knows how to print spans and normalized `log` metadata.
//!
//! The two per-call lines (`call finished`, `call rejected`) skip the event machinery when the
//! process's own subscriber is installed ([`init`]): their fields are known, so the line is
//! put together from them directly and written to stderr in one write, the text the event
//! would have made (a test holds the two equal). Filtering still applies: the line is written
//! only when an INFO event of target `toolgate::call` is enabled. Under any other subscriber
//! the lines are ordinary events.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Installs toolgate's log subscriber: [`JsonLines`] on stderr, filtered by `filter`.
pub fn init(filter: tracing_subscriber::EnvFilter) {
    tracing_subscriber::fmt()
        .fmt_fields(fields())
        .event_format(JsonLines::default())
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    DIRECT.store(true, Ordering::Release);
}

/// Set by [`init`]: the per-call lines may be written to stderr directly.
static DIRECT: AtomicBool = AtomicBool::new(false);

/// The event format of toolgate's logs (see the module's comment).
pub struct JsonLines<T = SystemTime> {
    timer: T,
    stock: Format<Json, T>,
}

impl Default for JsonLines {
    fn default() -> Self {
        JsonLines::with_timer(SystemTime)
    }
}

impl<T: FormatTime + Clone> JsonLines<T> {
    /// The format with its timestamps from `timer`.
    pub fn with_timer(timer: T) -> Self {
        JsonLines {
            stock: tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_timer(timer.clone()),
            timer,
        }
    }
}

/// The field formatter that goes with [`JsonLines`] (spans' fields, for the stock format).
pub fn fields() -> JsonFields {
    JsonFields::new()
}

impl<S, N, T> FormatEvent<S, N> for JsonLines<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    T: LineTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let in_span = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current())
            .is_some();
        if in_span || meta.target() == "log" {
            return self.stock.format_event(ctx, writer, event);
        }
        let mut line = line_start(&self.timer, meta.level())?;
        let mut fields = Fields {
            out: &mut line,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        line.push_str(",\"target\":");
        escaped(&mut line, meta.target())?;
        line.push_str("}\n");
        writer.write_str(&line)
    }
}

/// Room for a typical line, so the buffer is allocated once.
const LINE_CAPACITY: usize = 384;

/// A line's `{"timestamp":…,"level":…` (what comes first in every line).
fn line_start(timer: &impl LineTime, level: &tracing::Level) -> Result<String, fmt::Error> {
    let mut line = String::with_capacity(LINE_CAPACITY);
    line.push_str("{\"timestamp\":\"");
    if !timer.push_now(&mut line) {
        let mut timestamp = String::new();
        timer.format_time(&mut Writer::new(&mut timestamp))?;
        escaped_body(&mut line, &timestamp)?;
    }
    line.push_str("\",\"level\":\"");
    line.push_str(level.as_str());
    line.push('"');
    Ok(line)
}

/// The `call finished` line, of a call that was reserved.
pub struct Finished<'a> {
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub tool: &'a str,
    pub status: &'a str,
    pub evidence_status: &'a str,
    pub code: &'a str,
    pub layer: &'a str,
    pub duration_ms: u64,
    pub cause: &'a str,
}

/// The `call rejected` line, of a call refused before it was reserved.
pub struct Rejected<'a> {
    pub code: &'a str,
    pub layer: &'a str,
    pub tool: &'a str,
    pub tool_call_id: &'a str,
    pub cause: &'a str,
}

impl Finished<'_> {
    /// Logs the line (see the module's comment).
    pub fn log(&self) {
        per_call(
            || self.line(&SystemTime),
            || {
                tracing::info!(
                    target: "toolgate::call",
                    run_id = self.run_id,
                    "gen_ai.tool.call.id" = self.tool_call_id,
                    "gen_ai.tool.name" = self.tool,
                    status = self.status,
                    evidence_status = self.evidence_status,
                    code = self.code,
                    layer = self.layer,
                    duration_ms = self.duration_ms,
                    cause = self.cause,
                    "call finished"
                )
            },
        );
    }

    /// The text of the line, with the time from `timer`.
    fn line(&self, timer: &impl LineTime) -> Option<String> {
        let mut line = Line::start(timer, "call finished")?;
        line.str(",\"run_id\":", self.run_id);
        line.str(",\"gen_ai.tool.call.id\":", self.tool_call_id);
        line.str(",\"gen_ai.tool.name\":", self.tool);
        line.str(",\"status\":", self.status);
        line.str(",\"evidence_status\":", self.evidence_status);
        line.str(",\"code\":", self.code);
        line.str(",\"layer\":", self.layer);
        line.u64(",\"duration_ms\":", self.duration_ms);
        line.str(",\"cause\":", self.cause);
        Some(line.finish())
    }
}

impl Rejected<'_> {
    /// Logs the line (see the module's comment).
    pub fn log(&self) {
        per_call(
            || self.line(&SystemTime),
            || {
                tracing::info!(
                    target: "toolgate::call",
                    code = self.code,
                    layer = self.layer,
                    "gen_ai.tool.name" = self.tool,
                    "gen_ai.tool.call.id" = self.tool_call_id,
                    cause = self.cause,
                    "call rejected"
                )
            },
        );
    }

    /// The text of the line, with the time from `timer`.
    fn line(&self, timer: &impl LineTime) -> Option<String> {
        let mut line = Line::start(timer, "call rejected")?;
        line.str(",\"code\":", self.code);
        line.str(",\"layer\":", self.layer);
        line.str(",\"gen_ai.tool.name\":", self.tool);
        line.str(",\"gen_ai.tool.call.id\":", self.tool_call_id);
        line.str(",\"cause\":", self.cause);
        Some(line.finish())
    }
}

/// A per-call line, if an INFO event of target `toolgate::call` is enabled: written directly
/// (`line`) when it may be, else logged as the event (`event`).
fn per_call(line: impl FnOnce() -> Option<String>, event: impl FnOnce()) {
    if !tracing::enabled!(target: "toolgate::call", tracing::Level::INFO) {
        return;
    }
    if direct() {
        write_direct(line());
    } else {
        event();
    }
}

/// Whether a per-call line may skip the event: [`init`] ran, and no span is current (an event
/// in a span is written by the stock format, with the span).
fn direct() -> bool {
    DIRECT.load(Ordering::Acquire) && tracing::Span::current().is_none()
}

/// Hands a line to stderr in one write, as the subscriber's writer does (and, like it, drops
/// a failed write: a log line never fails a call).
fn write_direct(line: Option<String>) {
    use std::io::Write as _;
    if let Some(line) = line {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// An INFO line of target `toolgate::call`, field by field: what [`JsonLines`] writes for
/// such an event. Field names are written as given, values are escaped.
struct Line(String);

impl Line {
    /// The line's start and its `message`, the first field of an event.
    fn start(timer: &impl LineTime, message: &str) -> Option<Line> {
        let mut line = Line(line_start(timer, &tracing::Level::INFO).ok()?);
        line.str(",\"message\":", message);
        Some(line)
    }

    /// A string field; `name` is its punctuation and quoted name, `,"name":`.
    fn str(&mut self, name: &'static str, value: &str) {
        self.0.push_str(name);
        push_json_string(&mut self.0, value);
    }

    /// A number field, `name` as for [`Line::str`].
    fn u64(&mut self, name: &'static str, value: u64) {
        self.0.push_str(name);
        self.0.push_str(itoa::Buffer::new().format(value));
    }

    fn finish(mut self) -> String {
        self.0.push_str(",\"target\":\"toolgate::call\"}\n");
        self.0
    }
}

/// A log timer that can write the time now straight into a line.
pub trait LineTime: FormatTime {
    /// Appends the time now and returns `true`, or returns `false` to have
    /// [`FormatTime::format_time`] write it.
    fn push_now(&self, _line: &mut String) -> bool {
        false
    }
}

impl LineTime for SystemTime {
    /// The template of [`crate::clock::push_log_time`]: the same text as this timer's.
    fn push_now(&self, line: &mut String) -> bool {
        crate::clock::push_log_time(line)
    }
}

/// Writes every field as `,"name":value`, valued as the stock format values them.
struct Fields<'a, W: Write> {
    out: &'a mut W,
    result: fmt::Result,
}

impl<W: Write> Fields<'_, W> {
    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self
                .out
                .write_char(',')
                .and_then(|()| escaped(self.out, field.name()))
                .and_then(|()| self.out.write_char(':'))
                .and_then(|()| value(self.out));
        }
    }
}

impl<W: Write> Visit for Fields<'_, W> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |out| {
            out.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field, |out| {
            let text = serde_json::to_string(&value).map_err(|_| fmt::Error)?;
            out.write_str(&text)
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |out| escaped(out, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |out| {
            out.write_char('"')?;
            write!(Escaping(&mut *out), "{value:?}")?;
            out.write_char('"')
        });
    }
}

/// Escapes what is written through it, for a value formatted straight into the line.
struct Escaping<'a, W: Write>(&'a mut W);

impl<W: Write> Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escaped_body(self.0, s)
    }
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
#[inline]
pub fn push_json_string(out: &mut String, s: &str) {
    // Most strings (ids, names, codes, times) need no escape: three pushes, sized once.
    if crate::compact::plain_run(s.as_bytes()).is_none() {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        // Writing to a String cannot fail.
        let _ = escaped(out, s);
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn escaped(out: &mut impl Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    escaped_body(out, s)?;
    out.write_char('"')
}

/// `s` escaped as inside a JSON string, without the quotes.
fn escaped_body(out: &mut impl Write, s: &str) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Most values (ids, names, codes) need no escape: one scan, eight bytes at a time, for the
    // first byte that needs one (a quote, a backslash or a control character), one write.
    let Some(first) = crate::compact::plain_run(s.as_bytes()) else {
        return out.write_str(s);
    };
    out.write_str(&s[..first])?;
    let mut start = first;
    for (i, b) in s.bytes().enumerate().skip(first) {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.write_str(&s[start..i])?;
        if short.is_empty() {
            let (hi, lo) = (HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]);
            write!(out, "\\u00{}{}", char::from(hi), char::from(lo))?;
        } else {
            out.write_str(short)?;
        }
        start = i + 1;
    }
    out.write_str(&s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[derive(Clone)]
    struct Fixed;

    impl FormatTime for Fixed {
        fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
            w.write_str("2026-01-02T03:04:05.678901Z")
        }
    }

    impl LineTime for Fixed {}

    #[test]
    fn the_time_template_writes_what_the_system_timer_writes() {
        // Read back to back until both land in the same second; the fractions differ.
        for _ in 0..100 {
            let mut stock = String::new();
            SystemTime
                .format_time(&mut Writer::new(&mut stock))
                .unwrap();
            let mut ours = String::new();
            assert!(SystemTime.push_now(&mut ours));
            assert_eq!(ours.len(), stock.len(), "{ours} {stock}");
            let shape = |t: &str| t.bytes().map(|b| b.is_ascii_digit()).collect::<Vec<_>>();
            assert_eq!(shape(&ours), shape(&stock), "{ours} {stock}");
            if ours[..20] == stock[..20] {
                return;
            }
        }
        panic!("the two timers never agreed on the second");
    }

    fn events() {
        let cause = String::from("tool said \"no\"\n\u{1}é\\");
        tracing::info!(
            target: "toolgate::call",
            run_id = "run-1",
            "gen_ai.tool.call.id" = "call-1",
            "gen_ai.tool.name" = %"search",
            status = "READY",
            evidence_status = "EVIDENCE_FOUND",
            code = "",
            layer = "",
            duration_ms = 12u64,
            cause = cause.as_str(),
            "call finished"
        );
        tracing::warn!(error = %cause, n = -3i64, ok = true, x = 1.5f64, nan = f64::NAN, "oops {}", 7);
        tracing::error!(big = 1u128 << 100, list = ?vec!["a\tb"], "débug");
        let span = tracing::info_span!("inside", k = "v");
        span.in_scope(|| tracing::info!(a = 1u64, "in a span"));
    }

    fn captured(sub: impl Subscriber + Send + Sync, sink: &Sink) -> String {
        tracing::subscriber::with_default(sub, events);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    proptest::proptest! {
        #[test]
        fn strings_are_escaped_as_serde_json_escapes_them(s in "(\\PC|[\"\\\\\u{0}-\u{1f}\u{7f}])*") {
            let mut ours = String::new();
            push_json_string(&mut ours, &s);
            proptest::prop_assert_eq!(ours, serde_json::to_string(&s).unwrap());
        }
    }

    /// What the stock flattened JSON format writes for what `emit` logs, at most `level`.
    fn stock_text(level: tracing::Level, emit: impl FnOnce()) -> String {
        let sink = Sink::default();
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_timer(Fixed)
            .with_max_level(level)
            .with_writer({
                let s = sink.clone();
                move || s.clone()
            })
            .finish();
        tracing::subscriber::with_default(sub, emit);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    proptest::proptest! {
        #[test]
        fn per_call_lines_are_the_lines_of_their_events(
            id in "(\\PC|[\"\\\\\u{0}-\u{1f}])*",
            cause in "(\\PC|[\"\\\\\u{0}-\u{1f}\u{7f}])*",
            ms in proptest::prelude::any::<u64>(),
        ) {
            let finished = Finished {
                run_id: &id,
                tool_call_id: &cause,
                tool: "search",
                status: "ERROR",
                evidence_status: "ERROR",
                code: "TOOL_ERROR",
                layer: "TOOL",
                duration_ms: ms,
                cause: &cause,
            };
            let rejected = Rejected {
                code: "INVALID_INPUT",
                layer: "AGENT",
                tool: &id,
                tool_call_id: "",
                cause: &cause,
            };
            let want = stock_text(tracing::Level::INFO, || {
                finished.log();
                rejected.log();
            });
            let ours = [finished.line(&Fixed), rejected.line(&Fixed)].map(Option::unwrap).concat();
            proptest::prop_assert_eq!(ours, want);
        }
    }

    #[test]
    fn per_call_lines_follow_the_filter() {
        let finished = Finished {
            run_id: "run-1",
            tool_call_id: "call-1",
            tool: "search",
            status: "READY",
            evidence_status: "EVIDENCE_FOUND",
            code: "",
            layer: "",
            duration_ms: 3,
            cause: "",
        };
        let rejected = Rejected {
            code: "UNKNOWN_TOOL",
            layer: "AGENT",
            tool: "_unknown",
            tool_call_id: "call-2",
            cause: "no such tool",
        };
        let quiet = stock_text(tracing::Level::WARN, || {
            finished.log();
            rejected.log();
        });
        assert_eq!(quiet, "");
        let lines = stock_text(tracing::Level::INFO, || {
            finished.log();
            rejected.log();
        });
        assert_eq!(lines.lines().count(), 2, "{lines}");
        assert!(
            lines.contains(r#""message":"call finished","run_id":"run-1""#),
            "{lines}"
        );
    }

    #[test]
    fn lines_are_those_of_the_stock_flattened_json_format() {
        let ours = Sink::default();
        let stock = Sink::default();
        let want = captured(
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_timer(Fixed)
                .with_writer({
                    let s = stock.clone();
                    move || s.clone()
                })
                .finish(),
            &stock,
        );
        let got = captured(
            tracing_subscriber::fmt()
                .fmt_fields(fields())
                .event_format(JsonLines::with_timer(Fixed))
                .with_writer({
                    let s = ours.clone();
                    move || s.clone()
                })
                .finish(),
            &ours,
        );
        assert_eq!(got.lines().count(), 4, "{got}");
        assert_eq!(got, want);
    }
}
