//! Endpoint handlers, one file each: typed input in, `Result<Response, ApiError>` out. The
//! errors of `fs` and `auth` become `ApiError`s through `?`, by the one mapping in `status`.

pub mod as_user;
pub mod collapse;
pub mod compose;
pub mod connect_stub;
pub mod cors;
pub mod download;
pub mod envs;
pub mod filesystem;
pub mod freeze;
pub mod fsfreeze;
pub mod health;
pub mod init;
mod init_token;
pub mod long_calls;
pub mod metrics;
pub mod process;
pub mod rpc;
mod status;
pub mod upload;

use std::sync::Arc;

use crate::app::App;
use crate::error::ApiError;
use crate::http::{Action, Head, Response};

/// Every request message of both Connect services read from `data` in both codecs (the fuzz
/// target `connect_proto`).
#[cfg(feature = "fuzzing")]
pub fn fuzz_requests(data: &[u8]) {
    for codec in [crate::connect::Codec::Proto, crate::connect::Codec::Json] {
        filesystem::fuzz_requests(codec, data);
        process::fuzz_requests(codec, data);
    }
}

/// Largest JSON request body (compose, init): SPEC §10.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// Deserialises a JSON body.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// A handler of a collected JSON body.
pub type JsonHandler = fn(&Arc<App>, &Head, &[u8]) -> Result<Response, ApiError>;

/// Collects a JSON body of at most [`MAX_JSON_BODY`] bytes (in the event loop, not in a
/// worker), then answers with `handle`.
pub fn collect_json(app: &Arc<App>, handle: JsonHandler) -> Action {
    let app = Arc::clone(app);
    Action::Collect {
        limit: MAX_JSON_BODY,
        then: Box::new(move |head, body| handle(&app, head, &body).unwrap_or_else(Response::from)),
    }
}
