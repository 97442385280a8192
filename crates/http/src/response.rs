//! Responses: what a handler returns, and their heads as written to the socket.
//!
//! A response is a head plus a body source: bytes in memory, a range of a file (sent with
//! `sendfile(2)`), or a stream fed over time by a producer ([`crate::stream`]). Every response
//! carries `Date` and `Server`; bodies of known length are framed by `Content-Length`, streams
//! by chunked transfer coding (HTTP/1.1) or by closing the connection (HTTP/1.0).

use std::borrow::Cow;
use std::fs::File;
use std::io::Write;

use crate::deferred::Deferred;
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
        self.headers.push((name, value.into()));
        self
    }
}

/// How a response's head is to be written.
pub(crate) struct HeadOptions<'a> {
    /// The `Server` header's value.
    pub server: &'a str,
    pub date: &'a str,
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

/// Appends the head of `response` to `out`; returns how its body is framed.
pub(crate) fn write_head(out: &mut Vec<u8>, response: &Response, options: &HeadOptions) -> Framing {
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nServer: {}\r\nDate: {}\r\n",
        response.status,
        reason(response.status),
        options.server,
        options.date
    );
    for (name, value) in &response.headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    let framing = if !has_body(response.status) {
        Framing::None
    } else {
        match response.body.len() {
            Some(len) => {
                let _ = write!(out, "Content-Length: {len}\r\n");
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

/// The reason phrase of a status code.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}
