//! The seam between `POST /init` and the system files it writes: `caBundle` (`ca_bundle`) and
//! `hyperloopIP` (`hosts` and `E2B_EVENTS_ADDRESS`). `/init` calls [`Request::parse`] with the
//! other fields' validation (a 400 changes nothing) and [`Request::apply`] before it applies its
//! in-memory fields.
//!
//! [`Request::apply`] runs under one lock, [`SystemFiles`], which also remembers the newest
//! `timestamp` whose files were written: two `/init`s racing can't interleave their
//! read-modify-writes, and an older one arriving late never overwrites a newer one's files.
//! The CA files come first; a failure there is a 500 and the `/init` stops (envd answers 400
//! `failed to install CA bundle: ...`). The hosts file comes second, and a failure there is only
//! logged, as envd logs it (`failed to modify hosts file`) and answers 204: the orchestrator
//! retries a failed `/init` until it gives up on the sandbox, and the events entry is not worth
//! a sandbox. `E2B_EVENTS_ADDRESS` is set only once the entry is written, as envd's.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;

use super::{ca_bundle, hosts};
use crate::error::ApiError;

/// The variable that tells sandboxed code where the event service is (envd's).
pub const EVENTS_ADDRESS: &str = "E2B_EVENTS_ADDRESS";

/// What one `/init` asks of the system files, validated.
#[derive(Debug, Default, PartialEq)]
pub struct Request {
    ca: Option<CaChange>,
    hyperloop: Option<IpAddr>,
}

#[derive(Debug, PartialEq)]
enum CaChange {
    /// The normalised PEM to install in place of the previous one.
    Install(String),
    /// `""`: remove the one installed.
    Remove,
}

/// The lock every write of system files takes, and the newest `/init` timestamp (Unix
/// nanoseconds) whose files were written.
#[derive(Default)]
pub struct SystemFiles {
    newest: Mutex<Option<i128>>,
}

impl Request {
    /// Validates the two fields; `None` leaves a file as it is. An empty `hyperloopIP` is
    /// also left alone (the orchestrator never sends one; envd only logs it).
    pub fn parse(ca_bundle: Option<&str>, hyperloop_ip: Option<&str>) -> Result<Request, ApiError> {
        let ca = match ca_bundle {
            None => None,
            Some("") => Some(CaChange::Remove),
            Some(pem) => Some(CaChange::Install(ca_bundle::validate(pem).map_err(
                |why| ApiError::bad_request(format!("invalid caBundle: {why}")),
            )?)),
        };
        let hyperloop = match hyperloop_ip {
            None | Some("") => None,
            Some(text) => Some(text.parse::<IpAddr>().map_err(|_| {
                let shown: String = text.chars().take(64).collect();
                ApiError::bad_request(format!(
                    "invalid hyperloopIP '{shown}': not an IPv4 or IPv6 address"
                ))
            })?),
        };
        Ok(Request { ca, hyperloop })
    }

    /// Writes the files under `root` unless a newer `/init` already wrote them (`state`
    /// orders them; module documentation for the order and the errors). The value of
    /// [`EVENTS_ADDRESS`] once the hosts entry is written, for the caller to set.
    pub fn apply(
        &self,
        state: &SystemFiles,
        root: &Path,
        timestamp: Option<i128>,
    ) -> Result<Option<String>, ApiError> {
        if *self == Request::default() {
            return Ok(None);
        }
        let mut newest = state.newest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(new) = timestamp {
            if newest.is_some_and(|newest| new < newest) {
                return Ok(None);
            }
            *newest = Some(new);
        }
        let ca = match &self.ca {
            None => Ok(()),
            Some(CaChange::Install(pem)) => ca_bundle::install(root, pem),
            Some(CaChange::Remove) => ca_bundle::uninstall(root),
        };
        ca.map_err(|error| ApiError::internal(format!("error installing caBundle: {error}")))?;
        let Some(address) = self.hyperloop else {
            return Ok(None);
        };
        match hosts::set_events_entry(root, address) {
            Ok(()) => Ok(Some(events_url(address))),
            Err(error) => {
                crate::log::line(format_args!(
                    "init: hyperloopIP: cannot write the {} entry: {error}; {EVENTS_ADDRESS} unchanged",
                    hosts::EVENTS_HOST
                ));
                Ok(None)
            }
        }
    }
}

/// `http://<address>`, as envd sets it, with an IPv6 address in brackets (envd's
/// `http://fd00::1` is not a URL a client can parse).
fn events_url(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => format!("http://{v4}"),
        IpAddr::V6(v6) => format!("http://[{v6}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_to_changes_or_400s() {
        assert_eq!(Request::parse(None, None), Ok(Request::default()));
        assert_eq!(Request::parse(None, Some("")), Ok(Request::default()));
        assert_eq!(
            Request::parse(Some(""), Some("10.0.0.1")),
            Ok(Request {
                ca: Some(CaChange::Remove),
                hyperloop: Some("10.0.0.1".parse().unwrap())
            })
        );
        for bad in [
            "10.0.0",
            "10.0.0.256",
            "010.0.0.1",
            "fe80::1%eth0",
            "[fd00::1]",
            " 10.0.0.1",
            "x",
        ] {
            let error = Request::parse(None, Some(bad)).unwrap_err();
            assert_eq!(
                error,
                ApiError::bad_request(format!(
                    "invalid hyperloopIP '{bad}': not an IPv4 or IPv6 address"
                )),
            );
        }
        let error = Request::parse(Some("junk"), None).unwrap_err();
        assert_eq!(error.status, 400);
        assert!(
            error.message.starts_with("invalid caBundle: line 1 "),
            "{error}"
        );
    }

    #[test]
    fn events_urls() {
        assert_eq!(events_url("10.11.0.1".parse().unwrap()), "http://10.11.0.1");
        assert_eq!(events_url("fd00::1".parse().unwrap()), "http://[fd00::1]");
    }
}
