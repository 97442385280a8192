//! `FIFREEZE` and `FITHAW`: freezing the filesystem that holds a path (flushed and every new
//! write held until the thaw) and thawing it. Both need `CAP_SYS_ADMIN`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of `linux/fs.h` (the generic ioctl
/// encoding of x86_64 and aarch64); the argument is ignored.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// Freezes the filesystem holding `path`; one already frozen (`EBUSY`) is not an error.
pub fn freeze(path: &Path) -> io::Result<()> {
    match ioctl(path, FIFREEZE) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
        other => other,
    }
}

/// Thaws the filesystem holding `path`; one not frozen (`EINVAL`) is not an error.
pub fn thaw(path: &Path) -> io::Result<()> {
    match ioctl(path, FITHAW) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

fn ioctl(path: &Path, request: libc::c_ulong) -> io::Result<()> {
    let file = File::open(path)?;
    // SAFETY: `file` is open for the call; FIFREEZE and FITHAW take an int argument they
    // ignore (0) and touch no memory of ours.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), request as _, 0) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_path_is_its_open_error() {
        let error = freeze(Path::new("/nonexistent/sandboxd")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            thaw(Path::new("/nonexistent/sandboxd")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
