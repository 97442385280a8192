//! `POST /fsfreeze` and `POST /fsthaw` (SPEC §11), and the gate the daemon's file writers pass
//! while a filesystem freeze may be in effect (`platform::fsfreeze`): uploads (`POST /files`,
//! each piece of the body and its end), compose, and the filesystem service's `MakeDir`,
//! `Move` and `Remove` are refused while frozen instead of sleeping in the kernel.

use std::sync::Arc;

use crate::app::App;
use crate::error::ApiError;
use crate::http::{Action, BodySink, Head, Response};
use crate::platform::fsfreeze::{FsFreeze, FsFreezeError};

/// The refusal of a write while the filesystem is frozen.
pub const FROZEN: &str =
    "the filesystem is frozen (POST /fsfreeze): nothing is written until POST /fsthaw";

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

fn frozen() -> ApiError {
    ApiError::new(503, FROZEN)
}

/// `begin` of a route that writes files, behind the gate: refused while frozen, once
/// `authorise` (the route's own check of the token or signature) let the request through, so a
/// caller without them is told 401, not that the filesystem is frozen; the sink of a body it
/// consumes, and the answer of a body it collects, pass the gate again.
pub fn gated(
    app: &Arc<App>,
    head: &Head,
    authorise: fn(&Arc<App>, &Head) -> Result<(), ApiError>,
    begin: fn(&Arc<App>, &Head) -> Result<Action, ApiError>,
) -> Result<Action, ApiError> {
    let Some(gate) = app.fsfreeze.writing() else {
        authorise(app, head)?;
        return Err(frozen());
    };
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
                Some(_gate) => then(head, body),
                None => frozen().into(),
            }),
        },
        respond => respond,
    })
}

/// An upload's sink behind the gate. Refused while frozen; what it drops then (the unnamed
/// file it was writing) is dropped on `FsFreeze::defer_drop`'s thread.
struct Gated {
    inner: Option<Box<dyn BodySink>>,
    fs: Arc<FsFreeze>,
}

impl BodySink for Gated {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        let _gate = self.fs.writing().ok_or_else(|| Response::from(frozen()))?;
        match self.inner.as_mut() {
            Some(inner) => inner.data(bytes),
            None => Err(frozen().into()),
        }
    }

    fn end(mut self: Box<Self>) -> Response {
        let Some(_gate) = self.fs.writing() else {
            return frozen().into();
        };
        match self.inner.take() {
            Some(inner) => inner.end(),
            None => frozen().into(),
        }
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        match self.fs.writing() {
            Some(_gate) => drop(inner),
            None => self.fs.defer_drop(Box::new(inner)),
        }
    }
}
