//! Process-wide settings and children: the open-file limit (and the one the daemon was started
//! with, which children get back), signal masks, `sigwait`, waiting for children without
//! blocking (`waitpid` with `WNOHANG`), and signals to a process or a process group.

use std::io;
use std::sync::OnceLock;

use super::check;

/// The `RLIMIT_NOFILE` the daemon was started with (soft, hard), before
/// [`raise_nofile_limit`]; children get it back (`sys::spawn`).
static STARTED_NOFILE: OnceLock<(u64, u64)> = OnceLock::new();

/// The open-file limit (soft, hard) the daemon was started with, once it raised its own.
pub fn started_nofile_limit() -> Option<(u64, u64)> {
    STARTED_NOFILE.get().copied()
}

/// The `RLIMIT_NOFILE` now (soft, hard).
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit the kernel writes into.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the new soft limit. The limit
/// found is remembered first ([`started_nofile_limit`]).
pub fn raise_nofile_limit() -> io::Result<u64> {
    let (soft, hard) = nofile_limit()?;
    let _ = STARTED_NOFILE.set((soft, hard));
    let mut limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid, initialised rlimit the kernel only reads.
        check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) })?;
    }
    Ok(limit.rlim_cur)
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use, and
    // sigaddset with a valid signal number only sets a bit.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks `signals` in the calling thread and in every thread it spawns afterwards, so that
/// they are only ever received by [`wait_signal_from`]. Blocked signals are queued even for PID 1.
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<()> {
    let set = signal_set(signals);
    // SAFETY: `set` is an initialised sigset_t; the old mask is not requested (null).
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// A signal received, and its sender as this process's PID namespace sees it (0: the kernel,
/// or a process outside the namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub signal: libc::c_int,
    pub sender: libc::pid_t,
}

/// Waits until one of `signals` (which must be blocked) arrives; it and who sent it.
pub fn wait_signal_from(signals: &[libc::c_int]) -> io::Result<Received> {
    let set = signal_set(signals);
    loop {
        // SAFETY: siginfo_t is plain data the call fills; all-zero bytes are a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is initialised and `info` is a writable siginfo_t for the call.
        let signal = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if signal < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        // SAFETY: `info` was filled by sigwaitinfo; si_pid is meaningful for signals sent by
        // kill and 0 in the zeroed value otherwise.
        let sender = unsafe { info.si_pid() };
        return Ok(Received { signal, sender });
    }
}

/// How a child ended, as `waitpid` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// It called `exit` with this code.
    Exited(i32),
    /// A signal ended it; `core`: it dumped core.
    Signaled { signal: i32, core: bool },
}

impl WaitStatus {
    fn decode(status: libc::c_int) -> Option<WaitStatus> {
        if libc::WIFEXITED(status) {
            Some(WaitStatus::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(WaitStatus::Signaled {
                signal: libc::WTERMSIG(status),
                core: libc::WCOREDUMP(status),
            })
        } else {
            // Stopped or continued: not asked for (no WUNTRACED or WCONTINUED).
            None
        }
    }
}

/// Reaps one exited child, any of them, without blocking: `None` when none has exited (or
/// there are no children). As PID 1, orphans of the sandbox are children too.
pub fn wait_any() -> Option<(u32, WaitStatus)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid int the call writes into; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return None;
        }
        if let (Ok(pid), Some(status)) = (u32::try_from(pid), WaitStatus::decode(status)) {
            return Some((pid, status));
        }
    }
}

/// Reaps child `pid` if it has exited, without blocking; `Ok(None)` while it runs. `ECHILD`:
/// it is not (or no longer) a child of this process.
pub fn wait_pid(pid: u32) -> io::Result<Option<WaitStatus>> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let mut status = 0;
    // SAFETY: `status` is a valid int the call writes into; WNOHANG never blocks.
    let ret = check(unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) })?;
    Ok(if ret == 0 {
        None
    } else {
        WaitStatus::decode(status)
    })
}

/// Sends `signal` to the process group `pgid` (every process in it).
pub fn kill_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pgid =
        libc::pid_t::try_from(pgid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pgid <= 1 {
        // -1 would be every process, -0 the caller's own group.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill takes plain integers; a negative pid names a process group.
    check(unsafe { libc::kill(-pgid, signal) }).map(drop)
}

/// Sends `signal` to this process (the main thread, waiting in `sigwait`, takes it).
pub fn signal_self(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: getpid cannot fail; kill takes plain integers and names this process only.
    check(unsafe { libc::kill(libc::getpid(), signal) }).map(drop)
}

/// Sends `signal` to process `pid` (the daemon signals groups; tests signal one process).
#[cfg(test)]
pub fn kill(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill takes plain integers; `pid` is positive, so it names one process.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn wait_for(pid: u32) -> WaitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = wait_pid(pid).unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "child {pid} did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // The children are reaped by `wait_pid`, which is what is tested; clippy cannot see that.
    #[allow(clippy::zombie_processes)]
    #[test]
    fn exit_codes_and_signals_are_decoded() {
        let child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        assert_eq!(wait_for(child.id()), WaitStatus::Exited(3));
        let child = Command::new("sleep").arg("10").spawn().unwrap();
        assert_eq!(wait_pid(child.id()).unwrap(), None, "still running");
        kill(child.id(), libc::SIGKILL).unwrap();
        assert_eq!(
            wait_for(child.id()),
            WaitStatus::Signaled {
                signal: libc::SIGKILL,
                core: false
            }
        );
        let error = wait_pid(child.id()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ECHILD));
    }

    #[allow(clippy::zombie_processes)]
    #[test]
    fn a_group_signal_reaches_the_whole_group() {
        use std::os::unix::process::CommandExt;
        let child = Command::new("sh")
            .args(["-c", "sleep 10 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        kill_group(child.id(), libc::SIGTERM).unwrap();
        assert_eq!(
            wait_for(child.id()),
            WaitStatus::Signaled {
                signal: libc::SIGTERM,
                core: false
            }
        );
        assert!(kill_group(0, libc::SIGTERM).is_err());
        assert!(kill_group(1, libc::SIGTERM).is_err());
        assert!(kill(0, libc::SIGTERM).is_err());
    }
}
