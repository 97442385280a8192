//! `POST /init` (envd-compatible subset): set the token, variables, default user and workdir.
//!
//! Everything is validated before anything changes. With a token already set, the caller must
//! present it, in `X-Access-Token` or as the body's `accessToken`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use std::sync::Arc;

use super::{collect_json, parse_json};
use crate::app::App;
use crate::auth;
use crate::error::ApiError;
use crate::fs::users;
use crate::http::{Action, Head, Response};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InitBody {
    access_token: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
    default_user: Option<String>,
    default_workdir: Option<String>,
}

/// A wrong `X-Access-Token` is refused from the head alone; without one, the current token may
/// still come in the body, which is then collected (bounded, without a worker) and checked.
pub fn begin(app: &Arc<App>, head: &Head) -> Result<Action, ApiError> {
    if let Some(current) = app.token() {
        let sent = head.header("x-access-token").filter(|t| !t.is_empty());
        if sent.is_some() && auth::check_token(Some(&current), sent).is_err() {
            return Err(ApiError::unauthorized(auth::UNAUTHORIZED));
        }
    }
    Ok(collect_json(app, post))
}

fn post(app: &App, head: &Head, body: &[u8]) -> Result<Response, ApiError> {
    let body: InitBody = if body.is_empty() {
        InitBody {
            access_token: None,
            env_vars: None,
            default_user: None,
            default_workdir: None,
        }
    } else {
        parse_json(body)?
    };
    if let Some(current) = app.token() {
        let by_header = auth::check_token(Some(&current), head.header("x-access-token"));
        let by_body = body
            .access_token
            .as_deref()
            .is_some_and(|t| auth::constant_time_eq(t.as_bytes(), current.as_bytes()));
        if by_header.is_err() && !by_body {
            return Err(ApiError::unauthorized(auth::UNAUTHORIZED));
        }
    }
    if body.access_token.as_deref() == Some("") {
        return Err(ApiError::bad_request("accessToken must not be empty"));
    }
    if let Some(env) = &body.env_vars {
        if let Some(key) = env.keys().find(|k| !valid_env_name(k)) {
            return Err(ApiError::bad_request(format!(
                "invalid envVars name '{key}': must be non-empty without '=' or NUL"
            )));
        }
        if let Some(key) = env.iter().find(|(_, v)| v.contains('\0')).map(|(k, _)| k) {
            return Err(ApiError::bad_request(format!(
                "invalid envVars value of '{key}': contains NUL"
            )));
        }
    }
    if let Some(user) = &body.default_user {
        users::lookup(&app.config.passwd_file, user)?;
    }
    let workdir = match body.default_workdir.as_deref() {
        None => None,
        Some("") => Some(None),
        Some(dir) if dir.starts_with('/') && !dir.contains('\0') => Some(Some(PathBuf::from(dir))),
        Some(dir) => {
            return Err(ApiError::bad_request(format!(
                "defaultWorkdir must be an absolute path, not '{dir}'"
            )))
        }
    };
    app.apply_init(body.access_token, body.env_vars, body.default_user, workdir);
    Ok(Response::empty(204))
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}
