//! Writing an answer until the peer takes no more: the head and an in-memory body from a
//! buffer, a file with `sendfile`, a stream as its producer yields it (chunked or not); parked
//! for writability in between, closed after the send timeout without progress, and logged once
//! out (or cut short).

use std::fs::File;
use std::io;
use std::time::Instant;

use super::after::After;
use super::{log, Conn, Context, Exchange, Io, Phase, Step, Wait, TURN_BYTES};
use crate::handler::Handler;
use crate::stream::{Poll, StreamSource};

/// Most bytes one `sendfile` call is asked for.
const SENDFILE_CHUNK: usize = 2 << 20;
/// A file body of this size or more is sent corked (`TCP_CORK`, nginx's `tcp_nopush`): with
/// `TCP_NODELAY`, each time the peer's acknowledgements make room in a full socket the kernel
/// sends what fits, partial segments too. Corked, only full segments go out (on loopback a
/// GiB took 37 % fewer segments, and the sender's CPU per GB came down to nginx's:
/// docs/performance.md, Downloads). Below it a body goes out in one or two segments anyway,
/// and two `setsockopt`s would cost more than they save.
pub(super) const CORK_FROM: u64 = 128 << 10;

/// A small answer's facts while its bytes are in the worker's buffer.
pub(super) struct Reply {
    pub(super) exchange: Exchange,
    pub(super) status: u16,
    pub(super) body_bytes: u64,
    pub(super) after: After,
}

pub(super) struct Sending {
    pub(super) exchange: Exchange,
    pub(super) status: u16,
    pub(super) out: Vec<u8>,
    pub(super) sent: usize,
    pub(super) body: Outgoing,
    pub(super) body_bytes: u64,
    pub(super) last_progress: Instant,
    pub(super) after: After,
}

pub(super) enum Outgoing {
    None,
    File {
        file: File,
        offset: u64,
        end: u64,
        /// `TCP_CORK` is set for it (until its last byte is written).
        corked: bool,
    },
    Stream {
        source: StreamSource,
        chunked: bool,
        batch: Batch,
    },
}

/// The bytes taken from a stream at once, being written: framed as a chunk (its size line
/// before, CRLF after) by a vectored send rather than copied into one buffer, and handed back
/// to the stream once out ([`StreamSource::recycle`]).
#[derive(Default)]
pub(super) struct Batch {
    /// The chunk's size line (`<hex>\r\n`), empty when not chunked.
    size_line: ([u8; 18], usize),
    bytes: Vec<u8>,
    /// The chunk's CRLF, empty when not chunked.
    tail: &'static [u8],
    /// Bytes of the three written so far.
    sent: usize,
}

impl Batch {
    fn new(bytes: Vec<u8>, chunked: bool) -> Batch {
        let mut size_line = ([0u8; 18], 0);
        if chunked {
            size_line.1 = hex_line(bytes.len(), &mut size_line.0);
        }
        Batch {
            size_line,
            bytes,
            tail: if chunked { b"\r\n" } else { b"" },
            sent: 0,
        }
    }

    fn len(&self) -> usize {
        self.size_line.1 + self.bytes.len() + self.tail.len()
    }

    /// What is left to write, as at most three slices.
    fn rest(&self) -> [io::IoSlice<'_>; 3] {
        let parts = [
            &self.size_line.0[..self.size_line.1],
            &self.bytes,
            self.tail,
        ];
        let mut skip = self.sent;
        parts.map(|part| {
            let from = skip.min(part.len());
            skip -= from;
            io::IoSlice::new(&part[from..])
        })
    }
}

/// Writes `n` in hexadecimal followed by CRLF into `out` (a chunk's size line); its length.
fn hex_line(n: usize, out: &mut [u8; 18]) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - (n | 1).leading_zeros()).div_ceil(4) as usize;
    for (i, slot) in out[..digits].iter_mut().enumerate() {
        *slot = DIGITS[(n >> (4 * (digits - 1 - i))) & 0xf];
    }
    out[digits..digits + 2].copy_from_slice(b"\r\n");
    digits + 2
}

impl Conn {
    pub(super) fn send<H: Handler>(&mut self, io: &mut impl Io, cx: &mut Context<'_, H>) -> Step {
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
                Outgoing::File {
                    file,
                    offset,
                    end,
                    corked,
                } => {
                    if *offset >= *end {
                        // The tail held for a full segment leaves now. A socket that refuses
                        // is failing, and its next write says so.
                        if *corked {
                            let _ = io.cork(false);
                        }
                        sending.body = Outgoing::None;
                        continue;
                    }
                    if !*corked && *end - *offset >= CORK_FROM {
                        // Refused, the file is sent uncorked all the same.
                        *corked = io.cork(true).is_ok();
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
                            // Short: the socket filled up (or the file ended early, and the
                            // next call says so). nginx waits for room at once; here only when
                            // the socket says it is full, since a file that shrank leaves room
                            // and would bring no edge.
                            if n < count && io.full() {
                                let deadline = cx.now + cx.limits.send_timeout;
                                return Step::Wait(Wait::Write, Some(deadline));
                            }
                        }
                        Err(e) => {
                            if let Some(step) = sending.blocked(e, cx) {
                                return self.send_stopped(step, cx);
                            }
                        }
                    }
                }
                Outgoing::Stream {
                    source,
                    chunked,
                    batch,
                } => {
                    if batch.sent < batch.len() {
                        match io.send_vectored(&batch.rest(), false) {
                            Ok(n) => {
                                batch.sent += n;
                                sending.last_progress = cx.now;
                            }
                            Err(e) => {
                                if let Some(step) = sending.blocked(e, cx) {
                                    return self.send_stopped(step, cx);
                                }
                            }
                        }
                        continue;
                    }
                    if batch.bytes.capacity() > 0 {
                        // Written: its allocation goes back to the queue, which then does
                        // not grow anew for every batch.
                        source.recycle(std::mem::take(&mut batch.bytes));
                    }
                    match source.poll(cx.waker) {
                        Poll::Data(bytes) => {
                            sending.body_bytes += bytes.len() as u64;
                            turn += bytes.len() as u64;
                            *batch = Batch::new(bytes, *chunked);
                        }
                        // Woken by the peer leaving rather than by the producer: closed, so
                        // the producer learns it (`SendError::Closed`, `is_closed`) even while
                        // it has nothing to send; parked again, the hang-up would wake it at once.
                        Poll::Pending if io.hung_up() => return self.send_stopped(Step::Close, cx),
                        Poll::Pending => return Step::Wait(Wait::Producer, None),
                        Poll::Finished => {
                            if *chunked {
                                sending.out.extend_from_slice(b"0\r\n\r\n");
                            }
                            sending.body = Outgoing::None;
                        }
                        Poll::Aborted => return self.send_stopped(Step::Close, cx),
                    }
                }
            }
        }
    }

    /// Sends the answer waiting in the worker's buffer. What the peer cannot take now moves to
    /// a [`Sending`] of the connection's own, as the buffer stays with the worker.
    pub(super) fn reply<H: Handler>(
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

    /// Sending stopped early (`step` is a wait or a close): a close is logged with what was sent.
    fn send_stopped<H: Handler>(&mut self, step: Step, cx: &mut Context<'_, H>) -> Step {
        if let (Step::Close, Phase::Send(sending)) = (&step, &self.phase) {
            log(cx, &sending.exchange, sending.status, sending.body_bytes);
        }
        step
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: usize) -> String {
        let mut out = [0u8; 18];
        let len = hex_line(n, &mut out);
        String::from_utf8(out[..len].to_vec()).unwrap()
    }

    #[test]
    fn size_lines_are_lower_case_hex_without_leading_zeros() {
        assert_eq!(line(0), "0\r\n");
        assert_eq!(line(1), "1\r\n");
        assert_eq!(line(15), "f\r\n");
        assert_eq!(line(16), "10\r\n");
        assert_eq!(line(65536 + 10), "1000a\r\n");
        assert_eq!(line(usize::MAX), "ffffffffffffffff\r\n");
    }

    #[test]
    fn a_batch_resumes_where_the_peer_stopped_taking() {
        let mut batch = Batch::new(b"hello".to_vec(), true);
        let joined =
            |batch: &Batch| -> Vec<u8> { batch.rest().iter().flat_map(|s| s.to_vec()).collect() };
        assert_eq!(joined(&batch), b"5\r\nhello\r\n");
        assert_eq!(batch.len(), 10);
        for (sent, rest) in [
            (2, &b"\nhello\r\n"[..]),
            (6, b"lo\r\n"),
            (9, b"\n"),
            (10, b""),
        ] {
            batch.sent = sent;
            assert_eq!(joined(&batch), rest);
        }
        let plain = Batch::new(b"abc".to_vec(), false);
        assert_eq!((joined(&plain), plain.len()), (b"abc".to_vec(), 3));
    }
}
