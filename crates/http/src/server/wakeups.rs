//! Work for the workers that does not come from a socket: a streamed answer's producer with
//! new bytes, a connection whose deadline passed.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use super::{lock, Connection, WAKE, WANT_IN};
use crate::sys::Epoll;

/// Work for a worker that did not come from a socket event.
pub(super) enum Dispatch {
    /// The producer of the connection's streamed answer has bytes (or finished).
    Wake(u64),
    /// A connection taken from its slot because its deadline passed.
    Run(u64, Box<Connection>),
}

/// The queue of [`Dispatch`]es, signalled through an eventfd registered one-shot: each signal
/// wakes one worker, which takes one item and re-arms the eventfd, so further items wake others.
pub(super) struct Wakeups {
    pub(super) queue: Mutex<VecDeque<Dispatch>>,
    pub(super) fd: File,
    /// Items pushed so far, and connections run again by their own worker at a turn's end
    /// instead: a test's proof that a long send wakes no other worker.
    #[cfg(test)]
    pub(super) pushed: std::sync::atomic::AtomicU64,
    #[cfg(test)]
    pub(super) kept: std::sync::atomic::AtomicU64,
    /// `sendfile` calls refused for want of room: a test's proof that a short one whose
    /// socket is full is the last before the edge.
    #[cfg(test)]
    pub(super) refused_sendfiles: std::sync::atomic::AtomicU64,
}

impl Wakeups {
    pub(super) fn push(&self, dispatch: Dispatch) {
        let mut queue = lock(&self.queue);
        queue.push_back(dispatch);
        #[cfg(test)]
        self.pushed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    pub(super) fn pop(&self, epoll: &Epoll) -> Option<Dispatch> {
        let dispatch = {
            let mut queue = lock(&self.queue);
            let dispatch = queue.pop_front();
            if queue.is_empty() {
                let mut counter = [0u8; 8];
                let _ = (&self.fd).read(&mut counter);
            }
            dispatch
        };
        let _ = epoll.modify(self.fd.as_raw_fd(), WAKE, WANT_IN);
        dispatch
    }
}
