//! `POST /freeze` and `POST /unfreeze` (SPEC §11): envd's pre-pause workload freeze and its
//! rollback thaw, over `platform::cgroups::freeze`.
//!
//! `/freeze` takes envd's query: `mode` (`legacy`, the default, or `hierarchy`; an unknown
//! value is legacy, as envd's), `maxCgroups` (the hierarchy walk's bound; absent or not
//! positive: 512) and `maxWaitMs` (absent or not positive: no wait and a bare 204, the answer
//! envd's older callers expect; else the wait's budget, at most [`MAX_WAIT`], and a 200 with the
//! `FreezeResult`). A value that is not an integer is 400. Both answer 503 while another freeze
//! or thaw holds the lock; `/unfreeze` is 500 when a group could not be thawed.

use std::time::Duration;

use crate::app::{query, App};
use crate::error::ApiError;
use crate::http::{Head, Response};
use crate::platform::cgroups::freeze::{Mode, Options};

/// The longest wait `maxWaitMs` may ask for: a freeze holds its worker and the lock meanwhile.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

const BUSY: &str = "another freeze or thaw is in progress; retry when it ends";

pub fn post_freeze(app: &App, head: &Head) -> Result<Response, ApiError> {
    app.require_token(head)?;
    let query = query(head)?;
    let integer = |name: &str| -> Result<i64, ApiError> {
        query.get(name).map_or(Ok(0), |text| {
            text.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid query parameter '{name}': '{text}' is not an integer"
                ))
            })
        })
    };
    let max_wait_ms = integer("maxWaitMs")?;
    let max_cgroups = integer("maxCgroups")?;
    let options = Options {
        max_wait: Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0)).min(MAX_WAIT),
        mode: match query.get("mode") {
            Some("hierarchy") => Mode::Hierarchy,
            _ => Mode::Legacy,
        },
        max_cgroups: usize::try_from(max_cgroups).unwrap_or(0),
    };
    let result = app
        .cgroups
        .freeze(&options)
        .map_err(|_| ApiError::new(503, BUSY))?;
    if options.max_wait.is_zero() {
        return Ok(Response::empty(204).with_header("Cache-Control", "no-store"));
    }
    Ok(Response::json(200, result.to_json().into_bytes()).with_header("Cache-Control", "no-store"))
}

pub fn post_unfreeze(app: &App, head: &Head) -> Result<Response, ApiError> {
    app.require_token(head)?;
    let result = app
        .cgroups
        .try_thaw()
        .map_err(|_| ApiError::new(503, BUSY))?;
    if result.failed > 0 {
        return Err(ApiError::internal(format!(
            "{} cgroups could not be thawed ({} were)",
            result.failed, result.thawed
        )));
    }
    Ok(Response::empty(204).with_header("Cache-Control", "no-store"))
}
