//! Socket and readiness calls std does not offer: epoll, eventfd, `send` with flags, `sendfile`.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{check, check_size};

/// Readiness for reading, one-shot: after one event the descriptor is disarmed until re-armed.
pub const EPOLL_READ_ONESHOT: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;
/// Level-triggered readiness for reading (listeners, wake-up descriptors).
pub const EPOLL_READ: u32 = libc::EPOLLIN as u32;

/// An epoll instance. Safe to share between threads: the kernel serialises `epoll_ctl`.
pub struct Epoll {
    fd: OwnedFd,
}

/// One readiness event: the token registered with the descriptor.
#[derive(Clone, Copy)]
pub struct Event {
    pub token: u64,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns, so wrapping it in OwnedFd is sound.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    pub fn modify(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` is a valid, initialised epoll_event that outlives the call; the kernel
        // only reads it. Invalid descriptors are reported through errno.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut event) })?;
        Ok(())
    }

    /// Waits up to `timeout_ms` (-1: forever) and appends the ready tokens to `out`.
    pub fn wait(&self, out: &mut Vec<Event>, timeout_ms: i32) -> io::Result<()> {
        const BATCH: usize = 256;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        // SAFETY: `events` is a writable array of BATCH epoll_event; the kernel writes at most
        // BATCH entries and returns how many.
        let ret = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                BATCH as i32,
                timeout_ms,
            )
        };
        match check(ret) {
            Ok(n) => {
                out.extend(events[..n as usize].iter().map(|e| Event { token: e.u64 }));
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A non-blocking eventfd, used to wake a thread blocked in `epoll_wait`.
pub fn eventfd() -> io::Result<File> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `send` with `MSG_MORE` (more data follows: hold the segment) or `MSG_DONTWAIT` semantics.
fn send_flags(fd: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is a valid readable slice for its whole length during the call.
    check_size(unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            flags | libc::MSG_NOSIGNAL,
        )
    })
}

/// Sends `buf` telling the kernel that more data follows, so the response head and the first
/// bytes of a file leave in the same segment.
pub fn send_more(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, libc::MSG_MORE)
}

/// Sends without blocking: used for the acceptor's canned answers, which must never stall it.
pub fn send_nonblocking(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    send_flags(fd, buf, libc::MSG_DONTWAIT)
}

/// Reads what is already there without blocking; `WouldBlock` when nothing is.
pub fn recv_nonblocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable slice for its whole length during the call.
    check_size(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) })
}

/// `sendfile(2)`: copies up to `count` bytes of `file` from `*offset` to `socket` inside the
/// kernel and advances `*offset` by the amount sent.
pub fn sendfile(socket: RawFd, file: RawFd, offset: &mut u64, count: usize) -> io::Result<usize> {
    let mut off = i64::try_from(*offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    // SAFETY: `off` is a valid i64 the kernel reads and updates; both descriptors are checked by
    // the kernel.
    let sent = check_size(unsafe { libc::sendfile(socket, file, &mut off, count) })?;
    *offset = off as u64;
    Ok(sent)
}
