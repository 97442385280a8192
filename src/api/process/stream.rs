//! The `Start` and `Connect` streams: `{"event":{"start":{"pid":N}}}` first, then the
//! process's output as `data` events in order, `keepalive` events whenever nothing was sent for
//! the keep-alive interval, and the `end` event, after which the stream ends.
//!
//! A stream is a subscriber of the process hub (`proc`), run on its I/O thread; the connection
//! waits in the HTTP layer's event loop meanwhile, without a worker. Decisions:
//!
//! - Each stream queues at most [`QUEUE_BYTES`] its client has not taken. When the next chunk of
//!   output would not fit, the process's output is held back (its writes wait, as with any slow
//!   reader of a pipe) until the connection takes the queue: nothing is dropped and memory does
//!   not grow. A client that takes nothing for [`STALL`] while output waits for it is ended with
//!   `resource_exhausted`, and the process's output goes on for its other subscribers (a
//!   `Connect` stream may hold it back, not freeze it).
//! - The call's deadline (`Connect-Timeout-Ms`) ends the stream with `deadline_exceeded`; a
//!   `Start` call's also kills the process, as envd's does (the hub's business).
//! - A client that leaves is noticed within [`CHECK_EVERY`] (or at the next output); the
//!   process keeps running.
//! - When the daemon shuts down, a stream whose process has not ended within the hub's grace
//!   ends with `unavailable`.

use std::time::{Duration, Instant};

use super::messages::{write_data_event, EndEvent, Event, EventResponse};
use crate::connect::{Code, Error, Stream};
use crate::http::stream::SendError;
use crate::http::Response;
use crate::proc::{Exit, OutputKind, Subscriber, Wake, CHUNK};

/// Bytes of events a stream holds for a client that has not taken them.
pub const QUEUE_BYTES: usize = 256 << 10;
/// The largest event: a chunk of output in base64, with its JSON and envelope.
const MAX_EVENT: usize = CHUNK.div_ceil(3) * 4 + 64;
const _: () = assert!(MAX_EVENT < QUEUE_BYTES);
/// How long a client may take nothing while output waits for it.
pub const STALL: Duration = Duration::from_secs(10);
/// How often a stream looks whether its client is still there.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// One stream of a process's events.
pub struct ProcessStream {
    /// `None` once ended.
    stream: Option<Stream>,
    keepalive: Duration,
    last_sent: Instant,
    next_check: Instant,
    deadline: Option<Instant>,
    /// Since when output has waited for room in the queue.
    blocked_since: Option<Instant>,
}

impl ProcessStream {
    /// A stream and the answer carrying it; nothing is queued yet.
    pub fn open(keepalive: Duration, timeout: Option<Duration>) -> (ProcessStream, Response) {
        let (stream, response) = Stream::open(QUEUE_BYTES);
        let now = Instant::now();
        let stream = ProcessStream {
            stream: Some(stream),
            keepalive,
            last_sent: now,
            next_check: now + CHECK_EVERY,
            deadline: timeout.and_then(|timeout| now.checked_add(timeout)),
            blocked_since: None,
        };
        (stream, response)
    }

    /// Queues the start event (first, before any output).
    pub fn started(&mut self, pid: u32) {
        self.send(Event::Start { pid });
    }

    /// Queues the end event and ends the stream.
    pub fn ended(&mut self, exit: Exit) {
        if self.send(Event::End(EndEvent::from(exit))) {
            self.finish(Ok(()));
        }
    }

    /// Queues an event; false when the stream has ended (now or before).
    fn send(&mut self, event: Event) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        let sent = stream.send(&EventResponse { event });
        self.sent(sent)
    }

    /// Follows up a send: the time of the last message, or the end of the stream.
    fn sent(&mut self, outcome: Result<(), SendError>) -> bool {
        match outcome {
            Ok(()) => {
                self.last_sent = Instant::now();
                true
            }
            Err(SendError::Full) => {
                self.finish(Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "the client is not reading fast enough: {} KiB of events waited for it",
                        QUEUE_BYTES >> 10
                    ),
                )));
                false
            }
            Err(SendError::Closed) => {
                self.stream = None;
                false
            }
        }
    }

    fn finish(&mut self, outcome: Result<(), Error>) {
        if let Some(stream) = self.stream.take() {
            stream.finish(outcome);
        }
    }
}

impl Subscriber for ProcessStream {
    fn ready(&mut self, wake: &Wake) -> bool {
        let Some(stream) = &self.stream else {
            // Ended: the next output drops it.
            return true;
        };
        let wake = wake.clone();
        if stream.wait_for_room(MAX_EVENT, move || wake.wake()) {
            self.blocked_since = None;
            true
        } else {
            self.blocked_since.get_or_insert_with(Instant::now);
            false
        }
    }

    fn output(&mut self, kind: OutputKind, bytes: &[u8]) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        let sent = stream.send_with(|out| write_data_event(out, kind, bytes));
        self.sent(sent)
    }

    fn next_tick(&self) -> Option<Instant> {
        let mut next = (self.last_sent + self.keepalive).min(self.next_check);
        if let Some(deadline) = self.deadline {
            next = next.min(deadline);
        }
        if let Some(since) = self.blocked_since {
            next = next.min(since + STALL);
        }
        Some(next)
    }

    fn tick(&mut self, now: Instant) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        if stream.is_closed() {
            self.stream = None;
            return false;
        }
        if self.deadline.is_some_and(|deadline| deadline <= now) {
            self.finish(Err(Error::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) has passed",
            )));
            return false;
        }
        if self.blocked_since.is_some_and(|since| since + STALL <= now) {
            self.finish(Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "the client is not reading fast enough: it took nothing for {} s while the \
                     process's output waited for it",
                    STALL.as_secs()
                ),
            )));
            return false;
        }
        if now >= self.last_sent + self.keepalive && !self.send(Event::Keepalive {}) {
            return false;
        }
        self.next_check = now + CHECK_EVERY;
        true
    }

    fn end(mut self: Box<Self>, exit: Exit) {
        self.ended(exit);
    }

    fn abort(mut self: Box<Self>) {
        self.finish(Err(Error::new(
            Code::Unavailable,
            "sandboxd is shutting down",
        )));
    }
}
