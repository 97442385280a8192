//! `Start` (run a process and stream its events) and `Connect` (stream a running one's events
//! from now on), both server streams.
//!
//! A process is started as envd starts it: as the caller's user (uid, primary gid and the
//! groups of the group file beside the passwd file), in `cwd` resolved for that user (SPEC §4:
//! by default the default workdir, else the home; it must exist), with the environment
//! `proc::spawn::environment` builds (never the daemon's own variables), in a new session, with
//! pipes or, when `pty` is given, a terminal of that size. envd runs every command through
//! `/bin/sh -c '... exec "$@"'`; sandboxd execs it directly (no shell per command, and no
//! dependence on one), so a program that cannot be executed is not a shell's exit 127 but the
//! error envd gives when its own start fails: `invalid_argument` `error starting process
//! '<cmd args>' in '<cwd>' as <user>: <reason>` (the directory and user added: the reason may be
//! theirs, a directory the user may not enter), at the end of a stream with no event.
//!
//! The process joins its cgroup (`platform::cgroups`: `ptys` with a terminal, else `user`, none
//! for the `_system` tag) before it executes anything; while `/freeze` holds those groups
//! frozen, a `Start` into them is `unavailable` at once rather than a child that would freeze
//! before `exec` with its `Start` hanging until the thaw.

use std::sync::Arc;
use std::time::Duration;

use super::messages::{selector, ProcessConfig, PtySize, SelectorRequest, StartRequest};
use super::stream::ProcessStream;
use super::{hub, proc_error, spawn_code};
use crate::api::rpc::{api_error, failed};
use crate::app::App;
use crate::connect::{Call, Code, Error};
use crate::fs::owners;
use crate::http::Response;
use crate::platform::cgroups::Group;
use crate::proc::{Attached, Config, Hub, ProcError, Spec};
use crate::sys::pty::WindowSize;
use crate::sys::spawn::Credentials;

/// `Start`: the stream, or its failure as the stream's only message.
pub fn start(
    app: &Arc<App>,
    username: Option<&str>,
    call: &Call,
    keepalive: Duration,
    request: StartRequest,
) -> Response {
    start_process(app, username, call, keepalive, request)
        .unwrap_or_else(|error| failed(call.codec, error))
}

fn start_process(
    app: &Arc<App>,
    username: Option<&str>,
    call: &Call,
    keepalive: Duration,
    request: StartRequest,
) -> Result<Response, Error> {
    // The command may be a server about to listen: the forwarder scans often for a while.
    crate::platform::forward::nudge();
    let resolver = app.resolver(username).map_err(api_error)?;
    let user = &resolver.user;
    let config = request.process.unwrap_or_default();
    check_config(&config)?;
    let cwd = resolver
        .resolve(config.cwd.as_deref().unwrap_or(""))
        .map_err(|e| Error::invalid_argument(e.to_string()))?;
    if !cwd.exists() {
        return Err(Error::invalid_argument(format!(
            "cwd '{}' does not exist",
            cwd.display()
        )));
    }
    let terminal = match request.pty {
        Some(pty) => Some(window_size(pty.size.unwrap_or_default())?),
        None => None,
    };
    let env = crate::proc::spawn::environment(
        app.base_path(),
        user,
        terminal.is_some(),
        &app.init_env(),
        &config.envs,
    );
    let spec = Spec {
        config: Config {
            cmd: config.cmd.clone(),
            args: config.args.clone(),
            envs: config.envs.clone(),
            cwd: config.cwd.clone(),
        },
        env,
        cwd,
        credentials: Some(Credentials {
            uid: user.uid,
            gid: user.gid,
            groups: owners::groups(&app.config.passwd_file, user),
        }),
        terminal,
        stdin: request.stdin.unwrap_or(true),
        tag: request.tag,
        cgroup: None,
    };
    let group = Group::of_start(spec.tag.as_deref(), spec.terminal.is_some());
    let placement = app.cgroups.placement(group).map_err(|_| {
        Error::new(
            Code::Unavailable,
            "the sandbox's processes are frozen (POST /freeze): a process can start once \
             /unfreeze or /init thaws them",
        )
    })?;
    let spec = Spec {
        cgroup: placement.procs.clone(),
        ..spec
    };
    let (mut stream, response) = ProcessStream::open(call, keepalive);
    hub()?
        .start(&spec, call.timeout, move |pid| {
            stream.started(pid);
            Box::new(stream)
        })
        .map_err(|error| match error {
            ProcError::Spawn(error) => Error::new(
                spawn_code(&error),
                format!(
                    "error starting process '{}' in '{}' as {}: {error}",
                    command_line(&config),
                    spec.cwd.display(),
                    user.name
                ),
            ),
            other => proc_error(other, "error starting process"),
        })?;
    // Held across the spawn: a freeze waits for it (`platform::cgroups::freeze`).
    drop(placement);
    Ok(response)
}

/// `Connect`: the stream of a live process from now on; of one that ended lately, its start and
/// end (envd remembers ends for 30 s); else `not_found`.
pub fn connect(call: &Call, keepalive: Duration, request: SelectorRequest) -> Response {
    attach(call, keepalive, request).unwrap_or_else(|error| failed(call.codec, error))
}

fn attach(call: &Call, keepalive: Duration, request: SelectorRequest) -> Result<Response, Error> {
    let selector = selector(request.process.as_ref())?;
    let hub =
        Hub::running().ok_or_else(|| proc_error(ProcError::NotFound(selector.clone()), ""))?;
    let (stream, response) = ProcessStream::open(call, keepalive);
    let attached = hub
        .attach(&selector, stream, ProcessStream::started)
        .map_err(|e| proc_error(e, "error connecting to process"))?;
    if let Attached::Ended(pid, exit, mut stream) = attached {
        stream.started(pid);
        stream.ended(exit);
    }
    Ok(response)
}

/// The checks std's spawn would make less clearly: no empty program, no NUL anywhere, no `=`
/// in a variable's name.
fn check_config(config: &ProcessConfig) -> Result<(), Error> {
    if config.cmd.is_empty() {
        return Err(Error::invalid_argument("process.cmd is empty"));
    }
    let has_nul = |text: &str| text.as_bytes().contains(&0);
    if has_nul(&config.cmd) || config.args.iter().any(|a| has_nul(a)) {
        return Err(Error::invalid_argument(
            "process.cmd and process.args must not contain NUL bytes",
        ));
    }
    for (name, value) in &config.envs {
        if name.is_empty() || name.contains('=') || has_nul(name) || has_nul(value) {
            return Err(Error::invalid_argument(format!(
                "process.envs: '{}' is not a valid variable (a non-empty name without '=', no NUL)",
                name.escape_debug()
            )));
        }
    }
    Ok(())
}

/// A terminal size the kernel can hold: 1 to 65535 rows and columns.
pub fn window_size(size: PtySize) -> Result<WindowSize, Error> {
    let fits = |n: u32| u16::try_from(n).ok().filter(|n| *n > 0);
    match (fits(size.rows), fits(size.cols)) {
        (Some(rows), Some(cols)) => Ok(WindowSize { rows, cols }),
        _ => Err(Error::invalid_argument(format!(
            "pty size {}x{} (cols x rows): each must be 1 to 65535",
            size.cols, size.rows
        ))),
    }
}

/// The command as envd's messages show it: the program and its arguments, space-separated.
fn command_line(config: &ProcessConfig) -> String {
    std::iter::once(config.cmd.as_str())
        .chain(config.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sizes_must_fit_the_kernels() {
        let size = |cols, rows| window_size(PtySize { cols, rows });
        assert_eq!(size(80, 24).unwrap(), WindowSize { rows: 24, cols: 80 });
        assert!(size(65535, 1).is_ok());
        for (cols, rows) in [(0, 24), (80, 0), (65536, 24), (80, u32::MAX)] {
            assert!(size(cols, rows).is_err(), "{cols}x{rows}");
        }
    }

    #[test]
    fn configs_are_checked_before_spawning() {
        let config = |cmd: &str, args: &[&str], envs: &[(&str, &str)]| ProcessConfig {
            cmd: cmd.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
        };
        assert!(check_config(&config("ls", &["-l"], &[("A", "1")])).is_ok());
        assert!(check_config(&config("", &[], &[])).is_err());
        assert!(check_config(&config("ls", &["a\0b"], &[])).is_err());
        assert!(check_config(&config("ls", &[], &[("A=B", "1")])).is_err());
        assert!(check_config(&config("ls", &[], &[("", "1")])).is_err());
        assert_eq!(
            command_line(&config("/bin/bash", &["-l", "-c", "echo hi"], &[])),
            "/bin/bash -l -c echo hi"
        );
    }
}
