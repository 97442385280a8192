//! Sockets std does not make: a TCP connection started without waiting (`connect` on a
//! non-blocking socket), the kernel's `NETLINK_SOCK_DIAG` socket, which lists sockets, and
//! `splice(2)` between a socket and a pipe, which moves bytes without copying them through
//! user memory.
//!
//! Used by the port forwarder (`platform::forward`). The netlink messages themselves are built
//! and parsed in safe code there (`scan`); this module only moves their bytes.

use std::io;
use std::mem;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{check, check_size};

/// A non-blocking TCP socket of `addr`'s family, not connected yet, so that its descriptor can
/// be judged before anything is sent; [`connect_nonblocking`] connects it.
pub fn tcp_socket_for(addr: SocketAddr) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket takes no pointers; a non-negative result is a new descriptor.
    let fd = check(unsafe { libc::socket(family, kind, 0) })?;
    // SAFETY: `fd` was just returned by the kernel and is wrapped exactly once.
    Ok(TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Connects `stream` (non-blocking, of [`tcp_socket_for`]) to `addr`: `true` when the
/// connection is already made (loopback often is), `false` while it is under way
/// (`EINPROGRESS`: writable once done, `take_error` then says how it ended).
pub fn connect_nonblocking(stream: &TcpStream, addr: SocketAddr) -> io::Result<bool> {
    let (storage, len) = sockaddr(addr);
    // SAFETY: `storage` holds a sockaddr_in or sockaddr_in6 of `len` bytes, initialised by
    // `sockaddr`, alive for the call and only read by the kernel.
    let ret = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            (&raw const storage).cast::<libc::sockaddr>(),
            len,
        )
    };
    match check(ret) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `addr` as the C structure and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data for which all-zero bytes are valid.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::sa_family_t::try_from(libc::AF_INET6).unwrap_or(10),
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, libc::socklen_t::try_from(len).unwrap_or(0))
}

/// A non-blocking pipe for [`splice`]: (read end, write end), of at most `size` bytes where the
/// kernel allows it (the default, 64 KiB, otherwise).
pub fn splice_pipe(size: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a writable array of two ints, which pipe2 fills on success.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just returned by the kernel and are wrapped exactly once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ takes an int; a refusal (above /proc/sys/fs/pipe-max-size) leaves
    // the pipe as it was, which is fine.
    let _ = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
    Ok((read, write))
}

/// Moves up to `len` bytes from `from` to `to`, one of which is a pipe, without waiting:
/// `WouldBlock` when `from` has nothing or `to` has no room; 0 at the end of `from`.
pub fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are borrowed for the call; null offsets mean each file's own
        // position (required for pipes and sockets). No memory is passed.
        let moved = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                to.as_raw_fd(),
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
            )
        };
        match check_size(moved) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Makes closing `stream` abort its connection (`SO_LINGER` of 0: a reset, anything unsent
/// dropped) instead of ending it, so that its peer cannot take a cut stream for a whole one.
pub fn reset_on_close(stream: &TcpStream) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let len = libc::socklen_t::try_from(mem::size_of::<libc::linger>()).unwrap_or(8);
    // SAFETY: `linger` is a live value of the type SO_LINGER takes, its size passed with it;
    // the descriptor is borrowed for the call.
    check(unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast::<libc::c_void>(),
            len,
        )
    })
    .map(drop)
}

/// Sets `stream`'s congestion control (`TCP_CONGESTION`) to the algorithm named `name`.
pub fn set_congestion(stream: &TcpStream, name: &str) -> io::Result<()> {
    let len = libc::socklen_t::try_from(name.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is live and readable for `len` bytes during the call; the descriptor is
    // borrowed for the call.
    check(unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast::<libc::c_void>(),
            len,
        )
    })
    .map(drop)
}

/// The name of `stream`'s congestion control (the tests' look at what was set).
#[cfg(test)]
pub fn congestion(stream: &TcpStream) -> io::Result<String> {
    // TCP_CA_NAME_MAX
    let mut name = [0u8; 16];
    let mut len = libc::socklen_t::try_from(name.len()).unwrap_or(0);
    // SAFETY: `name` is writable for `len` bytes and `len` is a live `socklen_t`, both for the
    // call; the kernel writes at most `len` bytes and stores how many in `len`.
    check(unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast::<libc::c_void>(),
            &raw mut len,
        )
    })?;
    let written = &name[..usize::try_from(len).unwrap_or(0).min(name.len())];
    let end = written
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(written.len());
    Ok(String::from_utf8_lossy(&written[..end]).into_owned())
}

/// Listens again on `listener` with this backlog (Linux takes a second `listen` as a change of
/// the queue's length).
pub fn set_backlog(listener: &std::net::TcpListener, backlog: i32) -> io::Result<()> {
    // SAFETY: listen takes no pointers; the descriptor is borrowed for the call.
    check(unsafe { libc::listen(listener.as_raw_fd(), backlog) }).map(drop)
}

/// Whether `fd` is a stream socket in `LISTEN` (an error: it is no socket at all). The port
/// forwarder checks a listener a previous image handed over (`platform::forward::relay`).
pub fn is_listening(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut values = [0 as libc::c_int; 2];
    for (option, value) in [libc::SO_ACCEPTCONN, libc::SO_TYPE]
        .into_iter()
        .zip(values.iter_mut())
    {
        let mut len = libc::socklen_t::try_from(mem::size_of::<libc::c_int>()).unwrap_or(4);
        // SAFETY: `value` and `len` are valid for writes of a c_int and its size; the
        // descriptor is borrowed for the call.
        check(unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (value as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
    }
    Ok(values[0] != 0 && values[1] == libc::SOCK_STREAM)
}

/// The bytes waiting in a pipe (`FIONREAD` on its read end).
pub fn pipe_len(read_end: BorrowedFd<'_>) -> io::Result<usize> {
    let mut len: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer, which is valid for it; the descriptor is
    // borrowed for the call.
    check(unsafe { libc::ioctl(read_end.as_raw_fd(), libc::FIONREAD, &mut len) })?;
    usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A `NETLINK_SOCK_DIAG` socket: requests go to the kernel, answers come back as datagrams.
pub struct DiagSocket {
    fd: OwnedFd,
}

impl DiagSocket {
    pub fn open() -> io::Result<DiagSocket> {
        let kind = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC;
        // SAFETY: socket takes no pointers; a non-negative result is a new descriptor.
        let fd = check(unsafe { libc::socket(libc::AF_NETLINK, kind, libc::NETLINK_SOCK_DIAG) })?;
        // SAFETY: `fd` was just returned by the kernel and is wrapped exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DiagSocket { fd })
    }

    /// Sends one request (a whole netlink message) to the kernel.
    pub fn send(&self, message: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_nl is plain old data for which all-zero bytes are valid.
        let mut kernel: libc::sockaddr_nl = unsafe { mem::zeroed() };
        kernel.nl_family = libc::sa_family_t::try_from(libc::AF_NETLINK).unwrap_or(16);
        let len = libc::socklen_t::try_from(mem::size_of::<libc::sockaddr_nl>()).unwrap_or(0);
        // SAFETY: `message` is a live buffer of its length and `kernel` a sockaddr_nl of
        // `len` bytes; both are only read during the call.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
                (&raw const kernel).cast::<libc::sockaddr>(),
                len,
            )
        };
        check_size(sent).map(drop)
    }

    /// Receives one datagram of the answer into `buf` (blocking); its length.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is a live, writable buffer of its length; the kernel writes at most
            // that many bytes.
            let got =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            match check_size(got) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn a_stream_closed_after_reset_on_close_is_reset_not_ended() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        reset_on_close(&server).unwrap();
        drop(server);
        let mut buf = [0u8; 8];
        let err = client.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        // Without it, the same close is an end of stream.
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        drop(server);
        assert_eq!(client.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn a_streams_congestion_control_is_set_and_read_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Reno is the kernel's own, always there.
        set_congestion(&stream, "reno").unwrap();
        assert_eq!(congestion(&stream).unwrap(), "reno");
        let err = set_congestion(&stream, "no-such-algorithm").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(congestion(&stream).unwrap(), "reno");
    }

    #[test]
    fn a_listener_is_listening_and_a_pipe_says_what_it_holds() {
        use std::os::fd::AsFd;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening(listener.as_fd()).unwrap());
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(!is_listening(stream.as_fd()).unwrap());
        let (read, write) = splice_pipe(1 << 16).unwrap();
        assert!(is_listening(read.as_fd()).is_err(), "a pipe is no socket");
        assert_eq!(pipe_len(read.as_fd()).unwrap(), 0);
        std::fs::File::from(write).write_all(b"seven b").unwrap();
        assert_eq!(pipe_len(read.as_fd()).unwrap(), 7);
    }

    #[test]
    fn a_connection_started_without_waiting_reaches_a_loopback_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        let mut stream = tcp_socket_for(to).unwrap();
        let done = connect_nonblocking(&stream, to).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        if !done {
            let fd = std::os::fd::AsFd::as_fd(&stream);
            crate::sys::poll::poll_ready(&[(fd, crate::sys::poll::Interest::Write)], None).unwrap();
        }
        assert!(stream.take_error().unwrap().is_none());
        stream.set_nonblocking(false).unwrap();
        stream.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let port = TcpListener::bind("[::1]:0").unwrap().local_addr().unwrap();
        // The listener is closed: nothing listens on the port now.
        let stream = tcp_socket_for(port).unwrap();
        match connect_nonblocking(&stream, port) {
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED)),
            Ok(_) => {
                let fd = std::os::fd::AsFd::as_fd(&stream);
                crate::sys::poll::poll_ready(&[(fd, crate::sys::poll::Interest::Write)], None)
                    .unwrap();
                assert!(stream.take_error().unwrap().is_some());
            }
        }
    }
}
