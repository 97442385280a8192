//! Reaping: the one place that waits for *any* child.
//!
//! A process may have only one reaper, or exits go missing: a `waitpid(-1)` anywhere takes
//! whichever child ended, so every such wait in sandboxd is [`reap_all`], which hands each exit
//! of a process the hub started to the hub and drops the rest (as PID 1, the orphans the
//! sandbox leaves). The daemon's main thread calls it on each `SIGCHLD` (`daemon`); `SIGCHLD` is
//! blocked everywhere and queued, so no exit goes unnoticed, and a burst of them is one signal
//! but one loop reaps all.
//!
//! Two races are closed by one lock, [`spawning`], which a start holds (shared: starts run in
//! parallel) from before the fork until the new process is in the table, and [`reap_all`] holds
//! exclusively while it waits and hands out:
//!
//! - a child that exits at once would be reaped before the table knows its pid, and its exit
//!   dropped as an orphan's;
//! - std's `spawn`, when `exec` fails, waits for that child itself (`waitpid(pid)`) and aborts
//!   if the child is gone; a concurrent `waitpid(-1)` could take it first.
//!
//! The hub waits *under its own lock* and records each exit before letting go
//! (`Hub::reap_all`), so that under that lock a process without an exit has not been reaped:
//! its pid, and the id of its process group, cannot have been given to anyone else, and a
//! signal to them reaches only it and its group. A reaped one is never signalled.
//!
//! Children the daemon starts for itself are claimed (`claimed`): their exits are kept for
//! their waiter instead of being dropped.
//!
//! Waiting for one known child (`sys::process::wait_pid`, as the I/O thread does when a
//! process's outputs have closed) needs no lock: it can only take that child, which is ours.

use std::sync::{RwLock, RwLockReadGuard};

use super::Hub;
use crate::sys::process::wait_any;

static SPAWNING: RwLock<()> = RwLock::new(());

/// Held from before a fork until the new process is in the table.
pub fn spawning() -> RwLockReadGuard<'static, ()> {
    SPAWNING.read().unwrap_or_else(|e| e.into_inner())
}

/// Reaps every child that has exited, handing the hub the exits of its processes.
pub fn reap_all() {
    let _exclusive = SPAWNING.write().unwrap_or_else(|e| e.into_inner());
    match Hub::running() {
        Some(hub) => hub.reap_all(),
        // No process was ever started: orphans and the daemon's own helpers only.
        None => {
            while let Some((pid, status)) = wait_any() {
                super::claimed::offer(pid, status);
            }
        }
    }
}
