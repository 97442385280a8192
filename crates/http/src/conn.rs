//! One connection as a state machine: driven by a worker while there is something to do, parked
//! in the event loop whenever the next step is waiting for the peer (or for a producer).
//!
//! [`Conn::run`] reads, decides and writes through an [`Io`] until it would block, then says
//! what to wait for ([`Next`]). It never blocks on the socket itself: the sockets are
//! non-blocking, and the server (or a test, or the fuzzer, with an in-memory `Io`) calls `run`
//! again when the awaited readiness comes. The phases and what moves a connection between them
//! are told in the crate's documentation.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::{Budget, Reservation};
use crate::deferred::{Deferred, Ready};
use crate::error::{BodyError, Error, MIN_BODY_RATE};
use crate::framing::{Framing, Piece};
use crate::handler::{Action, BodySink, Collected, Handler, Record};
use crate::head::{Head, HeadError, MAX_HEAD_BYTES};
use crate::response::{self, HeadOptions, Response, ResponseBody};
use crate::stream::{Poll, StreamSource, Waker};

/// Most bytes read from the socket at once while a head is incomplete.
const HEAD_READ: usize = 16 * 1024;
/// Most body bytes of a file sent, or of a request body read, in one turn before the connection
/// goes to the back of the line, so that a fast transfer cannot keep a worker from the others.
const TURN_BYTES: u64 = 8 << 20;
/// Largest in-memory body sent from the worker's buffer; a larger one gets a buffer of its own.
const INLINE_BODY: usize = 16 * 1024;
/// Most bytes one `sendfile` call is asked for.
const SENDFILE_CHUNK: usize = 1 << 20;
/// How long a closing connection keeps reading (and discarding) so that the peer, still
/// sending, reads the answer instead of a reset (nginx's lingering close).
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes read and discarded while lingering.
const LINGER_BYTES: u64 = 16 << 20;

/// The socket, as the state machine sees it. Every call returns at once: `WouldBlock` when the
/// peer is not ready.
pub(crate) trait Io {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// `more`: further bytes follow at once (a head before a file).
    fn send(&mut self, buf: &[u8], more: bool) -> io::Result<usize>;
    fn sendfile(&mut self, file: &File, offset: &mut u64, count: usize) -> io::Result<usize>;
    fn shutdown_write(&mut self);
    /// True when the peer hung up (or the socket failed), found without reading.
    fn hung_up(&mut self) -> bool {
        false
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
    pub server: &'a str,
    pub date: &'a str,
    pub now: Instant,
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
}

/// A connection's state between two runs.
pub(crate) struct Conn {
    /// Received bytes not consumed yet: part of a head, or what follows a request (pipelining).
    inbuf: Vec<u8>,
    /// How far `inbuf` was searched for the end of a head.
    scanned: usize,
    /// An answer was just written and nothing is buffered: the next request has most likely
    /// not arrived, so park at once rather than pay a `recv` that would say so (epoll reports
    /// a request that did arrive right away).
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

pub(crate) struct Reading {
    /// `100 Continue` is still to be sent: the client waits for it before sending the body.
    send_continue: bool,
    exchange: Exchange,
    framing: Framing,
    consumer: Consumer,
    progress: Progress,
}

impl Reading {
    /// `self` in a box, the worker's spare if it has one. Every request with a body boxes its
    /// state, and musl's allocator (mallocng) gives a size class's group back to the kernel as
    /// soon as its last slot is freed: a box made and freed per request cost an `mmap`, a page
    /// fault and a `munmap` each time (`strace` of a unary `Stat`).
    fn boxed(self, spare: &mut Option<Box<Reading>>) -> Box<Reading> {
        match spare.take() {
            Some(mut reused) => {
                *reused = self;
                reused
            }
            None => Box::new(self),
        }
    }

    /// Takes the state out of its box and keeps the box as the worker's spare.
    fn unbox(mut boxed: Box<Reading>, cx: &mut Context<'_, impl Handler>) -> Reading {
        let spent = Reading {
            send_continue: false,
            exchange: Exchange {
                head: None,
                started: cx.now,
                keep_alive: false,
                http11: false,
                head_only: false,
                _in_flight: None,
            },
            framing: Framing::Length(0),
            consumer: Consumer::Discard { left: 0 },
            progress: Progress::new(cx.now),
        };
        let reading = std::mem::replace(&mut *boxed, spent);
        *cx.spare = Some(boxed);
        reading
    }
}

/// A deferred answer awaited: see [`crate::deferred`].
struct Waiting {
    exchange: Exchange,
    after: After,
    deferred: Deferred,
    /// Headers set on the response that carried the deferred answer (CORS, say): added to it.
    headers: Vec<(&'static str, std::borrow::Cow<'static, str>)>,
    close: bool,
}

enum Consumer {
    Collect {
        limit: usize,
        bytes: Vec<u8>,
        then: Collected,
        /// The body's share of the collect budget: its whole length when known, else what
        /// arrived.
        reserved: Reservation,
        /// The `Content-Length` (reserved up front).
        known: Option<usize>,
    },
    Sink(Box<dyn BodySink>),
    /// After the answer: throw the body away, at most `left` more bytes.
    Discard {
        left: u64,
    },
}

/// Body progress: no gap longer than the body timeout, and at least [`MIN_BODY_RATE`] on
/// average over each window of that length.
struct Progress {
    last: Instant,
    window_start: Instant,
    window_bytes: u64,
}

/// A small answer's facts while its bytes are in the worker's buffer.
struct Reply {
    exchange: Exchange,
    status: u16,
    body_bytes: u64,
    after: After,
}

struct Sending {
    exchange: Exchange,
    status: u16,
    out: Vec<u8>,
    sent: usize,
    body: Outgoing,
    body_bytes: u64,
    last_progress: Instant,
    after: After,
}

enum Outgoing {
    None,
    File { file: File, offset: u64, end: u64 },
    Stream { source: StreamSource, chunked: bool },
}

/// What follows a complete answer.
enum After {
    /// The next request.
    KeepAlive,
    /// Discard the rest of the request body, then the next request.
    Discard(Framing),
    Close,
    /// Close after lingering.
    Linger,
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

    /// True between requests with nothing received: closing it loses nothing.
    /// Waiting for the head of its first request, or reading a head: a request may be on its
    /// way that no answer has been promised to yet.
    pub(crate) fn awaits_head(&self) -> bool {
        matches!(self.phase, Phase::Head { .. })
    }

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

    // ---- heads -------------------------------------------------------------------------

    fn read_head<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
        match self.scan_head() {
            Some(Ok(head)) => return self.begin(head, cx),
            Some(Err(error)) => return self.refuse(None, Error::Head(error), cx),
            None => {}
        }
        if let (true, Phase::Idle { since }) = (self.park_before_reading, &self.phase) {
            self.park_before_reading = false;
            return Step::Wait(Wait::Read, Some(*since + cx.limits.idle_timeout));
        }
        // Into the worker's scratch first: the connection keeps only the bytes that came.
        let want = HEAD_READ
            .min(MAX_HEAD_BYTES + 1 - self.inbuf.len())
            .min(cx.scratch.len());
        match io.recv(&mut cx.scratch[..want]) {
            Ok(0) => match Head::parse(&self.inbuf) {
                // The peer stopped sending in the middle of a head that was already malformed
                // (not yet parsed, as no blank line came): refused as if it had come whole.
                Err(error) if !self.inbuf.is_empty() => self.refuse(None, Error::Head(error), cx),
                _ => Step::Close,
            },
            Ok(n) => {
                if let Phase::Idle { .. } = self.phase {
                    self.phase = Phase::Head {
                        deadline: cx.now + cx.limits.header_timeout,
                    };
                }
                if !self.inbuf.is_empty() {
                    self.inbuf.extend_from_slice(&cx.scratch[..n]);
                    return Step::Continue;
                }
                // The usual case, a whole head in one read: parsed where it landed, and only
                // what follows it (a body's first bytes, a pipelined request) is kept.
                match Head::parse(&cx.scratch[..n]) {
                    Ok(Some((head, len))) => {
                        self.inbuf.extend_from_slice(&cx.scratch[len..n]);
                        self.begin(head, cx)
                    }
                    Ok(None) => {
                        self.inbuf.extend_from_slice(&cx.scratch[..n]);
                        self.scanned = n;
                        Step::Continue
                    }
                    Err(error) => self.refuse(None, Error::Head(error), cx),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let deadline = match self.phase {
                    Phase::Idle { since } => since + cx.limits.idle_timeout,
                    Phase::Head { deadline } => deadline,
                    _ => cx.now,
                };
                if cx.now < deadline {
                    Step::Wait(Wait::Read, Some(deadline))
                } else {
                    if !self.inbuf.is_empty() {
                        cx.handler.log(&Record {
                            method: "-",
                            target: "-",
                            status: 408,
                            bytes: 0,
                            duration: cx.limits.header_timeout,
                        });
                    }
                    Step::Close
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Step::Continue,
            Err(_) => Step::Close,
        }
    }

    /// Parses the head in `inbuf` when it may be complete: on the first bytes (so garbage is
    /// refused at once), then only once the blank line that ends a head has arrived, searched
    /// for from where the previous search stopped. A trickled head is so scanned once, not once
    /// per byte.
    fn scan_head(&mut self) -> Option<Result<Head, HeadError>> {
        if self.inbuf.is_empty() {
            return None;
        }
        let first = self.scanned == 0;
        let from = self.scanned.saturating_sub(3);
        let ended = find_head_end(&self.inbuf[from..]);
        self.scanned = self.inbuf.len();
        if !first && !ended && self.inbuf.len() <= MAX_HEAD_BYTES {
            return None;
        }
        match Head::parse(&self.inbuf) {
            Ok(Some((head, len))) => {
                self.inbuf.drain(..len);
                self.scanned = 0;
                Some(Ok(head))
            }
            Ok(None) => None,
            Err(error) => Some(Err(error)),
        }
    }

    /// A complete head: checks what the layer owns, then asks the handler.
    fn begin<H: Handler>(&mut self, head: Head, cx: &mut Context<'_, H>) -> Step {
        if let Err(reason) = head.check_host() {
            return self.refuse(Some(head), Error::Host(reason), cx);
        }
        let transfer_encoded = head.headers_named("transfer-encoding").next().is_some();
        if head.minor_version == 0 && transfer_encoded {
            let error = Error::Framing(crate::framing::FramingError::TransferEncodingInHttp10);
            return self.refuse(Some(head), error, cx);
        }
        let framing = match Framing::from_headers(
            head.headers_named("content-length"),
            head.headers_named("transfer-encoding"),
        ) {
            Ok(framing) => framing,
            Err(error) => return self.refuse(Some(head), Error::Framing(error), cx),
        };
        let http11 = head.minor_version >= 1;
        let keep_alive = if http11 {
            !head.header_has_token("connection", "close")
        } else {
            head.header_has_token("connection", "keep-alive")
        };
        let expects_continue = http11
            && head
                .header("expect")
                .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"100-continue"));
        let exchange = Exchange {
            head_only: head.method() == "HEAD",
            head: Some(head),
            started: cx.now,
            keep_alive,
            http11,
            _in_flight: Some(InFlight::new(cx.in_flight)),
        };
        let action = match &exchange.head {
            Some(head) => cx.handler.begin(head),
            None => return Step::Close,
        };
        let consumer = match action {
            Action::Respond(response) => {
                let after = if framing.is_done() {
                    After::KeepAlive
                } else if expects_continue
                    || framing
                        .remaining()
                        .is_some_and(|n| n > cx.limits.discard_cap)
                {
                    // A client waiting for 100 Continue may or may not send its body now: where
                    // the next request starts is unknowable.
                    After::Linger
                } else {
                    After::Discard(framing)
                };
                return self.respond(exchange, response, after, cx);
            }
            Action::Collect { limit, .. }
                if framing.remaining().is_some_and(|n| n > limit as u64) =>
            {
                let error = Error::BodyTooLarge { limit };
                let response = cx.handler.refused(exchange.head.as_ref(), &error);
                return self.respond(exchange, response, After::Linger, cx);
            }
            Action::Collect { limit, then } => {
                let mut reserved = cx.limits.collect_budget.reservation();
                let known = framing
                    .remaining()
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
                if !reserved.grow(known.unwrap_or(0)) {
                    let budget = cx.limits.collect_budget.limit();
                    let error = Error::BodyBudget { budget };
                    let response = cx.handler.refused(exchange.head.as_ref(), &error);
                    return self.respond(exchange, response, After::Linger, cx);
                }
                Consumer::Collect {
                    limit,
                    bytes: Vec::new(),
                    then,
                    reserved,
                    known,
                }
            }
            Action::Consume(sink) => Consumer::Sink(sink),
        };
        let reading = Reading {
            send_continue: expects_continue && !framing.is_done(),
            exchange,
            framing,
            consumer,
            progress: Progress::new(cx.now),
        };
        self.phase = Phase::Body(reading.boxed(cx.spare));
        Step::Continue
    }

    /// Answers a request the layer refuses, then closes.
    fn refuse<H: Handler>(
        &mut self,
        head: Option<Head>,
        error: Error,
        cx: &mut Context<'_, H>,
    ) -> Step {
        let response = cx.handler.refused(head.as_ref(), &error);
        let exchange = Exchange {
            head_only: head.as_ref().is_some_and(|h| h.method() == "HEAD"),
            http11: head.as_ref().is_none_or(|h| h.minor_version >= 1),
            head,
            started: cx.now,
            keep_alive: false,
            _in_flight: Some(InFlight::new(cx.in_flight)),
        };
        self.inbuf.clear();
        self.respond(exchange, response, After::Linger, cx)
    }

    // ---- bodies ------------------------------------------------------------------------

    fn read_body<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
        let Phase::Body(reading) = &mut self.phase else {
            return Step::Close;
        };
        if std::mem::take(&mut reading.send_continue) {
            // Nothing else is pending on the socket at a request boundary, so these 25 bytes fit
            // in its buffer; if they do not, the connection cannot go on honestly.
            let line = b"HTTP/1.1 100 Continue\r\n\r\n";
            if !matches!(io.send(line, false), Ok(n) if n == line.len()) {
                return Step::Close;
            }
        }
        // Bytes that came with the head (or after the previous request) go first.
        if !self.inbuf.is_empty() {
            let mut input = std::mem::take(&mut self.inbuf);
            let (used, fed) = reading.feed(&input);
            input.drain(..used);
            self.inbuf = input;
            if let Err(outcome) = fed {
                return self.body_outcome(outcome, cx);
            }
        }
        let mut turn = 0u64;
        loop {
            let Phase::Body(reading) = &mut self.phase else {
                return Step::Close;
            };
            if reading.framing.is_done() {
                return self.body_complete(cx);
            }
            if turn >= TURN_BYTES {
                return Step::Wait(Wait::Read, Some(cx.now));
            }
            // Never read past a body of known length: what follows is the next request's.
            let want = reading
                .framing
                .remaining()
                .map_or(cx.scratch.len(), |left| {
                    usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(cx.scratch.len())
                });
            match io.recv(&mut cx.scratch[..want]) {
                Ok(0) => return self.body_outcome(Outcome::Failed(BodyError::Truncated), cx),
                Ok(n) => {
                    turn += n as u64;
                    reading.progress.record(n as u64, cx.now);
                    let scratch = &cx.scratch[..n];
                    let (used, fed) = reading.feed(scratch);
                    self.inbuf.extend_from_slice(&scratch[used..]);
                    if let Err(outcome) = fed {
                        return self.body_outcome(outcome, cx);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return match reading.progress.check(cx.now, cx.limits.body_timeout) {
                        Ok(deadline) => Step::Wait(Wait::Read, Some(deadline)),
                        Err(error) => self.body_outcome(Outcome::Failed(error), cx),
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Close,
            }
        }
    }

    /// The whole body arrived: the handler's answer, or the next request after a discard.
    fn body_complete<H: Handler>(&mut self, cx: &mut Context<'_, H>) -> Step {
        let Phase::Body(reading) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            return Step::Close;
        };
        let Reading {
            exchange, consumer, ..
        } = Reading::unbox(reading, cx);
        let response = match consumer {
            Consumer::Collect {
                bytes,
                then,
                reserved,
                ..
            } => {
                // Handed over: the application's now, bounded by its workers.
                drop(reserved);
                match &exchange.head {
                    Some(head) => then(head, bytes),
                    None => return Step::Close,
                }
            }
            Consumer::Sink(sink) => sink.end(),
            Consumer::Discard { .. } => {
                drop(exchange);
                self.next_request(cx);
                return Step::Continue;
            }
        };
        self.respond(exchange, response, After::KeepAlive, cx)
    }

    /// A body that could not be completed, or a sink's early answer.
    fn body_outcome<H: Handler>(&mut self, outcome: Outcome, cx: &mut Context<'_, H>) -> Step {
        let Phase::Body(reading) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            return Step::Close;
        };
        let Reading {
            exchange,
            framing,
            consumer,
            ..
        } = Reading::unbox(reading, cx);
        let discarding = matches!(consumer, Consumer::Discard { .. });
        // The sink undoes its work here, before the answer.
        drop(consumer);
        if discarding {
            return Step::Close;
        }
        let (response, after) = match outcome {
            Outcome::Answer(response) => (response, After::Discard(framing)),
            Outcome::Failed(error) => (
                cx.handler
                    .refused(exchange.head.as_ref(), &Error::Body(error)),
                After::Linger,
            ),
            Outcome::TooLarge(limit) => (
                cx.handler
                    .refused(exchange.head.as_ref(), &Error::BodyTooLarge { limit }),
                After::Linger,
            ),
            Outcome::OverBudget(budget) => (
                cx.handler
                    .refused(exchange.head.as_ref(), &Error::BodyBudget { budget }),
                After::Linger,
            ),
        };
        self.respond(exchange, response, after, cx)
    }

    // ---- answers -----------------------------------------------------------------------

    /// Starts writing `response`.
    fn respond<H: Handler>(
        &mut self,
        exchange: Exchange,
        response: Response,
        after: After,
        cx: &mut Context<'_, H>,
    ) -> Step {
        if let ResponseBody::Deferred(deferred) = response.body {
            self.phase = Phase::Waiting(Box::new(Waiting {
                exchange,
                after,
                deferred,
                headers: response.headers,
                close: response.close,
            }));
            return Step::Continue;
        }
        let keep_alive = exchange.keep_alive && !response.close && !cx.stopping;
        let after = match after {
            After::KeepAlive if !keep_alive => After::Close,
            // Closing with body bytes still to come would reset a peer that is still sending
            // before it reads the answer: linger instead.
            After::Discard(framing) if !keep_alive && !framing.is_done() => After::Linger,
            After::Discard(_) if !keep_alive => After::Close,
            After::Discard(framing) if framing.is_done() => After::KeepAlive,
            After::Discard(framing) => After::Discard(framing),
            other => other,
        };
        let out = &mut *cx.out;
        out.clear();
        let options = HeadOptions {
            server: cx.server,
            date: cx.date,
            keep_alive: !matches!(after, After::Close | After::Linger),
            announce_keep_alive: !exchange.http11,
            chunked_allowed: exchange.http11,
        };
        let framing = response::write_head(out, &response, &options);
        let send_body = !exchange.head_only && framing != response::Framing::None;
        let after = if framing == response::Framing::Close {
            After::Close
        } else {
            after
        };
        // In-memory bodies leave with the head; they count as sent once queued.
        let counted_bytes = match &response.body {
            ResponseBody::Bytes(bytes) if send_body => bytes.len() as u64,
            _ => 0,
        };
        let body = match response.body {
            ResponseBody::Bytes(bytes) if send_body && bytes.len() > INLINE_BODY => {
                let mut whole = Vec::with_capacity(out.len() + bytes.len());
                whole.extend_from_slice(out);
                whole.extend_from_slice(&bytes);
                out.clear();
                self.phase = Phase::Send(Box::new(Sending {
                    exchange,
                    status: response.status,
                    body_bytes: counted_bytes,
                    out: whole,
                    sent: 0,
                    body: Outgoing::None,
                    last_progress: cx.now,
                    after,
                }));
                return Step::Continue;
            }
            ResponseBody::Bytes(bytes) if send_body => {
                out.extend_from_slice(&bytes);
                Outgoing::None
            }
            ResponseBody::File { file, offset, len } if send_body && len > 0 => Outgoing::File {
                file,
                offset,
                end: offset.saturating_add(len),
            },
            ResponseBody::Stream(source) if send_body => Outgoing::Stream {
                source,
                chunked: framing == response::Framing::Chunked,
            },
            _ => Outgoing::None,
        };
        if let Outgoing::None = body {
            self.phase = Phase::Closed;
            return Step::Reply(Reply {
                exchange,
                status: response.status,
                body_bytes: counted_bytes,
                after,
            });
        }
        let head = out.to_vec();
        out.clear();
        self.phase = Phase::Send(Box::new(Sending {
            exchange,
            status: response.status,
            body_bytes: counted_bytes,
            out: head,
            sent: 0,
            body,
            last_progress: cx.now,
            after,
        }));
        Step::Continue
    }

    /// A deferred answer: written once it came; meanwhile parked, only the peer leaving
    /// watched (then closed: dropping the [`Deferred`] tells the work its client is gone).
    fn wait_answer<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
        let Phase::Waiting(waiting) = &mut self.phase else {
            return Step::Close;
        };
        match waiting.deferred.poll(cx.waker) {
            Ready::Answer(mut response) => {
                let Phase::Waiting(waiting) = std::mem::replace(&mut self.phase, Phase::Closed)
                else {
                    return Step::Close;
                };
                let Waiting {
                    exchange,
                    after,
                    headers,
                    close,
                    ..
                } = *waiting;
                response.headers.extend(headers);
                response.close |= close;
                self.respond(exchange, response, after, cx)
            }
            Ready::Pending if io.hung_up() => {
                log(cx, &waiting.exchange, 499, 0);
                Step::Close
            }
            Ready::Pending => Step::Wait(Wait::Producer, None),
            Ready::Abandoned => {
                log(cx, &waiting.exchange, 500, 0);
                Step::Close
            }
        }
    }

    fn send<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
        let Phase::Send(sending) = &mut self.phase else {
            return Step::Close;
        };
        let mut turn = 0u64;
        loop {
            if sending.sent < sending.out.len() {
                let more = matches!(sending.body, Outgoing::File { .. });
                match io.send(&sending.out[sending.sent..], more) {
                    Ok(n) => {
                        sending.sent += n;
                        sending.last_progress = cx.now;
                    }
                    Err(e) => match sending.blocked(e, cx) {
                        Some(step) => return self.send_stopped(step, cx),
                        None => continue,
                    },
                }
                continue;
            }
            sending.out.clear();
            sending.sent = 0;
            if turn >= TURN_BYTES {
                return Step::Wait(Wait::Write, Some(cx.now + cx.limits.send_timeout));
            }
            match &mut sending.body {
                Outgoing::None => return self.sent(cx),
                Outgoing::File { file, offset, end } => {
                    if *offset >= *end {
                        sending.body = Outgoing::None;
                        continue;
                    }
                    let count = usize::try_from(*end - *offset)
                        .unwrap_or(usize::MAX)
                        .min(SENDFILE_CHUNK);
                    match io.sendfile(file, offset, count) {
                        // The file shrank: the promised length cannot be sent honestly.
                        Ok(0) => return self.send_stopped(Step::Close, cx),
                        Ok(n) => {
                            sending.body_bytes += n as u64;
                            turn += n as u64;
                            sending.last_progress = cx.now;
                        }
                        Err(e) => {
                            if let Some(step) = sending.blocked(e, cx) {
                                return self.send_stopped(step, cx);
                            }
                        }
                    }
                }
                Outgoing::Stream { source, chunked } => {
                    let chunked = *chunked;
                    match source.poll(cx.waker) {
                        Poll::Data(bytes) => {
                            sending.body_bytes += bytes.len() as u64;
                            turn += bytes.len() as u64;
                            if chunked {
                                let _ = std::io::Write::write_fmt(
                                    &mut sending.out,
                                    format_args!("{:x}\r\n", bytes.len()),
                                );
                                sending.out.extend_from_slice(&bytes);
                                sending.out.extend_from_slice(b"\r\n");
                                // Copied: its allocation goes back to the queue, which then
                                // does not grow anew for every batch.
                                source.recycle(bytes);
                            } else {
                                sending.out = bytes;
                            }
                        }
                        // Woken by the peer leaving rather than by the producer: closed, so
                        // the producer learns it (`SendError::Closed`, `is_closed`) even while
                        // it has nothing to send; parked again, the hang-up would wake it at once.
                        Poll::Pending if io.hung_up() => return self.send_stopped(Step::Close, cx),
                        Poll::Pending => return Step::Wait(Wait::Producer, None),
                        Poll::Finished => {
                            sending.body = Outgoing::None;
                            if chunked {
                                sending.out.extend_from_slice(b"0\r\n\r\n");
                            }
                        }
                        Poll::Aborted => return self.send_stopped(Step::Close, cx),
                    }
                }
            }
        }
    }

    /// Sends the answer waiting in the worker's buffer. What the peer cannot take now moves to
    /// a [`Sending`] of the connection's own, as the buffer stays with the worker.
    fn reply<H: Handler>(
        &mut self,
        reply: Reply,
        io: &mut impl Io,
        cx: &mut Context<'_, H>,
    ) -> Step {
        let mut sent = 0;
        let error = loop {
            match io.send(&cx.out[sent..], false) {
                Ok(n) => {
                    sent += n;
                    if sent == cx.out.len() {
                        cx.out.clear();
                        let Reply {
                            exchange,
                            status,
                            body_bytes,
                            after,
                        } = reply;
                        return self.answered(exchange, status, body_bytes, after, cx);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break e,
            }
        };
        let rest = cx.out[sent..].to_vec();
        cx.out.clear();
        self.phase = Phase::Send(Box::new(Sending {
            exchange: reply.exchange,
            status: reply.status,
            body_bytes: reply.body_bytes,
            out: rest,
            sent: 0,
            body: Outgoing::None,
            last_progress: cx.now,
            after: reply.after,
        }));
        let Phase::Send(sending) = &self.phase else {
            return Step::Close;
        };
        match sending.blocked(error, cx) {
            Some(step) => self.send_stopped(step, cx),
            None => Step::Continue,
        }
    }

    /// The answer is out: log it and go on as `after` says.
    fn sent<H: Handler>(&mut self, cx: &mut Context<'_, H>) -> Step {
        let Phase::Send(sending) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            return Step::Close;
        };
        let Sending {
            exchange,
            status,
            body_bytes,
            after,
            ..
        } = *sending;
        self.answered(exchange, status, body_bytes, after, cx)
    }

    fn answered<H: Handler>(
        &mut self,
        exchange: Exchange,
        status: u16,
        body_bytes: u64,
        after: After,
        cx: &mut Context<'_, H>,
    ) -> Step {
        log(cx, &exchange, status, body_bytes);
        drop(exchange);
        match after {
            After::KeepAlive => {
                self.next_request(cx);
                Step::Continue
            }
            After::Discard(framing) => {
                let left = cx.limits.discard_cap;
                let exchange = Exchange {
                    head: None,
                    started: cx.now,
                    keep_alive: true,
                    http11: true,
                    head_only: false,
                    _in_flight: None,
                };
                let reading = Reading {
                    send_continue: false,
                    exchange,
                    framing,
                    consumer: Consumer::Discard { left },
                    progress: Progress::new(cx.now),
                };
                self.phase = Phase::Body(reading.boxed(cx.spare));
                Step::Continue
            }
            After::Close => Step::Close,
            After::Linger => {
                self.inbuf = Vec::new();
                self.start_linger(cx.now)
            }
        }
    }

    /// Sending stopped early (`step` is a wait or a close): a close is logged with what was sent.
    fn send_stopped<H: Handler>(&mut self, step: Step, cx: &mut Context<'_, H>) -> Step {
        if let (Step::Close, Phase::Send(sending)) = (&step, &self.phase) {
            log(cx, &sending.exchange, sending.status, sending.body_bytes);
        }
        step
    }

    fn next_request<H: Handler>(&mut self, cx: &mut Context<'_, H>) {
        self.park_before_reading = self.inbuf.is_empty();
        self.phase = if self.inbuf.is_empty() {
            Phase::Idle { since: cx.now }
        } else {
            Phase::Head {
                deadline: cx.now + cx.limits.header_timeout,
            }
        };
    }

    fn start_linger(&mut self, now: Instant) -> Step {
        self.phase = Phase::Linger {
            until: now + LINGER,
            left: LINGER_BYTES,
        };
        Step::Continue
    }

    fn linger<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
        let Phase::Linger { until, left } = &mut self.phase else {
            return Step::Close;
        };
        io.shutdown_write();
        loop {
            match io.recv(cx.scratch) {
                Ok(0) => return Step::Close,
                Ok(n) if n as u64 <= *left => *left -= n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if cx.now < *until {
                        Step::Wait(Wait::Read, Some(*until))
                    } else {
                        Step::Close
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => return Step::Close,
            }
        }
    }
}

/// Whether a body read ends in an answer or a failure.
enum Outcome {
    /// The sink answered early.
    Answer(Response),
    Failed(BodyError),
    TooLarge(usize),
    /// The collect budget (its size) is full.
    OverBudget(usize),
}

impl Reading {
    /// Feeds received bytes to the consumer. Returns how many it used (the rest is the next
    /// request's, or what follows a refused piece of this body), and whether all went well.
    fn feed(&mut self, input: &[u8]) -> (usize, Result<(), Outcome>) {
        let mut used = 0;
        while used < input.len() {
            let (n, piece) = match self.framing.decode(&input[used..]) {
                Ok(decoded) => decoded,
                Err(e) => return (used, Err(Outcome::Failed(BodyError::Chunk(e)))),
            };
            let start = used;
            used += n;
            match piece {
                Piece::Data(range) => {
                    let bytes = &input[start + range.start..start + range.end];
                    if let Err(outcome) = self.consume(bytes) {
                        return (used, Err(outcome));
                    }
                }
                Piece::NeedMore | Piece::Done => break,
            }
        }
        (used, Ok(()))
    }

    fn consume(&mut self, bytes: &[u8]) -> Result<(), Outcome> {
        match &mut self.consumer {
            Consumer::Collect {
                limit,
                bytes: all,
                reserved,
                known,
                ..
            } => {
                if all.len() + bytes.len() > *limit {
                    return Err(Outcome::TooLarge(*limit));
                }
                match *known {
                    // Reserved up front: allocated once, exactly.
                    Some(total) if all.capacity() == 0 => all.reserve_exact(total),
                    Some(_) => {}
                    None => {
                        let more = (all.len() + bytes.len()).saturating_sub(reserved.bytes());
                        if !reserved.grow(more) {
                            return Err(Outcome::OverBudget(reserved.budget_limit()));
                        }
                    }
                }
                all.extend_from_slice(bytes);
                Ok(())
            }
            Consumer::Sink(sink) => sink.data(bytes).map_err(Outcome::Answer),
            Consumer::Discard { left } => match left.checked_sub(bytes.len() as u64) {
                Some(rest) => {
                    *left = rest;
                    Ok(())
                }
                None => Err(Outcome::Failed(BodyError::Truncated)),
            },
        }
    }
}

impl Progress {
    fn new(now: Instant) -> Progress {
        Progress {
            last: now,
            window_start: now,
            window_bytes: 0,
        }
    }

    fn record(&mut self, bytes: u64, now: Instant) {
        self.last = now;
        self.window_bytes += bytes;
    }

    /// With nothing more to read now: the error if the body is too slow, else until when to
    /// wait for more.
    fn check(&mut self, now: Instant, timeout: Duration) -> Result<Instant, BodyError> {
        if now.duration_since(self.last) >= timeout {
            return Err(BodyError::Stalled(timeout));
        }
        let window = now.duration_since(self.window_start);
        if window >= timeout {
            let needed = u128::from(MIN_BODY_RATE) * window.as_millis() / 1000;
            if u128::from(self.window_bytes) < needed {
                return Err(BodyError::TooSlow);
            }
            self.window_start = now;
            self.window_bytes = 0;
        }
        Ok((self.last + timeout).min(self.window_start + timeout))
    }
}

impl Sending {
    /// A send that could not proceed: `None` to retry, else what to do.
    fn blocked<H: Handler>(&self, error: io::Error, cx: &Context<'_, H>) -> Option<Step> {
        match error.kind() {
            io::ErrorKind::Interrupted => None,
            io::ErrorKind::WouldBlock => {
                let deadline = self.last_progress + cx.limits.send_timeout;
                Some(if cx.now < deadline {
                    Step::Wait(Wait::Write, Some(deadline))
                } else {
                    Step::Close
                })
            }
            _ => Some(Step::Close),
        }
    }
}

fn log<H: Handler>(cx: &Context<'_, H>, exchange: &Exchange, status: u16, bytes: u64) {
    let (method, target) = exchange
        .head
        .as_ref()
        .map_or(("-", "-"), |h| (h.method(), h.target()));
    cx.handler.log(&Record {
        method,
        target,
        status,
        bytes,
        duration: exchange.started.elapsed(),
    });
}

/// True when `bytes` (the search continuing from a previous position) hold the blank line that
/// ends a head: CRLF CRLF, or bare LF LF which httparse also accepts.
fn find_head_end(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::sync::Arc;

    use crate::fuzzing::{connection_splits, exchange, TestHandler};

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
