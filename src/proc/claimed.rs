//! Children the daemon starts for itself, outside the hub (`mount`, `umount`, `findmnt` for
//! `/init`'s volumes): their exits, kept for whoever waits for them.
//!
//! The reaper takes every child's exit (`reaper::reap_all`, a `waitpid(-1)`), so a plain
//! `Child::wait` could find its child already reaped and its status lost. A child started for
//! the daemon is *claimed* instead, while [`reaper::spawning`](super::reaper::spawning) is
//! held (so no reap can happen between the fork and the claim); the reaper hands the exit of a
//! claimed pid here ([`offer`]) rather than dropping it as an orphan's, and [`wait`] takes it,
//! or reaps the child itself when no reaper runs (a subcommand, a unit test).

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::sys::process::{wait_pid, WaitStatus};

/// Claimed pids, with their exit once reaped.
static CLAIMED: Mutex<BTreeMap<u32, Option<WaitStatus>>> = Mutex::new(BTreeMap::new());
static REAPED: Condvar = Condvar::new();

/// How often [`wait`] also tries to reap the child itself.
const SELF_REAP_EVERY: Duration = Duration::from_millis(20);

fn claimed() -> MutexGuard<'static, BTreeMap<u32, Option<WaitStatus>>> {
    CLAIMED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Claims `pid`, a child just started with `reaper::spawning` held.
pub fn claim(pid: u32) {
    claimed().insert(pid, None);
}

/// Keeps `status` if `pid` is claimed; false when it is not (an orphan's exit).
pub fn offer(pid: u32, status: WaitStatus) -> bool {
    let mut claimed = claimed();
    match claimed.get_mut(&pid) {
        Some(slot) => {
            *slot = Some(status);
            REAPED.notify_all();
            true
        }
        None => false,
    }
}

/// The exit of claimed child `pid`, waited for until `deadline`; `None` if it still runs
/// then (it stays claimed: wait again, after killing it). The claim ends with the exit.
pub fn wait(pid: u32, deadline: Instant) -> Option<WaitStatus> {
    let mut claimed = claimed();
    loop {
        if let Some(Some(status)) = claimed.get(&pid) {
            let status = *status;
            claimed.remove(&pid);
            return Some(status);
        }
        // Under the lock: an exit the reaper takes meanwhile is offered after we let go.
        if let Ok(Some(status)) = wait_pid(pid) {
            claimed.remove(&pid);
            return Some(status);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let pause = SELF_REAP_EVERY.min(deadline - now);
        claimed = REAPED
            .wait_timeout(claimed, pause)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    // Reaped by `wait`, through the claim, not by `Child::wait`.
    #[allow(clippy::zombie_processes)]
    fn a_claimed_exit_is_kept_for_its_waiter_and_an_orphans_is_not() {
        let child = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        let pid = child.id();
        claim(pid);
        let status = wait(pid, Instant::now() + Duration::from_secs(10));
        assert_eq!(status, Some(WaitStatus::Exited(7)));
        assert!(!offer(pid, WaitStatus::Exited(0)), "the claim ended");
    }

    #[test]
    fn an_exit_offered_by_the_reaper_reaches_the_waiter() {
        let pid = u32::MAX - 5;
        claim(pid);
        assert!(offer(pid, WaitStatus::Exited(3)));
        assert_eq!(wait(pid, Instant::now()), Some(WaitStatus::Exited(3)));
    }

    #[test]
    // Reaped by `wait`, through the claim, not by `Child::wait`.
    #[allow(clippy::zombie_processes)]
    fn a_child_still_running_at_the_deadline_stays_claimed() {
        let mut child = Command::new("sleep").arg("10").spawn().unwrap();
        let pid = child.id();
        claim(pid);
        assert_eq!(wait(pid, Instant::now() + Duration::from_millis(30)), None);
        child.kill().unwrap();
        let status = wait(pid, Instant::now() + Duration::from_secs(10));
        assert_eq!(
            status,
            Some(WaitStatus::Signaled {
                signal: libc::SIGKILL,
                core: false
            })
        );
    }
}
