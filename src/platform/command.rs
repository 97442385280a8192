//! Running a system program for the daemon itself (`/init`'s `mount`), as envd's
//! `exec.CommandContext(...).CombinedOutput()` does, within a time budget.
//!
//! The program is found on the daemon's `PATH` (a test puts fakes first), or, with [`run_from`],
//! executed from an open descriptor (live upgrade's new binary, never looked up by path); it
//! starts with no input,
//! an empty signal mask and default dispositions (std's spawn resets them), in a process group
//! of its own, with its output and errors in one pipe, of which the first [`OUTPUT_KEPT`]
//! bytes are kept. Past the deadline the whole group is killed (`mount.nfs` is `mount`'s child)
//! and the run is [`Failure::TimedOut`]. Its exit is claimed (`proc::claimed`), so the daemon's
//! reaper hands it over instead of dropping it.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::proc::{claimed, reaper};
use crate::sys::poll::{poll_ready, Interest};
use crate::sys::process::{kill_group, WaitStatus};

/// Output bytes kept for the error message.
pub const OUTPUT_KEPT: usize = 4096;

/// How a run that did not exit with 0 ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// It could not be started (not found, not executable).
    NotStarted(String),
    /// It ended with this status.
    Ended(WaitStatus),
    /// The deadline passed and it was killed.
    TimedOut,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NotStarted(reason) => write!(f, "cannot start it: {reason}"),
            Failure::Ended(WaitStatus::Exited(code)) => write!(f, "exit status {code}"),
            Failure::Ended(WaitStatus::Signaled { signal, .. }) => {
                write!(f, "killed by signal {signal}")
            }
            Failure::TimedOut => write!(f, "it did not finish in time and was killed"),
        }
    }
}

/// What a run printed, and whether it succeeded.
#[derive(Debug)]
pub struct Ran {
    pub result: Result<(), Failure>,
    /// Output and errors together, at most [`OUTPUT_KEPT`] bytes, lossily UTF-8.
    pub output: String,
}

/// Runs `program args...` until it exits or `deadline` passes.
pub fn run(program: &str, args: &[&str], deadline: Instant) -> Ran {
    let mut command = Command::new(program);
    command.args(args);
    run_command(command, deadline)
}

/// Runs the program open at `program` (executed from the descriptor, never looked up by path;
/// `name` is its `argv[0]`) with `args`, as [`run`] does.
pub fn run_from(program: BorrowedFd<'_>, name: &str, args: &[&str], deadline: Instant) -> Ran {
    let mut command = Command::new(name);
    let argv: Vec<OsString> = std::iter::once(name)
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect();
    match crate::sys::exec::run_instead(&mut command, program, &argv) {
        Ok(()) => run_command(command, deadline),
        Err(error) => not_started(&error),
    }
}

fn run_command(command: Command, deadline: Instant) -> Ran {
    match start(command) {
        Ok((pid, output)) => finish(pid, output, deadline),
        Err(error) => not_started(&error),
    }
}

fn not_started(error: &io::Error) -> Ran {
    Ran {
        result: Err(Failure::NotStarted(error.to_string())),
        output: String::new(),
    }
}

fn start(mut command: Command) -> io::Result<(u32, io::PipeReader)> {
    let (reader, writer) = io::pipe()?;
    command
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .process_group(0);
    let _spawning = reaper::spawning();
    let child = command.spawn()?;
    claimed::claim(child.id());
    // `command` still holds the pipe's write ends: dropped here, so the pipe ends with the child.
    drop(command);
    Ok((child.id(), reader))
}

fn finish(pid: u32, mut output: io::PipeReader, deadline: Instant) -> Ran {
    let mut kept = Vec::new();
    let timed_out = !read_until_closed(&mut output, &mut kept, deadline);
    if timed_out {
        let _ = kill_group(pid, libc::SIGKILL);
    }
    // Killed, or its output closed: it ends promptly (a child that closed its output and runs
    // on is given until the deadline, then killed too).
    let status = match claimed::wait(pid, deadline) {
        Some(status) => status,
        None => {
            let _ = kill_group(pid, libc::SIGKILL);
            claimed::wait(pid, Instant::now() + std::time::Duration::from_secs(5)).unwrap_or(
                WaitStatus::Signaled {
                    signal: libc::SIGKILL,
                    core: false,
                },
            )
        }
    };
    let result = match status {
        _ if timed_out => Err(Failure::TimedOut),
        WaitStatus::Exited(0) => Ok(()),
        ended => Err(Failure::Ended(ended)),
    };
    Ran {
        result,
        output: String::from_utf8_lossy(&kept).into_owned(),
    }
}

/// Reads `pipe` until every writer closed it (true) or `deadline` (false), keeping the first
/// [`OUTPUT_KEPT`] bytes.
fn read_until_closed(pipe: &mut io::PipeReader, kept: &mut Vec<u8>, deadline: Instant) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        match poll_ready(&[(pipe.as_fd(), Interest::Read)], Some(deadline - now)) {
            Ok(ready) if ready.first() == Some(&true) => {}
            Ok(_) => continue,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
        match pipe.read(&mut chunk) {
            Ok(0) => return true,
            Ok(n) => {
                let room = OUTPUT_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn output_and_errors_are_kept_together() {
        let ran = run("sh", &["-c", "echo out; echo err >&2"], soon());
        assert_eq!(ran.result, Ok(()));
        assert_eq!(ran.output, "out\nerr\n");
    }

    #[test]
    fn an_exit_code_is_the_failure() {
        let ran = run("sh", &["-c", "echo no >&2; exit 32"], soon());
        assert_eq!(ran.result, Err(Failure::Ended(WaitStatus::Exited(32))));
        assert_eq!(ran.result.unwrap_err().to_string(), "exit status 32");
    }

    #[test]
    fn a_missing_program_is_not_started() {
        let ran = run("/nonexistent/sandboxd-helper", &[], soon());
        assert!(
            matches!(&ran.result, Err(Failure::NotStarted(r)) if r.contains("No such file")),
            "{ran:?}"
        );
    }

    #[test]
    fn past_the_deadline_the_group_is_killed() {
        // The grandchild holds the pipe too: killing the group ends both.
        let ran = run(
            "sh",
            &["-c", "sleep 30 & echo started; wait"],
            Instant::now() + Duration::from_millis(300),
        );
        assert_eq!(ran.result, Err(Failure::TimedOut));
        assert_eq!(ran.output, "started\n");
    }

    #[test]
    fn output_is_kept_up_to_its_bound() {
        let ran = run(
            "sh",
            &["-c", "head -c 100000 /dev/zero | tr '\\0' x"],
            soon(),
        );
        assert_eq!(ran.result, Ok(()));
        assert_eq!(ran.output.len(), OUTPUT_KEPT);
    }
}
