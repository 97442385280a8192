//! `POST /fsfreeze` and `POST /fsthaw` (SPEC §11), and the gate the daemon's file writers pass
//! while a filesystem freeze may be in effect (`platform::fsfreeze`): uploads (`POST /files`,
//! each piece of the body and its end), compose, a live upgrade's binary, and the filesystem
//! service's `MakeDir`, `Move` and `Remove` are refused while frozen, and while a freeze waits
//! for the writes in progress, instead of sleeping in the kernel or waiting for the freeze.
//! The router checks the caller before the gate, so a request without a token is 401 whatever
//! the gate says.

use std::sync::Arc;

use crate::app::App;
use crate::error::ApiError;
use crate::http::{Action, BodySink, Head, Response};
use crate::platform::fsfreeze::{Closed, FsFreeze, FsFreezeError};

/// The refusal of a write while the filesystem is frozen.
pub const FROZEN: &str =
    "the filesystem is frozen (POST /fsfreeze): nothing is written until POST /fsthaw";
/// The refusal of a write while a freeze waits for the writes in progress.
pub const FREEZING: &str = "a filesystem freeze is in progress (POST /fsfreeze waits for the \
                            writes under way): nothing is written until POST /fsthaw";

/// The refusal's message.
pub fn refusal(closed: Closed) -> &'static str {
    match closed {
        Closed::Freezing => FREEZING,
        Closed::Frozen => FROZEN,
    }
}

pub fn post_fsfreeze(app: &Arc<App>, head: &Head) -> Result<Response, ApiError> {
    app.require_token(head)?;
    app.fsfreeze.freeze().map_err(error)?;
    Ok(Response::empty(204).with_header("Cache-Control", "no-store"))
}

pub fn post_fsthaw(app: &App, head: &Head) -> Result<Response, ApiError> {
    app.require_token(head)?;
    app.fsfreeze.thaw().map_err(error)?;
    Ok(Response::empty(204).with_header("Cache-Control", "no-store"))
}

fn error(error: FsFreezeError) -> ApiError {
    match error {
        FsFreezeError::Busy => ApiError::new(
            503,
            "another filesystem freeze or thaw is in progress; retry when it ends",
        ),
        FsFreezeError::Failed(message) => ApiError::internal(message),
    }
}

fn closed(closed: Closed) -> ApiError {
    ApiError::new(503, refusal(closed))
}

/// `begin` of a route that writes files, behind the gate, for a caller the router has
/// authorised: refused while the gate is closed; the sink of a body it consumes, and the answer
/// of a body it collects, pass the gate again.
pub fn gated(
    app: &Arc<App>,
    head: &Head,
    begin: fn(&Arc<App>, &Head) -> Result<Action, ApiError>,
) -> Result<Action, ApiError> {
    let gate = app.fsfreeze.writing().map_err(closed)?;
    let action = begin(app, head)?;
    drop(gate);
    let fs = Arc::clone(&app.fsfreeze);
    Ok(match action {
        Action::Consume(sink) => Action::Consume(Box::new(Gated {
            inner: Some(sink),
            fs,
        })),
        Action::Collect { limit, then } => Action::Collect {
            limit,
            then: Box::new(move |head, body| match fs.writing() {
                Ok(_gate) => then(head, body),
                Err(refused) => closed(refused).into(),
            }),
        },
        respond => respond,
    })
}

/// An upload's sink behind the gate. Refused while the gate is closed; what it drops then (the
/// unnamed file it was writing) is dropped on `FsFreeze::defer_drop`'s thread.
struct Gated {
    inner: Option<Box<dyn BodySink>>,
    fs: Arc<FsFreeze>,
}

impl BodySink for Gated {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        let _gate = self.fs.writing().map_err(|c| Response::from(closed(c)))?;
        match self.inner.as_mut() {
            Some(inner) => inner.data(bytes),
            None => Err(closed(Closed::Frozen).into()),
        }
    }

    fn end(mut self: Box<Self>) -> Response {
        let _gate = match self.fs.writing() {
            Ok(gate) => gate,
            Err(refused) => return closed(refused).into(),
        };
        match self.inner.take() {
            Some(inner) => inner.end(),
            None => closed(Closed::Frozen).into(),
        }
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        match self.fs.writing() {
            Ok(_gate) => drop(inner),
            Err(_) => self.fs.defer_drop(Box::new(inner)),
        }
    }
}
