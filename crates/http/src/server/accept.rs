//! Accepting connections: a new one is run at once by the worker that accepted it. Accept
//! errors never stop the server: one that concerns an aborted connection is ignored; running
//! out of descriptors frees one (the oldest idle connection, else the oldest unfinished head,
//! else whatever the application gives up: [`Handler::shed_descriptor`]) and tries again; and
//! anything else pauses accepting for a moment (the timekeeper resumes it).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::worker::Worker;
use super::{lock, Connection, Shared, LISTENER, WANT_IN};
use crate::conn::Conn;
use crate::handler::Handler;
use crate::sys;

/// Pause after an accept error that closing a connection could not cure.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Pause after the application was asked to give up a descriptor, which its own thread does a
/// moment later.
const SHED_WAIT: Duration = Duration::from_millis(2);

impl<H: Handler> Shared<H> {
    pub(super) fn accept(&self, worker: &mut Worker, now: Instant) {
        let accepted = {
            let listener = lock(&self.listener);
            let Some(listener) = listener.as_ref() else {
                return;
            };
            let accepted = sys::accept_nonblocking(listener);
            // Counted while the listener is held: once `pause_accepting` has taken it, every
            // connection accepted before is counted until its first run ends.
            if accepted.is_ok() {
                self.first_runs.fetch_add(1, Ordering::SeqCst);
            }
            // Re-armed at once unless accepting itself failed (then: below).
            if accepted.as_ref().map_or_else(is_transient, |_| true) {
                let _ = self.epoll.modify(listener.as_raw_fd(), LISTENER, WANT_IN);
            }
            accepted
        };
        match accepted {
            Ok(socket) => {
                self.accept_error_logged.store(false, Ordering::Relaxed);
                // Without TCP_NODELAY small answers wait for delayed ACKs (40 ms). Set on the
                // listener, it comes with the socket: no system call here.
                if !self.nodelay_inherited.load(Ordering::Relaxed) {
                    let _ = socket.set_nodelay(true);
                }
                let connection = Connection {
                    socket,
                    conn: Conn::new(now + self.limits.header_timeout),
                    registered: false,
                };
                let token = lock(&self.slots).reserve();
                self.drive(token, connection, worker, now);
                self.first_runs.fetch_sub(1, Ordering::SeqCst);
            }
            Err(e) if is_transient(&e) => {}
            Err(e) => {
                if !self.accept_error_logged.swap(true, Ordering::Relaxed) {
                    self.handler
                        .notice(format_args!("accept failed: {e}; retrying"));
                }
                let retry = if is_resource_exhaustion(&e) {
                    self.free_descriptor()
                } else {
                    None
                };
                match retry {
                    Some(Duration::ZERO) => self.rearm_listener(),
                    wait => {
                        let wait = wait.unwrap_or(ACCEPT_BACKOFF);
                        *lock(&self.accept_paused_until) = Some(Instant::now() + wait);
                        self.timekeeper.notify_all();
                    }
                }
            }
        }
    }

    /// Frees a descriptor for the next accept: a parked connection of the server's own closed
    /// at once (`Some(ZERO)`), else one the application gives up, closed by its own thread in
    /// a moment (`Some(SHED_WAIT)`); `None` when neither has one.
    fn free_descriptor(&self) -> Option<Duration> {
        let evicted = lock(&self.slots).evict_for_descriptor();
        if evicted.is_some() {
            // Closed outside the lock.
            drop(evicted);
            return Some(Duration::ZERO);
        }
        self.handler.shed_descriptor().then_some(SHED_WAIT)
    }

    pub(super) fn rearm_listener(&self) {
        if let Some(listener) = lock(&self.listener).as_ref() {
            let _ = self.epoll.modify(listener.as_raw_fd(), LISTENER, WANT_IN);
        }
    }
}

/// Errors that concern one aborted connection, not the listener.
fn is_transient(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::WouldBlock
        || matches!(
            error.raw_os_error(),
            Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EPERM)
        )
}

fn is_resource_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}
