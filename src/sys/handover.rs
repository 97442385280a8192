//! Descriptors carried across a live upgrade's `execve` (`crate::upgrade`): a memory file for
//! the state, the close-on-exec flag, and taking back, in the new image, the descriptors the old
//! one left open under numbers it named.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::check;

/// An anonymous file in memory (`memfd_create`), closed on exec until told otherwise.
pub fn memory_file(name: &str) -> io::Result<File> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `name` is a NUL-terminated string alive for the call; the flags are constants.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel for this process and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Sets or clears `FD_CLOEXEC` on `fd` (cleared: the descriptor survives `execve`).
pub fn set_close_on_exec(fd: &impl AsRawFd, close: bool) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller holds; F_GETFD reads only its flags.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let flags = if close {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above; F_SETFD changes only this descriptor's flags.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) }).map(drop)
}

/// Whether `fd` is open in this process.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD on any number is harmless: EBADF when nothing is open there.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Takes ownership of `fd`, an inherited listening TCP socket, as a listener closed on exec.
/// Refused (and left alone) when nothing is open there or it is not a listening TCP socket.
///
/// Only for numbers the previous image named, before this process opens anything of its own
/// that could have been given the same number: then nothing else in the process owns it.
pub fn take_listener(fd: RawFd) -> io::Result<TcpListener> {
    if fd < 3 || !is_open(fd) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let mut listening: libc::c_int = 0;
    let mut kind: libc::c_int = 0;
    for (option, value) in [
        (libc::SO_ACCEPTCONN, &mut listening),
        (libc::SO_TYPE, &mut kind),
    ] {
        const INT_SIZE: libc::socklen_t = 4;
        const _: () = assert!(std::mem::size_of::<libc::c_int>() == INT_SIZE as usize);
        let mut len = INT_SIZE;
        // SAFETY: `value` and `len` are valid for writes of a c_int and its size.
        check(unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (value as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
    }
    if listening == 0 || kind != libc::SOCK_STREAM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a listening stream socket",
        ));
    }
    // SAFETY: per this function's contract, `fd` is open, inherited, and owned by nothing else.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    set_close_on_exec(&listener, true)?;
    Ok(listener)
}

/// Takes ownership of `fd`, an inherited descriptor of any kind, closed on exec. Same contract
/// as [`take_listener`].
pub fn take_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 || !is_open(fd) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: per the contract, `fd` is open, inherited, and owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_close_on_exec(&owned, true)?;
    Ok(owned)
}

/// Takes ownership of `fd`, an inherited file (the state), closed on exec. Same contract as
/// [`take_listener`].
pub fn take_file(fd: RawFd) -> io::Result<File> {
    take_fd(fd).map(File::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::IntoRawFd;

    #[test]
    fn a_memory_file_holds_what_is_written() {
        let mut file = memory_file("test").unwrap();
        file.write_all(b"state").unwrap();
        file.rewind().unwrap();
        let mut back = String::new();
        file.read_to_string(&mut back).unwrap();
        assert_eq!(back, "state");
    }

    #[test]
    fn only_a_listening_socket_is_taken_as_a_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let taken = take_listener(listener.into_raw_fd()).unwrap();
        assert_eq!(taken.local_addr().unwrap(), addr);
        let file = memory_file("not-a-socket").unwrap();
        assert!(take_listener(file.as_raw_fd()).is_err());
        assert!(take_listener(-1).is_err());
        assert!(take_listener(1 << 20).is_err());
    }
}
