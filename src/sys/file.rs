//! What the system offers for files without a name: whether `O_TMPFILE` is missing where it was
//! asked for, and whether `/proc/self/fd` is there to name such a file through. Making and naming
//! them is `sys::dir`'s ([`Dir::create_unnamed`](super::dir::Dir::create_unnamed),
//! [`Dir::link_file`](super::dir::Dir::link_file)); deciding when to use them, and what to do
//! where the filesystem or the kernel cannot, is `fs::atomic`'s.

use std::io;
use std::path::Path;

/// Whether the error of an `O_TMPFILE` open means "no `O_TMPFILE` here" (the filesystem does not
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

#[cfg(test)]
mod tests {
    use super::*;

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
