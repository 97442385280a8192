//! Responses: what a handler returns, and their heads as written to the socket.
//!
//! A response is a head plus a body source: bytes in memory, a range of a file (sent with
//! `sendfile(2)`), or a stream fed over time by a producer ([`crate::stream`]). Every response
//! carries `Date` and `Server`; bodies of known length are framed by `Content-Length`, streams
//! by chunked transfer coding (HTTP/1.1) or by closing the connection (HTTP/1.0).

use std::borrow::Cow;
use std::fs::File;

use crate::deferred::Deferred;
use crate::digits::push_u64;
use crate::stream::StreamSource;

/// What a response's body comes from.
pub enum ResponseBody {
    /// No body.
    Empty,
    /// These bytes.
    Bytes(Vec<u8>),
    /// `len` bytes of `file` from `offset`, sent with `sendfile`.
    File {
        /// The open file.
        file: File,
        /// Where the range starts.
        offset: u64,
        /// How many bytes (the `Content-Length`).
        len: u64,
    },
    /// Bytes pushed by a producer until it finishes; length unknown in advance.
    Stream(StreamSource),
    /// The whole response comes later through the [`crate::deferred`] channel. The status of
    /// the response carrying this is not used; headers added to it (and `close`) are added to
    /// the answer when it comes, so a layer that decorates responses needs not know.
    Deferred(Deferred),
}

impl ResponseBody {
    /// The length, when known in advance.
    fn len(&self) -> Option<u64> {
        match self {
            ResponseBody::Empty => Some(0),
            ResponseBody::Bytes(bytes) => Some(bytes.len() as u64),
            ResponseBody::File { len, .. } => Some(*len),
            ResponseBody::Stream(_) | ResponseBody::Deferred(_) => None,
        }
    }
}

/// A response: status, headers (the layer adds `Date`, `Server`, framing and `Connection`),
/// body.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names and values, written in order.
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
    /// The body source.
    pub body: ResponseBody,
    /// Close the connection after this response.
    pub close: bool,
}

impl Response {
    /// A response with no extra headers.
    pub fn new(status: u16, body: ResponseBody) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body,
            close: false,
        }
    }

    /// A response without a body.
    pub fn empty(status: u16) -> Response {
        Response::new(status, ResponseBody::Empty)
    }

    /// A response that comes later: see [`crate::deferred`].
    pub fn deferred(deferred: Deferred) -> Response {
        Response::new(0, ResponseBody::Deferred(deferred))
    }

    /// A JSON body with `Content-Type: application/json`.
    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response::new(status, ResponseBody::Bytes(body))
            .with_header("Content-Type", "application/json")
    }

    /// Adds a header.
    pub fn with_header(
        mut self,
        name: &'static str,
        value: impl Into<Cow<'static, str>>,
    ) -> Response {
        if self.headers.capacity() == 0 {
            self.headers = crate::spare::headers();
        }
        self.headers.push((name, value.into()));
        self
    }
}

/// How a response's head is to be written.
pub(crate) struct HeadOptions<'a> {
    /// The `Server` and `Date` header lines, with their CRLFs ([`crate::date::DateCache`]).
    pub server_and_date: &'a str,
    pub keep_alive: bool,
    /// HTTP/1.0 keep-alive must be confirmed with `Connection: keep-alive`.
    pub announce_keep_alive: bool,
    /// The peer speaks HTTP/1.1, so a stream may be chunked.
    pub chunked_allowed: bool,
}

/// How the body follows the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body may follow (1xx, 204, 304).
    None,
    Length,
    Chunked,
    /// Until the connection closes (a stream to an HTTP/1.0 client).
    Close,
}

/// Appends the head of `response` to `out`; returns how its body is framed. Bytes copied and
/// digits written by hand: no `core::fmt` on the path of every answer.
pub(crate) fn write_head(out: &mut Vec<u8>, response: &Response, options: &HeadOptions) -> Framing {
    if let Some(line) = status_line(response.status) {
        out.extend_from_slice(line.as_bytes());
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        push_u64(out, u64::from(response.status));
        out.extend_from_slice(b" Unknown\r\n");
    }
    out.extend_from_slice(options.server_and_date.as_bytes());
    for (name, value) in &response.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let framing = if !has_body(response.status) {
        Framing::None
    } else {
        match response.body.len() {
            Some(len) => {
                out.extend_from_slice(b"Content-Length: ");
                push_u64(out, len);
                out.extend_from_slice(b"\r\n");
                Framing::Length
            }
            None if options.chunked_allowed => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                Framing::Chunked
            }
            None => Framing::Close,
        }
    };
    if !options.keep_alive || framing == Framing::Close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if options.announce_keep_alive {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    framing
}

/// 1xx, 204 and 304 responses never have a body (nor a `Content-Length` here).
fn has_body(status: u16) -> bool {
    !(status < 200 || status == 204 || status == 304)
}

/// Writes `status_line`: the whole status line of each known status, `HTTP/1.1 204 No
/// Content\r\n`, a constant copied at once.
macro_rules! status_lines {
    ($($status:literal $reason:literal,)*) => {
        /// The status line of a known status code, with its CRLF.
        fn status_line(status: u16) -> Option<&'static str> {
            match status {
                $($status => Some(concat!("HTTP/1.1 ", $status, " ", $reason, "\r\n")),)*
                _ => None,
            }
        }
    };
}

status_lines! {
    100 "Continue",
    101 "Switching Protocols",
    200 "OK",
    204 "No Content",
    206 "Partial Content",
    304 "Not Modified",
    400 "Bad Request",
    401 "Unauthorized",
    403 "Forbidden",
    404 "Not Found",
    405 "Method Not Allowed",
    408 "Request Timeout",
    411 "Length Required",
    412 "Precondition Failed",
    413 "Content Too Large",
    415 "Unsupported Media Type",
    416 "Range Not Satisfiable",
    431 "Request Header Fields Too Large",
    500 "Internal Server Error",
    501 "Not Implemented",
    502 "Bad Gateway",
    503 "Service Unavailable",
    504 "Gateway Timeout",
    505 "HTTP Version Not Supported",
    507 "Insufficient Storage",
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(response: &Response, keep_alive: bool, http11: bool) -> (String, Framing) {
        let mut out = b"before|".to_vec();
        let options = HeadOptions {
            server_and_date: "Server: sandboxd\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n",
            keep_alive,
            announce_keep_alive: !http11,
            chunked_allowed: http11,
        };
        let framing = write_head(&mut out, response, &options);
        (String::from_utf8(out).unwrap(), framing)
    }

    #[test]
    fn heads_are_written_byte_for_byte() {
        let health = Response::empty(204).with_header("Cache-Control", "no-store");
        assert_eq!(
            head(&health, true, true),
            (
                "before|HTTP/1.1 204 No Content\r\nServer: sandboxd\r\n\
                 Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nCache-Control: no-store\r\n\r\n"
                    .into(),
                Framing::None
            )
        );
        let json = Response::json(404, b"{}".to_vec());
        assert_eq!(
            head(&json, false, false),
            (
                "before|HTTP/1.1 404 Not Found\r\nServer: sandboxd\r\n\
                 Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nContent-Type: application/json\r\n\
                 Content-Length: 2\r\nConnection: close\r\n\r\n"
                    .into(),
                Framing::Length
            )
        );
        let (text, framing) = head(
            &Response::new(599, ResponseBody::Bytes(vec![0; 1_234_567])),
            true,
            false,
        );
        assert!(
            text.starts_with("before|HTTP/1.1 599 Unknown\r\n"),
            "{text}"
        );
        assert!(
            text.ends_with("Content-Length: 1234567\r\nConnection: keep-alive\r\n\r\n"),
            "{text}"
        );
        assert_eq!(framing, Framing::Length);
    }
}
