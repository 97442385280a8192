//! Serving one connection: heads, handler, body discard, response, keep-alive and pipelining.
//!
//! A worker runs [`serve`] while the connection has requests ready; when it has none, the
//! connection goes back to the event loop ([`Outcome::Park`]) and the worker is free again.

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

/// A connection between requests: its socket and any bytes already received (pipelining).
pub struct Conn {
    pub socket: TcpStream,
    pub pending: Vec<u8>,
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
    /// The peer closed or went silent before a complete head.
    Gone,
    Refused(ApiError),
}

pub fn serve<H: Handler>(conn: Conn, shared: &Shared<H>, scratch: &mut Scratch) -> Outcome {
    let mut stream = Stream::new(
        conn.socket,
        std::mem::take(&mut scratch.read_buffer),
        &conn.pending,
    );
    let keep = serve_requests(&mut stream, shared, scratch);
    let (socket, pending, buffer) = stream.into_parts();
    scratch.read_buffer = buffer;
    if keep {
        Outcome::Park(Conn { socket, pending })
    } else {
        Outcome::Close
    }
}

/// Serves requests until the connection must close (false) or has nothing more to say right
/// now (true: park it).
fn serve_requests<H: Handler>(
    stream: &mut Stream,
    shared: &Shared<H>,
    scratch: &mut Scratch,
) -> bool {
    loop {
        let started = Instant::now();
        let head = match read_head(stream, shared.config.header_timeout) {
            ReadHead::Ready(head) => head,
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
                Ok(None) => return true,
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

/// Reads until a complete head is buffered, within `timeout` from now.
fn read_head(stream: &mut Stream, timeout: Duration) -> ReadHead {
    let deadline = Instant::now() + timeout;
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
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || stream.set_read_timeout(remaining).is_err() {
            return ReadHead::Gone;
        }
        match stream.fill() {
            Ok(0) | Err(_) => return ReadHead::Gone,
            Ok(_) => {}
        }
    }
}

fn framing_error(error: FramingError) -> ApiError {
    match error {
        FramingError::UnsupportedTransferEncoding => ApiError::new(501, error.to_string()),
        _ => ApiError::bad_request(error.to_string()),
    }
}
