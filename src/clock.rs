//! The one clock: epoch milliseconds for deadlines, TTLs and record times, and RFC 3339 UTC with
//! milliseconds as the contract writes times.
//!
//! It is the wall clock, moved by tokio's clock: when a test pauses tokio time
//! (`tokio::time::pause`, `start_paused`) and advances it, deadlines, the memory store's TTLs and
//! the times in records all move with it, so no test has to sleep on the wall clock. Outside a
//! paused runtime tokio's clock is the monotonic clock, so this is the wall clock read through
//! an anchor (the wall clock minus the monotonic clock, in nanoseconds) that is taken again
//! whenever the wall clock is stepped by more than a second. The wall clock is compared with the
//! anchor at most every [`CHECK_EVERY_NS`] of tokio's clock, so a step is followed within that
//! time, and most reads cost one monotonic clock read and two atomic loads, with no lock.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The monotonic instant the clock counts from.
static BASE: OnceLock<Instant> = OnceLock::new();

/// The anchor: the wall clock's nanoseconds since the epoch minus the monotonic clock's since
/// [`BASE`], when it was last taken. The time is this plus tokio's clock since `BASE`.
static OFFSET_NS: AtomicI64 = AtomicI64::new(0);

/// Tokio's clock since [`BASE`] when the wall clock was last compared with the anchor.
static CHECKED_NS: AtomicI64 = AtomicI64::new(0);

/// When the wall clock and the monotonic clock disagree by more than this (the wall clock was
/// stepped), the anchor is taken again.
const RESYNC_NS: u64 = 1_000_000_000;

/// How often the wall clock is compared with the anchor.
const CHECK_EVERY_NS: u64 = 100_000_000;

#[allow(clippy::disallowed_methods)] // the one place the wall clock is read
fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Nanoseconds as a signed count, saturating (past the year 2262).
fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `t` less `base` in nanoseconds; negative when `t` is earlier (a paused tokio clock can
/// stand before the instant the clock was first read).
fn since(t: Instant, base: Instant) -> i64 {
    match t.checked_duration_since(base) {
        Some(ahead) => ns(ahead),
        None => -ns(base.duration_since(t)),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let base = *BASE.get_or_init(|| {
        let at = Instant::now();
        OFFSET_NS.store(ns(wall()), Relaxed);
        at
    });
    // tokio's clock: the monotonic clock, or the paused (and advanced) one in tests.
    let now = since(tokio::time::Instant::now().into_std(), base);
    let checked = CHECKED_NS.load(Relaxed);
    // One caller compares the clocks; the others read the anchor as it is.
    if now.abs_diff(checked) >= CHECK_EVERY_NS
        && CHECKED_NS
            .compare_exchange(checked, now, Relaxed, Relaxed)
            .is_ok()
    {
        resync(base);
    }
    let at = OFFSET_NS.load(Relaxed).saturating_add(now);
    u64::try_from(at / 1_000_000).unwrap_or(0)
}

/// Takes the anchor again if the wall clock no longer agrees with it. Compared on the real
/// monotonic clock, so a paused tokio clock is never mistaken for a stepped wall clock.
#[cold]
fn resync(base: Instant) {
    let real = since(Instant::now(), base);
    let wall = ns(wall());
    let expected = OFFSET_NS.load(Relaxed).saturating_add(real);
    if expected.abs_diff(wall) > RESYNC_NS {
        OFFSET_NS.store(wall.saturating_sub(real), Relaxed);
    }
}

/// Formats epoch milliseconds as `2026-11-29T22:03:04.123Z`. Every record is stamped with it,
/// so the digits are written into a fixed template rather than through `format!`.
pub fn rfc3339(ms: u64) -> String {
    match stamp::<24>(ms / 1000, ms % 1000) {
        Some(text) => std::str::from_utf8(&text).unwrap_or_default().to_owned(),
        None => by_format(ms),
    }
}

/// [`rfc3339`] through `format!`: for years the template does not hold (and, in the tests,
/// what the template is checked against).
fn by_format(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

/// Appends the wall clock's time now as log lines carry it, `2026-11-29T22:03:04.123456Z`
/// (microseconds, as tracing-subscriber's `SystemTime` timer writes it). `false`, with nothing
/// written, for a year outside 0–9999, which that timer writes differently.
pub fn push_log_time(out: &mut String) -> bool {
    let now = wall();
    match stamp::<27>(now.as_secs(), u64::from(now.subsec_micros())) {
        Some(text) => {
            out.push_str(std::str::from_utf8(&text).unwrap_or_default());
            true
        }
        None => false,
    }
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS.` then `fraction` in the `N - 21` digits
/// left before a closing `Z`; `None` for a year outside 0–9999.
fn stamp<const N: usize>(secs: u64, fraction: u64) -> Option<[u8; N]> {
    let mut out = [b'0'; N];
    out[..19].copy_from_slice(&second(secs)?);
    out[19] = b'.';
    out[N - 1] = b'Z';
    digits(&mut out[20..N - 1], fraction);
    Some(out)
}

thread_local! {
    /// The last second this thread wrote, and its text: a call stamps its records and its log
    /// line within the same second, so the date is worked out once a second, not every time.
    static LAST_SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS`; `None` for a year outside 0–9999.
fn second(secs: u64) -> Option<[u8; 19]> {
    let (last, text) = LAST_SECOND.get();
    if last == secs {
        return Some(text);
    }
    let text = date_time(secs)?;
    LAST_SECOND.set((secs, text));
    Some(text)
}

fn date_time(secs: u64) -> Option<[u8; 19]> {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    if !(0..=9999).contains(&y) {
        return None;
    }
    let mut out = [b'0'; 19];
    for (at, sep) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')] {
        out[at] = sep;
    }
    digits(&mut out[0..4], y as u64);
    digits(&mut out[5..7], u64::from(m));
    digits(&mut out[8..10], u64::from(d));
    digits(&mut out[11..13], rem / 3600);
    digits(&mut out[14..16], rem / 60 % 60);
    digits(&mut out[17..19], rem % 60);
    Some(out)
}

/// Writes `v` as exactly `out.len()` decimal digits, zero-padded.
fn digits(out: &mut [u8], mut v: u64) {
    for c in out.iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(rfc3339(1_796_000_000_123), "2026-11-30T00:53:20.123Z");
    }

    proptest::proptest! {
        #[test]
        fn the_template_writes_what_format_would(
            ms in 0u64..=253_402_300_797_999,
            later in proptest::collection::vec(0u64..2_000, 1..4),
        ) {
            proptest::prop_assert_eq!(rfc3339(ms), by_format(ms));
            // Times soon after: the same second (the date kept from before) or the next ones.
            let mut at = ms;
            for step in later {
                at += step;
                proptest::prop_assert_eq!(rfc3339(at), by_format(at));
            }
        }
    }

    #[test]
    fn past_year_9999_it_still_formats() {
        assert_eq!(rfc3339(253_402_300_800_000), "10000-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the wall clock, to compare with
    fn agrees_with_the_wall_clock_from_every_thread() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..10_000)
                        .map(|_| {
                            let ours = now_ms();
                            let wall = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .unwrap()
                                .as_millis() as u64;
                            ours.abs_diff(wall)
                        })
                        .max()
                        .unwrap()
                })
            })
            .collect();
        for t in threads {
            let off = t.join().unwrap();
            assert!(off <= 1_000, "now_ms is {off} ms off the wall clock");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let before = now_ms();
        tokio::time::advance(Duration::from_secs(3600)).await;
        let after = now_ms();
        assert!(
            (3_599_000..3_601_000).contains(&(after - before)),
            "{before} -> {after}"
        );
    }
}
