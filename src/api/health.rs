//! `GET /health`: 204 while serving, 503 once shutdown has begun. No authentication.

use crate::app::App;
use crate::error::ApiError;
use crate::http::Response;

pub fn get(app: &App) -> Response {
    if app.is_shutting_down() {
        return Response::from(ApiError::new(503, "shutting down"))
            .with_header("Cache-Control", "no-store");
    }
    Response::empty(204).with_header("Cache-Control", "no-store")
}
