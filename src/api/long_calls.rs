//! Long calls run off the HTTP workers: a small executor of its own, bounded in threads and in
//! queue, whose answers reach the client as deferred answers (`http::deferred`).
//!
//! A call whose work may take seconds (`ListDir` of a deep, wide tree) would otherwise hold one
//! of the HTTP layer's workers for all that time, and eight such calls would hold all of them:
//! `/health` and every short call would wait. Here the worker only hands the work over and
//! returns; the connection waits in the event loop holding nothing, and the answer wakes it.
//! [`THREADS`] threads run the work, at most [`QUEUE`] more calls wait for one; a call past
//! that is answered `resource_exhausted` at once (SPEC §9b). Work whose client left before it
//! began is dropped unrun, and holds no place in a full queue.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use crate::connect::{Code, Error};
use crate::http::deferred::{self, Answer};
use crate::http::Response;

/// Threads running long calls: a bound on the CPUs and disk they take together.
pub const THREADS: usize = 2;
/// Long calls waiting for a thread, past which a call is refused.
pub const QUEUE: usize = 64;
/// The threads' nice value: below the workers, so a worker woken for `/health` preempts a long
/// call at once, but not so low that a busy sandbox starves the calls.
pub const NICE: i32 = 5;

type Work = Box<dyn FnOnce() -> Response + Send>;

pub struct Executor {
    queue: Mutex<VecDeque<(Work, Answer)>>,
    ready: Condvar,
}

static EXECUTOR: OnceLock<Executor> = OnceLock::new();

/// The executor, its threads started on first use. Threads take the credentials of the thread
/// that starts them: with `--fs-as-user` the daemon starts it before any call switches
/// (`daemon`), and each call takes its user's credentials itself.
pub fn start() -> &'static Executor {
    EXECUTOR.get_or_init(|| {
        for index in 0..THREADS {
            // Without its threads the executor would hold calls forever: a daemon that cannot
            // start a thread at launch is not usable anyway.
            let spawned = std::thread::Builder::new()
                .name(format!("long-call-{index}"))
                .spawn(serve);
            if let Err(e) = spawned {
                crate::log::line(format_args!("cannot start a long-call thread: {e}"));
            }
        }
        Executor {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        }
    })
}

/// Runs `work` on the executor; the response answers the call when it is done. A full queue
/// is `resource_exhausted`.
pub fn run(work: impl FnOnce() -> Response + Send + 'static) -> Result<Response, Error> {
    let executor = start();
    let (answer, deferred) = deferred::channel();
    {
        let mut queue = lock(&executor.queue);
        if queue.len() >= QUEUE {
            // Calls whose client left hold no place.
            queue.retain(|(_, answer)| !answer.is_abandoned());
        }
        if queue.len() >= QUEUE {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!("too many long calls under way: {QUEUE} wait already; try again later"),
            ));
        }
        queue.push_back((Box::new(work), answer));
    }
    executor.ready.notify_one();
    Ok(Response::deferred(deferred))
}

fn serve() {
    if let Err(e) = crate::sys::priority::set_thread_nice(NICE) {
        crate::log::line(format_args!("long calls run at the workers' priority: {e}"));
    }
    let executor = EXECUTOR.wait();
    loop {
        let (work, answer) = {
            let queue = lock(&executor.queue);
            let mut queue = executor
                .ready
                .wait_while(queue, |queue| queue.is_empty())
                .unwrap_or_else(|e| e.into_inner());
            match queue.pop_front() {
                Some(job) => job,
                None => continue,
            }
        };
        if answer.is_abandoned() {
            continue;
        }
        answer.send(work());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_full_queue_is_resource_exhausted_and_calls_whose_client_left_are_not_run() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        // Both threads busy until released.
        let mut busy = Vec::new();
        for _ in 0..THREADS {
            let (ran, released) = (Arc::clone(&ran), Arc::clone(&released));
            busy.push(
                run(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                    let _ = lock(&released).recv();
                    Response::empty(204)
                })
                .unwrap(),
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while ran.load(Ordering::SeqCst) < THREADS {
            assert!(Instant::now() < deadline, "the threads never took the work");
            std::thread::sleep(Duration::from_millis(1));
        }
        let waiting: Vec<Response> = (0..QUEUE)
            .map(|_| {
                let ran = Arc::clone(&ran);
                run(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Response::empty(204)
                })
                .unwrap()
            })
            .collect();
        let Err(refused) = run(|| Response::empty(204)) else {
            panic!("a call past the queue was taken");
        };
        assert_eq!(refused.code, Code::ResourceExhausted);
        assert!(refused.message.contains("64 wait"), "{}", refused.message);
        // Their clients leave: the queued calls are dropped unrun.
        drop(waiting);
        let (done, finished) = mpsc::channel();
        let last = run(move || {
            let _ = done.send(());
            Response::empty(204)
        })
        .unwrap();
        for _ in 0..THREADS {
            release.send(()).unwrap();
        }
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("the last call runs");
        assert_eq!(ran.load(Ordering::SeqCst), THREADS, "no abandoned call ran");
        drop((busy, last));
    }
}
