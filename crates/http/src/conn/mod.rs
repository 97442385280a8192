//! One connection as a state machine: driven by a worker while there is something to do, parked
//! in the event loop whenever the next step is waiting for the peer (or for a producer).
//!
//! [`Conn::run`] reads, decides and writes through an [`Io`] until it would block, then says
//! what to wait for ([`Next`]). It never blocks on the socket itself: the sockets are
//! non-blocking, and the server (or a test, or the fuzzer, with an in-memory `Io`) calls `run`
//! again when the awaited readiness comes. The phases and what moves a connection between them
//! are told in the crate's documentation.
//!
//! The phases live in submodules, each adding the methods of its phase to [`Conn`]:
//!
//! - [`heads`]: reading a head, checking what the layer owns, asking the handler; refused heads.
//! - [`bodies`]: reading a request body ([`Reading`]) and feeding it to its consumer.
//! - [`answer`]: starting an answer from a [`Response`](crate::Response), and awaiting a
//!   deferred one.
//! - [`send`]: writing an answer: from the worker's buffer, a file, a stream.
//! - [`after`]: what follows an answer: the next request, a discard, a close, lingering.

mod after;
mod answer;
mod bodies;
mod heads;
mod send;

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::handler::{Handler, Record};
use crate::head::Head;
use crate::stream::Waker;
use answer::Waiting;
pub(crate) use bodies::Reading;
use send::{Reply, Sending};

/// Most body bytes of a file sent, or of a request body read, in one turn before the connection
/// goes to the back of the line, so that a fast transfer cannot keep a worker from the others.
const TURN_BYTES: u64 = 8 << 20;

/// The socket, as the state machine sees it. Every call returns at once: `WouldBlock` when the
/// peer is not ready.
pub(crate) trait Io {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// `more`: further bytes follow at once (a head before a file).
    fn send(&mut self, buf: &[u8], more: bool) -> io::Result<usize>;
    /// `send` of several buffers, in order, as far as the peer takes them.
    fn send_vectored(&mut self, bufs: &[io::IoSlice<'_>], more: bool) -> io::Result<usize> {
        match bufs.iter().find(|buf| !buf.is_empty()) {
            Some(buf) => self.send(buf, more),
            None => Ok(0),
        }
    }
    fn sendfile(&mut self, file: &File, offset: &mut u64, count: usize) -> io::Result<usize>;
    /// `on`: hold partial segments back until full (`TCP_CORK`) while a large file is sent;
    /// off: send what is held at once.
    fn cork(&mut self, on: bool) -> io::Result<()>;
    fn shutdown_write(&mut self);
    /// True when the peer hung up (or the socket failed), found without reading.
    fn hung_up(&mut self) -> bool {
        false
    }
    /// Asked after a short write: true when the socket has no room now, so that room will be
    /// reported (an edge) and no further write is needed to learn it.
    fn full(&mut self) -> bool {
        false
    }
    /// True when the last read found nothing more waiting, so the peer's next bytes will be
    /// reported: an idle connection may then be parked without a read that would say so.
    fn drained(&self) -> bool {
        true
    }
}

/// What the connection waits for when `run` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Bytes from the peer.
    Read,
    /// Room in the socket's send buffer.
    Write,
    /// Its producer (a streamed response); only the peer leaving is watched meanwhile.
    Producer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Park until `wait` is ready; close it once `deadline` passes without progress.
    Park {
        wait: Wait,
        deadline: Option<Instant>,
    },
    Close,
}

/// Limits and timeouts of every connection.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub send_timeout: Duration,
    pub body_timeout: Duration,
    /// Most bytes of an unneeded request body read and discarded to keep the connection.
    pub discard_cap: u64,
    /// Bytes of collected bodies held by all connections together.
    pub collect_budget: Arc<Budget>,
}

/// What a `run` needs besides the connection: set up by the worker for each call.
pub(crate) struct Context<'a, H> {
    pub handler: &'a H,
    pub limits: &'a Limits,
    /// The `Server` and `Date` header lines of this run's answers.
    pub server_and_date: &'a str,
    /// The run's one reading of the monotonic clock.
    pub now: Instant,
    /// The worker's wall clock: a log line's time.
    pub wall: &'a crate::clock::Wall,
    /// The server is draining: every answer closes its connection.
    pub stopping: bool,
    /// Worker scratch space for request heads and bodies.
    pub scratch: &'a mut [u8],
    /// Worker buffer an answer is written into; a small answer sent whole never leaves it.
    pub out: &'a mut Vec<u8>,
    /// Makes the waker of this connection, for a streamed response whose producer is idle.
    pub waker: &'a dyn Fn() -> Waker,
    /// Requests under way, for draining.
    pub in_flight: &'a Arc<AtomicUsize>,
    /// The worker's spare box for a request body's state, reused from one request to the next
    /// (see [`Reading::boxed`]).
    pub spare: &'a mut Option<Box<Reading>>,
    /// Set when a request is logged ([`Handler::log`]): the worker then owes the handler an
    /// [`idle`](Handler::idle) before it waits.
    pub logged: &'a std::cell::Cell<bool>,
}

/// A connection's state between two runs.
pub(crate) struct Conn {
    /// Received bytes not consumed yet: part of a head, or what follows a request (pipelining).
    inbuf: Vec<u8>,
    /// How far `inbuf` was searched for the end of a head.
    scanned: usize,
    /// An answer was just written and nothing is buffered: the next request has most likely
    /// not arrived, so park at once rather than pay a `recv` that would say so, when the socket
    /// was drained (then its next bytes are reported).
    park_before_reading: bool,
    phase: Phase,
}

enum Phase {
    /// Between requests, nothing of the next one received.
    Idle {
        since: Instant,
    },
    /// Part of a head received (or a new connection): complete it by `deadline`.
    Head {
        deadline: Instant,
    },
    /// Reading the request body.
    Body(Box<Reading>),
    /// Waiting for a deferred answer, holding no worker.
    Waiting(Box<Waiting>),
    /// Writing the answer.
    Send(Box<Sending>),
    /// Answered and closing: discard what the peer still sends, for a while.
    Linger {
        until: Instant,
        left: u64,
    },
    Closed,
}

/// One request's facts needed until its answer is logged.
struct Exchange {
    head: Option<Head>,
    started: Instant,
    /// The peer allows keep-alive (version and `Connection`).
    keep_alive: bool,
    http11: bool,
    head_only: bool,
    /// Counts the request as under way (drain waits for it); `None` for a discard.
    _in_flight: Option<InFlight>,
}

/// Counts a request under way until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> InFlight {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one step of a phase leads to.
enum Step {
    Continue,
    /// Send the answer in the worker's buffer now.
    Reply(Reply),
    Wait(Wait, Option<Instant>),
    Close,
}

impl Conn {
    /// A new connection: its head is due within the header timeout.
    pub(crate) fn new(header_deadline: Instant) -> Conn {
        Conn {
            inbuf: Vec::new(),
            scanned: 0,
            park_before_reading: false,
            phase: Phase::Head {
                deadline: header_deadline,
            },
        }
    }

    /// Bytes held for an incomplete head (the partial-head budget counts them), else 0.
    pub(crate) fn partial_head_bytes(&self) -> usize {
        match self.phase {
            Phase::Head { .. } => self.inbuf.len(),
            _ => 0,
        }
    }

    /// Waiting for the head of its first request, or reading a head: a request may be on its
    /// way that no answer has been promised to yet.
    pub(crate) fn awaits_head(&self) -> bool {
        matches!(self.phase, Phase::Head { .. })
    }

    /// True between requests with nothing received: closing it loses nothing.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle { .. })
            || matches!(self.phase, Phase::Head { .. } if self.inbuf.is_empty())
    }

    /// Advances the connection as far as it can go without waiting.
    pub(crate) fn run<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Next {
        loop {
            let step = match &mut self.phase {
                Phase::Idle { .. } | Phase::Head { .. } => self.read_head(io, cx),
                Phase::Body(_) => self.read_body(io, cx),
                Phase::Waiting(_) => self.wait_answer(io, cx),
                Phase::Send(_) => self.send(io, cx),
                Phase::Linger { .. } => self.linger(io, cx),
                Phase::Closed => Step::Close,
            };
            let step = match step {
                Step::Reply(reply) => self.reply(reply, io, cx),
                step => step,
            };
            match step {
                Step::Continue | Step::Reply(_) => {}
                Step::Wait(wait, deadline) => {
                    self.release_buffers();
                    return Next::Park { wait, deadline };
                }
                Step::Close => {
                    self.phase = Phase::Closed;
                    return Next::Close;
                }
            }
        }
    }

    /// An idle connection keeps no buffer; a partial head keeps only its bytes.
    fn release_buffers(&mut self) {
        if self.inbuf.is_empty() {
            self.inbuf = Vec::new();
        } else if self.inbuf.capacity() > 2 * self.inbuf.len() {
            self.inbuf.shrink_to_fit();
        }
    }
}

fn log<H: Handler>(cx: &Context<'_, H>, exchange: &Exchange, status: u16, bytes: u64) {
    let (method, target) = exchange
        .head
        .as_ref()
        .map_or(("-", "-"), |h| (h.method(), h.target()));
    cx.logged.set(true);
    // The request's one reading of the clock besides its run's: the end, for both the
    // duration and the line's time.
    let end = Instant::now();
    cx.handler.log(&Record {
        method,
        target,
        status,
        bytes,
        duration: end.saturating_duration_since(exchange.started),
        at: cx.wall.at(end),
    });
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::sync::Arc;

    use crate::fuzzing::{connection_splits, exchange, exchange_io, TestHandler};

    fn run(input: &str) -> (String, bool) {
        let (out, closed) = exchange(&TestHandler { file: None }, &[input.as_bytes()]);
        (String::from_utf8_lossy(&out).into_owned(), closed)
    }

    /// The status codes and bodies of every answer in `out`, in order.
    fn answers(out: &str) -> Vec<(u16, String)> {
        let mut found = Vec::new();
        let mut rest = out;
        while let Some(start) = rest.find("HTTP/1.1 ") {
            let status = rest[start + 9..start + 12].parse().unwrap();
            let head_end = rest[start..].find("\r\n\r\n").unwrap() + start + 4;
            let head = &rest[start..head_end];
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |n| n.trim().parse().unwrap());
            found.push((status, rest[head_end..head_end + len].to_string()));
            rest = &rest[head_end + len..];
        }
        found
    }

    #[test]
    fn pipelined_requests_are_answered_in_order() {
        let (out, closed) = run(
            "GET /a HTTP/1.1\r\nHost: h\r\n\r\nPOST /collect HTTP/1.1\r\nHost: h\r\n\
             Content-Length: 3\r\n\r\nxyzGET /b?q HTTP/1.1\r\nHost: h\r\n\r\n",
        );
        assert_eq!(
            answers(&out),
            vec![
                (200, "GET /a".into()),
                (200, "xyz".into()),
                (200, "GET /b?q".into())
            ]
        );
        assert!(closed, "the peer's end of stream closes it");
    }

    #[test]
    fn an_unread_body_is_discarded_and_the_next_request_served() {
        let (out, _) = run(
            "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /y HTTP/1.1\r\n\
             Host: h\r\n\r\n",
        );
        assert_eq!(
            answers(&out),
            vec![(200, "POST /x".into()), (200, "GET /y".into())]
        );
        // Over the discard cap (1 KiB here): answered, then closed.
        let (out, closed) = run("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n\r\n");
        assert_eq!(answers(&out), vec![(200, "POST /x".into())]);
        assert!(out.contains("Connection: close"));
        assert!(closed);
    }

    #[test]
    fn host_and_version_rules() {
        for (request, status) in [
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET / HTTP/1.0\r\n\r\n", 200),
            ("GET http://h:1/abs?x HTTP/1.1\r\nHost: h:1\r\n\r\n", 200),
        ] {
            let (out, _) = run(request);
            assert_eq!(answers(&out)[0].0, status, "{request:?} -> {out}");
        }
        let (out, closed) = run("GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(
            answers(&out).len(),
            1,
            "nothing after a refused head: {out}"
        );
        assert!(closed && out.contains("Connection: close"));
        let (out, _) = run("GET http://h:1/abs?x HTTP/1.1\r\nHost: h:1\r\n\r\n");
        assert!(out.ends_with("GET http://h:1/abs?x"), "{out}");
    }

    #[test]
    fn bodies_reach_sinks_and_collectors_with_their_limits() {
        let chunked = "POST /sink HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
                       3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n";
        assert_eq!(answers(&run(chunked).0), vec![(200, "7".into())]);
        // The sink refuses part-way: answered at once, the rest discarded, the next served.
        let refused =
            "POST /sink HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\nab!defGET /n HTTP/1.1\r\n\
                       Host: h\r\n\r\n";
        assert_eq!(
            answers(&run(refused).0),
            vec![(422, "no !".into()), (200, "GET /n".into())]
        );
        let (out, closed) = run("POST /collect HTTP/1.1\r\nHost: h\r\nContent-Length: 65\r\n\r\n");
        assert_eq!(
            answers(&out)[0],
            (
                413,
                "request body too large: at most 65 bytes".replace("65", "64")
            )
        );
        assert!(closed);
        let bad = "POST /collect HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert_eq!(
            answers(&run(bad).0),
            vec![(
                400,
                "error reading the request body: invalid chunk size".into()
            )]
        );
    }

    #[test]
    fn a_deferred_answer_is_written_in_its_turn() {
        let (out, _) = run(
            "GET /deferred?x HTTP/1.1\r\nHost: h\r\n\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n",
        );
        assert_eq!(
            answers(&out),
            vec![
                (201, "later /deferred?x".into()),
                (200, "GET /after".into())
            ]
        );
        assert!(
            out.starts_with("HTTP/1.1 201 ") && out.contains("\r\nX-Added: early\r\n"),
            "headers set on the deferred response are the answer's: {out}"
        );
    }

    #[test]
    fn continue_is_sent_only_when_the_body_is_wanted() {
        let (out, _) = run(
            "POST /collect HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
        );
        assert!(
            out.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"),
            "{out}"
        );
        let (out, closed) =
            run("POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 200") && out.contains("Connection: close"),
            "{out}"
        );
        assert!(closed);
    }

    #[test]
    fn head_answers_keep_the_length_and_drop_the_body() {
        let (out, _) = run("HEAD /abc HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(
            out.contains("Content-Length: 9\r\n") && out.ends_with("\r\n\r\n"),
            "{out}"
        );
    }

    #[test]
    fn files_are_sent_whole() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b'z'; 100_000]).unwrap();
        let handler = TestHandler {
            file: Some(Arc::new(file)),
        };
        let (out, _) = exchange(&handler, &[b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n"]);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Content-Length: 100000\r\n"));
        assert!(text.ends_with(&"z".repeat(100_000)));
    }

    #[test]
    fn a_large_file_is_sent_corked_and_uncorked_after_its_last_byte() {
        let len = usize::try_from(super::send::CORK_FROM).unwrap() + 1;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b'z'; len]).unwrap();
        let handler = TestHandler {
            file: Some(Arc::new(file)),
        };
        let requests =
            b"GET /file HTTP/1.1\r\nHost: h\r\n\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n";
        let (io, _) = exchange_io(&handler, &[requests]);
        let text = String::from_utf8_lossy(&io.output);
        let body_end = text.find(&"z".repeat(len)).unwrap() + len;
        let head_end = text.find("\r\n\r\n").unwrap() + 4;
        // Set after the head was queued (sent with `MSG_MORE`), before the file's first byte;
        // cleared once its last byte is out, before the next answer.
        assert_eq!(io.corks, [(head_end, true), (body_end, false)]);
        assert!(
            text[body_end..].starts_with("HTTP/1.1 200 OK\r\n"),
            "{text}"
        );
        assert!(text.ends_with("GET /after"), "{text}");
    }

    #[test]
    fn a_small_file_is_not_corked() {
        let len = usize::try_from(super::send::CORK_FROM).unwrap() - 1;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b'z'; len]).unwrap();
        let handler = TestHandler {
            file: Some(Arc::new(file)),
        };
        let (io, _) = exchange_io(&handler, &[b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n"]);
        assert!(io.output.ends_with(&vec![b'z'; len]));
        assert_eq!(io.corks, []);
    }

    #[test]
    fn answers_do_not_depend_on_how_the_input_is_split() {
        let inputs: [&[u8]; 6] = [
            b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nPOST /collect HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nabGET /b HTTP/1.1\r\nHost: h\r\n\r\n",
            b"POST /sink HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: y\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"\x16\x03\x01\x02\x00garbage",
            b"GET / HTTP/1.1\r\nHost: h\r\nX: \x01\r\n\r\n",
            b"POST /sink HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\na!cdGET /z HTTP/1.1\r\nHost: h\r\n\r\n",
            // Found by the fuzzer: malformed after its first byte, then the peer stops.
            b"A\x0f\n",
        ];
        for input in inputs {
            for seed in 0..31u8 {
                let mut data = vec![seed];
                data.extend_from_slice(input);
                connection_splits(&data);
            }
        }
    }

    #[test]
    fn a_trickled_head_is_scanned_from_where_the_search_stopped() {
        // Byte by byte: the answer is the same as for the head in one piece.
        let request = b"GET /slow HTTP/1.1\r\nHost: h\r\nX-Long: aaaaaaaaaaaaaaaa\r\n\r\n";
        let pieces: Vec<&[u8]> = request.chunks(1).collect();
        let (out, _) = exchange(&TestHandler { file: None }, &pieces);
        assert!(String::from_utf8_lossy(&out).ends_with("GET /slow"));
    }
}
