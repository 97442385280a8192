//! Starting one process: its environment, its standard streams (pipes, or a terminal), and the
//! user it runs as, from a [`Spec`] the service made of the request.
//!
//! `std::process::Command` forks and execs; `sys::spawn` sets the child up before `exec`
//! (session, terminal, groups and ids, working directory, and a clean start: default signal
//! dispositions, an empty mask, the open-file limit the daemon was started with). The
//! environment is built here and only here, from nothing (`env_clear`): the daemon's own
//! variables, its token among them, never reach a child.
//!
//! The daemon's ends of the pipes, and a terminal's master, are non-blocking: the I/O thread
//! reads them when `poll` says so, and writes input the same way. The child's ends are its own
//! descriptors, blocking as programs expect.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use crate::sys::poll::set_nonblocking;
use crate::sys::pty::{self, WindowSize};
use crate::sys::spawn::{self as child, ChildSetup, Credentials};

/// `PATH` for children when the daemon has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `TERM` of a terminal session whose request sets none.
pub const DEFAULT_TERM: &str = "xterm-256color";

/// Which of a process's outputs bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Stdout,
    Stderr,
    /// A terminal's master: stdout and stderr together, as the terminal shows them.
    Pty,
}

/// What a process was asked to be, as the request said it (the service lists it back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

/// Everything needed to start a process.
#[derive(Debug, Clone)]
pub struct Spec {
    pub config: Config,
    /// The whole environment of the child.
    pub env: BTreeMap<String, String>,
    /// The working directory, resolved.
    pub cwd: PathBuf,
    /// `None`: the daemon's own user.
    pub credentials: Option<Credentials>,
    /// A terminal of this size instead of pipes.
    pub terminal: Option<WindowSize>,
    /// A stdin pipe (else `/dev/null`); a terminal always has input.
    pub stdin: bool,
    pub tag: Option<String>,
    /// The `cgroup.procs` of the process's group (`platform::cgroups`); `None`: the daemon's.
    pub cgroup: Option<Arc<File>>,
}

/// A started child and the daemon's ends of its streams.
pub struct Spawned {
    pub pid: u32,
    /// In the order they are read when several are ready.
    pub outputs: Vec<(OutputKind, Arc<File>)>,
    /// Where input goes: the stdin pipe, or the terminal's master.
    pub input: Option<Arc<File>>,
    /// The terminal's master, for resizing.
    pub terminal: Option<Arc<File>>,
}

/// The environment of a child, in envd's order (later wins): `PATH` (the daemon's, else
/// [`DEFAULT_PATH`]), `HOME`, `USER`, `LOGNAME`, `TERM` for a terminal, the variables of
/// `/init`, then the request's.
pub fn environment(
    path: Option<&str>,
    user: &crate::fs::users::User,
    terminal: bool,
    init: &BTreeMap<String, String>,
    request: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        path.filter(|p| !p.is_empty())
            .unwrap_or(DEFAULT_PATH)
            .to_string(),
    );
    env.insert("HOME".to_string(), user.home.to_string_lossy().into_owned());
    env.insert("USER".to_string(), user.name.clone());
    env.insert("LOGNAME".to_string(), user.name.clone());
    if terminal {
        env.insert("TERM".to_string(), DEFAULT_TERM.to_string());
    }
    env.extend(init.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Starts the process. The error is the one `fork`, the set-up or `exec` met (std reports a
/// failed `exec`'s errno); the child is then already gone and reaped by std.
pub fn spawn(spec: &Spec) -> io::Result<Spawned> {
    let mut command = Command::new(&spec.config.cmd);
    command.args(&spec.config.args).env_clear().envs(&spec.env);
    let setup = ChildSetup {
        credentials: spec.credentials.clone(),
        cwd: spec.cwd.clone(),
        controlling_terminal: spec.terminal.is_some(),
        // The daemon raised its own soft limit; its children get the one it was started with.
        open_files: crate::sys::process::started_nofile_limit(),
        cgroup_procs: spec.cgroup.as_ref().map(|procs| procs.as_raw_fd()),
    };
    child::configure(&mut command, &setup)?;
    match spec.terminal {
        Some(size) => spawn_with_terminal(command, size),
        None => spawn_with_pipes(command, spec.stdin),
    }
}

fn spawn_with_pipes(mut command: Command, stdin: bool) -> io::Result<Spawned> {
    command
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn()?;
    let pid = child.id();
    let ends = take_pipes(&mut child);
    // The Child is dropped without waiting: the reaper observes the exit (`proc::reaper`).
    drop(child);
    let (stdout, stderr, input) = ends?;
    Ok(Spawned {
        pid,
        outputs: vec![(OutputKind::Stdout, stdout), (OutputKind::Stderr, stderr)],
        input,
        terminal: None,
    })
}

type Pipes = (Arc<File>, Arc<File>, Option<Arc<File>>);

/// The stdout pipe's size.
const OUTPUT_PIPE: usize = 1 << 20;

fn take_pipes(child: &mut Child) -> io::Result<Pipes> {
    let missing = || io::Error::other("the child's pipes were not created");
    let stdout = OwnedFd::from(child.stdout.take().ok_or_else(missing)?);
    let _ = crate::sys::poll::set_pipe_size(stdout.as_fd(), OUTPUT_PIPE);
    let stdout = nonblocking(stdout)?;
    let stderr = nonblocking(OwnedFd::from(child.stderr.take().ok_or_else(missing)?))?;
    let input = match child.stdin.take() {
        Some(stdin) => Some(nonblocking(OwnedFd::from(stdin))?),
        None => None,
    };
    Ok((stdout, stderr, input))
}

fn spawn_with_terminal(mut command: Command, size: WindowSize) -> io::Result<Spawned> {
    let (master, slave) = pty::open(size)?;
    command
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    let child = command.spawn()?;
    let pid = child.id();
    // Dropping the command closes the daemon's copies of the slave: once the child and its
    // descendants close theirs, reading the master fails with EIO, the terminal's end of file.
    drop(command);
    drop(child);
    let master = nonblocking(master)?;
    Ok(Spawned {
        pid,
        outputs: vec![(OutputKind::Pty, Arc::clone(&master))],
        input: Some(Arc::clone(&master)),
        terminal: Some(master),
    })
}

fn nonblocking(fd: OwnedFd) -> io::Result<Arc<File>> {
    set_nonblocking(fd.as_fd())?;
    Ok(Arc::new(File::from(fd)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::users::User;

    #[test]
    fn the_environment_is_built_from_nothing_in_envds_order() {
        let user = User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
        };
        let init = BTreeMap::from([
            ("FROM_INIT".to_string(), "1".to_string()),
            ("PATH".to_string(), "/init/bin".to_string()),
        ]);
        let request = BTreeMap::from([
            ("FROM_INIT".to_string(), "2".to_string()),
            ("TERM".to_string(), "dumb".to_string()),
        ]);
        let env = environment(Some("/usr/bin:/bin"), &user, true, &init, &request);
        let expected = BTreeMap::from([
            ("FROM_INIT", "2"),
            ("HOME", "/home/user"),
            ("LOGNAME", "user"),
            ("PATH", "/init/bin"),
            ("TERM", "dumb"),
            ("USER", "user"),
        ]);
        let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, expected);
        let plain = environment(None, &user, false, &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(plain["PATH"], DEFAULT_PATH);
        assert!(!plain.contains_key("TERM"));
    }
}
