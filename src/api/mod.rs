//! Endpoint handlers, one file each: typed input in, `Result<Response, ApiError>` out.

pub mod compose;
pub mod connect_stub;
pub mod cors;
pub mod download;
pub mod envs;
pub mod health;
pub mod init;
pub mod metrics;
pub mod upload;

use crate::error::ApiError;
use crate::http::Body;

/// Largest JSON request body (compose, init): SPEC §10.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// Reads a JSON body of at most [`MAX_JSON_BODY`] bytes and deserialises it.
pub fn read_json<T: serde::de::DeserializeOwned>(body: &mut Body<'_>) -> Result<T, ApiError> {
    let bytes = body
        .read_to_end_limited(MAX_JSON_BODY)
        .map_err(|e| ApiError::bad_request(format!("error reading request body: {e}")))?
        .ok_or_else(|| ApiError::payload_too_large("request body too large: at most 1 MiB"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}
