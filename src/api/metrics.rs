//! `GET /metrics`: the ten resource figures of SPEC §7, sampled on request.
//!
//! The sampler is created at start (so the first `cpu_used_pct` covers the time since then) and
//! kept behind a mutex; each call reads its kept descriptors with `pread`. No background thread.

use crate::app::App;
use crate::error::ApiError;
use crate::http::Response;

pub fn get(app: &App) -> Result<Response, ApiError> {
    let metrics = app.sample_metrics()?;
    let body = serde_json::to_vec(&metrics)
        .map_err(|e| ApiError::internal(format!("error encoding metrics: {e}")))?;
    Ok(Response::json(200, body).with_header("Cache-Control", "no-store"))
}
