//! The router: the one place where paths and methods are matched, and sandboxd's side of the
//! HTTP layer's [`Handler`] interface.
//!
//! Each route names its handler and its authentication, decided from the head alone, before
//! any byte of a body is read. Every error becomes the JSON of SPEC §2 here, the layer's own
//! refusals included, and an unknown method on a known path is 405 with `Allow`.

use std::fmt;
use std::sync::Arc;

use crate::api;
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Action, Error, Handler, Head, Record, Response};
use crate::log;

/// Every route and the methods it answers (HEAD is answered wherever GET is).
pub const ROUTES: &[(&str, &str)] = &[
    ("/health", "GET, HEAD"),
    ("/envs", "GET, HEAD"),
    ("/init", "POST"),
    ("/upgrade", "POST"),
    ("/metrics", "GET, HEAD"),
    ("/files/compose", "POST"),
    ("/files", "GET, HEAD, POST, PUT"),
    ("/freeze", "POST"),
    ("/unfreeze", "POST"),
    ("/fsfreeze", "POST"),
    ("/fsthaw", "POST"),
    ("/collapse", "POST"),
];

pub struct Router {
    pub app: Arc<App>,
}

impl Handler for Router {
    /// CORS preflights are answered before anything else; every other answer gets the CORS
    /// headers its request calls for, however it is produced.
    fn begin(&self, head: &Head) -> Action {
        if let Some(preflight) = api::cors::preflight(head) {
            return Action::Respond(preflight);
        }
        let action = route(&self.app, head).unwrap_or_else(|error| Action::Respond(error.into()));
        api::cors::decorate_action(head, action)
    }

    fn refused(&self, head: Option<&Head>, error: &Error) -> Response {
        let mut response: Response = match head {
            Some(head) if api::connect_stub::procedure(head.path()).is_some() => {
                api::rpc::refused(head, error)
            }
            _ => ApiError::new(error.status(), error.to_string()).into(),
        };
        if let Some(head) = head {
            if head.path() == "/init" {
                response = api::init::with_envd_headers(Ok(response));
            }
            api::cors::decorate(head, &mut response);
        }
        response
    }

    fn log(&self, record: &Record<'_>) {
        log::request(
            record.at,
            record.method,
            record.target,
            record.status,
            record.bytes,
            record.duration,
        );
    }

    fn notice(&self, message: fmt::Arguments<'_>) {
        log::line(message);
    }

    /// The worker's buffered request lines are written before it waits.
    fn idle(&self) {
        log::flush_idle();
    }

    /// Every buffered request line is written on each round (at most a second apart); the port
    /// forwarder's idle-time scan rides on it too.
    fn tick(&self) {
        log::flush();
        crate::platform::forward::tick();
    }

    /// Out of descriptors with no HTTP connection to spare: a forwarded connection goes
    /// (`crate::descriptors`).
    fn shed_descriptor(&self) -> bool {
        crate::platform::forward::shed()
    }
}

fn route(app: &Arc<App>, head: &Head) -> Result<Action, ApiError> {
    let method = head.method();
    let respond = |response: Response| Ok(Action::Respond(response));
    match (head.path(), method) {
        ("/health", "GET" | "HEAD") => respond(api::health::get(app)),
        ("/envs", "GET" | "HEAD") => {
            app.require_token(head)?;
            respond(api::envs::get(app)?)
        }
        ("/init", "POST") => api::init::begin(app, head),
        // The writers' routes check the caller before the filesystem-freeze gate: a request
        // without a token is 401 whatever the gate says, and never waits on it.
        ("/upgrade", "POST") => {
            app.require_token(head)?;
            api::fsfreeze::gated(app, head, crate::upgrade::begin)
        }
        ("/metrics", "GET" | "HEAD") => {
            app.require_token(head)?;
            respond(api::metrics::get(app)?)
        }
        ("/files/compose", "POST") => {
            app.require_token(head)?;
            api::fsfreeze::gated(app, head, api::compose::begin)
        }
        ("/freeze", "POST") => respond(api::freeze::post_freeze(app, head)?),
        ("/unfreeze", "POST") => respond(api::freeze::post_unfreeze(app, head)?),
        ("/fsfreeze", "POST") => respond(api::fsfreeze::post_fsfreeze(app, head)?),
        ("/fsthaw", "POST") => respond(api::fsfreeze::post_fsthaw(app, head)?),
        ("/collapse", "POST") => respond(api::collapse::post(app, head)?),
        ("/files", "GET" | "HEAD") => respond(api::download::get(app, head)?),
        ("/files", "POST" | "PUT") => {
            api::upload::authorise(app, head)?;
            api::fsfreeze::gated(app, head, api::upload::begin)
        }
        (path, "POST") if service_method(path, api::filesystem::SERVICE).is_some() => {
            let method = service_method(path, api::filesystem::SERVICE).unwrap_or_default();
            Ok(api::filesystem::begin(app, head, method))
        }
        (path, "POST") if service_method(path, api::process::SERVICE).is_some() => {
            let method = service_method(path, api::process::SERVICE).unwrap_or_default();
            Ok(api::process::begin(app, head, method))
        }
        (path, _) if api::connect_stub::procedure(path).is_some() => {
            respond(api::connect_stub::answer(app, head))
        }
        (path, _) => Err(match ROUTES.iter().find(|(p, _)| *p == path) {
            Some((_, allow)) => {
                return respond(
                    Response::from(ApiError::new(
                        405,
                        format!("method {method} is not allowed on {path}; allowed: {allow}"),
                    ))
                    .with_header("Allow", *allow),
                )
            }
            None => ApiError::not_found(format!("no route for {method} {path}")),
        }),
    }
}

/// The method a `POST` to `/<service>/<Method>` calls.
fn service_method<'a>(path: &'a str, service: &str) -> Option<&'a str> {
    api::connect_stub::procedure(path)?
        .strip_prefix(service)?
        .strip_prefix('/')
}
