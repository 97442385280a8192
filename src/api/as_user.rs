//! `--fs-as-user` at the routes: a switch that failed as an answer, and a body sink that runs
//! each of its steps as the user.
//!
//! A body is fed to its sink piece by piece, by whichever worker picks the connection up each
//! time, long after the worker that began the request has moved on; so the sink cannot rely on
//! its beginning's guard. [`AsUserSink`] takes the guard again on the feeding thread for every
//! piece, for the end, and for the drop (which undoes a sink's work: removing a temporary).

use crate::error::ApiError;
use crate::fs::as_user::{Identity, SwitchError};
use crate::http::{BodySink, Response};

impl From<SwitchError> for ApiError {
    /// The daemon, not the client, is at fault: 500 naming the cause.
    fn from(error: SwitchError) -> ApiError {
        ApiError::internal(error.to_string())
    }
}

/// Runs `inner`'s every step with `identity`'s credentials.
pub struct AsUserSink {
    identity: Identity,
    inner: Option<Box<dyn BodySink>>,
}

impl AsUserSink {
    /// `inner` as it is without an identity (`--fs-as-user` off), else wrapped.
    pub fn wrap(identity: Option<Identity>, inner: Box<dyn BodySink>) -> Box<dyn BodySink> {
        match identity {
            Some(identity) => Box::new(AsUserSink {
                identity,
                inner: Some(inner),
            }),
            None => inner,
        }
    }
}

impl BodySink for AsUserSink {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        let _guard = self.identity.enter().map_err(ApiError::from)?;
        match self.inner.as_mut() {
            Some(inner) => inner.data(bytes),
            None => Err(ApiError::internal("upload already ended").into()),
        }
    }

    fn end(mut self: Box<Self>) -> Response {
        let guard = match self.identity.enter() {
            Ok(guard) => guard,
            // `self` is dropped as the user below, which undoes the inner sink's work.
            Err(error) => return ApiError::from(error).into(),
        };
        let response = match self.inner.take() {
            Some(inner) => inner.end(),
            None => ApiError::internal("upload already ended").into(),
        };
        drop(guard);
        response
    }
}

impl Drop for AsUserSink {
    /// An unfinished sink undoes its work (a temporary file removed) as the user too. Should
    /// the switch fail, the undoing is done as the daemon: leaving a temporary behind is worse.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let _guard = self.identity.enter();
            drop(inner);
        }
    }
}
