//! The end of the machine, for a daemon that is PID 1 (a minimal image's init): every other
//! process killed, the filesystems synced, and the kernel asked to power off, halt or restart.
//! In a PID namespace of its own the kernel ends that namespace instead (its init is killed
//! with `SIGINT` for power-off and halt, `SIGHUP` for a restart), which is how it is tested.

use std::fmt;
use std::io;

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

/// Kills every other process, syncs, and asks the kernel for `how`. Returns only when the
/// kernel refused (the error): the caller can but log it and exit.
pub fn end_machine(how: Power) -> io::Error {
    // SAFETY: kill(-1, SIGKILL) takes plain integers and signals every process this one may
    // signal but itself (and, as PID 1, nothing outside its namespace).
    unsafe { libc::kill(-1, libc::SIGKILL) };
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
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
