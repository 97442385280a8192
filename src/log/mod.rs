//! Log lines on stderr: one per request, plus lifecycle events. Never a token or a signature.
//!
//! A line is text (`<RFC 3339 time> <message>`) or, with `--log-format json`, one JSON object
//! with envd's field names ([`json`]); when the metadata service names a logs collector, every
//! line is also queued, as JSON, for it ([`export`]). Each line is formatted into buffers of its
//! thread and written with one `write(2)`, so lines from different threads never interleave, and
//! logging a request neither allocates nor takes a lock (std's `Stderr` is a mutex that busy
//! workers would queue on); exporting adds one short lock and a copy.

pub mod export;
mod json;

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::date::civil_from_days;
use crate::http::query::redact_signature;

/// Longest line a thread's buffers keep room for between lines.
const KEPT_CAPACITY: usize = 4096;

/// How lines are written on stderr (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

static JSON_ON_STDERR: AtomicBool = AtomicBool::new(false);
/// envd's `operation_id`: a number per request, in the order they are logged.
static OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// Sets the format of every line written from now on.
pub fn set_format(format: Format) {
    JSON_ON_STDERR.store(format == Format::Json, Ordering::Relaxed);
}

/// A request's fields, for the JSON form of its line.
pub(crate) struct RequestFields<'a> {
    method: &'a str,
    target: &'a str,
    status: u16,
    bytes: u64,
    micros: u128,
}

struct Buffers {
    /// The message alone, then the line written.
    message: String,
    line: Vec<u8>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = const {
        RefCell::new(Buffers { message: String::new(), line: Vec::new() })
    };
}

/// Writes one line (and queues it for the collector, if there is one).
pub fn line(message: fmt::Arguments) {
    emit(message, None, true);
}

/// A line for stderr only, never exported: the exporter's own complaints (which would
/// otherwise feed themselves back into the queue they are about).
pub fn local_line(message: fmt::Arguments) {
    emit(message, None, false);
}

/// The request line: method, target without `signature`, status, body bytes, duration.
pub fn request(method: &str, target: &str, status: u16, bytes: u64, took: Duration) {
    let target = redact_signature(target);
    let micros = took.as_micros();
    let fields = RequestFields {
        method,
        target: &target,
        status,
        bytes,
        micros,
    };
    emit(
        format_args!("{method} {target} {status} {bytes} {micros}us"),
        Some(fields),
        true,
    );
}

fn emit(message: fmt::Arguments, request: Option<RequestFields>, exported: bool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let json_on_stderr = JSON_ON_STDERR.load(Ordering::Relaxed);
    let exporting = exported && export::is_on();
    BUFFERS.with(|buffers| {
        let Ok(mut buffers) = buffers.try_borrow_mut() else {
            return;
        };
        let Buffers {
            message: text,
            line,
        } = &mut *buffers;
        line.clear();
        if json_on_stderr || exporting {
            // The message alone, to be escaped into the JSON object.
            text.clear();
            let _ = fmt::write(text, message);
            let operation = request
                .is_some()
                .then(|| OPERATIONS.fetch_add(1, Ordering::Relaxed) + 1);
            // `9999-12-31T23:59:59.999Z` is 24 bytes; a later year (saturated) is cut.
            let mut stamp = [0u8; 32];
            let mut cursor = io::Cursor::new(&mut stamp[..]);
            write_timestamp(&mut cursor, now);
            let written = usize::try_from(cursor.position()).unwrap_or(0);
            json::write_line(line, &stamp[..written], text, request.as_ref(), operation);
            if exporting {
                export::push(line);
            }
        }
        if !json_on_stderr {
            // Formatted straight into the line (the common case: no JSON at all).
            line.clear();
            write_timestamp(line, now);
            let _ = write!(line, " {message}");
        }
        line.push(b'\n');
        write_stderr(line);
        if line.capacity() > KEPT_CAPACITY {
            *line = Vec::new();
        }
        if text.capacity() > KEPT_CAPACITY {
            *text = String::new();
        }
    });
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

fn write_timestamp(out: &mut impl Write, since_epoch: Duration) {
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
