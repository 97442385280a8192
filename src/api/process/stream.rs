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
//! - A client that leaves is noticed within a second, `rpc::CHECK_EVERY` (or at the next
//!   output); the process keeps running.
//! - When the daemon shuts down, a stream whose process has not ended within the hub's grace
//!   ends with `unavailable`; when it is upgraded, every stream ends with `unavailable` at once,
//!   after all the output read before (the rest waits for a `Connect` to the next image).

use std::time::{Duration, Instant};

use super::messages::{
    read_proto_data_event, write_data_event, Empty, EndEvent, Event, EventResponse, StartEvent,
    PROTO_HEADER_MAX,
};
use crate::api::rpc::LiveStream;
use crate::connect::envelope::PREFIX;
use crate::connect::{Call, Code, Codec, Error};
use crate::http::Response;
use crate::proc::{Abort, Exit, OutputKind, Subscriber, Wake, CHUNK};

/// Bytes of events a stream holds for a client that has not taken them.
pub const QUEUE_BYTES: usize = 256 << 10;
/// The largest event: a chunk of output in base64, with its JSON and envelope (and, gzip,
/// deflate's few bytes per block of stored data and its framing).
const MAX_EVENT: usize = CHUNK.div_ceil(3) * 4 + 256;
const _: () = assert!(MAX_EVENT < QUEUE_BYTES);
/// A protobuf data event's framing: its envelope's prefix and its header.
const PROTO_FRAMING: usize = PREFIX + PROTO_HEADER_MAX;
/// The least room a read straight into the queue waits for.
const MIN_READ: usize = 16 << 10;
/// How long a client may take nothing while output waits for it.
pub const STALL: Duration = Duration::from_secs(10);

/// One stream of a process's events.
pub struct ProcessStream {
    live: LiveStream,
    /// Since when output has waited for room in the queue.
    blocked_since: Option<Instant>,
}

impl ProcessStream {
    /// A stream and the answer carrying it; nothing is queued yet.
    pub fn open(call: &Call, keepalive: Duration) -> (ProcessStream, Response) {
        let (live, response) = LiveStream::open(call, QUEUE_BYTES, "", keepalive);
        let stream = ProcessStream {
            live,
            blocked_since: None,
        };
        (stream, response)
    }

    /// Queues the start event (first, before any output).
    pub fn started(&mut self, pid: u32) {
        self.send(Event::Start(StartEvent { pid }));
    }

    /// Queues the end event and ends the stream.
    pub fn ended(&mut self, exit: Exit) {
        if self.send(Event::End(EndEvent::from(exit))) {
            self.live.finish(Ok(()));
        }
    }

    /// Queues an event; false when the stream has ended (now or before).
    fn send(&mut self, event: Event) -> bool {
        self.live.send(&EventResponse::of(event))
    }
}

impl ProcessStream {
    /// Whether `bytes` more fit in the queue now; if not, `wake` is called once they may.
    fn room_for(&mut self, bytes: usize, wake: &Wake) -> bool {
        let Some(stream) = self.live.stream() else {
            // Ended: the next output drops it.
            return true;
        };
        let wake = wake.clone();
        if stream.wait_for_room(bytes, move || wake.wake()) {
            self.blocked_since = None;
            true
        } else {
            self.blocked_since.get_or_insert_with(Instant::now);
            false
        }
    }
}

impl Subscriber for ProcessStream {
    fn ready(&mut self, wake: &Wake) -> bool {
        self.room_for(MAX_EVENT, wake)
    }

    /// A read straight into the queue is as large as the room left (at most a chunk), so a
    /// batch fills the queue: four events of 64 KiB, the last a little less, rather than three.
    fn ready_to_read(&mut self, wake: &Wake) -> bool {
        self.room_for(PROTO_FRAMING + MIN_READ, wake)
    }

    fn output(&mut self, kind: OutputKind, bytes: &[u8]) -> bool {
        self.live.send_raw(|codec, out| {
            write_data_event(codec, out, kind, bytes);
            true
        })
    }

    /// In protobuf, uncompressed: the output is read straight into the queue, where its event
    /// is written around it (JSON's base64 and gzip need the bytes elsewhere first).
    fn reads_output(&self) -> bool {
        self.live
            .stream()
            .is_some_and(|stream| stream.codec() == Codec::Proto && !stream.compresses())
    }

    fn output_read(
        &mut self,
        kind: OutputKind,
        read: &mut dyn FnMut(&mut Vec<u8>, usize) -> usize,
    ) -> bool {
        let room = self.live.stream().map_or(0, |stream| stream.room());
        let max = room.saturating_sub(PROTO_FRAMING).min(CHUNK);
        self.live.send_raw(|codec, out| match codec {
            Codec::Proto => read_proto_data_event(out, kind, max, read),
            Codec::Json => {
                let mut bytes = Vec::new();
                read(&mut bytes, CHUNK) > 0 && {
                    write_data_event(codec, out, kind, &bytes);
                    true
                }
            }
        })
    }

    fn next_tick(&self) -> Option<Instant> {
        let next = self.live.next_tick();
        Some(
            self.blocked_since
                .map_or(next, |since| next.min(since + STALL)),
        )
    }

    fn tick(&mut self, now: Instant) -> bool {
        if !self.live.check(now) {
            return false;
        }
        if self.blocked_since.is_some_and(|since| since + STALL <= now) {
            self.live.finish(Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "the client is not reading fast enough: it took nothing for {} s while the \
                     process's output waited for it",
                    STALL.as_secs()
                ),
            )));
            return false;
        }
        self.live
            .keep_alive(now, &EventResponse::of(Event::Keepalive(Empty {})))
    }

    fn end(mut self: Box<Self>, exit: Exit) {
        self.ended(exit);
    }

    fn abort(mut self: Box<Self>, why: Abort) {
        let message = match why {
            Abort::Shutdown => "sandboxd is shutting down",
            Abort::Upgrade => {
                "sandboxd is being upgraded: the process lives on; Connect to it again for the \
                 rest of its output"
            }
        };
        self.live
            .finish(Err(Error::new(Code::Unavailable, message)));
    }
}
