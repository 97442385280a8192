//! `POST /collapse` (SPEC §11): the daemon's heap into transparent hugepages before a pause
//! (`platform::collapse`), answered with envd's `CollapseResult` and `supported`.

use crate::app::App;
use crate::error::ApiError;
use crate::http::{Head, Response};
use crate::platform::collapse;

pub fn post(app: &App, head: &Head) -> Result<Response, ApiError> {
    app.require_token(head)?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| ApiError::internal(format!("error reading /proc/self/maps: {e}")))?;
    let result = collapse::collapse_self(
        &maps,
        || {
            std::fs::read_to_string("/proc/self/smaps_rollup")
                .ok()
                .and_then(|text| collapse::anon_huge_pages(&text))
        },
        crate::sys::madvise::collapse_supported(),
    );
    Ok(Response::json(200, result.to_json().into_bytes()).with_header("Cache-Control", "no-store"))
}
