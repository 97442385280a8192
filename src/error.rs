//! `ApiError`: every error sandboxd answers with, as a status and one sentence.
//!
//! Handlers return `Result<_, ApiError>`; the router turns the error into the JSON body of SPEC §2,
//! `{"code":<status>,"message":"<sentence>"}`. This module owns the mapping from OS errors to
//! statuses (`ENOSPC`/`EDQUOT` -> 507, `ENAMETOOLONG` -> 400) and nothing else.

use std::fmt;
use std::io;

use crate::http::{Response, ResponseBody};

/// An error answered to the client: the HTTP status and a message naming the offending input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

/// The message of SPEC §2 for a full disk or an exceeded quota.
pub const DISK_FULL: &str = "not enough disk space available";

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// Maps an OS error met while doing `what` (for example "writing '/home/user/a'"):
    /// a full disk or quota is 507 with SPEC's fixed message; a path component longer than the
    /// filesystem's NAME_MAX (a path within SPEC's 4096 bytes can hold one) is the client's
    /// input, 400; anything else 500 naming the error.
    pub fn from_io(err: &io::Error, what: &str) -> Self {
        if is_disk_full(err) {
            Self::new(507, DISK_FULL)
        } else if err.raw_os_error() == Some(libc::ENAMETOOLONG) {
            Self::bad_request(format!("error {what}: {err}"))
        } else {
            Self::internal(format!("error {what}: {err}"))
        }
    }

    /// The JSON body of SPEC §2.
    pub fn to_json(&self) -> Vec<u8> {
        let body = serde_json::json!({ "code": self.status, "message": self.message });
        body.to_string().into_bytes()
    }
}

/// True for `ENOSPC` and `EDQUOT`, the two errors SPEC answers with 507.
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl From<ApiError> for Response {
    fn from(error: ApiError) -> Response {
        Response::new(error.status, ResponseBody::Bytes(error.to_json()))
            .with_header("Content-Type", "application/json; charset=utf-8")
            .with_header("X-Content-Type-Options", "nosniff")
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_body_repeats_status_and_escapes_message() {
        let err = ApiError::not_found("path '/home/user/\"x\"' does not exist");
        assert_eq!(
            err.to_json(),
            br#"{"code":404,"message":"path '/home/user/\"x\"' does not exist"}"#.to_vec()
        );
    }

    #[test]
    fn disk_full_errors_map_to_507() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let err = ApiError::from_io(&io::Error::from_raw_os_error(errno), "writing 'a'");
            assert_eq!(err, ApiError::new(507, DISK_FULL));
        }
    }

    #[test]
    fn a_name_too_long_is_the_clients_400() {
        let err = ApiError::from_io(
            &io::Error::from_raw_os_error(libc::ENAMETOOLONG),
            "writing 'a'",
        );
        assert_eq!(err.status, 400);
        assert!(
            err.message.starts_with("error writing 'a': "),
            "{}",
            err.message
        );
    }

    #[test]
    fn other_os_errors_map_to_500_naming_the_error() {
        let err = ApiError::from_io(&io::Error::from_raw_os_error(libc::EIO), "writing 'a'");
        assert_eq!(err.status, 500);
        assert!(
            err.message.starts_with("error writing 'a': "),
            "{}",
            err.message
        );
    }
}
