//! Files without a name: creating one with `O_TMPFILE` and naming it with `linkat(2)`.
//!
//! An `O_TMPFILE` file lives in a directory's filesystem but in no directory until it is linked,
//! so a process killed before that leaves nothing behind. The link goes through the file's
//! `/proc/self/fd/N` magic link with `AT_SYMLINK_FOLLOW`, which needs `/proc` but no capability
//! (`AT_EMPTY_PATH` would need `CAP_DAC_READ_SEARCH`). Deciding when to use them, and what to do
//! where the filesystem or the kernel cannot, is `fs::atomic`'s business.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::check;

/// Opens a new unnamed regular file in `dir`, for reading and writing, with `mode` (less the
/// umask). Linkable later (no `O_EXCL`).
pub fn open_unnamed(dir: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .mode(mode)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
}

/// Whether the error of [`open_unnamed`] means "no `O_TMPFILE` here" (the filesystem does not
/// implement it: `EOPNOTSUPP`; a kernel before 3.11 reads the flags as `O_DIRECTORY` and
/// answers `EISDIR`; some FUSE and network filesystems answer `EINVAL` or `ENOSYS`), rather
/// than a real failure such as a full disk or a missing directory.
pub fn unnamed_unsupported(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOSYS)
    )
}

/// Whether this process can name unnamed files: `/proc/self/fd` is there.
pub fn can_link_unnamed() -> bool {
    Path::new("/proc/self/fd").is_dir()
}

/// Gives `file` (an unnamed file, or any file) the new name `to`. Fails with `EEXIST` when `to`
/// exists: a link never replaces anything.
pub fn link_unnamed(file: &File, to: &Path) -> io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let to = CString::new(to.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both paths are NUL-terminated CStrings alive for the call; `file` stays open for
    // the borrow, so the descriptor number in `from` names it; AT_FDCWD with absolute or
    // relative paths needs no directory descriptor.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })?;
    Ok(())
}

/// Which times [`touch`] sets to now, and so what inotify reports of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The access and modification times: an attribute change (`IN_ATTRIB`), as `utime`.
    Times,
    /// The modification time alone: a modification (`IN_MODIFY`), as a write.
    Modified,
}

/// Sets times of the file at `path` (not following a final symlink) to now, and nothing else:
/// the data, owner and mode are untouched; what a directory watcher is told is `what`'s.
pub fn touch(path: &Path, what: Touch) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    };
    let access = match what {
        Touch::Times => now,
        Touch::Modified => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    };
    let times = [access, now];
    // SAFETY: `path` is a NUL-terminated CString and `times` an array of two timespecs, both
    // alive for the call, which only reads them.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn an_unnamed_file_is_invisible_until_linked_and_then_keeps_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = match open_unnamed(dir.path(), 0o600) {
            Ok(file) => file,
            Err(err) if unnamed_unsupported(&err) => {
                eprintln!("skipped: no O_TMPFILE on the test directory's filesystem: {err}");
                return;
            }
            Err(err) => panic!("{err}"),
        };
        file.write_all(b"bytes").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let name = dir.path().join("named");
        link_unnamed(&file, &name).unwrap();
        assert_eq!(std::fs::read(&name).unwrap(), b"bytes");
        // A second link onto an existing name is EEXIST, never a replacement.
        let err = link_unnamed(&file, &name).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        assert!(link_unnamed(&file, Path::new("bad\0name")).is_err());
    }

    #[test]
    fn unsupported_means_only_the_missing_feature() {
        for errno in [libc::EOPNOTSUPP, libc::EISDIR, libc::EINVAL, libc::ENOSYS] {
            assert!(unnamed_unsupported(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::ENOSPC, libc::ENOENT, libc::EACCES, libc::EIO] {
            assert!(!unnamed_unsupported(&io::Error::from_raw_os_error(errno)));
        }
    }
}
