//! Serving one connection: heads, handler, body discard, response, keep-alive and pipelining.
//!
//! A worker runs [`serve`] while the connection has requests ready; when it has none, the
//! connection goes back to the event loop ([`Outcome::Park`]) and the worker is free again.
//! That includes a head that is only partly there: a worker never waits for the rest of a head
//! (a slowloris client trickling one would otherwise hold it until the header timeout), so the
//! connection is parked with the bytes it sent and its header deadline, and comes back when more
//! arrive.

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::body::{Body, Framing, FramingError};
use super::date::DateCache;
use super::head::{Head, HeadError};
use super::response::{self, WriteOptions};
use super::server::Shared;
use super::stream::Stream;
use super::{Handler, Request};
use crate::error::ApiError;
use crate::log;

/// Most bytes of an unread request body discarded to keep a connection alive; past it, closed.
const DISCARD_CAP: u64 = 256 * 1024;

/// A connection between requests: its socket, any bytes already received (pipelining, or the
/// start of a head), and the deadline of the head being received, if one is.
pub struct Conn {
    pub socket: TcpStream,
    pub pending: Vec<u8>,
    /// When the head must be complete: set at accept and when a head starts arriving on a
    /// kept-alive connection; `None` between requests (the idle timeout applies then).
    pub head_deadline: Option<Instant>,
}

pub enum Outcome {
    /// No request ready: watch it again until the idle timeout.
    Park(Conn),
    Close,
}

/// Per-worker scratch space reused across connections.
#[derive(Default)]
pub struct Scratch {
    read_buffer: Vec<u8>,
    head_buffer: Vec<u8>,
    date: DateCache,
}

enum ReadHead {
    Ready(Head),
    /// Part of a head, nothing more to read yet: park the connection.
    Partial,
    /// The peer closed, or the header deadline passed, before a complete head.
    Gone,
    Refused(ApiError),
}

pub fn serve<H: Handler>(conn: Conn, shared: &Shared<H>, scratch: &mut Scratch) -> Outcome {
    let mut stream = Stream::new(
        conn.socket,
        std::mem::take(&mut scratch.read_buffer),
        &conn.pending,
    );
    let mut head_deadline = conn.head_deadline;
    let keep = serve_requests(&mut stream, shared, scratch, &mut head_deadline);
    let (socket, pending, buffer) = stream.into_parts();
    scratch.read_buffer = buffer;
    if keep {
        Outcome::Park(Conn {
            socket,
            pending,
            head_deadline,
        })
    } else {
        Outcome::Close
    }
}

/// Serves requests until the connection must close (false) or has nothing more to say right
/// now (true: park it, with `head_deadline` set when a head is under way).
fn serve_requests<H: Handler>(
    stream: &mut Stream,
    shared: &Shared<H>,
    scratch: &mut Scratch,
    head_deadline: &mut Option<Instant>,
) -> bool {
    loop {
        let started = Instant::now();
        let deadline = *head_deadline.get_or_insert(started + shared.config.header_timeout);
        let head = match read_head(stream, deadline) {
            ReadHead::Ready(head) => {
                *head_deadline = None;
                head
            }
            ReadHead::Partial => return true,
            ReadHead::Gone => return false,
            ReadHead::Refused(error) => {
                let options = write_options(scratch, false, false, false);
                let _ = response::write(stream, error.into(), &options.0, options.1);
                return false;
            }
        };
        let wants_keep_alive = if head.minor_version >= 1 {
            !head.header_has_token("connection", "close")
        } else {
            head.header_has_token("connection", "keep-alive")
        };
        let framing = Framing::from_headers(
            head.headers_named("content-length"),
            head.headers_named("transfer-encoding"),
        );
        let (response, body_reusable, head) = match framing {
            Ok(framing) => {
                let expects_continue = head.minor_version >= 1
                    && head
                        .header("expect")
                        .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"100-continue"));
                let body = Body::new(
                    stream,
                    framing,
                    expects_continue,
                    shared.config.body_timeout,
                );
                let mut request = Request { head, body };
                let response = shared.handler.handle(&mut request);
                let reusable = request.body.finish(DISCARD_CAP);
                (response, reusable, request.head)
            }
            Err(error) => (framing_error(error).into(), false, head),
        };
        let keep_alive = wants_keep_alive
            && body_reusable
            && !response.close
            && !shared.stopping.load(Ordering::Relaxed);
        let status = response.status;
        let head_only = head.method() == "HEAD";
        let announce = keep_alive && head.minor_version == 0;
        let (options, head_buffer) = write_options(scratch, head_only, keep_alive, announce);
        let sent = response::write(stream, response, &options, head_buffer);
        log::request(
            head.method(),
            head.target(),
            status,
            *sent.as_ref().unwrap_or(&0),
            started.elapsed(),
        );
        if sent.is_err() || !keep_alive {
            return false;
        }
        if stream.buffered().is_empty() {
            match stream.fill_nonblocking() {
                Ok(Some(n)) if n > 0 => {}
                Ok(None) => {
                    *head_deadline = None;
                    return true;
                }
                _ => return false,
            }
        }
    }
}

fn write_options(
    scratch: &mut Scratch,
    head_only: bool,
    keep_alive: bool,
    announce_keep_alive: bool,
) -> (WriteOptions<'_>, &mut Vec<u8>) {
    let options = WriteOptions {
        date: scratch.date.now(),
        head_only,
        keep_alive,
        announce_keep_alive,
    };
    (options, &mut scratch.head_buffer)
}

/// Parses the head from what is buffered, reading what the peer already sent without ever
/// waiting for more: an incomplete head is `Partial`, and `Gone` once `deadline` has passed.
fn read_head(stream: &mut Stream, deadline: Instant) -> ReadHead {
    loop {
        match Head::parse(stream.buffered()) {
            Ok(Some((head, len))) => {
                stream.consume(len);
                return ReadHead::Ready(head);
            }
            Ok(None) => {}
            Err(HeadError::TooLarge) => {
                return ReadHead::Refused(ApiError::new(
                    431,
                    "request head too large: at most 64 KiB and 100 header fields",
                ))
            }
            Err(HeadError::Malformed(reason)) => {
                return ReadHead::Refused(ApiError::bad_request(format!(
                    "malformed request: {reason}"
                )))
            }
        }
        if Instant::now() >= deadline {
            return ReadHead::Gone;
        }
        match stream.fill_nonblocking() {
            Ok(Some(0)) | Err(_) => return ReadHead::Gone,
            Ok(Some(_)) => {}
            Ok(None) => return ReadHead::Partial,
        }
    }
}

fn framing_error(error: FramingError) -> ApiError {
    match error {
        FramingError::UnsupportedTransferEncoding => ApiError::new(501, error.to_string()),
        _ => ApiError::bad_request(error.to_string()),
    }
}
