//! Pseudo-terminals: a master and slave pair from `/dev/ptmx`, and their window size.
//!
//! Both ends are opened close-on-exec and without becoming anyone's controlling terminal
//! (`O_NOCTTY`), so a concurrent spawn in another thread never inherits them; the child gets
//! the slave on its fds 0-2 through std's stdio and makes it its controlling terminal itself
//! (`sys::spawn`). Not `openpty(3)`: it opens without `O_CLOEXEC`, leaving a moment in which
//! another fork could take the descriptors along.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use super::check;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
}

/// A new pseudo-terminal of `size`: `(master, slave)`.
pub fn open(size: WindowSize) -> io::Result<(OwnedFd, OwnedFd)> {
    let master: File = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/ptmx")?;
    let fd = master.as_raw_fd();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which points at `unlock`, alive for
    // the call.
    check(unsafe { libc::ioctl(fd, libc::TIOCSPTLCK, &unlock) })?;
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int into `number`, alive for the call.
    check(unsafe { libc::ioctl(fd, libc::TIOCGPTN, &mut number) })?;
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(format!("/dev/pts/{number}"))?;
    let master = OwnedFd::from(master);
    set_window_size(master.as_fd(), size)?;
    Ok((master, OwnedFd::from(slave)))
}

/// Sets the window size of the terminal `fd` (either end); the foreground process group gets
/// `SIGWINCH` when it changes.
pub fn set_window_size(fd: BorrowedFd<'_>, size: WindowSize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize struct from the pointer, alive for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) }).map(drop)
}

/// The window size of the terminal `fd` (the tests' check of `set_window_size`).
#[cfg(test)]
pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<WindowSize> {
    let mut winsize = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize struct into `winsize`, alive for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut winsize) })?;
    Ok(WindowSize {
        rows: winsize.ws_row,
        cols: winsize.ws_col,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_pair_carries_bytes_and_its_size() {
        let size = WindowSize { rows: 24, cols: 80 };
        let Ok((master, slave)) = open(size) else {
            eprintln!("skipped: no /dev/ptmx");
            return;
        };
        assert_eq!(window_size(slave.as_fd()).unwrap(), size);
        let bigger = WindowSize {
            rows: 50,
            cols: 132,
        };
        set_window_size(master.as_fd(), bigger).unwrap();
        assert_eq!(window_size(slave.as_fd()).unwrap(), bigger);
        let mut master = File::from(master);
        let mut slave = File::from(slave);
        slave.write_all(b"hi").unwrap();
        let mut buf = [0u8; 16];
        let n = master.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
    }
}
