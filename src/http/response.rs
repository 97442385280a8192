//! Responses: what a handler returns, and writing it to the socket.
//!
//! Every response is framed by `Content-Length` (or has no body) and carries `Date` and
//! `Server`. File bodies leave by `sendfile(2)`, the head sent with `MSG_MORE` so that it and the
//! first bytes share a segment.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::stream::Stream;
use crate::sys::net;

pub const SERVER: &str = concat!("sandboxd/", env!("CARGO_PKG_VERSION"));

/// Largest body copied into the head's buffer so both leave in one write.
const COALESCE_BYTES: usize = 16 * 1024;

pub enum ResponseBody {
    Empty,
    Bytes(Vec<u8>),
    /// `len` bytes of `file` from `offset`, sent with `sendfile`.
    File {
        file: File,
        offset: u64,
        len: u64,
    },
}

impl ResponseBody {
    fn len(&self) -> u64 {
        match self {
            ResponseBody::Empty => 0,
            ResponseBody::Bytes(bytes) => bytes.len() as u64,
            ResponseBody::File { len, .. } => *len,
        }
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: ResponseBody,
    /// Close the connection after this response.
    pub close: bool,
}

impl Response {
    pub fn new(status: u16, body: ResponseBody) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body,
            close: false,
        }
    }

    pub fn empty(status: u16) -> Response {
        Response::new(status, ResponseBody::Empty)
    }

    /// A JSON body with `Content-Type: application/json`.
    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response::new(status, ResponseBody::Bytes(body))
            .with_header("Content-Type", "application/json")
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn closing(mut self) -> Response {
        self.close = true;
        self
    }
}

/// How the response is to be written.
pub struct WriteOptions<'a> {
    pub date: &'a str,
    pub head_only: bool,
    pub keep_alive: bool,
    /// HTTP/1.0 keep-alive must be confirmed with `Connection: keep-alive`.
    pub announce_keep_alive: bool,
}

/// Writes `response`; returns the body bytes sent. An error means the connection is unusable.
pub fn write(
    stream: &mut Stream,
    response: Response,
    options: &WriteOptions,
    head: &mut Vec<u8>,
) -> io::Result<u64> {
    head.clear();
    write_head(head, &response, options);
    let send_body = !options.head_only && has_body(response.status);
    match response.body {
        ResponseBody::Bytes(bytes) if send_body && bytes.len() <= COALESCE_BYTES => {
            head.extend_from_slice(&bytes);
            stream.write_all(head)?;
            Ok(bytes.len() as u64)
        }
        ResponseBody::Bytes(bytes) if send_body => {
            stream.write_all(head)?;
            stream.write_all(&bytes)?;
            Ok(bytes.len() as u64)
        }
        ResponseBody::File { file, offset, len } if send_body && len > 0 => {
            send_head_more(stream, head)?;
            send_file(stream, &file, offset, len)?;
            Ok(len)
        }
        _ => {
            stream.write_all(head)?;
            Ok(0)
        }
    }
}

/// Serialises a response with an in-memory body into `out` (for answers that must not block).
pub fn serialize(response: Response, options: &WriteOptions, out: &mut Vec<u8>) {
    write_head(out, &response, options);
    if let ResponseBody::Bytes(bytes) = &response.body {
        if !options.head_only && has_body(response.status) {
            out.extend_from_slice(bytes);
        }
    }
}

fn write_head(out: &mut Vec<u8>, response: &Response, options: &WriteOptions) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nServer: {SERVER}\r\nDate: {}\r\n",
        response.status,
        reason(response.status),
        options.date
    );
    for (name, value) in &response.headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if has_body(response.status) {
        let _ = write!(out, "Content-Length: {}\r\n", response.body.len());
    }
    if !options.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if options.announce_keep_alive {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// 1xx, 204 and 304 responses never have a body (nor a `Content-Length` here).
fn has_body(status: u16) -> bool {
    !(status < 200 || status == 204 || status == 304)
}

fn send_head_more(stream: &mut Stream, mut head: &[u8]) -> io::Result<()> {
    let fd = stream.socket.as_raw_fd();
    while !head.is_empty() {
        match net::send_more(fd, head) {
            Ok(n) => head = &head[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends exactly `len` bytes of `file` from `offset`. If the file shrank meanwhile the response
/// cannot be completed honestly: the error closes the connection.
fn send_file(stream: &mut Stream, file: &File, mut offset: u64, len: u64) -> io::Result<()> {
    const MAX_CHUNK: u64 = 1 << 30;
    let end = offset + len;
    while offset < end {
        let count = (end - offset).min(MAX_CHUNK) as usize;
        match net::sendfile(
            stream.socket.as_raw_fd(),
            file.as_raw_fd(),
            &mut offset,
            count,
        ) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while it was being sent",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
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
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}
