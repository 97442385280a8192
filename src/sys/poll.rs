//! Waiting on descriptors: `poll(2)` for readability or writability, an `eventfd(2)` another
//! thread can make readable to wake the waiter, and `O_NONBLOCK` on a descriptor.
//!
//! Owns those calls. Reading and writing the eventfd's 8-byte counter go through
//! `std::fs::File`, so they need no `unsafe`. Used by the directory watcher thread
//! (`fs::watch`), which waits on its inotify descriptor and on an eventfd that workers signal,
//! and by the process I/O thread (`proc`), which waits on its children's pipes and terminals.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::check;

/// A counter another thread increments to wake a thread polling it. Non-blocking, closed on
/// exec.
#[derive(Debug)]
pub struct EventFd {
    file: File,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no one else; it is
        // wrapped exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd {
            file: File::from(fd),
        })
    }

    /// Makes the descriptor readable. A counter already at its maximum (`EAGAIN`) is readable
    /// anyway, so that is success too.
    pub fn signal(&self) -> io::Result<()> {
        match (&self.file).write(&1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Resets the counter, so the descriptor is not readable until the next [`signal`].
    ///
    /// [`signal`]: EventFd::signal
    pub fn drain(&self) -> io::Result<()> {
        let mut counter = [0u8; 8];
        match (&self.file).read(&mut counter) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Waits until one of `fds` is readable (or has an error or hang-up, which a read then
/// reports), at most `timeout` (`None`: no limit). Returns, for each descriptor in order,
/// whether it is ready; all `false` on timeout or when a signal interrupted the wait.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    poll(&mut polled, timeout)?;
    Ok(polled.iter().map(|p| p.revents != 0).collect())
}

/// What a descriptor is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    Read,
    Write,
    /// `POLLPRI`: a kernfs file (`cgroup.events`) changed since it was last read.
    Priority,
}

/// Waits until one of `fds` is ready for what it is waited for (or has an error or hang-up,
/// which the next read or write then reports), at most `timeout` (`None`: no limit). Returns,
/// for each descriptor in order, whether it is ready; all `false` on timeout or when a signal
/// interrupted the wait.
pub fn poll_ready(
    fds: &[(BorrowedFd<'_>, Interest)],
    timeout: Option<Duration>,
) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|(fd, interest)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: match interest {
                Interest::Read => libc::POLLIN,
                Interest::Write => libc::POLLOUT,
                Interest::Priority => libc::POLLPRI,
            },
            revents: 0,
        })
        .collect();
    poll(&mut polled, timeout)?;
    Ok(polled.iter().map(|p| p.revents != 0).collect())
}

/// Sets `O_NONBLOCK` on the open file description of `fd`: reads and writes that would wait
/// fail with `WouldBlock` instead. (Other descriptors for the same pipe end, such as a
/// child's, have their own description and are unaffected.)
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the descriptor's flags.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: F_SETFL takes an int of flags; the descriptor is borrowed for the call.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    }
    Ok(())
}

/// Asks the kernel to let the pipe of `fd` hold `size` bytes (`F_SETPIPE_SZ`); its answer,
/// the size it has now. Refused above `/proc/sys/fs/pipe-max-size` for an unprivileged caller.
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: usize) -> io::Result<usize> {
    let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ takes an int; the descriptor is borrowed for the call.
    let now = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) })?;
    Ok(usize::try_from(now).unwrap_or(0))
}

/// `poll(2)` on `polled`, filling each `revents`; an interrupted wait reports nothing ready.
fn poll(polled: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    for entry in polled.iter_mut() {
        entry.revents = 0;
    }
    let millis = match timeout {
        None => -1,
        // Rounded up, so a wait for a deadline never wakes just before it.
        Some(timeout) => {
            let millis = timeout.as_nanos().div_ceil(1_000_000);
            libc::c_int::try_from(millis).unwrap_or(libc::c_int::MAX)
        }
    };
    let count = libc::nfds_t::try_from(polled.len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `polled` is a live array of `count` initialised pollfd structs, which the kernel
    // reads and writes (only `revents`) during the call; the descriptors are borrowed for it.
    let ready = unsafe { libc::poll(polled.as_mut_ptr(), count, millis) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            for entry in polled.iter_mut() {
                entry.revents = 0;
            }
            return Ok(());
        }
        return Err(error);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn an_eventfd_wakes_a_poll_until_drained() {
        let wake = EventFd::new().unwrap();
        let started = Instant::now();
        let ready = poll_readable(&[wake.as_fd()], Some(Duration::from_millis(20))).unwrap();
        assert_eq!(ready, vec![false]);
        assert!(started.elapsed() >= Duration::from_millis(20));
        wake.signal().unwrap();
        wake.signal().unwrap();
        let ready = poll_readable(&[wake.as_fd()], None).unwrap();
        assert_eq!(ready, vec![true]);
        wake.drain().unwrap();
        let ready = poll_readable(&[wake.as_fd()], Some(Duration::ZERO)).unwrap();
        assert_eq!(ready, vec![false]);
        wake.drain().unwrap();
    }

    #[test]
    fn a_full_pipe_is_not_writable_until_read() {
        let (reader, writer) = std::io::pipe().unwrap();
        set_nonblocking(writer.as_fd()).unwrap();
        let mut writer = File::from(std::os::fd::OwnedFd::from(writer));
        let chunk = [0u8; 4096];
        let mut written = 0;
        loop {
            match writer.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(written >= 4096);
        let writable = |timeout| poll_ready(&[(writer.as_fd(), Interest::Write)], Some(timeout));
        assert_eq!(writable(Duration::from_millis(10)).unwrap(), vec![false]);
        let mut reader = File::from(std::os::fd::OwnedFd::from(reader));
        let mut buf = vec![0u8; written];
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(writable(Duration::ZERO).unwrap(), vec![true]);
    }

    #[test]
    fn readiness_is_reported_per_descriptor() {
        let (quiet, loud) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        loud.signal().unwrap();
        let ready = poll_readable(&[quiet.as_fd(), loud.as_fd()], Some(Duration::ZERO)).unwrap();
        assert_eq!(ready, vec![false, true]);
    }
}
