//! `FsError`: what went wrong in the filesystem layer, in its own terms.
//!
//! Every fallible function of `fs` but `watch`'s returns this error. It names the fact (a path with a NUL
//! byte, an unknown user, a file where a directory must be, a full disk, an OS error while doing
//! something) and carries the path or name it concerns; its `Display` is the sentence a client
//! reads. It knows nothing of HTTP: which status answers each variant is decided in one place,
//! `api::status`. The reason for the split is the Connect-RPC filesystem service (envd's
//! `filesystem.Filesystem`, `api::filesystem`), which answers the same errors with Connect
//! codes (`not_found`, `invalid_argument`, `resource_exhausted`, ...). It still derives them
//! from the HTTP status; giving them their own is a second `match` over these variants, beside
//! the first, and nothing here changes.
//!
//! This module also owns how `fs` classifies the OS errors it meets ([`FsError::io`]): a full
//! disk or quota and a name too long for the filesystem are told apart from every other OS
//! error here, so the mapping need not look at `errno`.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::fs::MAX_PATH_BYTES;

/// An error of the filesystem layer.
#[derive(Debug)]
pub enum FsError {
    /// A client path containing a NUL byte.
    PathHasNul,
    /// A client path longer than [`MAX_PATH_BYTES`].
    PathTooLong,
    /// A client path naming another user's home (`~name`), as sent.
    OtherUsersHome(String),
    /// A user name without a passwd entry.
    UnknownUser(String),
    /// Something other than a directory where a parent directory of a new file must be.
    NotADirectory(PathBuf),
    /// The destination of a new file (an upload or a compose) is a directory.
    DestinationIsADirectory(PathBuf),
    /// A compose source that does not exist.
    SourceNotFound(PathBuf),
    /// A compose source that is not a regular file.
    SourceNotRegular(PathBuf),
    /// A compose source that is the destination itself.
    SourceIsDestination(PathBuf),
    /// User metadata asked for on a filesystem without extended attributes.
    NoExtendedAttributes(PathBuf),
    /// User metadata too large for the destination's filesystem.
    MetadataTooLarge(PathBuf),
    /// An archive to unpack that sandboxd refuses (a member's name, kind or link, a limit):
    /// the sentence says which member and why.
    ArchiveRefused(String),
    /// No space left on the device, or the user's quota exceeded.
    DiskFull,
    /// A path component longer than the filesystem allows (`ENAMETOOLONG`), met while doing
    /// `what`: a path within [`MAX_PATH_BYTES`] can hold one.
    NameTooLong { what: String, source: io::Error },
    /// Any other OS error, met while doing `what` (for example "writing '/home/user/a'").
    Io { what: String, source: io::Error },
}

/// The message of a full disk (SPEC §2).
pub const DISK_FULL: &str = "not enough disk space available";

impl FsError {
    /// The error for `source`, met while doing `what`: [`DiskFull`](FsError::DiskFull) for
    /// `ENOSPC` and `EDQUOT`, [`NameTooLong`](FsError::NameTooLong) for `ENAMETOOLONG`, else
    /// [`Io`](FsError::Io).
    pub fn io(source: io::Error, what: String) -> FsError {
        if is_disk_full(&source) {
            FsError::DiskFull
        } else if source.raw_os_error() == Some(libc::ENAMETOOLONG) {
            FsError::NameTooLong { what, source }
        } else {
            FsError::Io { what, source }
        }
    }
}

/// True for `ENOSPC` and `EDQUOT`: no space, or the user's quota exceeded.
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsError::PathHasNul => f.write_str("path contains a NUL byte"),
            FsError::PathTooLong => write!(f, "path is longer than {MAX_PATH_BYTES} bytes"),
            FsError::OtherUsersHome(raw) => write!(
                f,
                "cannot resolve path '{raw}': '~user' paths are not supported"
            ),
            FsError::UnknownUser(name) => {
                write!(f, "error looking up user '{name}': unknown user")
            }
            FsError::NotADirectory(path) => write!(f, "path is a file: {}", path.display()),
            FsError::DestinationIsADirectory(path) => {
                write!(f, "destination is a directory: {}", path.display())
            }
            FsError::SourceNotFound(path) => {
                write!(f, "source file not found: {}", path.display())
            }
            FsError::SourceNotRegular(path) => {
                write!(f, "source path is not a regular file: {}", path.display())
            }
            FsError::SourceIsDestination(path) => write!(
                f,
                "source path \"{}\" cannot be the same as destination",
                path.display()
            ),
            FsError::NoExtendedAttributes(path) => write!(
                f,
                "invalid metadata: the filesystem of '{}' does not support extended attributes",
                path.display()
            ),
            FsError::MetadataTooLarge(path) => write!(
                f,
                "invalid metadata: too large for the filesystem of '{}'",
                path.display()
            ),
            FsError::ArchiveRefused(why) => f.write_str(why),
            FsError::DiskFull => f.write_str(DISK_FULL),
            FsError::NameTooLong { what, source } | FsError::Io { what, source } => {
                write!(f, "error {what}: {source}")
            }
        }
    }
}

impl std::error::Error for FsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FsError::NameTooLong { source, .. } | FsError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: i32) -> FsError {
        FsError::io(
            io::Error::from_raw_os_error(errno),
            "writing '/a'".to_string(),
        )
    }

    #[test]
    fn a_full_disk_or_quota_is_disk_full() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            assert!(matches!(os(errno), FsError::DiskFull), "{errno}");
        }
    }

    #[test]
    fn a_name_too_long_keeps_what_and_the_os_error() {
        let err = os(libc::ENAMETOOLONG);
        assert!(
            matches!(&err, FsError::NameTooLong { what, source }
                if what == "writing '/a'" && source.raw_os_error() == Some(libc::ENAMETOOLONG)),
            "{err:?}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn other_os_errors_are_io_naming_what_and_the_error() {
        for errno in [libc::EIO, libc::EACCES, libc::ENOENT, libc::EROFS] {
            let err = os(errno);
            assert!(matches!(err, FsError::Io { .. }), "{err:?}");
            let expected = format!(
                "error writing '/a': {}",
                io::Error::from_raw_os_error(errno)
            );
            assert_eq!(err.to_string(), expected);
        }
    }
}
