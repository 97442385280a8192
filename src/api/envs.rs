//! `GET /envs`: the sandbox's environment as a flat JSON object with sorted keys.

use crate::app::App;
use crate::error::ApiError;
use crate::http::Response;

pub fn get(app: &App) -> Result<Response, ApiError> {
    // A BTreeMap serialises with its keys sorted.
    let body = serde_json::to_vec(&app.environment())
        .map_err(|e| ApiError::internal(format!("error encoding environment: {e}")))?;
    Ok(Response::json(200, body).with_header("Cache-Control", "no-store"))
}
