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
//! - A client that leaves is noticed within a second, `rpc::CHECK_EVERY` (or at the next
//!   event), and its watch dropped.
//! - `Connect-Timeout-Ms` ends the stream with `deadline_exceeded` when it passes; the SDKs
//!   send their watch timeout (60 s by default) this way.
//! - When the daemon shuts down, streams end with `unavailable` within a second, so the drain
//!   does not wait for them.
//! - A call that fails once its head is accepted (a bad request message, a path that is not a
//!   directory, the watch limit) is answered 200 with only the end-of-stream error
//!   (`api::rpc::failed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{directory, ended_error, hub, watch_error, Describe, FilesystemEvent, WatchRequest};
use crate::api::filesystem::Caller;
use crate::api::rpc::LiveStream;
use crate::app::App;
use crate::connect::{Call, Code, Error};
use crate::fs::watch::{Change, Ended, Sink};
use crate::http::Response;

/// Bytes of messages a stream holds for a client that has not taken them.
pub const QUEUE_BYTES: usize = 1 << 20;

/// A message of the stream (`WatchDirResponse`, a oneof).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Message<'a> {
    Start {},
    Filesystem(&'a FilesystemEvent),
    Keepalive {},
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
    let (mut live, response) =
        LiveStream::open(QUEUE_BYTES, "; the watch is ended", keepalive, call.timeout);
    // Queued first; nothing reaches the client before this answer is returned, and it is
    // returned once every directory is watched, so what the client does after `start` is seen.
    if !live.send(&Message::Start {}) {
        return Err(Error::new(Code::Internal, "error sending start event"));
    }
    let sink = StreamSink {
        live,
        describe: Describe {
            include_entry: request.include_entry,
            owners: caller.owners,
        },
        app: Arc::clone(app),
    };
    hub.watch(&dir, request.recursive, Box::new(sink))
        .map_err(watch_error)?;
    Ok(response)
}

/// The producer of one WatchDir stream.
struct StreamSink {
    live: LiveStream,
    describe: Describe,
    app: Arc<App>,
}

impl Sink for StreamSink {
    fn deliver(&mut self, change: &Change<'_>) -> bool {
        let event = self.describe.event(change);
        self.live.send(&Message::Filesystem(&event))
    }

    fn next_tick(&self) -> Option<Instant> {
        Some(self.live.next_tick())
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
        self.live.keep_alive(now, &Message::Keepalive {})
    }

    fn end(mut self: Box<Self>, ended: Ended) {
        self.live.finish(Err(ended_error(ended)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_envds_oneof() {
        let event = FilesystemEvent {
            name: "a".into(),
            kind: super::super::EventType::Create,
            entry: None,
        };
        let json = |message: &Message| serde_json::to_string(message).unwrap();
        assert_eq!(json(&Message::Start {}), r#"{"start":{}}"#);
        assert_eq!(json(&Message::Keepalive {}), r#"{"keepalive":{}}"#);
        assert_eq!(
            json(&Message::Filesystem(&event)),
            r#"{"filesystem":{"name":"a","type":"EVENT_TYPE_CREATE"}}"#
        );
    }
}
