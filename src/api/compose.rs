//! `POST /files/compose` (SPEC §5): concatenate source files into a destination, then delete them.
//!
//! This module owns the request: the JSON body (the router checks the token, before the
//! filesystem-freeze gate), and validation steps 1 to 4 in SPEC's order (body, sources,
//! destination, user). Steps 5 and 6 and the write are `fs::compose`'s.
//! Nothing on disk changes before every step has passed.

use serde::Deserialize;

use std::sync::Arc;

use super::{collect_json, parse_json};
use crate::app::App;
use crate::error::ApiError;
use crate::fs::{compose, dirs, paths};
use crate::http::{Action, Head, Response};

/// Most sources in one compose (SPEC §10).
pub const MAX_SOURCES: usize = 10_000;

/// Missing fields are `None` rather than a serde error, so that each gets SPEC's own message.
#[derive(Deserialize)]
pub(crate) struct ComposeBody {
    source_paths: Option<Vec<String>>,
    destination: Option<String>,
    username: Option<String>,
}

/// Has the body collected; the router has checked the token (before the filesystem-freeze
/// gate).
pub fn begin(app: &Arc<App>, _head: &Head) -> Result<Action, ApiError> {
    Ok(collect_json(app, post))
}

fn post(app: &Arc<App>, _head: &Head, body: &[u8]) -> Result<Response, ApiError> {
    let body: ComposeBody = parse_json(body)?;
    let sources = body.source_paths.unwrap_or_default();
    if sources.is_empty() {
        return Err(ApiError::bad_request("source_paths must not be empty"));
    }
    if sources.len() > MAX_SOURCES {
        return Err(ApiError::bad_request(format!(
            "too many source_paths: at most {MAX_SOURCES}"
        )));
    }
    let destination = match body.destination {
        Some(destination) if !destination.is_empty() => destination,
        _ => return Err(ApiError::bad_request("destination is required")),
    };
    let resolver = app.resolver(body.username.as_deref())?;
    // Everything below touches the disk as the user (`--fs-as-user`); the guard ends with
    // the call.
    let _as_user = app.as_user(&resolver.user)?;
    let raw_destination = destination;
    let destination = resolver.resolve(&raw_destination)?;
    let plan = compose::validate(destination, sources.iter().map(String::as_str), |raw| {
        resolver.resolve(raw)
    })?;
    if paths::ends_as_directory(&raw_destination) {
        return Err(ApiError::bad_request(format!(
            "destination '{}/' ends with '/': it names a directory, not a file to write",
            plan.destination().display()
        )));
    }
    plan.run(resolver.user.uid, resolver.user.gid)?;
    let record = dirs::file_record(plan.destination());
    Ok(Response::json(200, record.to_string().into_bytes()))
}
