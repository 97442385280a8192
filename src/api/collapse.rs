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
    crate::log::line(format_args!(
        "collapse: {} regions, {} chunks, {} collapsed, {} already huge, {} skipped in {} ms{}",
        result.regions,
        result.chunks,
        result.collapsed,
        result.already_huge,
        result.skipped,
        result.elapsed_ms,
        if result.supported {
            ""
        } else {
            " (no MADV_COLLAPSE)"
        }
    ));
    let body = serde_json::to_vec(&result)
        .map_err(|e| ApiError::internal(format!("error encoding the collapse result: {e}")))?;
    Ok(Response::json(200, body).with_header("Cache-Control", "no-store"))
}
