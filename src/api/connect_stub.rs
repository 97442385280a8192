//! The paths of envd's Connect-RPC services (SPEC §9b), and the answer to what the services
//! do not take: a method other than `POST`.
//!
//! A `POST` to `/filesystem.Filesystem/<Method>` or `/process.Process/<Method>` is the service's
//! (`api::filesystem`, `api::process`). Any other request there is answered here, and never with
//! the plain 404 of an unknown route, because the Python SDK reads a plain 404 from these paths
//! as "file not found": authentication first, as on every route, then 405 with `Allow: POST`
//! and Connect's JSON error `{"code":"unimplemented","message":...}`, as connect-go answers.
//!
//! Decisions where SPEC leaves room:
//!
//! - Errors on these paths are in Connect's form, not SPEC §2's: a 401 is
//!   `{"code":"unauthenticated",...}`. With SPEC §2's numeric `code` connect-python (the Python
//!   SDK's client, 0.12) reads the call as `unavailable`, which the SDK takes for a sandbox that
//!   may be gone.
//! - Any method name under the two services counts, known to envd or not; a path with nothing
//!   or another `/` after the service is an unknown route (404).

use crate::app::App;
use crate::http::{Head, Response};

/// The Connect services of envd that sandboxd answers for.
pub const SERVICES: [&str; 2] = ["filesystem.Filesystem", "process.Process"];

/// The `<service>/<method>` a Connect path names, or `None` for any other path.
pub fn procedure(path: &str) -> Option<&str> {
    let procedure = path.strip_prefix('/')?;
    let (service, method) = procedure.split_once('/')?;
    let known = SERVICES.contains(&service) && !method.is_empty() && !method.contains('/');
    known.then_some(procedure)
}

/// The answer to a request whose path [`procedure`] accepts.
pub fn answer(app: &App, head: &Head) -> Response {
    let procedure = head.path().trim_start_matches('/');
    if let Err(refused) = app.require_token(head) {
        return error(401, "unauthenticated", refused.to_string());
    }
    if head.method() != "POST" {
        let message = format!(
            "method {} is not allowed on /{procedure}; Connect calls are POST",
            head.method()
        );
        return error(405, "unimplemented", message).with_header("Allow", "POST");
    }
    // A POST is routed to its service before it could get here.
    error(
        501,
        "unimplemented",
        format!("{procedure} is not implemented by sandboxd"),
    )
}

/// A Connect error: `status` with `{"code":<code>,"message":<message>}`.
fn error(status: u16, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "code": code, "message": message });
    Response::json(status, body.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_paths_of_the_two_services() {
        assert_eq!(
            procedure("/filesystem.Filesystem/Stat"),
            Some("filesystem.Filesystem/Stat")
        );
        assert_eq!(
            procedure("/process.Process/Start"),
            Some("process.Process/Start")
        );
        assert_eq!(
            procedure("/process.Process/NoSuchMethod"),
            Some("process.Process/NoSuchMethod")
        );
        for other in [
            "/filesystem.Filesystem/",
            "/filesystem.Filesystem",
            "/filesystem.Filesystem/Stat/x",
            "/other.Service/Stat",
            "filesystem.Filesystem/Stat",
            "/files",
        ] {
            assert_eq!(procedure(other), None, "{other}");
        }
    }

    #[test]
    fn errors_are_connect_json() {
        let response = error(501, "unimplemented", "x \"y\"".to_string());
        assert_eq!(response.status, 501);
        let crate::http::ResponseBody::Bytes(body) = &response.body else {
            panic!("no body")
        };
        assert_eq!(body, br#"{"code":"unimplemented","message":"x \"y\""}"#);
        assert!(response
            .headers
            .iter()
            .any(|(n, v)| *n == "Content-Type" && v == "application/json"));
    }
}
