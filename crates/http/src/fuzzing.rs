//! Drives the connection state machine over memory instead of a socket: the unit tests and the
//! fuzz targets (feature `fuzzing` only, never in releases).
//!
//! [`exchange`] feeds a byte stream to one connection in the pieces given and returns every
//! byte the connection wrote; [`connection_splits`] checks, for any input, that what is answered
//! does not depend on how the input was split. [`head`] and [`chunked`] do the same for the two
//! parsers underneath.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::chunked::{self, ChunkedDecoder};
use crate::conn::{Conn, Context, Io, Limits, Next, Wait};
use crate::handler::{Action, BodySink, Handler, Record};
use crate::head::{Head, MAX_HEAD_BYTES};
use crate::response::{Response, ResponseBody};
use crate::stream::Waker;
use crate::Error;

/// A global allocator counting each thread's allocations (`made`: the calling thread's so
/// far), for tests that prove a path allocates nothing.
pub use crate::sys::counting::{made as allocations_made, Counting};

/// A socket made of memory: `recv` hands out the input queued so far and then `WouldBlock`
/// (or end of stream once `eof`); everything sent is kept.
#[derive(Default)]
pub(crate) struct MemoryIo {
    input: Vec<u8>,
    read: usize,
    pub(crate) eof: bool,
    pub(crate) output: Vec<u8>,
    pub(crate) write_shut: bool,
    /// Each `cork` call: the bytes sent before it, and whether it set the cork.
    pub(crate) corks: Vec<(usize, bool)>,
}

impl Io for MemoryIo {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = &self.input[self.read..];
        if available.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.read += n;
        Ok(n)
    }

    fn send(&mut self, buf: &[u8], _more: bool) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn sendfile(&mut self, file: &File, offset: &mut u64, count: usize) -> io::Result<usize> {
        let mut buf = vec![0; count];
        let n = file.read_at(&mut buf, *offset)?;
        self.output.extend_from_slice(&buf[..n]);
        *offset += n as u64;
        Ok(n)
    }

    fn cork(&mut self, on: bool) -> io::Result<()> {
        self.corks.push((self.output.len(), on));
        Ok(())
    }

    fn shutdown_write(&mut self) {
        self.write_shut = true;
    }
}

/// A small application: `/collect` collects up to 64 bytes and echoes them, `/sink` consumes
/// a body and answers its length (refusing the byte `!`), `/file` answers a file's bytes,
/// `/deferred` answers 201 through a deferred answer, anything else answers its method and
/// target.
pub(crate) struct TestHandler {
    pub(crate) file: Option<Arc<File>>,
}

impl Handler for TestHandler {
    fn begin(&self, head: &Head) -> Action {
        match head.path() {
            "/collect" => Action::Collect {
                limit: 64,
                then: Box::new(|_, body| {
                    Response::new(200, ResponseBody::Bytes(body)).with_header("X-Kind", "collect")
                }),
            },
            "/sink" => Action::Consume(Box::new(CountingSink(0))),
            "/deferred" => {
                // Answered by another thread before the connection looks.
                let (answer, deferred) = crate::deferred::channel();
                let text = format!("later {}", head.target());
                std::thread::spawn(move || {
                    answer.send(Response::new(201, ResponseBody::Bytes(text.into_bytes())));
                })
                .join()
                .ok();
                Action::Respond(Response::deferred(deferred).with_header("X-Added", "early"))
            }
            "/file" => match self.file.as_ref().and_then(|f| f.try_clone().ok()) {
                Some(file) => {
                    let len = file.metadata().map_or(0, |m| m.len());
                    Action::Respond(Response::new(
                        200,
                        ResponseBody::File {
                            file,
                            offset: 0,
                            len,
                        },
                    ))
                }
                None => Action::Respond(Response::empty(404)),
            },
            _ => {
                let text = format!("{} {}", head.method(), head.target());
                Action::Respond(Response::new(200, ResponseBody::Bytes(text.into_bytes())))
            }
        }
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::new(
            error.status(),
            ResponseBody::Bytes(error.to_string().into_bytes()),
        )
    }

    fn log(&self, _record: &Record<'_>) {}

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

struct CountingSink(usize);

impl BodySink for CountingSink {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        if bytes.contains(&b'!') {
            return Err(Response::new(422, ResponseBody::Bytes(b"no !".to_vec())));
        }
        self.0 += bytes.len();
        Ok(())
    }

    fn end(self: Box<Self>) -> Response {
        Response::new(200, ResponseBody::Bytes(self.0.to_string().into_bytes()))
    }
}

/// Runs one connection over `pieces` (each delivered when the previous one is used up, then
/// the end of the stream) and returns what it wrote, and whether it closed.
pub(crate) fn exchange(handler: &TestHandler, pieces: &[&[u8]]) -> (Vec<u8>, bool) {
    let (io, closed) = exchange_io(handler, pieces);
    (io.output, closed)
}

/// [`exchange`], returning the whole memory socket.
pub(crate) fn exchange_io(handler: &TestHandler, pieces: &[&[u8]]) -> (MemoryIo, bool) {
    let limits = Limits {
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        send_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        discard_cap: 1024,
        collect_budget: crate::budget::Budget::new(1 << 20),
    };
    let now = Instant::now();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let waker = || -> Waker { Box::new(|| {}) };
    let wall = crate::clock::Wall::new();
    let mut scratch = vec![0u8; 4096];
    let mut conn = Conn::new(now + limits.header_timeout);
    let mut io = MemoryIo::default();
    let run = |conn: &mut Conn, io: &mut MemoryIo, scratch: &mut [u8]| {
        let mut cx = Context {
            handler,
            limits: &limits,
            server_and_date: "Server: test\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n",
            now,
            wall: &wall,
            stopping: false,
            scratch,
            out: &mut Vec::new(),
            waker: &waker,
            in_flight: &in_flight,
            spare: &mut None,
            logged: &std::cell::Cell::new(false),
        };
        conn.run(io, &mut cx)
    };
    // Runs until the connection closes or parks without having moved (as epoll would call it
    // again at once when bytes are waiting).
    let settle = |conn: &mut Conn, io: &mut MemoryIo, scratch: &mut [u8]| loop {
        let before = (io.read, io.output.len());
        match run(conn, io, scratch) {
            Next::Close => return None,
            next if before == (io.read, io.output.len()) => return Some(next),
            _ => {}
        }
    };
    for piece in pieces {
        io.input.extend_from_slice(piece);
        if settle(&mut conn, &mut io, &mut scratch).is_none() {
            return (io, true);
        }
    }
    io.eof = true;
    let closed = match settle(&mut conn, &mut io, &mut scratch) {
        None => true,
        Some(Next::Park { wait, .. }) => wait != Wait::Read,
        Some(Next::Close) => true,
    };
    (io, closed)
}

/// Any input, whole or split at points taken from its first bytes: the connection writes the
/// same bytes either way.
pub fn connection_splits(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let handler = TestHandler { file: None };
    let (whole, _) = exchange(&handler, &[input]);
    let step = usize::from(seed % 31) + 1;
    let pieces: Vec<&[u8]> = input.chunks(step).collect();
    let (split, _) = exchange(&handler, &pieces);
    assert_eq!(
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(&split),
        "split every {step} bytes"
    );
}

/// Request heads: a parsed head never claims more bytes than given or than the limit.
pub fn head(data: &[u8]) {
    if let Ok(Some((head, len))) = Head::parse(data) {
        assert!(len <= data.len() && len <= MAX_HEAD_BYTES);
        let _ = (
            head.method(),
            head.path(),
            head.raw_query(),
            head.header("host"),
        );
        let _ = head.header_has_token("connection", "close");
    }
}

/// Chunked bodies fed in pieces whose sizes come from the first byte: the data decoded must
/// not depend on how the input was split.
pub fn chunked(data: &[u8]) {
    let Some((&piece, body)) = data.split_first() else {
        return;
    };
    let whole = decode_chunked(body, body.len().max(1));
    let split = decode_chunked(body, usize::from(piece % 16) + 1);
    assert_eq!(whole, split);
}

fn decode_chunked(input: &[u8], piece: usize) -> Result<Vec<u8>, ()> {
    let mut decoder = ChunkedDecoder::default();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut end = piece.min(input.len());
    loop {
        let (used, next) = decoder.advance(&input[pos..end]).map_err(|_| ())?;
        pos += used;
        match next {
            chunked::Next::Done => return Ok(out),
            chunked::Next::Data(n) => {
                let take = usize::try_from(n).unwrap_or(usize::MAX).min(end - pos);
                out.extend_from_slice(&input[pos..pos + take]);
                decoder.consumed_data(take as u64);
                pos += take;
                if take == 0 && end == input.len() {
                    return Err(());
                }
            }
            chunked::Next::NeedMore if end == input.len() => return Err(()),
            chunked::Next::NeedMore => {}
        }
        if pos == end {
            end = (end + piece).min(input.len());
        }
    }
}
