//! `POST /init` (envd-compatible subset): set the token, variables, default user and workdir.
//!
//! Everything is validated before anything changes. With a token already set, the caller must
//! present it, in `X-Access-Token` or as the body's `accessToken`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::read_json;
use crate::app::App;
use crate::auth;
use crate::error::ApiError;
use crate::fs::users;
use crate::http::{Request, Response};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InitBody {
    access_token: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
    default_user: Option<String>,
    default_workdir: Option<String>,
}

pub fn post(app: &App, request: &mut Request<'_>) -> Result<Response, ApiError> {
    let empty_body = request.body.declared_length() == Some(0);
    let body: InitBody = if empty_body {
        InitBody {
            access_token: None,
            env_vars: None,
            default_user: None,
            default_workdir: None,
        }
    } else {
        read_json(&mut request.body)?
    };
    if let Some(current) = app.token() {
        let by_header = auth::check_token(Some(&current), request.head.header("x-access-token"));
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
