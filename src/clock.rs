//! The one clock: epoch milliseconds for deadlines, TTLs and record times, and RFC 3339 UTC with
//! milliseconds as the contract writes times.
//!
//! It is the wall clock, moved by tokio's clock: when a test pauses tokio time
//! (`tokio::time::pause`, `start_paused`) and advances it, deadlines, the memory store's TTLs and
//! the times in records all move with it, so no test has to sleep on the wall clock. Outside a
//! paused runtime tokio's clock is the monotonic clock and this is plain `SystemTime`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
#[allow(clippy::disallowed_methods)] // the one place the wall clock is read
pub fn now_ms() -> u64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i128)
        .unwrap_or(0);
    // How far tokio's clock is ahead of (paused and advanced) or behind (paused) the monotonic
    // one; zero unless time is paused.
    let tokio_now = tokio::time::Instant::now().into_std();
    let std_now = std::time::Instant::now();
    let skew = match tokio_now.checked_duration_since(std_now) {
        Some(ahead) => ahead.as_millis() as i128,
        None => -(std_now.duration_since(tokio_now).as_millis() as i128),
    };
    (wall + skew).max(0) as u64
}

/// Formats epoch milliseconds as `2026-11-29T22:03:04.123Z`.
pub fn rfc3339(ms: u64) -> String {
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
