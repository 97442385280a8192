//! Log lines on stderr: one per request, plus lifecycle events. Never a token or a signature.
//!
//! Each line is formatted into a buffer of its thread and written with one `write(2)`, so lines
//! from different threads never interleave, and logging a request neither allocates nor takes
//! a lock (std's `Stderr` is a mutex that busy workers would queue on).

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::date::civil_from_days;
use crate::http::query::redact_signature;

/// Longest line a thread's buffer keeps room for between lines.
const KEPT_CAPACITY: usize = 4096;

thread_local! {
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes one line: an RFC 3339 UTC timestamp with milliseconds, then `message`.
pub fn line(message: fmt::Arguments) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    LINE.with(|buffer| {
        let Ok(mut text) = buffer.try_borrow_mut() else {
            return;
        };
        text.clear();
        write_timestamp(&mut text, now);
        let _ = writeln!(text, " {message}");
        write_stderr(&text);
        if text.capacity() > KEPT_CAPACITY {
            *text = Vec::new();
        }
    });
}

/// The request line: method, target without `signature`, status, body bytes, duration.
pub fn request(method: &str, target: &str, status: u16, bytes: u64, took: Duration) {
    line(format_args!(
        "{method} {} {status} {bytes} {}us",
        redact_signature(target),
        took.as_micros()
    ));
}

/// One `write` on the process's stderr, through a descriptor of its own that no lock guards.
fn write_stderr(text: &[u8]) {
    static STDERR: OnceLock<Option<File>> = OnceLock::new();
    let unlocked = STDERR.get_or_init(|| {
        let fd = io::stderr().as_fd().try_clone_to_owned().ok()?;
        Some(File::from(fd))
    });
    if let Some(file) = unlocked {
        let mut file: &File = file;
        let _ = file.write_all(text);
    } else {
        let _ = io::stderr().lock().write_all(text);
    }
}

fn write_timestamp(out: &mut Vec<u8>, since_epoch: Duration) {
    // Past i64::MAX seconds (in 292 billion years) the timestamp saturates.
    let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let time = secs.rem_euclid(86_400);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        time / 3600,
        time / 60 % 60,
        time % 60,
        since_epoch.subsec_millis()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let mut text = Vec::new();
        write_timestamp(&mut text, Duration::from_millis(1_700_000_000_123));
        assert_eq!(text, b"2023-11-14T22:13:20.123Z");
    }
}
