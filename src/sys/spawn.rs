//! What a child does between `fork` and `exec`: a session of its own, optionally a controlling
//! terminal, a lower OOM priority, the user's groups and ids, and its working directory.
//!
//! Spawning itself is `std::process::Command`'s (argv and environment, the pipes, the `CLOEXEC`
//! pipe that reports an `exec` error, the signal mask and `SIGPIPE` reset in the child). This
//! module adds the one hook std runs last before `exec` ([`CommandExt::pre_exec`]), which is
//! `unsafe` to install: the closure runs in the forked child of a multi-threaded process, where
//! only async-signal-safe calls are sound. So it makes raw system calls on data prepared before
//! the fork, and never allocates, locks or logs.
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
//! 4. The credentials, when they differ from the daemon's: `setgroups`, `setresgid`,
//!    `setresuid`, as raw system calls (libc's wrappers broadcast to every thread, which in a
//!    forked child is at best pointless).
//! 5. `chdir` to the working directory, as the user: a directory they may not enter fails.

use std::ffi::CString;
use std::io;
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
    let hook = move || -> io::Result<()> {
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
        if let Some((uid, gid, groups)) = &credentials {
            set_credentials(*uid, *gid, groups)?;
        }
        // SAFETY: `cwd` is a NUL-terminated string owned by the closure, alive for the call.
        if unsafe { libc::chdir(cwd.as_ptr()) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec. It makes only async-signal-safe
    // raw system calls (setsid, ioctl, open, write, close, setgroups, setresgid, setresuid,
    // chdir) on data captured before the fork; it allocates nothing, takes no lock and touches
    // no state shared with other threads of the parent.
    unsafe {
        command.pre_exec(hook);
    }
    Ok(())
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
