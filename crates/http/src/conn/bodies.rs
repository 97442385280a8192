//! Reading a request body: its bytes decoded by their framing and fed to the consumer the
//! handler chose (collected in memory within the collect budget, a [`BodySink`], or discarded
//! after the answer), watched for stalls and the minimum rate; then the handler's answer, or a
//! refusal when the body fails.

use std::io;
use std::time::{Duration, Instant};

use super::after::After;
use super::{Conn, Context, Exchange, Io, Phase, Step, Wait, TURN_BYTES};
use crate::budget::Reservation;
use crate::error::{BodyError, Error, MIN_BODY_RATE};
use crate::framing::{Framing, Piece};
use crate::handler::{BodySink, Collected, Handler};
use crate::response::Response;

pub(crate) struct Reading {
    /// `100 Continue` is still to be sent: the client waits for it before sending the body.
    pub(super) send_continue: bool,
    pub(super) exchange: Exchange,
    pub(super) framing: Framing,
    pub(super) consumer: Consumer,
    pub(super) progress: Progress,
}

impl Reading {
    /// `self` in a box, the worker's spare if it has one. Every request with a body boxes its
    /// state, and musl's allocator (mallocng) gives a size class's group back to the kernel as
    /// soon as its last slot is freed: a box made and freed per request cost an `mmap`, a page
    /// fault and a `munmap` each time (`strace` of a unary `Stat`).
    pub(super) fn boxed(self, spare: &mut Option<Box<Reading>>) -> Box<Reading> {
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

pub(super) enum Consumer {
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
pub(super) struct Progress {
    last: Instant,
    window_start: Instant,
    window_bytes: u64,
}

impl Conn {
    pub(super) fn read_body<H: Handler>(
        &mut self,
        io: &mut impl Io,
        cx: &mut Context<'_, H>,
    ) -> Step {
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
    pub(super) fn new(now: Instant) -> Progress {
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
