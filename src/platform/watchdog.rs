//! A one-shot backstop timer: armed by a freeze, it calls its action when nobody disarmed it
//! within its delay (envd's thaw watchdog, `DefaultThawWatchdogWindow`: ten minutes,
//! `--thaw-watchdog`).
//!
//! Each arming starts a short-lived thread that waits on a condition variable until its
//! deadline or until a newer arming or a disarm makes it stale; at most one such thread is
//! waiting at a time (the older ones are woken and leave). The deadline is on the monotonic
//! clock, which barely advances while the VM is paused, so the window effectively counts from
//! the resume, as envd's. The action is given the arming's generation: it must check, under
//! its own lock, that the arming is still [`Watchdog::is_current`] before acting, so a fire
//! already on its way cannot undo a newer freeze.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Watchdog {
    after: Duration,
    generation: Mutex<u64>,
    changed: Condvar,
}

impl Watchdog {
    pub fn new(after: Duration) -> Arc<Watchdog> {
        Arc::new(Watchdog {
            after,
            generation: Mutex::new(0),
            changed: Condvar::new(),
        })
    }

    /// (Re)starts the timer; `fire(generation)` runs on the timer's thread when it expires.
    /// A thread that cannot be started leaves the freeze without its backstop (logged).
    pub fn arm(self: &Arc<Self>, fire: Box<dyn FnOnce(u64) + Send>) {
        let mine = self.bump();
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("sandboxd-watchdog".into())
            .spawn(move || {
                if me.wait(mine) {
                    fire(mine);
                }
            });
        if let Err(e) = spawned {
            crate::log::line(format_args!("cannot start the thaw watchdog: {e}"));
        }
    }

    /// Stops the timer: a fire already on its way finds itself stale.
    pub fn disarm(&self) {
        self.bump();
    }

    /// Whether `generation` is still the armed timer.
    pub fn is_current(&self, generation: u64) -> bool {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner()) == generation
    }

    fn bump(&self) -> u64 {
        let mut generation = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *generation += 1;
        self.changed.notify_all();
        *generation
    }

    /// Waits until the deadline (true) or until the arming is stale (false).
    fn wait(&self, mine: u64) -> bool {
        let deadline = Instant::now() + self.after;
        let mut generation = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *generation != mine {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            generation = self
                .changed
                .wait_timeout(generation, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn fires_once_unless_disarmed_or_rearmed() {
        let watchdog = Watchdog::new(Duration::from_millis(20));
        let (tx, rx) = mpsc::channel();
        let first = tx.clone();
        watchdog.arm(Box::new(move |generation| {
            first.send(("first", generation)).unwrap()
        }));
        let second = tx.clone();
        watchdog.arm(Box::new(move |generation| {
            second.send(("second", generation)).unwrap()
        }));
        let (which, generation) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(which, "second", "the first arming was superseded");
        assert!(watchdog.is_current(generation));
        watchdog.arm(Box::new(move |generation| {
            tx.send(("third", generation)).unwrap()
        }));
        watchdog.disarm();
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    }
}
