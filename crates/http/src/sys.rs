//! Socket and readiness calls std does not offer: epoll, eventfd, `poll`, `send` with flags,
//! `sendfile`. The only module of the crate with `unsafe`; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What a parked connection waits for, as the timekeeper's sweep asks `poll` (readiness of a
/// connection is reported by its edge-triggered registration, [`EDGE`]): readable or the peer
/// half-closed.
pub const WANT_READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Writable.
pub const WANT_WRITE: u32 = libc::EPOLLOUT as u32;
/// Only the peer leaving (hang-up, error, half-close): a connection waiting for its producer.
pub const WANT_HANGUP: u32 = libc::EPOLLRDHUP as u32;
/// A connection's registration, made once: every change of readiness is reported as it
/// happens (edge-triggered), so parking a connection needs no `epoll_ctl`. An edge reported
/// while no worker awaits it is not repeated: the server keeps what it knows (see
/// `server::worker`).
pub const EDGE: u32 =
    (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET).cast_unsigned();

/// Turns a libc return value into `io::Result`, reading `errno` when it is -1.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`check`], for calls returning `ssize_t`.
fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

/// An epoll instance. Safe to share between threads: the kernel serialises `epoll_ctl`.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns, so wrapping it in OwnedFd is sound.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
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

    /// Waits up to `timeout_ms` (-1: forever) for events; their tokens go into `tokens` (at
    /// most its capacity, which is left as is), and how many came is returned (0 on timeout or
    /// interruption).
    pub fn wait(&self, tokens: &mut Vec<u64>, timeout_ms: i32) -> io::Result<usize> {
        const MOST: usize = 64;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; MOST];
        let most = tokens
            .capacity()
            .saturating_sub(tokens.len())
            .clamp(1, MOST);
        let most_c = libc::c_int::try_from(most).unwrap_or(1);
        // SAFETY: `events` holds `MOST` writable epoll_events and the kernel writes at most
        // `most` <= MOST entries.
        let ret = unsafe {
            libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), most_c, timeout_ms)
        };
        match check(ret) {
            Ok(n) => {
                let n = usize::try_from(n).unwrap_or(0).min(most);
                tokens.extend(events[..n].iter().map(|event| event.u64));
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Accepts a connection on `listener`, its socket non-blocking and close-on-exec from the start
/// (`accept4`: no `ioctl` after it, as `TcpStream::set_nonblocking` would make).
pub fn accept_nonblocking(listener: &TcpListener) -> io::Result<TcpStream> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: null address pointers are allowed (the peer's address is not wanted); a
    // non-negative result is a new descriptor nothing else owns.
    let fd = check(unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            flags,
        )
    })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { TcpStream::from_raw_fd(fd) })
}

/// Sets `TCP_NODELAY` on a listening socket: Linux copies it to every socket accepted from it
/// (the listener's `tcp_sock` is cloned), so no `setsockopt` is needed per connection.
pub fn set_listener_nodelay(listener: &TcpListener) -> io::Result<()> {
    set_tcp_flag(listener.as_raw_fd(), libc::TCP_NODELAY, true)
}

/// Sets or clears `TCP_CORK` on a connection: while set, only full segments leave (a partial
/// one waits for more bytes, at most 200 ms); clearing it sends what waits at once.
pub fn set_cork(socket: RawFd, on: bool) -> io::Result<()> {
    set_tcp_flag(socket, libc::TCP_CORK, on)
}

fn set_tcp_flag(socket: RawFd, option: libc::c_int, on: bool) -> io::Result<()> {
    let value = libc::c_int::from(on);
    let size = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: `value` is a live `c_int` for the call and its size is passed with it.
    check(unsafe {
        libc::setsockopt(
            socket,
            libc::IPPROTO_TCP,
            option,
            std::ptr::addr_of!(value).cast(),
            size,
        )
    })?;
    Ok(())
}

/// A non-blocking eventfd, used to wake a thread blocked in `epoll_wait`.
pub fn eventfd() -> io::Result<File> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `send` without blocking and without `SIGPIPE`; with `more`, tells the kernel more data
/// follows (`MSG_MORE`), so a response head and the first bytes of a file share a segment.
pub fn send(fd: RawFd, buf: &[u8], more: bool) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if more { libc::MSG_MORE } else { 0 };
    // SAFETY: `buf` is a valid readable slice for its whole length during the call.
    check_size(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) })
}

/// [`send`] of several buffers in one call (`sendmsg`), in order: a chunk's size line, its
/// bytes and its CRLF go out without being copied together first.
pub fn send_vectored(fd: RawFd, bufs: &[io::IoSlice<'_>], more: bool) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if more { libc::MSG_MORE } else { 0 };
    // SAFETY: a zeroed msghdr is valid (no name, no control data); only its iovec fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `struct iovec` (std guarantees it on Unix); the kernel
    // only reads through these pointers.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    // `size_t` with glibc, `int` with musl.
    #[allow(clippy::useless_conversion)]
    {
        msg.msg_iovlen = bufs
            .len()
            .try_into()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    }
    // SAFETY: `msg` points at `bufs.len()` live iovecs, each a readable slice for the call.
    check_size(unsafe { libc::sendmsg(fd, &msg, flags) })
}

/// True when `fd` is ready now for any of `events` (`EPOLLIN`/`EPOLLOUT` bits) or has hung up.
pub fn is_ready(fd: RawFd, events: u32) -> bool {
    let mut wanted: libc::c_short = 0;
    if events & libc::EPOLLIN as u32 != 0 {
        wanted |= libc::POLLIN;
    }
    if events & libc::EPOLLOUT as u32 != 0 {
        wanted |= libc::POLLOUT;
    }
    if events & libc::EPOLLRDHUP as u32 != 0 {
        wanted |= libc::POLLRDHUP;
    }
    let mut pollfd = libc::pollfd {
        fd,
        events: wanted,
        revents: 0,
    };
    // SAFETY: `pollfd` is one valid, writable pollfd; a timeout of 0 never blocks.
    let ret = unsafe { libc::poll(&mut pollfd, 1, 0) };
    ret > 0 && pollfd.revents != 0
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
    *offset = u64::try_from(off).unwrap_or(*offset);
    Ok(sent)
}

/// `CLOCK_REALTIME_COARSE`: the wall clock as of the last timer tick (1-4 ms old), read from the
/// vDSO's data without the hardware counter. `None` if the kernel refuses the clock.
pub fn realtime_coarse() -> Option<(i64, i64)> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    (ret == 0).then_some((ts.tv_sec, ts.tv_nsec))
}

/// The allocator of the crate's unit tests (and, through [`crate::fuzzing`], of sandboxd's): the
/// system's, counting each thread's allocations, so a test can prove a path allocates nothing
/// (see `server::tests`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting.
    pub struct Counting;

    thread_local! {
        static MADE: Cell<u64> = const { Cell::new(0) };
    }

    /// Allocations (`alloc`, `alloc_zeroed`, `realloc`) made by the calling thread so far.
    pub fn made() -> u64 {
        MADE.with(Cell::get)
    }

    fn count() {
        // Not while the thread ends (its counter may be gone).
        let _ = MADE.try_with(|made| made.set(made.get() + 1));
    }

    // SAFETY: every call goes to the system allocator unchanged; counting touches only a
    // const-initialised thread-local `Cell`, which never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.realloc(ptr, layout, new_size) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[cfg(test)]
    #[global_allocator]
    static ALLOCATOR: Counting = Counting;
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_socket_accepted_from_a_nodelay_listener_has_nodelay() {
        for address in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(address) else {
                continue; // no IPv6 on this machine
            };
            let _before = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let plain = super::accept_nonblocking(&listener).unwrap();
            assert!(!plain.nodelay().unwrap(), "{address}: on before it was set");
            super::set_listener_nodelay(&listener).unwrap();
            let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let socket = super::accept_nonblocking(&listener).unwrap();
            assert!(socket.nodelay().unwrap(), "{address}: not inherited");
        }
    }

    #[test]
    fn an_accepted_socket_is_non_blocking_and_close_on_exec_from_the_start() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let socket = super::accept_nonblocking(&listener).unwrap();
        // SAFETY: F_GETFL and F_GETFD take no pointers; the descriptor is open.
        let (status, descriptor) = unsafe {
            (
                libc::fcntl(socket.as_raw_fd(), libc::F_GETFL),
                libc::fcntl(socket.as_raw_fd(), libc::F_GETFD),
            )
        };
        assert_ne!(status & libc::O_NONBLOCK, 0, "non-blocking");
        assert_ne!(descriptor & libc::FD_CLOEXEC, 0, "close-on-exec");
    }
}
