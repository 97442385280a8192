//! Where watches are set up, so that setting up big recursive trees never takes every HTTP
//! worker: a recursive watch lists and watches every directory below its root, which for `/`
//! or a tree of 100,000 directories takes seconds.
//!
//! - `WatchDir` answers at once and sets its watch up on one of [`SETUP_THREADS`] setup
//!   threads; the stream's `start` message is sent once every directory is watched, and an
//!   error is the end-of-stream message. At most [`MAX_PENDING`] setups wait for a thread;
//!   one more is `resource_exhausted` (answered before the stream).
//! - `CreateWatcher` answers the watcher's id only once the watch is in place, so its setup
//!   runs in its worker; a recursive one takes one of [`MAX_WORKER_SETUPS`] slots, and is
//!   `resource_exhausted` when they are all taken. So at most that many workers set watches up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use crate::connect::{Code, Error};
use crate::log;

/// Threads setting `WatchDir` watches up.
pub const SETUP_THREADS: usize = 2;
/// `WatchDir` setups waiting for a thread, at most.
pub const MAX_PENDING: usize = 64;
/// Recursive `CreateWatcher` setups running in workers at once, at most.
pub const MAX_WORKER_SETUPS: usize = 2;

type Job = Box<dyn FnOnce() + Send>;

static QUEUE: Mutex<Option<SyncSender<Job>>> = Mutex::new(None);
static IN_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Runs `job` on a setup thread (started on first use), or refuses when [`MAX_PENDING`]
/// already wait.
pub fn spawn(job: Job) -> Result<(), Error> {
    match start_threads()?.try_send(job) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => Err(Error::new(
            Code::ResourceExhausted,
            format!(
                "too many watches being set up: {MAX_PENDING} wait already; retry when they \
                 have started"
            ),
        )),
        Err(TrySendError::Disconnected(_)) => Err(Error::new(
            Code::Internal,
            "the watch setup threads are gone",
        )),
    }
}

/// The setup threads' queue, the threads started on first use. Threads take the credentials of
/// the thread that starts them: with `--fs-as-user` the daemon starts them before any call
/// switches (`daemon`), and each setup takes its user's credentials itself.
pub fn start_threads() -> Result<SyncSender<Job>, Error> {
    let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sender) = queue.as_ref() {
        return Ok(sender.clone());
    }
    let sender = start()?;
    *queue = Some(sender.clone());
    Ok(sender)
}

/// Starts the setup threads.
fn start() -> Result<SyncSender<Job>, Error> {
    let (sender, receiver) = sync_channel::<Job>(MAX_PENDING);
    let receiver = Arc::new(Mutex::new(receiver));
    for _ in 0..SETUP_THREADS {
        let receiver = Arc::clone(&receiver);
        std::thread::Builder::new()
            .name("sandboxd-watch-setup".into())
            .spawn(move || run(&receiver))
            .map_err(|e| {
                Error::new(
                    Code::ResourceExhausted,
                    format!("cannot start a watch setup thread: {e}"),
                )
            })?;
    }
    Ok(sender)
}

fn run(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match job {
            Ok(job) => job(),
            Err(_) => {
                log::line(format_args!("watch setup: the queue is gone"));
                return;
            }
        }
    }
}

/// A worker's right to set a recursive watch up; given back when dropped.
pub struct WorkerSlot(());

impl WorkerSlot {
    pub fn take() -> Result<WorkerSlot, Error> {
        let taken = IN_WORKERS.fetch_add(1, Ordering::SeqCst);
        if taken >= MAX_WORKER_SETUPS {
            IN_WORKERS.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "too many recursive watchers being set up: at most {MAX_WORKER_SETUPS} at \
                     once; retry when one is created"
                ),
            ));
        }
        Ok(WorkerSlot(()))
    }
}

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        IN_WORKERS.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_slots_are_bounded_and_given_back() {
        // Other tests may hold slots meanwhile: take what is left, then one more fails.
        let mut held = Vec::new();
        while let Ok(slot) = WorkerSlot::take() {
            held.push(slot);
            assert!(held.len() <= MAX_WORKER_SETUPS);
        }
        let error = WorkerSlot::take().err().map(|e| e.code);
        assert_eq!(error, Some(Code::ResourceExhausted));
    }

    #[test]
    fn jobs_run_on_a_setup_thread() {
        let (done, wait) = std::sync::mpsc::channel();
        spawn(Box::new(move || {
            let name = std::thread::current().name().map(str::to_string);
            let _ = done.send(name);
        }))
        .unwrap();
        let name = wait
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap();
        assert_eq!(name.as_deref(), Some("sandboxd-watch-setup"));
    }
}
