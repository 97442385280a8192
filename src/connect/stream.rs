//! The answer of a server-streaming call: `200`, `application/connect+json`, enveloped messages
//! pushed by a producer over time, then the end-of-stream message with the call's outcome.

use std::cell::RefCell;

use serde::Serialize;

use super::envelope::{self, END_STREAM};
use super::Error;
use crate::http::stream::{self, SendError, StreamSender};
use crate::http::{Response, ResponseBody};

/// Largest message buffer a thread keeps between messages.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The producer's end of a streaming answer. Dropped without [`Stream::finish`], the answer is
/// cut off without its end-of-stream message, which clients read as a broken call.
pub struct Stream {
    sender: StreamSender,
}

impl Stream {
    /// A stream whose queue holds at most `capacity` bytes the client has not taken, and the
    /// answer to return for the call.
    pub fn open(capacity: usize) -> (Stream, Response) {
        let (sender, source) = stream::channel(capacity);
        let response = Response::new(200, ResponseBody::Stream(source))
            .with_header("Content-Type", "application/connect+json");
        (Stream { sender }, response)
    }

    /// Queues one message. `Full`: the client reads slower than the producer writes.
    pub fn send<T: Serialize>(&self, message: &T) -> Result<(), SendError> {
        // Messages are the services' own types, whose encoding cannot fail; if one did, the
        // stream could not honestly go on.
        let json = serde_json::to_vec(message).map_err(|_| SendError::Closed)?;
        self.sender.send(&envelope::encode(0, &json))
    }

    /// Queues one message whose JSON `write` appends to the buffer it is given: for large
    /// messages, written straight into their envelope (in a buffer the thread keeps, so a busy
    /// producer allocates nothing per message) instead of through a serde value.
    pub fn send_with(&self, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), SendError> {
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buffer) => {
                envelope::encode_into(&mut buffer, 0, write);
                let sent = self.sender.send(&buffer);
                if buffer.capacity() > SCRATCH_KEPT {
                    *buffer = Vec::new();
                }
                sent
            }
            // Only if `write` itself sent on this thread: no scratch to share, a buffer of its own.
            Err(_) => {
                let mut buffer = Vec::new();
                envelope::encode_into(&mut buffer, 0, write);
                self.sender.send(&buffer)
            }
        })
    }

    /// Whether a message of `bytes` would fit in the queue now (or the client is gone). If not,
    /// `wake` is called once the connection takes the queue or the client leaves.
    pub fn wait_for_room(&self, bytes: usize, wake: impl FnOnce() + Send + 'static) -> bool {
        self.sender.wait_for_room(bytes, wake)
    }

    /// Bytes queued that the connection has not taken yet.
    pub fn queued(&self) -> usize {
        self.sender.queued()
    }

    /// True once the client is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Ends the answer with the end-of-stream message: `{}`, or the error.
    pub fn finish(self, outcome: Result<(), Error>) {
        let end = match outcome {
            Ok(()) => serde_json::json!({}),
            Err(error) => serde_json::json!({ "error": error.to_json() }),
        };
        self.sender
            .finish_with(&envelope::encode(END_STREAM, end.to_string().as_bytes()));
    }
}
