//! How a process ended, in the words envd's clients read: envd reports Go's
//! `os.ProcessState` (`ExitCode()`, `Exited()`, `String()`, and `cmd.Wait()`'s error), so
//! this module reproduces Go's text: `exit status 1`, `signal: killed`, with ` (core dumped)`
//! when the kernel says so, and Go's names of the Linux signals.

use crate::sys::process::WaitStatus;

/// The end of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub WaitStatus);

impl Exit {
    /// The exit code; -1 when a signal ended the process (Go's `ExitCode()`).
    pub fn code(self) -> i32 {
        match self.0 {
            WaitStatus::Exited(code) => code,
            WaitStatus::Signaled { .. } => -1,
        }
    }

    /// Whether the process called `exit` (Go's `Exited()`).
    pub fn exited(self) -> bool {
        matches!(self.0, WaitStatus::Exited(_))
    }

    /// Go's `ProcessState.String()`.
    pub fn status(self) -> String {
        match self.0 {
            WaitStatus::Exited(code) => format!("exit status {code}"),
            WaitStatus::Signaled { signal, core } => {
                let name =
                    signal_name(signal).map_or_else(|| format!("signal {signal}"), str::to_string);
                let core = if core { " (core dumped)" } else { "" };
                format!("signal: {name}{core}")
            }
        }
    }

    /// `cmd.Wait()`'s error as envd reports it: none for a clean exit, else the status.
    pub fn error(self) -> Option<String> {
        (self.0 != WaitStatus::Exited(0)).then(|| self.status())
    }
}

/// Go's names of the Linux signals (`syscall.Signal.String()`).
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        16 => "stack fault",
        17 => "child exited",
        18 => "continued",
        19 => "stopped (signal)",
        20 => "stopped",
        21 => "stopped (tty input)",
        22 => "stopped (tty output)",
        23 => "urgent I/O condition",
        24 => "CPU time limit exceeded",
        25 => "file size limit exceeded",
        26 => "virtual timer expired",
        27 => "profiling timer expired",
        28 => "window changed",
        29 => "I/O possible",
        30 => "power failure",
        31 => "bad system call",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_read_as_gos_process_state() {
        let clean = Exit(WaitStatus::Exited(0));
        assert_eq!(
            (clean.code(), clean.exited(), clean.status(), clean.error()),
            (0, true, "exit status 0".to_string(), None)
        );
        let failed = Exit(WaitStatus::Exited(127));
        assert_eq!(failed.error().as_deref(), Some("exit status 127"));
        let killed = Exit(WaitStatus::Signaled {
            signal: 9,
            core: false,
        });
        assert_eq!(
            (killed.code(), killed.exited(), killed.error().as_deref()),
            (-1, false, Some("signal: killed"))
        );
        let crashed = Exit(WaitStatus::Signaled {
            signal: 11,
            core: true,
        });
        assert_eq!(crashed.status(), "signal: segmentation fault (core dumped)");
        let realtime = Exit(WaitStatus::Signaled {
            signal: 40,
            core: false,
        });
        assert_eq!(realtime.status(), "signal: signal 40");
        assert_eq!(
            Exit(WaitStatus::Signaled {
                signal: 15,
                core: false
            })
            .status(),
            "signal: terminated"
        );
    }
}
