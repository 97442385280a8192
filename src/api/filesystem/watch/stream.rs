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
//! - A client that leaves is noticed within [`CHECK_EVERY`] (or at the next event), and its
//!   watch dropped.
//! - `Connect-Timeout-Ms` ends the stream with `deadline_exceeded` when it passes; the SDKs
//!   send their watch timeout (60 s by default) this way.
//! - When the daemon shuts down, streams end with `unavailable` within [`CHECK_EVERY`], so the
//!   drain does not wait for them.
//! - A call that fails once its head is accepted (a bad request message, a path that is not a
//!   directory, the watch limit) is answered 200 with only the end-of-stream error
//!   (`api::rpc::failed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{directory, ended_error, hub, watch_error, Describe, FilesystemEvent, WatchRequest};
use crate::api::filesystem::Caller;
use crate::app::App;
use crate::connect::{Call, Code, Error, Stream};
use crate::fs::watch::{Change, Ended, Sink};
use crate::http::stream::SendError;
use crate::http::Response;

/// Bytes of messages a stream holds for a client that has not taken them.
pub const QUEUE_BYTES: usize = 1 << 20;
/// How often a stream looks whether its client is still there.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

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
    let (stream, response) = Stream::open(QUEUE_BYTES);
    // Queued first; nothing reaches the client before this answer is returned, and it is
    // returned once every directory is watched, so what the client does after `start` is seen.
    stream
        .send(&Message::Start {})
        .map_err(|e| Error::new(Code::Internal, format!("error sending start event: {e}")))?;
    let now = Instant::now();
    let sink = StreamSink {
        stream: Some(stream),
        describe: Describe {
            include_entry: request.include_entry,
            owners: caller.owners,
        },
        keepalive,
        last_sent: now,
        next_check: now + CHECK_EVERY,
        deadline: call.timeout.and_then(|timeout| now.checked_add(timeout)),
        app: Arc::clone(app),
    };
    hub.watch(&dir, request.recursive, Box::new(sink))
        .map_err(watch_error)?;
    Ok(response)
}

/// The producer of one WatchDir stream.
struct StreamSink {
    /// `None` once ended.
    stream: Option<Stream>,
    describe: Describe,
    keepalive: Duration,
    last_sent: Instant,
    next_check: Instant,
    deadline: Option<Instant>,
    app: Arc<App>,
}

impl StreamSink {
    /// Queues a message; false when the stream has ended (now or before).
    fn send(&mut self, message: &Message<'_>) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        match stream.send(message) {
            Ok(()) => {
                self.last_sent = Instant::now();
                true
            }
            Err(SendError::Full) => {
                self.finish(Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "the client is not reading fast enough: {} KiB of events waited for it; \
                         the watch is ended",
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

impl Sink for StreamSink {
    fn deliver(&mut self, change: &Change<'_>) -> bool {
        let event = self.describe.event(change);
        self.send(&Message::Filesystem(&event))
    }

    fn next_tick(&self) -> Option<Instant> {
        let keepalive = self.last_sent + self.keepalive;
        let mut next = keepalive.min(self.next_check);
        if let Some(deadline) = self.deadline {
            next = next.min(deadline);
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
        if self.app.is_shutting_down() {
            self.finish(Err(Error::new(
                Code::Unavailable,
                "sandboxd is shutting down",
            )));
            return false;
        }
        if self.deadline.is_some_and(|deadline| deadline <= now) {
            self.finish(Err(Error::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) has passed",
            )));
            return false;
        }
        if now >= self.last_sent + self.keepalive && !self.send(&Message::Keepalive {}) {
            return false;
        }
        self.next_check = now + CHECK_EVERY;
        true
    }

    fn end(mut self: Box<Self>, ended: Ended) {
        self.finish(Err(ended_error(ended)));
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
