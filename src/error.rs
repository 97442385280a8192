//! `ApiError`: every error sandboxd answers with, as a status and one sentence.
//!
//! Handlers return `Result<_, ApiError>`; the router turns the error into the JSON body of SPEC §2,
//! `{"code":<status>,"message":"<sentence>"}`. This module owns that type and its JSON and
//! nothing else: the errors of `fs` and `auth` become `ApiError`s in `api::status`, the one
//! place that chooses their statuses.

use std::fmt;

use crate::http::{Response, ResponseBody};

/// An error answered to the client: the HTTP status and a message naming the offending input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

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

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// The JSON body of SPEC §2.
    pub fn to_json(&self) -> Vec<u8> {
        let body = serde_json::json!({ "code": self.status, "message": self.message });
        body.to_string().into_bytes()
    }
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
}
