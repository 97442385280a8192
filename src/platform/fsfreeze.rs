//! `/fsfreeze` and `/fsthaw`: the filesystem holding `--fsfreeze-path` frozen (`FIFREEZE`)
//! before a filesystem-only pause and thawed on the pause's rollback (envd's
//! `services/fsfreeze`), and the gate that keeps the daemon's own writers off it meanwhile.
//!
//! A write to a frozen filesystem sleeps in the kernel until the thaw, and so would the worker
//! making it; with enough of them every worker would sleep and nothing (not `/fsthaw` itself)
//! would be answered. So the daemon's writers go through a gate ([`FsFreeze::writing`]): a read
//! lock held across each write call, which a freeze takes for writing to mark the filesystem
//! frozen before `FIFREEZE`. A freeze therefore waits for the write calls in progress, and
//! every later one is refused (503, or `unavailable`) until the thaw, instead of sleeping.
//! What such a refused upload must undo (its unnamed file, whose last close writes to the
//! filesystem) is handed to a thread of its own that may sleep until the thaw
//! ([`FsFreeze::defer_drop`]). A freeze nobody thaws is thawed by the watchdog.
//!
//! One freeze or thaw at a time: `/fsfreeze` is 503 while another holds the lock, `/fsthaw`
//! waits for it (as envd's, so a rollback is never lost to contention).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, TryLockError, Weak};
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

pub struct FsFreeze {
    path: PathBuf,
    lock: Mutex<()>,
    /// True from just before `FIFREEZE` until `FITHAW` succeeded.
    gate: RwLock<bool>,
    watchdog: Arc<Watchdog>,
}

impl FsFreeze {
    pub fn new(path: PathBuf, thaw_after: Duration) -> FsFreeze {
        FsFreeze {
            path,
            lock: Mutex::new(()),
            gate: RwLock::new(false),
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
        // Marked frozen first: the write calls in progress finish, later ones are refused.
        *self.gate.write().unwrap_or_else(|e| e.into_inner()) = true;
        if let Err(e) = fsfreeze::freeze(&self.path) {
            *self.gate.write().unwrap_or_else(|e| e.into_inner()) = false;
            return Err(FsFreezeError::Failed(format!(
                "FIFREEZE {}: {e}",
                self.path.display()
            )));
        }
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
        *self.gate.write().unwrap_or_else(|e| e.into_inner()) = false;
        Ok(())
    }

    /// The gate for one write call: held across it; `None` while frozen (refuse the write).
    pub fn writing(&self) -> Option<RwLockReadGuard<'_, bool>> {
        let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        (!*gate).then_some(gate)
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
        assert!(fs.writing().is_some());
        *fs.gate.write().unwrap() = true;
        assert!(fs.writing().is_none());
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
}
