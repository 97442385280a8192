//! What the layer asks of the application: a decision per request head, the bodies of the
//! layer's own refusals, and a place for access-log records.
//!
//! The application never sees a socket. It looks at a complete head and says how the request
//! goes on ([`Action`]): answered at once (the body, if any, is then discarded by the loop or the
//! connection closed), its body collected in full up to a limit, or its body fed to a
//! [`BodySink`] as it arrives. Everything here runs in a worker and may block on disks.

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::head::Head;
use crate::response::Response;

/// The application behind the server.
pub trait Handler: Send + Sync + 'static {
    /// Decides what to do with a request whose head is complete. No byte of its body has been
    /// read yet, so a request refused here (a bad token, a wrong route) costs nothing more.
    fn begin(&self, head: &Head) -> Action;

    /// The answer to a request the layer itself refuses (a malformed head, bad framing, a body
    /// too slow or too large, the bodies' budget full). `error.status()` is the layer's status
    /// for it; the answer, its status included, is the application's (a protocol on some paths
    /// may have its own mapping), and so are headers it adds for the request, whose head is
    /// given when it was parsed.
    fn refused(&self, head: Option<&Head>, error: &Error) -> Response;

    /// Called once per answered request, after its last byte was written or the attempt failed.
    fn log(&self, record: &Record<'_>);

    /// Something about the server rather than a request (an accept error, once per burst).
    fn notice(&self, message: std::fmt::Arguments<'_>);

    /// Called by a worker that logged requests ([`log`](Self::log)) since it last called it and
    /// is about to wait for events with none ready (or to stand by): for what the application
    /// batches per thread, such as buffered log lines. Workers busy with a steady stream of
    /// events call it only when the stream pauses.
    fn idle(&self) {}

    /// Called by the timekeeper thread on each of its rounds (at most a second apart, more
    /// often when a timeout is short), for the application's own periodic work, so an idle
    /// server wakes no more often for it. Must not block for long: deadlines wait meanwhile.
    fn tick(&self) {}

    /// The server ran out of descriptors (`EMFILE` on accept) and has neither an idle
    /// connection nor an unfinished head of its own to close: the application may give up one
    /// of its own descriptors (sandboxd: a forwarded connection). True when it did or is about
    /// to (the server tries to accept again a moment later); false, the default: it has none,
    /// and the server backs off as after any accept error. Called from a worker; must not block.
    fn shed_descriptor(&self) -> bool {
        false
    }
}

/// How a request goes on after its head.
pub enum Action {
    /// Answer now without reading the body.
    Respond(Response),
    /// Read the whole body, at most `limit` bytes (more is answered with
    /// [`Error::BodyTooLarge`]), then answer with `then`. The connection waits for the body in
    /// the event loop, not in a worker. All bodies being collected share the server's
    /// `collect_budget`: one that would go past it is refused with [`Error::BodyBudget`].
    Collect {
        /// Most body bytes accepted.
        limit: usize,
        /// Makes the answer from the head and the whole body.
        then: Collected,
    },
    /// Feed the body to a sink as it arrives.
    Consume(Box<dyn BodySink>),
}

/// Makes the answer of an [`Action::Collect`] from the head and the whole body.
pub type Collected = Box<dyn FnOnce(&Head, Vec<u8>) -> Response + Send>;

/// Receives a request body piece by piece, in order. Dropped without [`end`](Self::end) when
/// the body cannot be completed (the peer left, a timeout, bad framing): the sink then undoes
/// what it started.
pub trait BodySink: Send {
    /// The next bytes of the body. An error is answered at once; the rest of the body is then
    /// discarded by the loop, within a cap, or the connection is closed.
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response>;

    /// The body is complete: the answer.
    fn end(self: Box<Self>) -> Response;
}

/// One access-log record. `method` and `target` are `-` for a head that could not be parsed.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The request method.
    pub method: &'a str,
    /// The request target as sent (the application redacts what must not be logged).
    pub target: &'a str,
    /// The status answered.
    pub status: u16,
    /// Body bytes written.
    pub bytes: u64,
    /// From the complete head to the last byte written.
    pub duration: Duration,
    /// When the request ended (its last byte written), by the wall clock.
    pub at: SystemTime,
}
