//! The answer of a streaming call: `200`, `application/connect+json` or
//! `application/connect+proto`, enveloped messages pushed by a producer over time (each
//! compressed when the client takes gzip and it is worth it), then the end-of-stream message
//! with the call's outcome, JSON in both codecs as the protocol has it.

use std::cell::RefCell;

use super::codec::{Codec, Outgoing};
use super::compression;
use super::envelope::{self, COMPRESSED, END_STREAM, PREFIX};
use super::Error;
use crate::http::stream::{self, SendError, StreamSender};
use crate::http::{Response, ResponseBody};

/// Largest message buffer a thread keeps between messages.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    /// A message as written, then (when compressed) its envelope.
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The producer's end of a streaming answer. Dropped without [`Stream::finish`], the answer is
/// cut off without its end-of-stream message, which clients read as a broken call.
pub struct Stream {
    sender: StreamSender,
    codec: Codec,
    /// The client takes gzip messages.
    gzip: bool,
}

impl Stream {
    /// A stream in `codec` (its messages gzip when `gzip` and worth it) whose queue holds at
    /// most `capacity` bytes the client has not taken, and the answer to return for the call.
    pub fn open(codec: Codec, gzip: bool, capacity: usize) -> (Stream, Response) {
        let (sender, source) = stream::channel(capacity);
        let mut response = Response::new(200, ResponseBody::Stream(source))
            .with_header("Content-Type", codec.stream_type())
            .with_header("Connect-Accept-Encoding", "gzip");
        if gzip {
            response = response.with_header("Connect-Content-Encoding", "gzip");
        }
        let stream = Stream {
            sender,
            codec,
            gzip,
        };
        (stream, response)
    }

    /// The codec messages are written in (for [`Stream::send_with`]).
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Whether its messages are compressed (when worth it).
    pub fn compresses(&self) -> bool {
        self.gzip
    }

    /// Queues one message. `Full`: the client reads slower than the producer writes.
    pub fn send<T: Outgoing>(&self, message: &T) -> Result<(), SendError> {
        let mut failed = false;
        let sent = self.send_with(|out| {
            // Messages are the services' own types, whose encoding cannot fail; if one did,
            // the stream could not honestly go on.
            failed = self.codec.encode(message, out).is_err();
        });
        if failed {
            return Err(SendError::Closed);
        }
        sent
    }

    /// Queues one message that `write` appends, in the stream's [`codec`](Self::codec), to
    /// the buffer it is given: messages are written straight into their envelope, in the
    /// stream's queue (or, to be compressed, a buffer the thread keeps), so a busy producer
    /// neither allocates nor copies per message.
    pub fn send_with(&self, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), SendError> {
        self.send_some(|out| {
            write(out);
            true
        })
    }

    /// As [`send_with`](Self::send_with), but `write` may find it has nothing to send (a read
    /// that finds nothing): it answers false and no message is queued.
    pub fn send_some(&self, write: impl FnOnce(&mut Vec<u8>) -> bool) -> Result<(), SendError> {
        if !self.gzip {
            // Straight into the queue: the message is not copied again on its way to the
            // connection.
            return self
                .sender
                .append(|queue| envelope::append_into(queue, 0, write));
        }
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buffers) => {
                let (message, envelope) = &mut *buffers;
                let sent = self.frame(message, envelope, write);
                for buffer in [message, envelope] {
                    if buffer.capacity() > SCRATCH_KEPT {
                        *buffer = Vec::new();
                    }
                }
                sent
            }
            // Only if `write` itself sent on this thread: no scratch to share, buffers of its own.
            Err(_) => self.frame(&mut Vec::new(), &mut Vec::new(), write),
        })
    }

    /// Writes the message into `message` (after room for the prefix), compresses it into
    /// `envelope` when that is due, and queues the envelope.
    fn frame(
        &self,
        message: &mut Vec<u8>,
        envelope: &mut Vec<u8>,
        write: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> Result<(), SendError> {
        message.clear();
        if !envelope::append_into(message, 0, write) {
            return Ok(());
        }
        if !self.gzip || message.len() - PREFIX < compression::MIN_BYTES {
            return self.sender.send(message);
        }
        envelope::encode_into(envelope, COMPRESSED, |out| {
            compression::gzip_on_thread(&message[PREFIX..], out);
        });
        self.sender.send(envelope)
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

    /// How many bytes more the queue takes now.
    pub fn room(&self) -> usize {
        self.sender.room()
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
