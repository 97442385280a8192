//! `/init`'s reads of the metadata service's `accessTokenHash`: off the HTTP workers, one read
//! at a time, each shared by every caller waiting for it ([`HashReads`]).
//!
//! An `/init` that needs the hash (`api::init_token`) must not wait for the service on a
//! worker: a service that accepts the connection and never answers would hold that worker for
//! the read's whole timeout, and a few local clients looping on `/init` without a token would
//! hold every worker, `/health` included. So the `/init` hands a [`Waiter`] over and returns;
//! its connection waits for a deferred answer holding no worker, and this module's own thread
//! reads the hash and gives it to each waiter.
//!
//! **One read for all the callers waiting.** At most one read is in flight. Callers that
//! arrive while it runs wait for the next one, which all of them share. So any number of
//! concurrent `/init`s cost at most two reads, and each `/init` is still decided by a read
//! begun after it arrived, as envd's, which reads the hash afresh for each `/init`: a read
//! begun earlier could predate the host's new hash. A waiter whose client left before its read
//! began is dropped unread; the queue is pruned of them as it grows, so clients that come and
//! go leave nothing behind.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One caller waiting for the hash.
pub trait Waiter: Send {
    /// False once nobody waits for the decision (its client left): dropped unrun.
    fn wanted(&self) -> bool;
    /// The outcome of the read begun after this waiter arrived: the hash (empty when the host
    /// set none), or why there is none.
    fn hash(self: Box<Self>, hash: Result<String, String>);
}

/// Queued waiters past which those whose client left are dropped (then twice as many as are
/// left, so the pruning costs O(1) a waiter).
const PRUNE_AT: usize = 64;

/// The waiters for the next read, and its thread.
pub struct HashReads {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    waiting: Vec<Box<dyn Waiter>>,
    prune_at: usize,
    /// Whether the reading thread runs: without it a waiter is answered at once, "no hash".
    running: bool,
}

impl HashReads {
    pub fn new() -> HashReads {
        HashReads {
            state: Mutex::new(State {
                waiting: Vec::new(),
                prune_at: PRUNE_AT,
                running: false,
            }),
            wake: Condvar::new(),
        }
    }

    /// Starts the thread that reads with `read` whenever a waiter waits.
    pub fn start(
        self: &Arc<Self>,
        read: impl Fn() -> Result<String, String> + Send + 'static,
    ) -> std::io::Result<()> {
        let reads = Arc::clone(self);
        std::thread::Builder::new()
            .name("mmds-hash".into())
            .spawn(move || reads.serve(read))?;
        lock(&self.state).running = true;
        Ok(())
    }

    /// Queues `waiter` for the next read begun from now on. Never blocks on the service.
    pub fn wait(&self, waiter: Box<dyn Waiter>) {
        let mut state = lock(&self.state);
        if !state.running {
            drop(state);
            waiter.hash(Err(
                "the thread that reads the metadata service is not running".into(),
            ));
            return;
        }
        if state.waiting.len() >= state.prune_at {
            state.waiting.retain(|waiter| waiter.wanted());
            state.prune_at = (state.waiting.len() * 2).max(PRUNE_AT);
        }
        state.waiting.push(waiter);
        drop(state);
        self.wake.notify_one();
    }

    /// The thread's loop: takes every waiter queued, reads once, answers each; again.
    fn serve(&self, read: impl Fn() -> Result<String, String>) {
        loop {
            let waiting = {
                let state = lock(&self.state);
                let mut state = self
                    .wake
                    .wait_while(state, |state| state.waiting.is_empty())
                    .unwrap_or_else(|e| e.into_inner());
                state.prune_at = PRUNE_AT;
                std::mem::take(&mut state.waiting)
            };
            let waiting: Vec<_> = waiting.into_iter().filter(|w| w.wanted()).collect();
            if waiting.is_empty() {
                continue;
            }
            let hash = read();
            if let Err(e) = &hash {
                crate::log::line(format_args!(
                    "init: no token hash from the metadata service: {e}"
                ));
            }
            for waiter in waiting {
                waiter.hash(hash.clone());
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    struct Tell {
        wanted: Arc<AtomicBool>,
        told: mpsc::Sender<Result<String, String>>,
    }

    impl Waiter for Tell {
        fn wanted(&self) -> bool {
            self.wanted.load(Ordering::SeqCst)
        }
        fn hash(self: Box<Self>, hash: Result<String, String>) {
            let _ = self.told.send(hash);
        }
    }

    fn waiter(told: &mpsc::Sender<Result<String, String>>) -> (Box<dyn Waiter>, Arc<AtomicBool>) {
        let wanted = Arc::new(AtomicBool::new(true));
        let tell = Tell {
            wanted: Arc::clone(&wanted),
            told: told.clone(),
        };
        (Box::new(tell), wanted)
    }

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn callers_arriving_during_a_read_share_the_next_one_and_the_left_are_not_read_for() {
        let reads = Arc::new(HashReads::new());
        let count = Arc::new(AtomicUsize::new(0));
        // Each read blocks until the test lets it end, and answers its own number.
        let (release, released) = mpsc::channel::<()>();
        let (began, begins) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let counted = Arc::clone(&count);
        reads
            .start(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                began.send(()).unwrap();
                released.lock().unwrap().recv().unwrap();
                Ok(format!("read {n}"))
            })
            .unwrap();
        let (told, answers) = mpsc::channel();
        reads.wait(waiter(&told).0);
        begins.recv_timeout(WAIT).expect("the first read began");
        // Twenty callers during the first read, and one whose client leaves before the next.
        for _ in 0..20 {
            reads.wait(waiter(&told).0);
        }
        let (gone, wanted) = waiter(&told);
        reads.wait(gone);
        wanted.store(false, Ordering::SeqCst);
        release.send(()).unwrap();
        assert_eq!(answers.recv_timeout(WAIT).unwrap().unwrap(), "read 1");
        begins.recv_timeout(WAIT).expect("the second read began");
        release.send(()).unwrap();
        for _ in 0..20 {
            assert_eq!(answers.recv_timeout(WAIT).unwrap().unwrap(), "read 2");
        }
        assert_eq!(count.load(Ordering::SeqCst), 2, "two reads for 22 callers");
        // Only callers that left are queued: no read is made for them.
        let (gone, wanted) = waiter(&told);
        wanted.store(false, Ordering::SeqCst);
        reads.wait(gone);
        let (last, _) = waiter(&told);
        reads.wait(last);
        begins
            .recv_timeout(WAIT)
            .expect("a third read for the last caller");
        release.send(()).unwrap();
        // Not "read 2": the caller that left before it was never answered.
        assert_eq!(answers.recv_timeout(WAIT).unwrap().unwrap(), "read 3");
    }

    #[test]
    fn without_its_thread_a_waiter_is_told_there_is_no_hash() {
        let reads = HashReads::new();
        let (told, answers) = mpsc::channel();
        reads.wait(waiter(&told).0);
        assert_eq!(
            answers.recv_timeout(WAIT).unwrap().unwrap_err(),
            "the thread that reads the metadata service is not running"
        );
    }

    #[test]
    fn a_growing_queue_is_pruned_of_callers_that_left() {
        let reads = HashReads::new();
        lock(&reads.state).running = true; // no thread: the queue only grows
        let (told, _answers) = mpsc::channel();
        let mut flags = Vec::new();
        for _ in 0..PRUNE_AT {
            let (waiter, wanted) = waiter(&told);
            reads.wait(waiter);
            flags.push(wanted);
        }
        for wanted in &flags[..PRUNE_AT - 10] {
            wanted.store(false, Ordering::SeqCst);
        }
        reads.wait(waiter(&told).0);
        let state = lock(&reads.state);
        assert_eq!(state.waiting.len(), 11);
        assert_eq!(state.prune_at, PRUNE_AT);
    }
}
