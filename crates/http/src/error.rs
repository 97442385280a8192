//! The layer's own errors: what it refuses before or while reading a request.
//!
//! Each knows its status; the application words the answer ([`crate::Handler::refused`]).

use std::fmt;
use std::time::Duration;

use crate::chunked::ChunkError;
use crate::framing::FramingError;
use crate::head::HeadError;

/// Slowest average body rate accepted over each window of the body timeout (the default of
/// Apache's mod_reqtimeout). A per-read timeout alone would let a client that sends a byte just
/// before each timeout hold a connection forever.
pub const MIN_BODY_RATE: u64 = 500;

/// A request the layer refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The head is not HTTP/1.x (400) or is over the limits (431).
    Head(HeadError),
    /// An HTTP/1.1 request without exactly one valid `Host` (RFC 9112 §3.2).
    Host(&'static str),
    /// `Content-Length` / `Transfer-Encoding` that cannot frame a body.
    Framing(FramingError),
    /// The body could not be read.
    Body(BodyError),
    /// A body collected in full is over the handler's limit.
    BodyTooLarge {
        /// The handler's limit in bytes.
        limit: usize,
    },
    /// Collecting the body would take the server's bodies past their shared byte budget.
    BodyBudget {
        /// The budget in bytes.
        budget: usize,
    },
}

/// Why reading a body failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// No byte for this long.
    Stalled(Duration),
    /// Less than [`MIN_BODY_RATE`] bytes per second over a window.
    TooSlow,
    /// The peer closed before the end of the body.
    Truncated,
    /// Bad chunked framing.
    Chunk(ChunkError),
}

impl Error {
    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            Error::Head(HeadError::TooLarge) => 431,
            Error::Framing(FramingError::UnsupportedTransferEncoding) => 501,
            Error::BodyTooLarge { .. } => 413,
            Error::BodyBudget { .. } => 503,
            _ => 400,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Head(HeadError::TooLarge) => {
                f.write_str("request head too large: at most 64 KiB and 100 header fields")
            }
            Error::Head(HeadError::Malformed(reason)) => write!(f, "malformed request: {reason}"),
            Error::Host(reason) => write!(f, "invalid Host header: {reason}"),
            Error::Framing(error) => error.fmt(f),
            Error::Body(error) => write!(f, "error reading the request body: {error}"),
            Error::BodyTooLarge { limit } if limit % (1 << 20) == 0 => {
                write!(f, "request body too large: at most {} MiB", limit >> 20)
            }
            Error::BodyTooLarge { limit } => {
                write!(f, "request body too large: at most {limit} bytes")
            }
            Error::BodyBudget { budget } => write!(
                f,
                "too many request bodies held at once (at most {} MiB in all): try again later",
                budget >> 20
            ),
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Stalled(timeout) => write!(f, "no request body bytes for {timeout:?}"),
            BodyError::TooSlow => write!(f, "request body slower than {MIN_BODY_RATE} bytes/s"),
            BodyError::Truncated => {
                f.write_str("connection closed before the end of the request body")
            }
            BodyError::Chunk(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_messages() {
        let cases = [
            (
                Error::Head(HeadError::TooLarge),
                431,
                "request head too large: at most 64 KiB and 100 header fields",
            ),
            (
                Error::Head(HeadError::Malformed("invalid header name")),
                400,
                "malformed request: invalid header name",
            ),
            (Error::Host("missing"), 400, "invalid Host header: missing"),
            (
                Error::Framing(FramingError::UnsupportedTransferEncoding),
                501,
                "unsupported Transfer-Encoding: only chunked is accepted",
            ),
            (
                Error::Body(BodyError::Stalled(Duration::from_secs(1))),
                400,
                "error reading the request body: no request body bytes for 1s",
            ),
            (
                Error::Body(BodyError::Chunk(ChunkError::InvalidSize)),
                400,
                "error reading the request body: invalid chunk size",
            ),
            (
                Error::BodyTooLarge { limit: 1 << 20 },
                413,
                "request body too large: at most 1 MiB",
            ),
            (
                Error::BodyTooLarge { limit: 1000 },
                413,
                "request body too large: at most 1000 bytes",
            ),
            (
                Error::BodyBudget { budget: 64 << 20 },
                503,
                "too many request bodies held at once (at most 64 MiB in all): try again later",
            ),
        ];
        for (error, status, message) in cases {
            assert_eq!(error.status(), status, "{error:?}");
            assert_eq!(error.to_string(), message);
        }
    }
}
