//! Which workers wait for events: as many as there are CPUs, plus one replacement for each
//! worker stuck in a long run (a blocking disk call); the others stand by, asleep.
//!
//! Waiting workers cost nothing at rest, but under load every worker asleep in `epoll_wait` is
//! woken for the next event even when a busy one would have taken it a microsecond later: with
//! four times as many waiters as CPUs, a keep-alive request paid a context switch. So only
//! `waiting` workers take events, and the rest exist for the moment some of those block on a
//! disk: the timekeeper, told when runs are under way, looks every [`STUCK`] and wakes a
//! standby worker for each waiting one that has been in a single run longer than that. A
//! worker that finishes finds more workers taking events than needed and goes back to standby.
//!
//! A stuck run matters only when no other worker is free to take the next event, or when the
//! stuck worker holds events it took but has not run. So a run is watched only when it starts
//! with that many runs under way (its own included: as many as `waiting`) or with events left
//! in its worker's batch; a lone run with another waiting worker free (one download's sends,
//! one per drained socket buffer) is not, and wakes no thread: before, the timekeeper looked
//! every [`STUCK`] through a whole download. A watched run sees every run under way, the
//! unwatched among them, as stuck or not.
//!
//! The timekeeper goes on looking while watched runs keep starting, and stops only after a
//! whole look found none under way and none started since the look before; only then does the
//! next watched run tell it (a futex wake). So a steady stream of short watched runs (keep-alive
//! requests on every waiting worker) wakes no other thread, and an isolated one costs the
//! timekeeper one wake-up and one look.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A run longer than this is presumed blocked on a disk, and its worker replaced.
/// Long enough that a fast transfer's turn (a few MiB) is not taken for one.
pub(crate) const STUCK: Duration = Duration::from_micros(STUCK_MICROS);
const STUCK_MICROS: u64 = 10_000;

/// A run's flags in [`Pool::runs`], below its start.
const UNDER_WAY: u64 = 1;
const WATCHED: u64 = 2;
const FLAGS: u32 = 2;

/// Workers taking events (not standing by), and wake-ups granted to standby workers.
struct Taking {
    count: usize,
    granted: usize,
}

pub(crate) struct Pool {
    /// Workers meant to take events when none is stuck.
    waiting: usize,
    /// When each worker's latest run started, in microseconds since `epoch`, shifted left by
    /// two; [`UNDER_WAY`] while that run is under way, [`WATCHED`] if it asked to be watched.
    runs: Vec<AtomicU64>,
    epoch: Instant,
    /// When the timekeeper last looked (`watch`), in microseconds since `epoch`.
    last_look: AtomicU64,
    taking: Mutex<Taking>,
    /// `taking.count`, readable without the lock: most of the time no worker is spare.
    taking_now: AtomicUsize,
    standby: Condvar,
    /// Runs are under way, so the timekeeper looks every [`STUCK`].
    watching: AtomicBool,
    /// Runs watched so far: a test's proof that a lone download is not.
    #[cfg(test)]
    pub(crate) watched_runs: AtomicU64,
}

impl Pool {
    pub(crate) fn new(workers: usize, waiting: usize) -> Pool {
        Pool {
            waiting: waiting.clamp(1, workers.max(1)),
            runs: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            last_look: AtomicU64::new(0),
            taking: Mutex::new(Taking {
                count: workers,
                granted: 0,
            }),
            taking_now: AtomicUsize::new(workers),
            standby: Condvar::new(),
            watching: AtomicBool::new(false),
            #[cfg(test)]
            watched_runs: AtomicU64::new(0),
        }
    }

    /// Worker `index` starts a run `now`, `holding` events it took but has not run. True when
    /// the timekeeper must be told to watch.
    pub(crate) fn run_started(&self, index: usize, holding: bool, now: Instant) -> bool {
        let run = (self.micros(now) << FLAGS) | UNDER_WAY;
        self.runs[index].store(run, Ordering::SeqCst);
        // Two runs starting at once each see the other (both stores come before both loads):
        // the later one is watched.
        let under_way = self
            .runs
            .iter()
            .filter(|run| run.load(Ordering::SeqCst) & UNDER_WAY != 0)
            .count();
        if !holding && under_way < self.waiting {
            return false;
        }
        self.runs[index].store(run | WATCHED, Ordering::SeqCst);
        #[cfg(test)]
        self.watched_runs.fetch_add(1, Ordering::SeqCst);
        !self.watching.load(Ordering::SeqCst) && !self.watching.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn run_ended(&self, index: usize) {
        let run = &self.runs[index];
        // Only this worker writes its entry: the start stays, for `watch`.
        run.store(run.load(Ordering::Relaxed) & !UNDER_WAY, Ordering::Release);
    }

    /// Whether [`stand_by_if_spare`](Self::stand_by_if_spare) may stand by (a hint, read
    /// without the lock).
    pub(crate) fn may_stand_by(&self) -> bool {
        self.taking_now.load(Ordering::Relaxed) > self.waiting
    }

    /// Between runs: stands by while more workers take events than are needed, until woken.
    pub(crate) fn stand_by_if_spare(&self) {
        if !self.may_stand_by() {
            return;
        }
        let mut taking = lock(&self.taking);
        if taking.count <= self.waiting + self.stuck(Instant::now()) {
            return;
        }
        taking.count -= 1;
        self.taking_now.store(taking.count, Ordering::Relaxed);
        // `watch` counts a worker back in before granting it a wake-up.
        let mut taking = self
            .standby
            .wait_while(taking, |taking| taking.granted == 0)
            .unwrap_or_else(|e| e.into_inner());
        taking.granted -= 1;
    }

    /// The timekeeper's look while watching: a standby worker woken for each stuck one beyond
    /// what already replaced it. False once no run is under way and none started since the
    /// look before (watching stops). Every run under way counts as stuck or not, watched or
    /// not.
    pub(crate) fn watch(&self, now: Instant) -> bool {
        let stuck = self.stuck(now);
        {
            let mut taking = lock(&self.taking);
            while taking.count < self.runs.len() && taking.count < self.waiting + stuck {
                taking.count += 1;
                taking.granted += 1;
                self.standby.notify_one();
            }
            self.taking_now.store(taking.count, Ordering::Relaxed);
        }
        let before = self.last_look.swap(self.micros(now), Ordering::Relaxed);
        if self.watched_running() || self.watched_since(before) {
            return true;
        }
        // Stop, then look again: a watched run that started meanwhile either sees the flag down
        // (and raises it) or is seen here.
        self.watching.store(false, Ordering::SeqCst);
        if self.watched_running() {
            self.watching.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Calls `each` with the index of every worker whose current run started longer than
    /// [`STUCK`] ago.
    pub(crate) fn each_stuck(&self, now: Instant, mut each: impl FnMut(usize)) {
        let limit = self.micros(now).saturating_sub(STUCK_MICROS);
        for (index, run) in self.runs.iter().enumerate() {
            let run = run.load(Ordering::Acquire);
            if run & UNDER_WAY != 0 && run >> FLAGS < limit {
                each(index);
            }
        }
    }

    pub(crate) fn is_watching(&self) -> bool {
        self.watching.load(Ordering::SeqCst)
    }

    fn watched_running(&self) -> bool {
        const BOTH: u64 = UNDER_WAY | WATCHED;
        self.runs
            .iter()
            .any(|run| run.load(Ordering::SeqCst) & BOTH == BOTH)
    }

    /// Whether a watched run started at or after `micros`.
    fn watched_since(&self, micros: u64) -> bool {
        self.runs.iter().any(|run| {
            let run = run.load(Ordering::Acquire);
            run & WATCHED != 0 && run >> FLAGS >= micros
        })
    }

    /// Workers whose current run started longer than [`STUCK`] ago.
    fn stuck(&self, now: Instant) -> usize {
        let mut stuck = 0;
        self.each_stuck(now, |_| stuck += 1);
        stuck
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};
    use std::thread;

    use super::*;

    fn taking(pool: &Pool) -> usize {
        lock(&pool.taking).count
    }

    /// Starts a worker thread that stands by if it is a spare; the receiver hears when it is
    /// back to taking events.
    fn worker_between_runs(pool: &Arc<Pool>) -> mpsc::Receiver<()> {
        let (back, backed) = mpsc::channel();
        let pool = Arc::clone(pool);
        thread::spawn(move || {
            pool.stand_by_if_spare();
            let _ = back.send(());
        });
        backed
    }

    fn wait_for_taking(pool: &Pool, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while taking(pool) != count {
            assert!(Instant::now() < deadline, "taking stayed {}", taking(pool));
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_stuck_run_wakes_a_standby_worker_who_stands_by_again_afterwards() {
        let pool = Arc::new(Pool::new(2, 1));
        let spare = worker_between_runs(&pool);
        wait_for_taking(&pool, 1);

        assert!(
            pool.run_started(0, false, Instant::now()),
            "the first run asks the timekeeper to watch"
        );
        assert!(
            !pool.run_started(0, false, Instant::now()),
            "watching already"
        );
        assert!(pool.watch(Instant::now()));
        assert!(
            spare.try_recv().is_err(),
            "a run shorter than STUCK is not replaced"
        );

        assert!(pool.watch(Instant::now() + 5 * STUCK));
        spare
            .recv_timeout(Duration::from_secs(5))
            .expect("the standby worker is woken for the stuck one");
        assert_eq!(taking(&pool), 2);

        pool.run_ended(0);
        assert!(
            !pool.watch(Instant::now()),
            "no run under way: watching stops"
        );
        assert!(!pool.is_watching());
        let again = worker_between_runs(&pool);
        wait_for_taking(&pool, 1);
        assert!(
            again.try_recv().is_err(),
            "the extra worker went back to standby"
        );
    }

    #[test]
    fn watching_goes_on_while_runs_keep_starting_and_stops_after_a_quiet_look() {
        // Runs holding events: watched with a waiting worker free.
        let pool = Pool::new(2, 2);
        assert!(
            pool.run_started(0, true, Instant::now()),
            "the first run asks the timekeeper to watch"
        );
        pool.run_ended(0);
        assert!(
            pool.watch(Instant::now()),
            "a run started since the look before"
        );
        thread::sleep(Duration::from_millis(1));
        assert!(
            !pool.run_started(1, true, Instant::now()),
            "still watching: the timekeeper is not told"
        );
        pool.run_ended(1);
        thread::sleep(Duration::from_millis(1));
        assert!(
            pool.watch(Instant::now()),
            "a run started since the last look"
        );
        thread::sleep(Duration::from_millis(1));
        assert!(
            !pool.watch(Instant::now()),
            "a look with no run under way or started since: watching stops"
        );
        assert!(!pool.is_watching());
        assert!(
            pool.run_started(0, true, Instant::now()),
            "the next run tells the timekeeper again"
        );
    }

    #[test]
    fn a_lone_run_with_a_waiting_worker_free_is_not_watched_until_another_starts() {
        let pool = Pool::new(8, 2);
        assert!(
            !pool.run_started(0, false, Instant::now()),
            "one run under way, another waiting worker free, no events held: not watched"
        );
        assert!(!pool.is_watching());
        assert!(
            pool.run_started(1, false, Instant::now()),
            "as many runs under way as waiting workers: the second is watched"
        );
        let later = Instant::now() + 5 * STUCK;
        let mut stuck = Vec::new();
        pool.each_stuck(later, |index| stuck.push(index));
        assert_eq!(stuck, [0, 1], "the unwatched run counts as stuck too");
        assert!(pool.watch(later));
        assert_eq!(taking(&pool), 8, "every worker already takes events");

        pool.run_ended(1);
        assert!(
            !pool.watch(later + STUCK),
            "only the unwatched run is under way: watching stops"
        );
        pool.run_ended(0);
        assert!(
            pool.run_started(2, true, Instant::now()),
            "a lone run holding events it took is watched"
        );
        assert_eq!(pool.watched_runs.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_waiting_workers_never_stand_by() {
        let pool = Pool::new(4, 2);
        lock(&pool.taking).count = 2;
        pool.stand_by_if_spare();
        assert_eq!(taking(&pool), 2);
    }
}
