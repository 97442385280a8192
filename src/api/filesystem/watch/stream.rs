//! `WatchDir`: a server stream of one directory's events, `{"start":{}}` first, then
//! `{"filesystem":{...}}` per change and `{"keepalive":{}}` whenever nothing was sent for the
//! keep-alive interval.
//!
//! The stream's producer is the watch's sink, run by the watcher thread; the connection waits
//! in the HTTP layer's event loop meanwhile, without a worker. Decisions:
//!
//! - The keep-alive interval is envd's (`api::rpc::keepalive_interval`). As in envd, every
//!   message sent restarts the interval.
//! - The queue of a stream holds at most [`QUEUE_BYTES`] its client has not taken (beyond what
//!   the connection and the kernel's socket buffers hold). A client that lets it fill is ended
//!   with `resource_exhausted`, after the events already queued, and its watch dropped: the
//!   watcher never waits for a client and memory never grows with one.
//! - What a stream's queue holds is charged to the daemon's budget for waiting events
//!   (`budget`), after each message and at each look (every second): a stream that finds no
//!   room is ended with `resource_exhausted` as a full queue is.
//! - A client that leaves is noticed within a second, `rpc::CHECK_EVERY` (or at the next
//!   event), and its watch dropped.
//! - `Connect-Timeout-Ms` ends the stream with `deadline_exceeded` when it passes; the SDKs
//!   send their watch timeout (60 s by default) this way.
//! - When the daemon shuts down, streams end with `unavailable` within a second, so the drain
//!   does not wait for them; at a live upgrade (`POST /upgrade`) they end at once with
//!   `unavailable` ("sandboxd is upgrading: call WatchDir again"): a stream is not carried.
//! - A call that fails once its head is accepted (a bad request message, a path that is not a
//!   directory) is answered 200 with only the end-of-stream error (`api::rpc::failed`).
//! - The watch is set up on a setup thread (`setup`), not in the worker: the answer is
//!   returned at once, `start` is sent once every directory is watched, and a failure (the
//!   watch limit, the instance limit) is the end-of-stream message after nothing else. Changes
//!   seen while the tree is being set up are held, within the queue's bytes, and sent right
//!   after `start`; keep-alives, the client's leaving and the deadline are looked at from
//!   `start` on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::budget::{self, Charge};
use super::{directory, ended_error, hub, setup, Describe, FilesystemEvent, WatchRequest};
use crate::api::filesystem::messages::Empty;
use crate::api::filesystem::Caller;
use crate::api::rpc::LiveStream;
use crate::app::App;
use crate::connect::{Call, Code, Error};
use crate::fs::watch::{Change, Ended, Refused, Sink};
use crate::http::Response;

/// Bytes of messages a stream holds for a client that has not taken them.
pub const QUEUE_BYTES: usize = 1 << 20;

/// A message of the stream (`WatchDirResponse`).
#[derive(Clone, PartialEq, Serialize, prost::Message)]
struct Message {
    #[prost(oneof = "Event", tags = "1, 2, 3")]
    #[serde(flatten)]
    event: Option<Event>,
}

/// `WatchDirResponse`'s oneof `event`.
// Built to be sent at once, one at a time: the empty variants' wasted bytes are never many.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Serialize, prost::Oneof)]
#[serde(rename_all = "camelCase")]
enum Event {
    #[prost(message, tag = "1")]
    Start(Empty),
    #[prost(message, tag = "2")]
    Filesystem(FilesystemEvent),
    #[prost(message, tag = "3")]
    Keepalive(Empty),
}

impl Message {
    fn of(event: Event) -> Message {
        Message { event: Some(event) }
    }
}

/// Starts watching and answers with the stream.
pub fn watch_dir(
    app: &Arc<App>,
    caller: Caller,
    call: &Call,
    keepalive: Duration,
    request: WatchRequest,
) -> Result<Response, Error> {
    let dir = directory(&caller, &request)?;
    let hub = hub()?;
    let (live, response) = LiveStream::open(call, QUEUE_BYTES, "; the watch is ended", keepalive);
    let sink = StreamSink {
        live,
        describe: Describe {
            include_entry: request.include_entry,
            owners: caller.owners,
        },
        app: Arc::clone(app),
        early: Some(Early::default()),
        charge: Charge::default(),
    };
    let recursive = request.recursive;
    let (app, user) = (Arc::clone(app), caller.user);
    setup::spawn(Box::new(move || {
        // The setup thread lists and watches the tree with the user's rights
        // (`--fs-as-user`), as the worker would have.
        let as_user = match app.as_user(&user) {
            Ok(guard) => guard,
            Err(error) => {
                let mut sink = sink;
                return sink
                    .live
                    .finish(Err(Error::new(Code::Internal, error.to_string())));
            }
        };
        if let Err(Refused { error, sink }) = hub.watch(&dir, recursive, Box::new(sink)) {
            sink.end(Ended::Failed(error));
        }
        drop(as_user);
    }))?;
    Ok(response)
}

/// The producer of one WatchDir stream.
struct StreamSink {
    live: LiveStream,
    describe: Describe,
    app: Arc<App>,
    /// Until the watch is in place (`None` after): the changes seen meanwhile.
    early: Option<Early>,
    /// What the queue (or `early`) holds, charged to the daemon's budget.
    charge: Charge,
}

impl StreamSink {
    /// Sends one message and charges what the queue holds now; false when the stream is over.
    fn send(&mut self, message: &Message) -> bool {
        self.live.send(message) && self.account()
    }

    /// Charges what the queue holds now; false (the stream ended) when it does not fit.
    fn account(&mut self) -> bool {
        let queued = self.live.stream().map_or(0, |stream| stream.queued());
        if self.charge.set(queued) {
            return true;
        }
        self.live.finish(Err(budget::exhausted()));
        false
    }
}

/// Changes seen while a watch is set up, held until its `start` is sent.
#[derive(Default)]
struct Early {
    events: Vec<FilesystemEvent>,
    bytes: usize,
}

impl Sink for StreamSink {
    fn deliver(&mut self, change: &Change<'_>) -> bool {
        let event = self.describe.event(change);
        let Some(early) = &mut self.early else {
            return self.send(&Message::of(Event::Filesystem(event)));
        };
        let bytes = event.heap_bytes() + std::mem::size_of::<FilesystemEvent>();
        early.bytes += bytes;
        if early.bytes > QUEUE_BYTES || !self.charge.add(bytes) {
            self.early = None;
            self.live.finish(Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "more than {} KiB of events came while the watch was being set up (or the \
                     daemon's {} MiB for waiting events are used up); the watch is ended",
                    QUEUE_BYTES >> 10,
                    budget::TOTAL_BYTES >> 20
                ),
            )));
            return false;
        }
        early.events.push(event);
        true
    }

    fn ready(&mut self) -> bool {
        let early = self.early.take().unwrap_or_default();
        if !self.send(&Message::of(Event::Start(Empty {}))) {
            return false;
        }
        early
            .events
            .into_iter()
            .all(|event| self.send(&Message::of(Event::Filesystem(event))))
    }

    fn next_tick(&self) -> Option<Instant> {
        match self.early {
            Some(_) => None,
            None => Some(self.live.next_tick()),
        }
    }

    fn tick(&mut self, now: Instant) -> bool {
        if !self.live.check(now) {
            return false;
        }
        if self.app.is_shutting_down() {
            self.live.finish(Err(Error::new(
                Code::Unavailable,
                "sandboxd is shutting down",
            )));
            return false;
        }
        self.live
            .keep_alive(now, &Message::of(Event::Keepalive(Empty {})))
            && self.account()
    }

    fn end(mut self: Box<Self>, ended: Ended) {
        self.live.finish(Err(ended_error(ended)));
    }

    /// A stream's connection does not cross the upgrade's `execve`: it ends now, so that the
    /// drain does not wait for it, and its client watches again.
    fn upgrading(&mut self) -> bool {
        self.live.finish(Err(Error::new(
            Code::Unavailable,
            "sandboxd is upgrading: call WatchDir again",
        )));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_envds_oneof() {
        let event = FilesystemEvent {
            name: "a".into(),
            kind: super::super::EventType::Create.into(),
            entry: None,
        };
        let json = |event: Event| serde_json::to_string(&Message::of(event)).unwrap();
        let proto = |event: Event| prost::Message::encode_to_vec(&Message::of(event));
        assert_eq!(json(Event::Start(Empty {})), r#"{"start":{}}"#);
        assert_eq!(json(Event::Keepalive(Empty {})), r#"{"keepalive":{}}"#);
        assert_eq!(
            json(Event::Filesystem(event.clone())),
            r#"{"filesystem":{"name":"a","type":"EVENT_TYPE_CREATE"}}"#
        );
        assert_eq!(proto(Event::Start(Empty {})), [0x0a, 0]);
        assert_eq!(proto(Event::Keepalive(Empty {})), [0x1a, 0]);
        assert_eq!(
            proto(Event::Filesystem(event)),
            [0x12, 5, 0x0a, 1, b'a', 0x10, 1]
        );
    }
}
