//! The log line: one JSON object per event, with the fields, names and order of
//! tracing-subscriber's flattened JSON format, without building a serde map for every event
//! (the per-call line is on every call's path). The line is put together in a buffer of its
//! own with plain string pushes, the timestamp from a fixed template, and handed to the writer
//! in one write.
//!
//! An event inside a span, or one forwarded from the `log` crate, is left to that stock
//! format, which knows how to print spans and normalized `log` metadata.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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
        let mut line = String::with_capacity(LINE_CAPACITY);
        line.push_str("{\"timestamp\":\"");
        if !self.timer.push_now(&mut line) {
            let mut timestamp = String::new();
            self.timer.format_time(&mut Writer::new(&mut timestamp))?;
            escaped_body(&mut line, &timestamp)?;
        }
        line.push_str("\",\"level\":\"");
        line.push_str(meta.level().as_str());
        line.push('"');
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
pub fn push_json_string(out: &mut String, s: &str) {
    // Writing to a String cannot fail.
    let _ = escaped(out, s);
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
