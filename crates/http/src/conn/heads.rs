//! Reading a request head: its bytes gathered (the search for its end resumed where it
//! stopped), what the layer owns checked (`Host`, framing, keep-alive, `Expect`), and the
//! handler asked what to do with it. A head the layer refuses is answered and the connection
//! closed.

use std::io;

use super::after::After;
use super::bodies::{Consumer, Progress, Reading};
use super::{Conn, Context, Exchange, InFlight, Io, Phase, Step, Wait};
use crate::error::Error;
use crate::framing::Framing;
use crate::handler::{Action, Handler, Record};
use crate::head::{Head, HeadError, MAX_HEAD_BYTES};

/// Most bytes read from the socket at once while a head is incomplete.
const HEAD_READ: usize = 16 * 1024;

impl Conn {
    pub(super) fn read_head<H: Handler>(
        &mut self,
        io: &mut impl Io,
        cx: &mut Context<'_, H>,
    ) -> Step {
        match self.scan_head() {
            Some(Ok(head)) => return self.begin(head, cx),
            Some(Err(error)) => return self.refuse(None, Error::Head(error), cx),
            None => {}
        }
        if std::mem::take(&mut self.park_before_reading) {
            if let (true, Phase::Idle { since }) = (io.drained(), &self.phase) {
                return Step::Wait(Wait::Read, Some(*since + cx.limits.idle_timeout));
            }
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
                            at: cx.wall.at(cx.now),
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
}

/// True when `bytes` (the search continuing from a previous position) hold the blank line that
/// ends a head: CRLF CRLF, or bare LF LF which httparse also accepts.
fn find_head_end(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}
