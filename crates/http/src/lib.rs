//! sandboxd's HTTP/1.1 server: **the event loop waits, workers only work.**
//!
//! A fixed pool of worker threads shares one epoll instance; as many as there are CPUs wait
//! in it, and the rest stand by to replace any that a disk call holds longer than
//! 10 ms (so a busy server pays no context switch per request). A worker takes one ready
//! connection, runs it as far as it can go without waiting — parses a head, asks the
//! [`Handler`], feeds a body to its consumer, writes an answer, `sendfile`s a file — and the
//! moment the next step would wait for the peer, the connection goes back to the epoll with its
//! state and the worker takes the next ready one. Blocking calls on disks (open, fsync,
//! `copy_file_range`, /proc) are the handler's and stay synchronous, in workers. So a thousand
//! slow peers cost a thousand small state records, not a thousand threads, and `/health` is
//! answered while they crawl.
//!
//! # Using it
//!
//! Implement [`Handler`]: [`Handler::begin`] sees each complete head and returns an
//! [`Action`]: respond at once ([`Response`] with bytes, a file range, a
//! [`stream`](stream::channel) or a [`deferred`] answer another thread sends later), collect a
//! small body (all such bodies together within [`Config::collect_budget`]), or consume a large
//! one piece by piece through a [`BodySink`]. Then [`start`] the server on a listener with a [`Config`].
//! The layer knows nothing of the application: its refusals are worded by
//! [`Handler::refused`], its access-log records go to [`Handler::log`].
//!
//! # The connection state machine
//!
//! ```text
//!            first byte                 head complete: Handler::begin
//!   Idle ───────────────▶ Head ──────────────────────────┬──────────────▶ Send
//!    ▲   (idle timeout)    │ (header timeout,             │ Collect/Consume ▲  │
//!    │                     │  partial-head budget)        ▼                 │  │
//!    │                     │                            Body ─ complete ────┘  │
//!    │                     ▼ refused head                 (body timeout,       │
//!    │                   Send ──▶ Linger ──▶ closed        minimum rate)       │
//!    │                                                                         │
//!    └──────── answer written (keep-alive; Discard the unread body first) ◀────┘
//! ```
//!
//! - **Idle**: between requests, no byte of the next one. Parked for reading, buffers freed;
//!   closed after the idle timeout.
//! - **Head**: bytes of a head arrived (or the connection is new). Parked for reading with the
//!   header deadline, which runs from the first byte (from accept for a new connection). The
//!   search for the blank line that ends a head resumes where it stopped, so a trickled head
//!   is scanned once. All incomplete heads together have a byte budget; past it the oldest is
//!   closed. Out of descriptors on accept, the oldest idle connection is closed, else the
//!   oldest incomplete head, else the application is asked to give one up
//!   ([`Handler::shed_descriptor`]). A refused head (malformed, 431, no valid `Host` in HTTP/1.1, bad framing,
//!   `Transfer-Encoding` in HTTP/1.0) is answered, logged and closed.
//! - **Body**: the handler wants the body. Bytes are fed to the consumer as they arrive
//!   (`100 Continue` first when asked for); parked for reading between arrivals. A gap longer
//!   than the body timeout, or less than [`MIN_BODY_RATE`] bytes/s over a window of that length,
//!   ends it with an answer from [`Handler::refused`].
//! - **Send**: writing the answer until `EAGAIN`, then parked for writability; closed after the
//!   send timeout without progress. A streamed body whose producer has nothing parks the
//!   connection watching only for the peer leaving; the producer's next bytes wake it. A fast
//!   transfer yields its worker every few MiB so others get a turn.
//! - **Waiting** (before Send): the handler's answer is [`deferred`]: parked holding no worker,
//!   only the peer leaving watched, until the answer arrives and is sent as any other.
//! - After the answer: the next request (already buffered ones first: pipelining, answered
//!   in order; nothing more is read while an answer cannot be written), or **Discard** of a body
//!   nobody read (within a cap, like Body but thrown away), or **Linger**: the write side shut,
//!   what the peer still sends read and dropped for a moment, then closed, so a client still
//!   sending reads the answer rather than a reset.
//!
//! Deadlines are enforced by a timekeeper thread that hands an expired connection to a worker,
//! except when its socket is ready: then it is waiting for a worker, not for its peer, and a
//! complete request that waits for a worker never times out.
//! Each of its rounds (at most a second apart) also calls [`Handler::tick`], so the
//! application's periodic work shares a wakeup the server has anyway.
#![deny(missing_docs)]

mod budget;
mod chunked;
mod clock;
mod conn;
pub mod date;
pub mod deferred;
pub mod digits;
mod error;
mod framing;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod handler;
mod head;
pub mod multipart;
mod pool;
pub mod query;
mod response;
mod server;
mod spare;
pub mod stream;
mod sys;

pub use chunked::ChunkError;
pub use error::{BodyError, Error, MIN_BODY_RATE};
pub use framing::FramingError;
pub use handler::{Action, BodySink, Collected, Handler, Record};
pub use head::{Head, HeadError};
pub use response::{Response, ResponseBody};
pub use server::{start, Config, Server};
