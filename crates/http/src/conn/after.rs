//! What follows a complete answer: the next request (a pipelined one first), the discard of
//! a body nobody read, a close, or a lingering close: the write side shut and what the peer
//! still sends read and dropped for a moment, so a client still sending reads the answer
//! rather than a reset.

use std::io;
use std::time::{Duration, Instant};

use super::bodies::{Consumer, Progress, Reading};
use super::{log, Conn, Context, Exchange, Io, Phase, Step, Wait};
use crate::framing::Framing;
use crate::handler::Handler;

/// How long a closing connection keeps reading (and discarding) so that the peer, still
/// sending, reads the answer instead of a reset (nginx's lingering close).
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes read and discarded while lingering.
const LINGER_BYTES: u64 = 16 << 20;

/// What follows a complete answer.
pub(super) enum After {
    /// The next request.
    KeepAlive,
    /// Discard the rest of the request body, then the next request.
    Discard(Framing),
    Close,
    /// Close after lingering.
    Linger,
}

impl Conn {
    pub(super) fn answered<H: Handler>(
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

    pub(super) fn next_request<H: Handler>(&mut self, cx: &mut Context<'_, H>) {
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

    pub(super) fn linger<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
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
