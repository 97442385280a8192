//! The router: the one place where paths and methods are matched.
//!
//! Each route names its handler and its authentication; every error becomes the JSON of SPEC §2
//! here, and an unknown method on a known path is 405 with `Allow`.

use std::sync::Arc;

use crate::api;
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Handler, Request, Response};

/// Every route and the methods it answers (HEAD is answered wherever GET is).
pub const ROUTES: &[(&str, &str)] = &[
    ("/health", "GET, HEAD"),
    ("/envs", "GET, HEAD"),
    ("/init", "POST"),
    ("/metrics", "GET, HEAD"),
    ("/files/compose", "POST"),
    ("/files", "GET, HEAD, POST"),
];

pub struct Router {
    pub app: Arc<App>,
}

impl Handler for Router {
    fn handle(&self, request: &mut Request<'_>) -> Response {
        if let Some(preflight) = api::cors::preflight(&request.head) {
            return preflight;
        }
        let mut response = route(&self.app, request).unwrap_or_else(Response::from);
        api::cors::decorate(&request.head, &mut response);
        response
    }
}

fn route(app: &App, request: &mut Request<'_>) -> Result<Response, ApiError> {
    let method = request.head.method();
    match (request.head.path(), method) {
        ("/health", "GET" | "HEAD") => Ok(api::health::get(app)),
        ("/envs", "GET" | "HEAD") => {
            app.require_token(&request.head)?;
            api::envs::get(app)
        }
        ("/init", "POST") => api::init::post(app, request),
        ("/metrics", "GET" | "HEAD") => {
            app.require_token(&request.head)?;
            api::metrics::get(app)
        }
        ("/files/compose", "POST") => api::compose::post(app, request),
        ("/files", "GET" | "HEAD") => api::download::get(app, request),
        ("/files", "POST") => api::upload::post(app, request),
        (path, _) if api::connect_stub::procedure(path).is_some() => {
            Ok(api::connect_stub::answer(app, &request.head))
        }
        (path, _) => Err(match ROUTES.iter().find(|(p, _)| *p == path) {
            Some((_, allow)) => {
                return Ok(Response::from(ApiError::new(
                    405,
                    format!("method {method} is not allowed on {path}; allowed: {allow}"),
                ))
                .with_header("Allow", *allow))
            }
            None => ApiError::not_found(format!("no route for {method} {path}")),
        }),
    }
}
