//! `POST /init` (envd-compatible, SPEC §9): set the token, variables, default user and workdir,
//! and have the system files written (`platform::init_files`).
//!
//! [`begin`] looks at the head, [`post`] parses the collected body and authorises it, [`apply`]
//! does what an authorised one asks, so how the body's bytes reach a handler can change
//! without touching the rules. Their order is envd's:
//!
//! 1. the body is parsed, `timestamp` included: malformed is 400;
//! 2. the caller is authorised, else 401 (below); the processes' cgroups are thawed, a
//!    `hierarchy` freeze of this image's audited first (`platform::cgroups::audit`): its counts
//!    ride this answer, errors included, as `X-Envd-Freeze-Audit`;
//! 3. an `/init` whose `timestamp` is older than the newest one applied changes nothing: 204;
//! 4. every field is validated before anything changes (400, or 401 for an unknown user);
//! 5. the clock is set from `timestamp`, in a Firecracker guest only (`platform::clock`; a
//!    failure is logged and changes no answer);
//! 6. the system files (`caBundle`, `hyperloopIP`) are written (500 when the CA files cannot
//!    be, and nothing below happens);
//! 7. the `volumeMounts` are mounted (`platform::volumes`; 400 in envd's words when one fails,
//!    and nothing below happens);
//! 8. the rest is applied: 204.
//!
//! Every answer, errors included, carries `Cache-Control: no-store` and `X-Envd-Version`, as
//! envd's do: the orchestrator reads the version off the `/init` it makes on every start and
//! resume.
//!
//! **Authorisation** is envd's `validateInitAccessToken` with the metadata service's token hash,
//! plus the current token in `X-Access-Token` and `--init-token-hash-file`: all in
//! [`init_token`](super::init_token), which also says when an `/init` clears the token. When
//! the metadata service's hash decides, the answer is deferred: the connection waits holding
//! no worker, and the hash thread (`mmds::hash`) reads the hash, once for every `/init` waiting
//! for it, and runs the rest of each `/init` (steps 2 to 8). Every authorised `/init` asks the
//! metadata service's poller for the identity again (`crate::mmds`).
//!
//! **System files.** `caBundle` and `hyperloopIP` are validated with the other fields (step 4)
//! and written under `--system-root` before the in-memory fields are applied; how, and what a
//! failure does, is `platform::init_files`'.
//!
//! **Where sandboxd differs from envd on purpose.** The clock is set from `timestamp` only in
//! a Firecracker guest (envd sets it wherever it runs; see `platform::clock`). `volumeMounts` are
//! checked before anything changes, and a failed mount leaves the in-memory fields as they were
//! (envd has applied the token and variables by then); see `platform::volumes` for the rest.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::init_token::{self, Authorisation, TokenChange};
use super::{collect_json, parse_json};
use crate::app::App;
use crate::auth::AuthError;
use crate::error::ApiError;
use crate::fs::users;
use crate::http::{deferred, Action, Head, Response};
use crate::log;
use crate::platform::cgroups::audit::Audit;
use crate::platform::{clock, init_files, volumes};

/// The envd API level sandboxd fully implements: printed by `sandboxd -version` (E2B's template
/// builder runs `envd -version` and records the answer as the template's envd version) and sent
/// in `X-Envd-Version` on every `/init` answer. The one place this string lives.
///
/// Clients switch behaviour on this number, so it must never name a version whose HTTP surface
/// sandboxd lacks (envd's history, `packages/envd` in e2b-dev/infra; the SDKs' `ENVD_*`
/// constants; the orchestrator's and API's `minEnvdVersionFor*`):
///
/// - 0.4.0: requests without `username` mean the default user (SDKs stop sending `user`). Have.
/// - 0.5.0: the host re-keys a resumed snapshot through `/init` (the orchestrator's snapshot
///   gate). Have: the metadata service's `accessTokenHash` (`--mmds-address`), or
///   `--init-token-hash-file` where there is no metadata service.
/// - 0.5.1–0.5.2: `Content-Disposition` on downloads, `volumeMounts` accepted by `/init` (only
///   sent from 0.5.14 on). Have.
/// - 0.5.3: `Content-Encoding: gzip` uploads. Have.
/// - 0.5.5 `/files/compose`, 0.5.7 raw `application/octet-stream` uploads (the SDKs' default
///   for streams, and their only way to send gzip), 0.5.9 `mem_cache`. Have.
/// - 0.5.13: `/init` installs `caBundle` (the API allows network transform rules from here on;
///   envd's commit "Propagate CA bundle to sandbox trust store on init"). Have
///   (`platform::ca_bundle`).
/// - 0.5.14: `/init` mounts NFS `volumeMounts` (the API allows volumes from here on). Have
///   (`platform::volumes`).
/// - 0.6.0–0.6.1: `POST /freeze`, `/unfreeze`, `/init` thawing. Have (`platform::cgroups`).
/// - 0.6.2: `X-Metadata-*` upload metadata (the SDKs refuse `metadata=` below it). Have.
/// - 0.6.3: entries in watch events (the SDKs' gate), the forwarders' group never frozen (the
///   orchestrator freezes across pauses from here on). Have: sandboxd forwards in its own
///   thread, in its own group, which no freeze touches.
/// - 0.6.4: `allowNetworkMounts` on watches (the SDKs' gate). Have.
/// - 0.6.5–0.6.6: `POST /collapse` with its split stats, `/fsfreeze` and `/fsthaw` (the
///   orchestrator calls them before pauses from here on; a failed `/fsfreeze` fails the pause).
///   Have (`platform::collapse`, `platform::fsfreeze`).
/// - 0.6.7–0.6.11: envd's fixes (upload metadata races, CA install, constant-time signatures,
///   `Start` after a cancelled request, prompt shutdown), none a new surface; sandboxd's
///   equivalents are in place.
/// - 0.6.12: `POST /upgrade`, the orchestrator's live upgrade at a resume: the new binary in
///   the body, the workload carried across a same-pid `execve`, the outcome in `/init`'s
///   `X-Envd-Handover`. Have (`upgrade`, SPEC §9c): the listener, `/init`'s state, processes,
///   watchers, forwards, a freeze in effect, each by sandboxd's own handover. The binary the
///   orchestrator delivers must be a sandboxd (`--handover-schema`): envd's is refused with
///   400 before anything is touched, and the sandbox goes on with sandboxd.
/// - 0.6.13: no new surface (envd's version bump after the live upgrade); with it, the level
///   the issue names for "every platform call": binary protobuf, `/init` with the metadata
///   service, pause and cgroups, port forwarding, live upgrade. Have.
/// - The Connect services (`filesystem.Filesystem`, `process.Process`), present in every envd:
///   have (SPEC §9b), `StreamInput` as a half-duplex client stream.
///
/// Hence 0.6.13, envd's newest: the SDKs turn on everything they gate (the highest gate is
/// 0.6.4), E2B's API allows network rules and volumes, and the orchestrator freezes, collapses,
/// fs-freezes and live-upgrades around pauses and resumes, all of which sandboxd does. (It
/// upgrades a daemon older than the level it promotes; told 0.6.13, it leaves sandboxd alone
/// until it promotes a newer one.)
pub const ENVD_VERSION: &str = "0.6.13";

/// The body of `POST /init`; every field optional, unknown fields ignored.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InitBody {
    access_token: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
    default_user: Option<String>,
    default_workdir: Option<String>,
    /// RFC 3339; an `/init` older than the newest one applied changes nothing. In a Firecracker
    /// guest, also the time the clock is set to when it is off by more than envd's margins.
    timestamp: Option<String>,
    /// PEM certificates for the trust store; `""` removes the installed one.
    ca_bundle: Option<String>,
    /// The address of `events.e2b.local` (`/etc/hosts`, `E2B_EVENTS_ADDRESS`).
    #[serde(rename = "hyperloopIP")]
    hyperloop_ip: Option<String>,
    /// NFS volumes to mount (`platform::volumes`).
    volume_mounts: Option<Vec<volumes::VolumeMount>>,
    /// The sandbox's lifecycle: a volume is remounted when it changes.
    #[serde(rename = "lifecycleID")]
    lifecycle_id: Option<String>,
}

/// The body (at most 1 MiB) is collected in the event loop, without a worker, since it may
/// carry the credential; then [`post`].
pub fn begin(app: &Arc<App>, _head: &Head) -> Result<Action, ApiError> {
    // Always the body first: a caller whose header is wrong may still present the current
    // token as the body's `accessToken` (envd reads only the body's), so who may /init is
    // known only once the body is read. It is small: `collect_json`'s limit bounds it.
    Ok(collect_json(app, post))
}

/// Parses and authorises; when the metadata service's hash decides, the answer is deferred:
/// the connection waits holding no worker while the hash thread reads it (`mmds::hash`), and
/// the rest of the `/init` runs there.
fn post(app: &Arc<App>, head: &Head, body: &[u8]) -> Result<Response, ApiError> {
    let parsed = if body.is_empty() {
        Ok(InitBody::default())
    } else {
        parse_json::<InitBody>(body)
    };
    let parsed = parsed.and_then(|body| {
        let timestamp = body.timestamp.as_deref().map(parse_timestamp).transpose()?;
        Ok((body, timestamp))
    });
    let (body, timestamp) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return Ok(answer(Err(e))),
    };
    let authorisation = init_token::authorise(app, head, body.access_token.as_deref());
    let app = Arc::clone(app);
    let finish = move |change: Result<TokenChange, AuthError>| {
        answer(
            change
                .map_err(ApiError::from)
                .and_then(|change| apply(&app, body, timestamp, change)),
        )
    };
    Ok(match authorisation {
        Authorisation::Decided(change) => finish(change),
        Authorisation::Pending(pending) => {
            let (reply, deferred) = deferred::channel();
            pending.decide(reply, finish);
            Response::deferred(deferred)
        }
    })
}

/// The answer to an `/init`, its envd headers added.
fn answer(result: Result<Response, ApiError>) -> Response {
    let response = with_envd_headers(result);
    // As envd's: once started from a live upgrade's handover, every /init says how it went.
    match crate::upgrade::outcome() {
        Some(outcome) => response.with_header("X-Envd-Handover", outcome.header()),
        None => response,
    }
}

/// Every `/init` answer, errors included, is `no-store` and names the envd level.
pub fn with_envd_headers(result: Result<Response, ApiError>) -> Response {
    result
        .unwrap_or_else(Response::from)
        .with_header("Cache-Control", "no-store")
        .with_header("X-Envd-Version", ENVD_VERSION)
}

/// Applies one authorised `/init` (the order is in the module documentation).
fn apply(
    app: &App,
    body: InitBody,
    timestamp: Option<i128>,
    change: TokenChange,
) -> Result<Response, ApiError> {
    app.mark_initialized();
    // As envd's deferred thaw: any authorised /init (a resume) thaws the processes' cgroups,
    // the frozen set audited first when this image's hierarchy sweep made it.
    let (audit, _) = app.cgroups.audit_and_thaw();
    let applied = apply_authorised(app, body, timestamp, change);
    let Some(audit) = audit else {
        return applied;
    };
    log_audit(&audit);
    let response = applied.unwrap_or_else(Response::from);
    Ok(response.with_header("X-Envd-Freeze-Audit", audit.header()))
}

/// The resume audit's findings for an operator: the counts, and the guest's names escaped.
fn log_audit(audit: &Audit) {
    if audit.truncated {
        log::line(format_args!(
            "init: the resume audit stopped at its bound after {} cgroups; the rest was not \
             classified",
            audit.visited
        ));
    }
    if audit.violations > 0 {
        log::line(format_args!(
            "init: {} cgroups the resume depends on were frozen: {:?}",
            audit.violations, audit.violation_paths
        ));
    }
    if audit.escaped > 0 {
        log::line(format_args!(
            "init: {} cgroups escaped the hierarchy freeze (made after it, or past its bound): \
             {:?}",
            audit.escaped, audit.escaped_paths
        ));
    }
}

/// Everything of an authorised `/init` after the thaw.
fn apply_authorised(
    app: &App,
    body: InitBody,
    timestamp: Option<i128>,
    change: init_token::TokenChange,
) -> Result<Response, ApiError> {
    if let Some(mmds) = &app.mmds {
        // As envd after every authorised /init: a resumed or forked sandbox has a new identity.
        mmds.poll();
    }
    if app.init_is_stale(timestamp) {
        return Ok(Response::empty(204));
    }
    if body.access_token.as_deref() == Some("") {
        return Err(ApiError::bad_request("accessToken must not be empty"));
    }
    if let Some(env) = &body.env_vars {
        if let Some(key) = env.keys().find(|k| !valid_env_name(k)) {
            return Err(ApiError::bad_request(format!(
                "invalid envVars name '{key}': must be non-empty without '=' or NUL"
            )));
        }
        if let Some(key) = env.iter().find(|(_, v)| v.contains('\0')).map(|(k, _)| k) {
            return Err(ApiError::bad_request(format!(
                "invalid envVars value of '{key}': contains NUL"
            )));
        }
    }
    if let Some(user) = &body.default_user {
        users::lookup(&app.config.passwd_file, user)?;
    }
    let workdir = match body.default_workdir.as_deref() {
        None => None,
        Some("") => Some(None),
        Some(dir) if dir.starts_with('/') && !dir.contains('\0') => Some(Some(PathBuf::from(dir))),
        Some(dir) => {
            return Err(ApiError::bad_request(format!(
                "defaultWorkdir must be an absolute path, not '{dir}'"
            )))
        }
    };
    let system_files =
        init_files::Request::parse(body.ca_bundle.as_deref(), body.hyperloop_ip.as_deref())?;
    let volumes = volumes::Request::parse(body.volume_mounts, body.lifecycle_id)?;
    clock::apply(app.mmds.as_deref(), timestamp);
    let events_address =
        system_files.apply(app.system_files(), &app.config.system_root, timestamp)?;
    if let Some(url) = events_address {
        app.set_internal_env(init_files::EVENTS_ADDRESS, url);
    }
    if let Some(volumes) = volumes {
        volumes.apply(&app.volumes, &app.config.system_root)?;
    }
    // False only when a newer /init was applied since the check above: this one is stale now.
    let token = match change {
        TokenChange::Clear => Some(None),
        TokenChange::SetOrKeep => body.access_token.map(Some),
    };
    app.apply_init(timestamp, token, body.env_vars, body.default_user, workdir);
    Ok(Response::empty(204))
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// `timestamp` as Unix nanoseconds, or 400 naming it.
fn parse_timestamp(text: &str) -> Result<i128, ApiError> {
    parse_rfc3339(text).ok_or_else(|| {
        let shown: String = text.chars().take(64).collect();
        ApiError::bad_request(format!(
            "invalid timestamp '{shown}': not an RFC 3339 date-time like 2006-01-02T15:04:05Z"
        ))
    })
}

/// Parses an RFC 3339 date-time (`2006-01-02T15:04:05.999999999+07:00`, `T`/`Z` in either
/// case, fraction optional and cut at nanoseconds) into Unix nanoseconds.
fn parse_rfc3339(text: &str) -> Option<i128> {
    let b = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        b.get(range)?.iter().try_fold(0i64, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(at, c)| b.get(at) != Some(&c))
        || !matches!(b.get(10), Some(b'T' | b't'))
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let days_in_month = match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return None,
    };
    if !(1..=days_in_month).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut at = 19;
    let mut nanos: i64 = 0;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..]
            .iter()
            .take_while(|d| d.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        // The first nine digits, padded with zeros to nine: nanoseconds.
        nanos = b[at + 1..at + 1 + digits.min(9)]
            .iter()
            .chain(std::iter::repeat(&b'0'))
            .take(9)
            .fold(0, |acc, &d| acc * 10 + i64::from(d - b'0'));
        at += 1 + digits;
    }
    let offset = match b.get(at..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (number(at + 1..at + 3)?, number(at + 4..at + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let offset = oh * 3600 + om * 60;
            if *sign == b'-' {
                -offset
            } else {
                offset
            }
        }
        _ => return None,
    };
    let seconds =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some(i128::from(seconds) * 1_000_000_000 + i128::from(nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i128 = 1_000_000_000;

    #[test]
    fn rfc3339_timestamps_to_unix_nanoseconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20Z"),
            Some(1_700_000_000 * SECOND)
        );
        assert_eq!(
            parse_rfc3339("2023-11-14t23:13:20.5+01:00"),
            Some(1_700_000_000 * SECOND + 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T21:13:20.123456789123-01:00"),
            Some(1_700_000_000 * SECOND + 123_456_789)
        );
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59z"), Some(-SECOND));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z"),
            Some(1_709_164_800 * SECOND)
        );
        assert_eq!(
            parse_rfc3339("9999-12-31T23:59:59Z"),
            Some(253_402_300_799 * SECOND)
        );
    }

    #[test]
    fn malformed_timestamps_are_refused() {
        for bad in [
            "",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-11-14 22:13:20Z",
            "2023-13-14T22:13:20Z",
            "2023-02-29T22:13:20Z",
            "2023-11-00T22:13:20Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:60:00Z",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+0100",
            "2023-11-14T22:13:20+24:00",
            "2023-11-14T22:13:20Zjunk",
            "+023-11-14T22:13:20Z",
            "2023-11-14T22:13:20\u{e9}",
            "2023-11-14T22:1\u{e9}:20Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
        let error = parse_timestamp(&"9".repeat(1000)).unwrap_err();
        assert_eq!(error.status, 400);
        assert!(error.message.len() < 200, "{}", error.message);
    }
}
