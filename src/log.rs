//! Log lines on stderr: one per request, plus lifecycle events. Never a token or a signature.
//!
//! Each line is formatted in memory and written with one `write`, so lines from different
//! threads never interleave.

use std::fmt;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::date::civil_from_days;
use crate::http::query::redact_signature;

/// Writes one line: an RFC 3339 UTC timestamp with milliseconds, then `message`.
pub fn line(message: fmt::Arguments) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut text = timestamp(now);
    let _ = writeln!(text, " {message}");
    let _ = std::io::stderr().lock().write_all(&text);
}

/// The request line: method, target without `signature`, status, body bytes, duration.
pub fn request(method: &str, target: &str, status: u16, bytes: u64, took: Duration) {
    line(format_args!(
        "{method} {} {status} {bytes} {}us",
        redact_signature(target),
        took.as_micros()
    ));
}

fn timestamp(since_epoch: Duration) -> Vec<u8> {
    let secs = since_epoch.as_secs() as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let time = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        time / 3600,
        time / 60 % 60,
        time % 60,
        since_epoch.subsec_millis()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let text = timestamp(Duration::from_millis(1_700_000_000_123));
        assert_eq!(text, b"2023-11-14T22:13:20.123Z");
    }
}
