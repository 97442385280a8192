//! An edge-triggered epoll instance for one thread that owns many sockets: the port
//! forwarder's (`platform::forward::relay`). The HTTP crate has its own (one-shot, shared by
//! workers); this one hands back a batch of events per wait.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::check;

/// Readable, writable, hang-ups and the peer's half-close, each reported once per change.
pub const EDGE_ALL: u32 =
    (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET).cast_unsigned();
/// Readable, reported once per change: a listener or an eventfd.
pub const EDGE_IN: u32 = (libc::EPOLLIN | libc::EPOLLET).cast_unsigned();
/// In an event: there is something to read (data, the peer's end, or an error to collect).
pub const READABLE: u32 =
    (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR).cast_unsigned();
/// In an event: there is room to write (or an error to collect).
pub const WRITABLE: u32 = (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR).cast_unsigned();
/// In an event: the peer's end (or the connection's) came with it: read on to the end.
pub const ENDED: u32 = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR).cast_unsigned();

/// One readiness report: the token given at registration and what is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub token: u64,
    pub ready: u32,
}

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is wrapped exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    pub fn add(&self, fd: BorrowedFd<'_>, token: u64, events: u32) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` is an initialised epoll_event that outlives the call and is only
        // read; the descriptor is borrowed for the call (a closed one is reported by errno).
        check(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut event,
            )
        })?;
        Ok(())
    }

    /// Waits at most `timeout` (`None`: no limit) and fills `events` (cleared first) with what
    /// happened; nothing on timeout or when a signal interrupted the wait. Closing a
    /// descriptor removes it: there is no `delete`.
    pub fn wait(&self, events: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<()> {
        const BATCH: usize = 256;
        events.clear();
        let millis = match timeout {
            None => -1,
            // Rounded up, so a wait for a deadline never wakes just before it.
            Some(t) => {
                libc::c_int::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
            }
        };
        let mut raw = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        // SAFETY: `raw` is a writable array of BATCH epoll_events; the kernel writes at most
        // BATCH entries (the count passed), and the result says how many.
        let ready = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                raw.as_mut_ptr(),
                libc::c_int::try_from(BATCH).unwrap_or(1),
                millis,
            )
        };
        match check(ready) {
            Ok(n) => {
                let n = usize::try_from(n).unwrap_or(0).min(BATCH);
                events.extend(raw[..n].iter().map(|e| Event {
                    token: e.u64,
                    ready: e.events,
                }));
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::poll::EventFd;
    use std::os::fd::AsFd;

    #[test]
    fn an_edge_is_reported_once_with_its_token() {
        let epoll = Epoll::new().unwrap();
        let wake = EventFd::new().unwrap();
        epoll.add(wake.as_fd(), 7, EDGE_IN).unwrap();
        let mut events = Vec::new();
        epoll.wait(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(events.is_empty());
        wake.signal().unwrap();
        epoll.wait(&mut events, Some(Duration::ZERO)).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].token, 7);
        assert_ne!(events[0].ready & READABLE, 0);
        // Still readable, but no new edge.
        epoll.wait(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(events.is_empty());
    }
}
