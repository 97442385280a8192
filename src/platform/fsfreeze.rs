//! `/fsfreeze` and `/fsthaw`: the filesystem holding `--fsfreeze-path` frozen (`FIFREEZE`)
//! before a filesystem-only pause and thawed on the pause's rollback (envd's
//! `services/fsfreeze`), and the gate that keeps the daemon's own writers off it meanwhile.
//!
//! A write to a frozen filesystem sleeps in the kernel until the thaw, and so would the worker
//! making it; with enough of them every worker would sleep and nothing (not `/fsthaw` itself)
//! would be answered. So the daemon's writers go through a gate ([`FsFreeze::writing`]): a
//! pass held across each write call and counted, which a freeze closes before `FIFREEZE`. A
//! freeze therefore waits for the write calls in progress, and every later one is refused at
//! once (503, or `unavailable`) until the thaw, instead of sleeping: while the freeze waits
//! ([`Closed::Freezing`]) as well as once it is done ([`Closed::Frozen`]). Nothing waits for
//! the gate but the freeze itself, so a write call that takes long (a `Remove` of a big tree)
//! holds one worker and the freeze's, never the workers of the writers that come after it.
//! What such a refused upload must undo (its unnamed file, whose last close writes to the
//! filesystem) is handed to a thread of its own that may sleep until the thaw
//! ([`FsFreeze::defer_drop`]). A freeze nobody thaws is thawed by the watchdog.
//!
//! One freeze or thaw at a time: `/fsfreeze` is 503 while another holds the lock, `/fsthaw`
//! waits for it (as envd's, so a rollback is never lost to contention).

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Duration;

use crate::platform::watchdog::Watchdog;
use crate::sys::fsfreeze;

/// Why a freeze or thaw did not happen.
#[derive(Debug)]
pub enum FsFreezeError {
    /// Another freeze or thaw holds the lock.
    Busy,
    /// The ioctl or the open before it failed: the message says which, on which path.
    Failed(String),
}

/// Why the gate refuses a write call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// A freeze waits for the write calls in progress.
    Freezing,
    /// Frozen (or being thawed): until `FITHAW` succeeded.
    Frozen,
}

pub struct FsFreeze {
    path: PathBuf,
    lock: Mutex<()>,
    gate: Mutex<Gate>,
    /// Told when the last write call in progress ends while the gate is closed.
    drained: Condvar,
    watchdog: Arc<Watchdog>,
}

struct Gate {
    /// Write calls in progress (passes held).
    writers: usize,
    /// `None` while open.
    closed: Option<Closed>,
}

/// The pass of one write call: the freeze waits until it is dropped.
pub struct Writing<'a> {
    fs: &'a FsFreeze,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut gate = self.fs.gate();
        gate.writers -= 1;
        if gate.writers == 0 && gate.closed.is_some() {
            self.fs.drained.notify_all();
        }
    }
}

impl FsFreeze {
    pub fn new(path: PathBuf, thaw_after: Duration) -> FsFreeze {
        FsFreeze {
            path,
            lock: Mutex::new(()),
            gate: Mutex::new(Gate {
                writers: 0,
                closed: None,
            }),
            drained: Condvar::new(),
            watchdog: Watchdog::new(thaw_after),
        }
    }

    /// `/fsfreeze`.
    pub fn freeze(self: &Arc<Self>) -> Result<(), FsFreezeError> {
        let _lock = match self.lock.try_lock() {
            Ok(lock) => lock,
            Err(TryLockError::WouldBlock) => return Err(FsFreezeError::Busy),
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        // Closed first: the write calls in progress finish, later ones are refused.
        let before = {
            let mut gate = self.gate();
            let before = gate.closed;
            gate.closed = Some(Closed::Freezing);
            let gate = self
                .drained
                .wait_while(gate, |gate| gate.writers > 0)
                .unwrap_or_else(|e| e.into_inner());
            drop(gate);
            before
        };
        if let Err(e) = fsfreeze::freeze(&self.path) {
            // As it was: open, or still frozen by an earlier freeze.
            self.gate().closed = before;
            return Err(FsFreezeError::Failed(format!(
                "FIFREEZE {}: {e}",
                self.path.display()
            )));
        }
        self.gate().closed = Some(Closed::Frozen);
        let weak = Arc::downgrade(self);
        self.watchdog
            .arm(Box::new(move |generation| watchdog_thaw(&weak, generation)));
        Ok(())
    }

    /// `/fsthaw`: waits for a freeze in progress.
    pub fn thaw(&self) -> Result<(), FsFreezeError> {
        let _lock = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.thaw_locked()
    }

    fn thaw_locked(&self) -> Result<(), FsFreezeError> {
        fsfreeze::thaw(&self.path)
            .map_err(|e| FsFreezeError::Failed(format!("FITHAW {}: {e}", self.path.display())))?;
        self.watchdog.disarm();
        self.gate().closed = None;
        Ok(())
    }

    /// The pass for one write call, held across it; refused at once while a freeze waits or
    /// holds (refuse the write). Never waits on a freeze.
    pub fn writing(&self) -> Result<Writing<'_>, Closed> {
        let mut gate = self.gate();
        if let Some(closed) = gate.closed {
            return Err(closed);
        }
        gate.writers += 1;
        Ok(Writing { fs: self })
    }

    fn gate(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops `leftover` on a thread of its own, which may sleep until the thaw (its drop may
    /// write to the frozen filesystem); inline if no thread can be started. Only uploads under
    /// way when the freeze began get here (later ones are refused before they open anything),
    /// so the threads are at most the connections that were uploading then.
    pub fn defer_drop(&self, leftover: Box<dyn Send>) {
        // A thread that cannot start drops its closure, and `leftover` with it, here.
        let _ = std::thread::Builder::new()
            .name("sandboxd-fsfreeze-drop".into())
            .spawn(move || drop(leftover));
    }
}

fn watchdog_thaw(fs: &Weak<FsFreeze>, generation: u64) {
    let Some(fs) = fs.upgrade() else {
        return;
    };
    let _lock = fs.lock.lock().unwrap_or_else(|e| e.into_inner());
    if !fs.watchdog.is_current(generation) {
        return;
    }
    match fs.thaw_locked() {
        Ok(()) => crate::log::line(format_args!(
            "thaw watchdog: a /fsfreeze nobody ended was thawed ({})",
            fs.path.display()
        )),
        Err(FsFreezeError::Failed(message)) => {
            crate::log::line(format_args!("thaw watchdog: {message}"))
        }
        Err(FsFreezeError::Busy) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_while_the_lock_is_held_and_a_failed_freeze_leaves_writers_open() {
        let fs = Arc::new(FsFreeze::new(
            "/nonexistent/sandboxd".into(),
            Duration::from_secs(600),
        ));
        let held = fs.lock.lock().unwrap();
        assert!(matches!(fs.freeze(), Err(FsFreezeError::Busy)));
        drop(held);
        match fs.freeze() {
            Err(FsFreezeError::Failed(message)) => assert_eq!(
                message,
                "FIFREEZE /nonexistent/sandboxd: No such file or directory (os error 2)"
            ),
            other => panic!("{other:?}"),
        }
        assert!(fs.writing().is_ok());
        fs.gate().closed = Some(Closed::Frozen);
        assert_eq!(fs.writing().err(), Some(Closed::Frozen));
        let (tx, rx) = std::sync::mpsc::channel();
        struct Tell(std::sync::mpsc::Sender<()>);
        impl Drop for Tell {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        fs.defer_drop(Box::new(Tell(tx)));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_freeze_waits_for_the_write_in_progress_and_refuses_later_ones_at_once() {
        let fs = Arc::new(FsFreeze::new(
            "/nonexistent/sandboxd".into(),
            Duration::from_secs(600),
        ));
        let pass = fs.writing().unwrap();
        let freezing = {
            let fs = Arc::clone(&fs);
            std::thread::spawn(move || fs.freeze())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fs.gate().closed.is_none() {
            assert!(std::time::Instant::now() < deadline, "the freeze began");
            std::thread::yield_now();
        }
        for _ in 0..100 {
            assert_eq!(fs.writing().err(), Some(Closed::Freezing));
        }
        assert!(!freezing.is_finished(), "it waits for the pass");
        drop(pass);
        let frozen = freezing.join().unwrap();
        assert!(
            matches!(frozen, Err(FsFreezeError::Failed(_))),
            "{frozen:?}"
        );
        assert!(fs.writing().is_ok(), "a failed freeze opens the gate again");
        // A freeze that fails while an earlier one holds leaves the gate closed.
        fs.gate().closed = Some(Closed::Frozen);
        assert!(fs.freeze().is_err());
        assert_eq!(fs.writing().err(), Some(Closed::Frozen));
    }
}
