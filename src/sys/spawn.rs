//! What a child does between `fork` and `exec`: a session of its own, optionally a controlling
//! terminal, a lower OOM priority, the open-file limit, the user's groups and ids, its working
//! directory, and signals as if nobody had touched them.
//!
//! Spawning itself is `std::process::Command`'s (argv and environment, the pipes, the `CLOEXEC`
//! pipe that reports an `exec` error, `SIGPIPE` reset in the child; std keeps the parent's
//! signal mask on purpose, so resetting it is this module's job). This module adds the one hook
//! std runs last before `exec` ([`CommandExt::pre_exec`]), which is `unsafe` to install: the
//! closure runs in the forked child of a multi-threaded process, where only async-signal-safe
//! calls are sound. So it makes raw system calls on data prepared before the fork, and never
//! allocates, locks or logs.
//!
//! Order in the child, each step's failure ending the spawn with its errno (std's `spawn`
//! returns it):
//!
//! 1. `setsid()`: the child leads a new session and process group (pgid = pid), so a signal
//!    to `-pid` reaches everything it starts, and it has no controlling terminal of sandboxd's.
//! 2. With a terminal: `ioctl(0, TIOCSCTTY)`, the terminal on fd 0 (the PTY's slave, put there
//!    by std) becomes the session's controlling terminal.
//! 3. `oom_score_adj` 100 (best effort), as envd gives its children: a daemon protected from
//!    the OOM killer must not pass that protection to user code. Before dropping privileges,
//!    since a non-root process may find its own `/proc/self` files owned by root.
//! 4. A normal CPU and I/O priority (best effort): nice 0 and I/O class best-effort at level 4,
//!    envd's `nice`/`ionice -c 2 -n 4` wrapper without the shell. The daemon may run at
//!    `Nice=-20` with realtime I/O (E2B's unit), and a worker that forks may have lowered its own
//!    thread's priority; neither reaches user code. A failure (a daemon started above nice 0
//!    without `CAP_SYS_NICE` cannot go back to 0) leaves the inherited value, as envd's `nice`.
//! 5. The open-file limit the daemon was started with (it raised its own soft limit), while
//!    setting a hard limit is still allowed.
//! 6. The credentials, when they differ from the daemon's: `setgroups`, `setresgid`,
//!    `setresuid`, as raw system calls (libc's wrappers broadcast to every thread, which in a
//!    forked child is at best pointless).
//! 7. `chdir` to the working directory, as the user: a directory they may not enter fails.
//! 8. Signals, last: every disposition back to its default (an ignored one survives `exec`: a
//!    daemon started under `nohup`, or with `SIGPIPE` ignored, must not pass that on), then an
//!    empty mask (the daemon blocks `SIGTERM`, `SIGINT` and `SIGCHLD` in every thread to
//!    `sigwait` them, and a mask survives `fork` and `exec`). Raw system calls again: musl's
//!    `sigaction` may take a lock, its `setrlimit` signals every thread.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Who the child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary one may be among them).
    pub groups: Vec<u32>,
}

/// How the child is set up before `exec`.
#[derive(Debug, Clone)]
pub struct ChildSetup {
    /// `None`: the daemon's own.
    pub credentials: Option<Credentials>,
    /// The working directory.
    pub cwd: std::path::PathBuf,
    /// fd 0 is a terminal to make the controlling one.
    pub controlling_terminal: bool,
    /// The `RLIMIT_NOFILE` (soft, hard) to give the child; `None`: the daemon's own.
    pub open_files: Option<(u64, u64)>,
    /// An open `cgroup.procs` the child writes itself to first; `None`: the daemon's group.
    /// The caller keeps it open until the spawn returns.
    pub cgroup_procs: Option<RawFd>,
}

const OOM_SCORE_ADJ: &[u8] = b"/proc/self/oom_score_adj\0";
const OOM_SCORE: &[u8] = b"100";

/// Installs `setup` as `command`'s last step before `exec`. A working directory with a NUL
/// byte is `InvalidInput`.
pub fn configure(command: &mut Command, setup: &ChildSetup) -> io::Result<()> {
    let cwd = path_cstring(&setup.cwd)?;
    // Prepared now: the child must not allocate.
    let credentials = setup.credentials.as_ref().map(|c| {
        let groups: Vec<libc::gid_t> = c.groups.clone();
        (c.uid, c.gid, groups)
    });
    let terminal = setup.controlling_terminal;
    let open_files = setup.open_files.map(|(soft, hard)| [soft, hard]);
    let cgroup_procs = setup.cgroup_procs;
    let hook = move || -> io::Result<()> {
        if let Some(fd) = cgroup_procs {
            join_cgroup(fd);
        }
        // SAFETY: setsid takes no arguments and only changes this (single-threaded, forked)
        // process's session.
        if unsafe { libc::setsid() } == -1 {
            return Err(io::Error::last_os_error());
        }
        if terminal {
            // SAFETY: TIOCSCTTY takes an int argument (0: do not steal a terminal another
            // session holds); fd 0 is the terminal std placed there.
            if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        raise_oom_score();
        normal_priority();
        close_inherited_on_exec();
        if let Some(limit) = &open_files {
            set_open_files(limit)?;
        }
        if let Some((uid, gid, groups)) = &credentials {
            set_credentials(*uid, *gid, groups)?;
        }
        // SAFETY: `cwd` is a NUL-terminated string owned by the closure, alive for the call.
        if unsafe { libc::chdir(cwd.as_ptr()) } == -1 {
            return Err(io::Error::last_os_error());
        }
        reset_signals()
    };
    // SAFETY: the hook runs in the forked child before exec. It makes only async-signal-safe
    // raw system calls (write to cgroup.procs, setsid, ioctl, open, write, close, setpriority, ioprio_set, close_range, prlimit64, setgroups, setresgid,
    // setresuid, chdir, rt_sigaction, rt_sigprocmask) on data captured before the fork; it
    // allocates nothing, takes no lock and touches no state shared with other threads of the
    // parent.
    unsafe {
        command.pre_exec(hook);
    }
    Ok(())
}

/// Writes `0` (the writer itself) to the open `cgroup.procs` `fd`: the child moves into that
/// group before anything of the user's runs. Best effort: a failure (the group removed, a
/// migration the kernel refuses) leaves it in the daemon's group, never a failed command.
fn join_cgroup(fd: RawFd) {
    // SAFETY: `fd` is a descriptor the caller keeps open across the spawn; the buffer is a
    // static byte string of the given length. The result is ignored on purpose (best effort).
    unsafe {
        libc::write(fd, b"0".as_ptr().cast::<libc::c_void>(), 1);
    }
}

/// Best effort: a failure (no /proc) leaves the inherited score.
fn raise_oom_score() {
    // SAFETY: the path is a NUL-terminated static string; the flags ask for no creation.
    let fd = unsafe {
        libc::open(
            OOM_SCORE_ADJ.as_ptr().cast::<libc::c_char>(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: `fd` was just opened by this process; the buffer is a static byte string
        // of the given length. The result is ignored on purpose (best effort).
        unsafe {
            libc::write(
                fd,
                OOM_SCORE.as_ptr().cast::<libc::c_void>(),
                OOM_SCORE.len(),
            );
            libc::close(fd);
        }
    }
}

/// Every descriptor above stderr closed at the child's `exec`: the daemon opens everything
/// close-on-exec, but a live upgrade clears the flag on the descriptors it hands over for the
/// instant before its own `execve` (`upgrade::carry`), and a child forked by another thread
/// then must not keep them. Best effort: a kernel before 5.11 lacks `CLOSE_RANGE_CLOEXEC`.
fn close_inherited_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes plain integers and only sets flags on this (forked) process's
    // descriptors; a raw system call. The result is ignored on purpose (best effort).
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 4)`: class 2 in the bits above 13, level 4 (envd's
/// `ionice -c 2 -n 4`).
const IOPRIO_BEST_EFFORT_4: libc::c_long = (2 << 13) | 4;
/// `IOPRIO_WHO_PROCESS`: `ioprio_set`'s `who` is a process id (0: the caller).
const IOPRIO_WHO_PROCESS: libc::c_long = 1;

/// Nice 0 and I/O priority best-effort 4 for this (forked) process; best effort, failures
/// ignored (see the module's step 4).
fn normal_priority() {
    // SAFETY: setpriority and ioprio_set take plain integers and touch no memory of ours; raw
    // system calls, so nothing of libc's runs in the forked child. Results ignored on purpose.
    unsafe {
        libc::syscall(libc::SYS_setpriority, libc::PRIO_PROCESS, 0, 0);
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_BEST_EFFORT_4,
        );
    }
}

/// The kernel's `NSIG` on the architectures sandboxd is built for (x86_64, aarch64).
const KERNEL_NSIG: libc::c_int = 64;
/// The kernel's `sigset_t`: one bit per signal, 64 signals.
const KERNEL_SIGSET_SIZE: usize = 8;

/// The kernel's `struct sigaction` all zero: handler `SIG_DFL` (0), no flags, no restorer, an
/// empty mask. Four words cover its layout with a restorer (x86_64, aarch64) and without; the
/// kernel reads only its own size.
const DEFAULT_ACTION: [u64; 4] = [0; 4];

/// Every signal's disposition to its default, then an empty mask: the child starts as if its
/// parent had never touched a signal.
fn reset_signals() -> io::Result<()> {
    for signal in 1..=KERNEL_NSIG {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `DEFAULT_ACTION` is a static, zeroed kernel sigaction (SIG_DFL) the kernel
        // only reads; no old action is asked for (null); the size is the kernel's sigset.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                DEFAULT_ACTION.as_ptr(),
                std::ptr::null_mut::<u64>(),
                KERNEL_SIGSET_SIZE,
            )
        };
        if ret == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    let empty: u64 = 0;
    // SAFETY: `empty` is a live kernel sigset (no signal) the kernel only reads; no old mask
    // is asked for (null).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_SIZE,
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `RLIMIT_NOFILE` to `limit` (soft, hard) for this process alone.
fn set_open_files(limit: &[u64; 2]) -> io::Result<()> {
    // SAFETY: `limit` is a live kernel rlimit64 (two u64: soft, hard) the kernel only reads;
    // pid 0 is this process; no old limit is asked for (null).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            limit.as_ptr(),
            std::ptr::null_mut::<u64>(),
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Groups first, then gid, then uid: each later step drops the privilege the earlier need.
fn set_credentials(uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: getuid and getgid take nothing and cannot fail.
    let (current_uid, current_gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if current_uid == uid && current_gid == gid && current_uid != 0 {
        // Already this user, without the privilege to change groups: nothing to do.
        return Ok(());
    }
    // SAFETY: the pointer and length describe the live slice `groups` of gid_t values, which
    // the kernel only reads.
    if unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresgid and setresuid take plain integers.
    if unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_leads_its_own_session_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("sh");
        command.args(["-c", "echo $$ $(ps -o sid= -p $$ 2>/dev/null); pwd"]);
        let setup = ChildSetup {
            credentials: None,
            cwd: dir.path().to_path_buf(),
            controlling_terminal: false,
            open_files: None,
            cgroup_procs: None,
        };
        configure(&mut command, &setup).unwrap();
        let output = command.output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let mut lines = text.lines();
        let ids: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        if ids.len() == 2 {
            assert_eq!(ids[0], ids[1], "pid is the session id");
        }
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(lines.next(), Some(cwd.to_str().unwrap()));
    }

    #[test]
    fn a_missing_directory_fails_the_spawn_with_its_errno() {
        let mut command = Command::new("true");
        let setup = ChildSetup {
            credentials: None,
            cwd: "/nonexistent/dir".into(),
            controlling_terminal: false,
            open_files: None,
            cgroup_procs: None,
        };
        configure(&mut command, &setup).unwrap();
        let error = command.spawn().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
        let setup = ChildSetup {
            cwd: "/a\0b".into(),
            ..setup
        };
        assert!(configure(&mut Command::new("true"), &setup).is_err());
    }

    /// A field of `/proc/self/status` as the child's shell printed it.
    fn status_field<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
    }

    // The child is reaped by `output`; the blocked and ignored signals are this thread's and
    // restored before the test ends.
    #[test]
    fn the_child_starts_with_default_signals_and_the_given_open_file_limit() {
        // A blocked and an ignored signal in the parent, as the daemon (blocked SIGTERM,
        // SIGINT, SIGCHLD) or its own parent (nohup: SIGHUP ignored) leaves them. Blocked in
        // this thread only: the fork copies the calling thread's mask.
        // SAFETY: plain sigset manipulation on local data; pthread_sigmask changes this
        // thread's mask and gives the old one back, restored below; SIG_IGN for SIGURG
        // (default: ignore anyway) changes nothing observable for the test harness.
        let (old_mask, old_action) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            let mut old: libc::sigset_t = std::mem::zeroed();
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            let old_action = libc::signal(libc::SIGURG, libc::SIG_IGN);
            (old, old_action)
        };
        let mut command = Command::new("sh");
        command.args(["-c", "cat /proc/self/status; ulimit -Sn; ulimit -Hn"]);
        let setup = ChildSetup {
            credentials: None,
            cwd: "/".into(),
            controlling_terminal: false,
            open_files: Some((77, 99)),
            cgroup_procs: None,
        };
        configure(&mut command, &setup).unwrap();
        let output = command.output();
        // SAFETY: restores the mask and disposition taken above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
            libc::signal(libc::SIGURG, old_action);
        }
        let output = output.unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        assert_eq!(status_field(&text, "SigBlk:"), "0000000000000000");
        assert_eq!(status_field(&text, "SigIgn:"), "0000000000000000");
        let limits: Vec<&str> = text.lines().rev().take(2).collect();
        assert_eq!(limits, ["99", "77"], "{text}");
    }

    #[test]
    fn credentials_are_set_when_root() {
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } != 0 {
            return;
        }
        let mut command = Command::new("sh");
        command.args(["-c", "id -u; id -g; id -G"]);
        let setup = ChildSetup {
            credentials: Some(Credentials {
                uid: 4242,
                gid: 4343,
                groups: vec![4343, 4444],
            }),
            cwd: "/".into(),
            controlling_terminal: false,
            open_files: None,
            cgroup_procs: None,
        };
        configure(&mut command, &setup).unwrap();
        let output = command.output().unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..2], ["4242", "4343"], "{text}");
        let mut groups: Vec<&str> = lines[2].split_whitespace().collect();
        groups.sort_unstable();
        assert_eq!(groups, ["4343", "4444"]);
    }
}
