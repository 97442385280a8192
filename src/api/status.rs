//! The one mapping from domain errors to HTTP statuses (SPEC §2).
//!
//! `fs` and `auth` say what went wrong in their own terms ([`FsError`], [`AuthError`]) and know
//! nothing of HTTP; this module alone decides the status each answers with, and turns it into
//! an [`ApiError`] whose message is the error's `Display`, unchanged. Each `match` names every
//! variant, without a catch-all, so a new variant does not build until it has its status here.
//! The Connect services answer with Connect codes instead: [`fs_code`] is the same decision for
//! them, next to the statuses so that the two stay in step.

use crate::auth::AuthError;
use crate::connect::Code;
use crate::error::ApiError;
use crate::fs::FsError;

impl From<FsError> for ApiError {
    fn from(err: FsError) -> ApiError {
        ApiError::new(fs_status(&err), err.to_string())
    }
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> ApiError {
        ApiError::new(auth_status(&err), err.to_string())
    }
}

fn fs_status(err: &FsError) -> u16 {
    match err {
        // The client's input: its path, its choice of files, its metadata.
        FsError::PathHasNul
        | FsError::PathTooLong
        | FsError::OtherUsersHome(_)
        | FsError::NameTooLong { .. }
        | FsError::NotADirectory(_)
        | FsError::DestinationIsADirectory(_)
        | FsError::SourceNotRegular(_)
        | FsError::SourceIsDestination(_)
        | FsError::NoExtendedAttributes(_)
        | FsError::MetadataTooLarge(_)
        | FsError::ArchiveRefused(_) => 400,
        // envd's answer: a user who does not exist cannot be acted for.
        FsError::UnknownUser(_) => 401,
        FsError::SourceNotFound(_) => 404,
        FsError::DiskFull => 507,
        // The kernel refused the caller (with `--fs-as-user`, the user; a read-only or
        // immutable file otherwise): a fact about the file, not a fault of the daemon.
        FsError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => 403,
        FsError::Io { .. } => 500,
    }
}

/// Whether an OS error says something ran out (descriptors of the daemon or of the system,
/// memory, processes, disk space or quota, inotify watches) rather than that the request was
/// wrong or the daemon broken. The one decision of Connect's `resource_exhausted` for OS
/// errors, used wherever the Connect services map them (`fs_code`, the filesystem service's
/// `io_error`, the process service's start and hub errors).
pub fn exhausted(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(
            libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::EDQUOT
        )
    )
}

/// The Connect code of an [`FsError`], for the Connect services (envd's codes for the same
/// cases).
pub fn fs_code(err: &FsError) -> Code {
    match err {
        FsError::PathHasNul
        | FsError::PathTooLong
        | FsError::OtherUsersHome(_)
        | FsError::NameTooLong { .. }
        | FsError::NotADirectory(_)
        | FsError::DestinationIsADirectory(_)
        | FsError::SourceNotRegular(_)
        | FsError::SourceIsDestination(_)
        | FsError::NoExtendedAttributes(_)
        | FsError::MetadataTooLarge(_)
        | FsError::ArchiveRefused(_) => Code::InvalidArgument,
        FsError::UnknownUser(_) => Code::Unauthenticated,
        FsError::SourceNotFound(_) => Code::NotFound,
        FsError::DiskFull => Code::ResourceExhausted,
        FsError::Io { source, .. } if exhausted(source) => Code::ResourceExhausted,
        FsError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            Code::PermissionDenied
        }
        FsError::Io { .. } => Code::Internal,
    }
}

fn auth_status(err: &AuthError) -> u16 {
    match err {
        AuthError::MissingToken
        | AuthError::WrongToken
        | AuthError::HeaderMismatch
        | AuthError::MissingSignature
        | AuthError::BadSignature
        | AuthError::Expired => 401,
        // A malformed query parameter (SPEC §2), not a refusal.
        AuthError::MalformedExpiration(_) => 400,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fs_errors_have_connect_codes_in_step_with_their_statuses() {
        use super::*;
        let cases = [
            (FsError::PathHasNul, Code::InvalidArgument),
            (FsError::UnknownUser("x".into()), Code::Unauthenticated),
            (FsError::SourceNotFound("/a".into()), Code::NotFound),
            (FsError::DiskFull, Code::ResourceExhausted),
            (
                FsError::io(
                    std::io::Error::from_raw_os_error(libc::EACCES),
                    "opening '/a'".into(),
                ),
                Code::PermissionDenied,
            ),
            (
                FsError::io(
                    std::io::Error::from_raw_os_error(libc::EIO),
                    "reading '/a'".into(),
                ),
                Code::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(fs_code(&err), code, "{err}");
        }
        let out_of_descriptors = FsError::io(
            std::io::Error::from_raw_os_error(libc::EMFILE),
            "opening '/a'".into(),
        );
        assert_eq!(fs_code(&out_of_descriptors), Code::ResourceExhausted);
    }

    #[test]
    fn running_out_of_something_is_told_apart_from_a_bad_request() {
        let errors = |errnos: &[i32]| -> Vec<bool> {
            let errors = errnos.iter().map(|&e| std::io::Error::from_raw_os_error(e));
            errors.map(|e| super::exhausted(&e)).collect()
        };
        // EMFILE 24, ENFILE 23, ENOMEM 12, EAGAIN 11, ENOSPC 28, EDQUOT 122 on Linux.
        assert_eq!(errors(&[24, 23, 12, 11, 28, 122]), [true; 6]);
        // ENOENT, EACCES, EPERM, EINVAL, EIO, E2BIG, ENOEXEC.
        assert_eq!(errors(&[2, 13, 1, 22, 5, 7, 8]), [false; 7]);
        assert!(!super::exhausted(&std::io::Error::other("no errno")));
    }

    use std::io;
    use std::path::PathBuf;

    use super::*;

    fn answer(err: impl Into<ApiError>) -> (u16, String) {
        let err = err.into();
        (err.status, err.message)
    }

    fn path(text: &str) -> PathBuf {
        PathBuf::from(text)
    }

    #[test]
    fn each_fs_error_has_its_status_and_message() {
        let cases = [
            (FsError::PathHasNul, 400, "path contains a NUL byte"),
            (FsError::PathTooLong, 400, "path is longer than 4096 bytes"),
            (
                FsError::OtherUsersHome("~root/.ssh".into()),
                400,
                "cannot resolve path '~root/.ssh': '~user' paths are not supported",
            ),
            (
                FsError::UnknownUser("late".into()),
                401,
                "error looking up user 'late': unknown user",
            ),
            (
                FsError::NotADirectory(path("/home/user/a/b")),
                400,
                "path is a file: /home/user/a/b",
            ),
            (
                FsError::DestinationIsADirectory(path("/home/user/dir")),
                400,
                "destination is a directory: /home/user/dir",
            ),
            (
                FsError::SourceNotFound(path("/home/user/part.1")),
                404,
                "source file not found: /home/user/part.1",
            ),
            (
                FsError::SourceNotRegular(path("/dev/null")),
                400,
                "source path is not a regular file: /dev/null",
            ),
            (
                FsError::SourceIsDestination(path("/home/user/out")),
                400,
                "source path \"/home/user/out\" cannot be the same as destination",
            ),
            (
                FsError::NoExtendedAttributes(path("/tmp/f")),
                400,
                "invalid metadata: the filesystem of '/tmp/f' does not support extended \
                 attributes",
            ),
            (
                FsError::MetadataTooLarge(path("/tmp/f")),
                400,
                "invalid metadata: too large for the filesystem of '/tmp/f'",
            ),
            (FsError::DiskFull, 507, "not enough disk space available"),
            (
                FsError::NameTooLong {
                    what: "writing '/tmp/xxx'".into(),
                    source: io::Error::other("File name too long"),
                },
                400,
                "error writing '/tmp/xxx': File name too long",
            ),
            (
                FsError::Io {
                    what: "syncing '/tmp'".into(),
                    source: io::Error::other("Input/output error"),
                },
                500,
                "error syncing '/tmp': Input/output error",
            ),
            (
                FsError::Io {
                    what: "creating '/root/a'".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                },
                403,
                "error creating '/root/a': Permission denied (os error 13)",
            ),
        ];
        for (err, status, message) in cases {
            let shown = format!("{err:?}");
            assert_eq!(answer(err), (status, message.to_string()), "{shown}");
        }
    }

    #[test]
    fn os_errors_are_classified_before_they_are_mapped() {
        let os = |errno| FsError::io(io::Error::from_raw_os_error(errno), "writing 'a'".into());
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            assert_eq!(
                answer(os(errno)),
                (507, "not enough disk space available".to_string())
            );
        }
        for (errno, status) in [(libc::ENAMETOOLONG, 400), (libc::EIO, 500)] {
            let shown = io::Error::from_raw_os_error(errno);
            assert_eq!(
                answer(os(errno)),
                (status, format!("error writing 'a': {shown}"))
            );
        }
    }

    #[test]
    fn each_auth_error_has_its_status_and_message() {
        let unauthorized =
            "unauthorized access, please provide a valid access token or method signing if \
             supported";
        let cases = [
            (AuthError::MissingToken, 401, unauthorized),
            (AuthError::WrongToken, 401, unauthorized),
            (
                AuthError::HeaderMismatch,
                401,
                "access token present in header but does not match",
            ),
            (
                AuthError::MissingSignature,
                401,
                "missing signature query parameter",
            ),
            (AuthError::BadSignature, 401, "invalid signature"),
            (AuthError::Expired, 401, "signature is already expired"),
            (
                AuthError::MalformedExpiration("17e8".into()),
                400,
                "invalid signature_expiration query parameter '17e8': expected Unix seconds",
            ),
        ];
        for (err, status, message) in cases {
            let shown = format!("{err:?}");
            assert_eq!(answer(err), (status, message.to_string()), "{shown}");
        }
    }
}
