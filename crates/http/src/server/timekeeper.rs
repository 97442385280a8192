//! The timekeeper thread: the one place where time passes without a socket event. It hands
//! connections whose deadline passed to the workers, resumes accepting after a backoff, wakes
//! standby workers to replace stuck ones and hands the events a stuck one took to the others,
//! and calls [`Handler::tick`].

use std::time::{Duration, Instant};

use super::wakeups::Dispatch;
use super::{lock, Shared};
use crate::handler::Handler;
use crate::pool::STUCK;

impl<H: Handler> Shared<H> {
    /// The timekeeper: hands connections whose deadline passed to the workers, resumes
    /// accepting after a backoff, and while runs are under way wakes standby workers to replace
    /// stuck ones.
    pub(super) fn keep_time(&self) {
        let shortest = self
            .limits
            .header_timeout
            .min(self.limits.idle_timeout)
            .min(self.limits.body_timeout)
            .min(self.limits.send_timeout);
        let every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut next_sweep = Instant::now() + every;
        loop {
            let paused = *lock(&self.accept_paused_until);
            {
                // Decided under the lock a worker takes to ask for watching: no request is lost.
                let guard = lock(&self.timekeeper_lock);
                let now = Instant::now();
                let mut until = paused.map_or(next_sweep, |paused| paused.min(next_sweep));
                if self.pool.is_watching() {
                    until = until.min(now + STUCK);
                }
                drop(
                    self.timekeeper
                        .wait_timeout(guard, until.saturating_duration_since(now)),
                );
            }
            let now = Instant::now();
            if self.pool.is_watching() {
                self.pool.watch(now);
                self.pool
                    .each_stuck(now, |index| self.hand_over_batch(index));
            }
            if paused.is_some_and(|until| now >= until) {
                *lock(&self.accept_paused_until) = None;
                self.rearm_listener();
            }
            if now >= next_sweep {
                next_sweep = now + every;
                self.handler.tick();
                let expired = lock(&self.slots).sweep(now);
                for (token, connection) in expired {
                    self.wakeups
                        .push(Dispatch::Run(token, Box::new(connection)));
                }
            }
        }
    }
}
