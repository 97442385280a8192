//! Log lines on stderr: one per request, plus lifecycle events. Never a token or a signature.
//!
//! A line is text (`<RFC 3339 time> <message>`) or, with `--log-format json`, one JSON object
//! with envd's field names ([`json`]); when the metadata service names a logs collector, every
//! line is also queued, as JSON, for it ([`export`]). Each line is formatted into buffers of its
//! thread, a request's without `core::fmt`; request lines are then held in the thread's buffer
//! and written many at a time ([`buffer`]: at most a second late), any other line is written at
//! once after them. Lines from different threads never interleave, and logging a request neither
//! allocates nor waits on another thread (std's `Stderr` is a mutex that busy workers would queue
//! on); exporting adds one short lock and a copy.

mod buffer;
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
use crate::http::digits::{push_padded, push_u64};
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
    micros: u64,
    /// When the request ended.
    at: SystemTime,
}

struct Buffers {
    /// The message alone, then the line written.
    message: String,
    line: Vec<u8>,
    /// The JSON form's timestamp.
    stamp: Vec<u8>,
    /// The second of the latest timestamp, formatted.
    second: Second,
}

/// A formatted second, `2023-11-14T22:13:20.`, and which it is: a thread's lines in the same
/// second share it, and only their milliseconds are written.
struct Second {
    text: Vec<u8>,
    of: Option<u64>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = const {
        RefCell::new(Buffers {
            message: String::new(),
            line: Vec::new(),
            stamp: Vec::new(),
            second: Second { text: Vec::new(), of: None },
        })
    };
}

/// Writes one line (and queues it for the collector, if there is one). The request lines
/// buffered by every thread are written first, so this line follows them.
pub fn line(message: fmt::Arguments) {
    emit(Message::Text(message), true);
}

/// A line for stderr only, never exported: the exporter's own complaints (which would
/// otherwise feed themselves back into the queue they are about).
pub fn local_line(message: fmt::Arguments) {
    emit(Message::Text(message), false);
}

/// The request line: `at` (when the request ended: the line's time), method, target without
/// `signature`, status, body bytes, duration. Held in the thread's buffer ([`buffer`]),
/// written within a second.
pub fn request(
    at: SystemTime,
    method: &str,
    target: &str,
    status: u16,
    bytes: u64,
    took: Duration,
) {
    let target = redact_signature(target);
    let fields = RequestFields {
        method,
        target: &target,
        status,
        bytes,
        micros: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        at,
    };
    emit(Message::Request(fields), true);
}

/// The calling thread's buffered request lines, written now: its worker is about to wait.
pub fn flush_idle() {
    buffer::flush_mine(write_stderr);
}

/// Every thread's buffered request lines, written now: on the timekeeper's round, at exit,
/// before a live upgrade's `execve`.
pub fn flush() {
    buffer::flush_all(write_stderr);
}

enum Message<'a> {
    Text(fmt::Arguments<'a>),
    Request(RequestFields<'a>),
}

impl Message<'_> {
    /// The message straight into the line, without `core::fmt` for a request's.
    fn write_bytes(&self, line: &mut Vec<u8>) {
        match self {
            Message::Text(message) => {
                let _ = line.write_fmt(*message);
            }
            Message::Request(r) => r.write_message(line, |line, text| {
                line.extend_from_slice(text.as_bytes());
            }),
        }
    }
}

impl RequestFields<'_> {
    /// A request's message, `METHOD TARGET STATUS BYTES MICROSus` (the text form's line and
    /// the JSON form's `message`), its method and target written by `text` (as they are, or
    /// escaped).
    fn write_message(&self, out: &mut Vec<u8>, text: fn(&mut Vec<u8>, &str)) {
        text(out, self.method);
        out.push(b' ');
        text(out, self.target);
        out.push(b' ');
        push_u64(out, u64::from(self.status));
        out.push(b' ');
        push_u64(out, self.bytes);
        out.push(b' ');
        push_u64(out, self.micros);
        out.extend_from_slice(b"us");
    }
}

fn emit(message: Message, exported: bool) {
    // A request's line carries the time its request ended (the server's reading of the clock
    // for its duration); any other line is timed here.
    let now = match &message {
        Message::Request(fields) => fields.at,
        Message::Text(_) => SystemTime::now(),
    }
    .duration_since(UNIX_EPOCH)
    .unwrap_or_default();
    let json_on_stderr = JSON_ON_STDERR.load(Ordering::Relaxed);
    let exporting = exported && export::is_on();
    let request = match &message {
        Message::Request(fields) => Some(fields),
        Message::Text(_) => None,
    };
    BUFFERS.with(|buffers| {
        let Ok(mut buffers) = buffers.try_borrow_mut() else {
            return;
        };
        let Buffers {
            message: text,
            line,
            stamp,
            second,
        } = &mut *buffers;
        line.clear();
        if json_on_stderr || exporting {
            stamp.clear();
            write_timestamp(stamp, second, now);
            match &message {
                Message::Request(fields) => {
                    let operation = OPERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
                    json::write_request_line(line, stamp, fields, operation);
                }
                Message::Text(args) => {
                    // The message alone, to be escaped into the JSON object.
                    text.clear();
                    let _ = fmt::write(text, *args);
                    json::write_line(line, stamp, text);
                }
            }
            if exporting {
                export::push(line);
            }
        }
        if !json_on_stderr {
            // Written straight into the line (the common case: no JSON at all).
            line.clear();
            write_timestamp(line, second, now);
            line.push(b' ');
            message.write_bytes(line);
        }
        line.push(b'\n');
        if request.is_some() {
            buffer::append(line, write_stderr);
        } else {
            buffer::flush_all(write_stderr);
            write_stderr(line);
        }
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

/// `2023-11-14T22:13:20.123Z`, digits by hand (on every request line), its second formatted
/// only when it is not `second`'s.
fn write_timestamp(out: &mut Vec<u8>, second: &mut Second, since_epoch: Duration) {
    let secs = since_epoch.as_secs();
    if second.of != Some(secs) {
        second.text.clear();
        write_second(&mut second.text, secs);
        second.of = Some(secs);
    }
    out.extend_from_slice(&second.text);
    push_padded(out, u64::from(since_epoch.subsec_millis()), 3);
    out.push(b'Z');
}

/// `2023-11-14T22:13:20.`, the second of a timestamp.
fn write_second(out: &mut Vec<u8>, secs: u64) {
    // Past i64::MAX seconds (in 292 billion years) the timestamp saturates.
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let time = secs.rem_euclid(86_400).unsigned_abs();
    let fields = [
        (year.unsigned_abs(), 4, b'-'),
        (month.unsigned_abs(), 2, b'-'),
        (day.unsigned_abs(), 2, b'T'),
        (time / 3600, 2, b':'),
        (time / 60 % 60, 2, b':'),
        (time % 60, 2, b'.'),
    ];
    for (value, width, after) in fields {
        push_padded(out, value, width);
        out.push(after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::fuzzing::allocations_made;

    #[test]
    fn a_request_line_allocates_nothing_once_warm() {
        std::thread::spawn(|| {
            let line = || {
                request(
                    SystemTime::now(),
                    "GET",
                    "/log-test?no-allocation",
                    204,
                    0,
                    Duration::from_micros(9),
                )
            };
            line();
            let before = allocations_made();
            for _ in 0..1000 {
                line();
            }
            assert_eq!(allocations_made() - before, 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let mut second = Second {
            text: Vec::new(),
            of: None,
        };
        for (millis, stamp) in [
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (1_700_000_000_999, "2023-11-14T22:13:20.999Z"),
            (1_700_000_001_004, "2023-11-14T22:13:21.004Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (0, "1970-01-01T00:00:00.000Z"),
        ] {
            let mut text = Vec::new();
            write_timestamp(&mut text, &mut second, Duration::from_millis(millis));
            assert_eq!(String::from_utf8(text).unwrap(), stamp);
        }
    }
}
