//! The system calls that end the machine, for a daemon that is PID 1 (a minimal image's init):
//! signalling every other process, reaping, syncing, remounting read-only, and asking the
//! kernel to power off, halt or restart (`crate::shutdown` orders them). In a PID namespace of
//! its own the kernel ends that namespace instead (its init is killed with `SIGINT` for
//! power-off and halt, `SIGHUP` for a restart), which is how it is tested on a host.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What PID 1 was asked for, as busybox's init reads its signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// `poweroff` (`SIGUSR2`).
    Off,
    /// `halt` (`SIGUSR1`).
    Halt,
    /// `reboot` (`SIGTERM`), and Ctrl-Alt-Del (`SIGINT`).
    Restart,
}

impl Power {
    /// busybox init's meaning of `signal`.
    pub fn of_signal(signal: libc::c_int) -> Power {
        match signal {
            libc::SIGUSR2 => Power::Off,
            libc::SIGUSR1 => Power::Halt,
            _ => Power::Restart,
        }
    }

    fn command(self) -> libc::c_int {
        match self {
            Power::Off => libc::RB_POWER_OFF,
            Power::Halt => libc::RB_HALT_SYSTEM,
            Power::Restart => libc::RB_AUTOBOOT,
        }
    }
}

impl fmt::Display for Power {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Power::Off => "power-off",
            Power::Halt => "halt",
            Power::Restart => "restart",
        })
    }
}

/// Sends `signal` to every process this one may signal but itself (as PID 1: every other
/// process of its PID namespace).
pub fn signal_all(signal: libc::c_int) {
    // SAFETY: kill(-1, sig) takes plain integers; it never signals the caller.
    unsafe { libc::kill(-1, signal) };
}

/// Reaps children until none is left (`true`) or `deadline` (`false`).
pub fn reap_all_until(deadline: Instant) -> bool {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only to `status`, a local that outlives the call.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        match pid {
            0 if Instant::now() >= deadline => return false,
            0 => std::thread::sleep(Duration::from_millis(10)),
            n if n > 0 => {}
            _ => return io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD),
        }
    }
}

/// Flushes every filesystem's dirty data and metadata to its device.
pub fn sync_all() {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Remounts the filesystem mounted at `path` read-only (its superblock, wherever else it is
/// mounted): what an init's `umount -a -r` does before the power goes.
pub fn remount_read_only(path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = libc::MS_REMOUNT | libc::MS_RDONLY;
    // SAFETY: `path` is a NUL-terminated string alive for the call; source, type and data may
    // be null for a remount.
    let ret = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    super::check(ret).map(drop)
}

/// Asks the kernel for `how`; returns only when it refused (the error).
pub fn reboot(how: Power) -> io::Error {
    // SAFETY: reboot takes a plain command; it returns only on failure.
    let ret = unsafe { libc::reboot(how.command()) };
    if ret == 0 {
        io::Error::other("the kernel returned from reboot")
    } else {
        io::Error::last_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_mean_what_busybox_init_makes_of_them() {
        assert_eq!(Power::of_signal(libc::SIGUSR2), Power::Off);
        assert_eq!(Power::of_signal(libc::SIGUSR1), Power::Halt);
        assert_eq!(Power::of_signal(libc::SIGTERM), Power::Restart);
        assert_eq!(Power::of_signal(libc::SIGINT), Power::Restart);
        assert_eq!(Power::Off.to_string(), "power-off");
    }
}
