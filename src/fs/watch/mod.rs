//! Directory watches for the whole daemon: one inotify instance per watch, and one thread
//! however many watches there are (SPEC §9b's `WatchDir` and watchers).
//!
//! A watch is a root directory (and, recursively, every directory below it) and a [`Sink`]: its
//! owner's side, told each [`Change`] and ticked when it asks for a moment (a keep-alive, a
//! deadline, an expiry). The [`Hub`] owns the watches, each with its inotify descriptor and its
//! table of watched directories (`table`), the meaning of events (`ops`, `state`) and the walk
//! that adds a directory tree (`tree`). Connect, streams and event buffers are the owner's
//! business (`api::filesystem::watch`).
//!
//! **The watcher thread** waits in `poll(2)` on every watch's inotify descriptor and on an
//! eventfd, with
//! a timeout for the earliest tick a sink asked for. It reads events, applies them under the
//! hub's lock and hands the changes to the sinks, which must never block (a stream's queue is
//! bounded: a client that does not keep up is the sink's to end). A thread setting up a watch
//! adds its directories itself, taking the lock for each one, and signals the eventfd so the
//! thread polls its descriptor and rereads the ticks; removing one signals it too, so that it
//! lets go of the descriptor it holds while it waits. So no thread waits for another.
//!
//! **A live upgrade** pauses the thread (it reads no queue and ticks no sink until resumed) and
//! carries each watch's instance and table to the next image, which reads the same queues on
//! (`carry`).
//!
//! One instance per watch (as envd's) means one kernel queue per watch
//! (`fs.inotify.max_queued_events`, 16384 by default): a flood in one watch overflows its
//! queue only, and ends that watch only. Each takes one of the user's
//! `fs.inotify.max_user_instances` (128 by default, shared with every root process): past it a
//! new watch is [`WatchError::Instances`]. The user's watch limit
//! (`fs.inotify.max_user_watches`) counts each directory once per watch that includes it;
//! reaching it is [`WatchError::Limit`].

pub mod carry;
pub mod ops;
mod state;
mod table;
mod tree;

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::log;
use crate::sys::inotify::{self, Inotify};
use crate::sys::poll::{poll_readable, EventFd};
pub use ops::Op;
use state::{lock, State};
pub use table::WatchId;
use tree::{add_tree, Locked, Tree};

/// Bytes read from the inotify descriptor at a time (fsnotify reads 64 KiB too).
const READ_BUFFER: usize = 64 << 10;
const _: () = assert!(READ_BUFFER >= inotify::MIN_BUFFER + inotify::HEADER + inotify::MAX_NAME);
/// Reads per wake-up before the thread ticks the sinks and polls again.
const READS_PER_TURN: usize = 16;

/// One change a watch saw.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub op: Op,
    /// Relative to the watch's root; `.` for the root itself.
    pub name: &'a Path,
    /// The root as the watch was given it, joined with `name`.
    pub path: &'a Path,
}

/// The owner's side of a watch. Called on the watcher thread under the hub's lock: every method
/// must return without waiting for anyone.
pub trait Sink: Send {
    /// One change; false when the sink is done (it has ended its side itself), which ends the
    /// watch.
    fn deliver(&mut self, change: &Change<'_>) -> bool;
    /// When the sink next wants [`Sink::tick`]; `None`: never.
    fn next_tick(&self) -> Option<Instant>;
    /// The moment asked for (or a later one) has come; false when the sink is done.
    fn tick(&mut self, now: Instant) -> bool;
    /// The watch ended on the hub's side; the sink is dropped after.
    fn end(self: Box<Self>, ended: Ended);
    /// Every directory of the watch is watched now (changes may have been delivered before);
    /// false when the sink is done.
    fn ready(&mut self) -> bool {
        true
    }
    /// A live upgrade is under way (`Hub::pause`): true when the watch is to be carried to the
    /// next image; false when the sink ended its side instead (the watch is then dropped).
    fn upgrading(&mut self) -> bool;
}

/// A watch that could not be set up, and its sink, given back untold (to end it, or drop it).
pub struct Refused {
    pub error: WatchError,
    pub sink: Box<dyn Sink>,
}

impl fmt::Debug for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Refused({:?})", self.error)
    }
}

/// Why the hub ended a watch.
#[derive(Debug)]
pub enum Ended {
    /// The kernel's event queue overflowed: events were lost.
    Overflow,
    /// A directory created inside a recursive watch could not be watched.
    Failed(WatchError),
}

/// Why a directory could not be watched.
#[derive(Debug)]
pub enum WatchError {
    /// No inotify instance for a new watch (`EMFILE`: the user's
    /// `fs.inotify.max_user_instances`; `ENFILE`, `ENOMEM`).
    Instances(io::Error),
    /// `ENOSPC`: the user's inotify watch limit is reached.
    Limit {
        path: PathBuf,
    },
    Io {
        path: PathBuf,
        error: io::Error,
    },
    /// The paths of every watched directory would pass `state::MAX_PATH_BYTES`.
    Paths {
        path: PathBuf,
    },
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Instances(error) => {
                let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
                    .map(|text| text.trim().to_string())
                    .unwrap_or_else(|_| "?".to_string());
                write!(
                    f,
                    "cannot start another watch: {error} (each watch takes an inotify instance; \
                     fs.inotify.max_user_instances = {limit}); end a watch or raise the limit"
                )
            }
            WatchError::Limit { path } => {
                let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
                    .map(|text| text.trim().to_string())
                    .unwrap_or_else(|_| "?".to_string());
                write!(
                    f,
                    "cannot watch {}: the inotify watch limit is reached \
                     (fs.inotify.max_user_watches = {limit}); watch fewer directories or raise it",
                    path.display()
                )
            }
            WatchError::Paths { path } => write!(
                f,
                "cannot watch {}: the paths of the watched directories would pass {} MiB; \
                 watch a shallower tree",
                path.display(),
                state::MAX_PATH_BYTES >> 20
            ),
            WatchError::Io { path, error } => {
                write!(f, "cannot watch {}: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for WatchError {}

/// The watcher: a handle to the watches, their thread and their state. Clones share them.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

struct Shared {
    wake: EventFd,
    state: Mutex<State>,
}

/// The daemon's hub, started by the first watch.
static GLOBAL: Mutex<Option<Hub>> = Mutex::new(None);

impl Hub {
    /// The daemon's hub, started on first use. A failure to start (no descriptors, no thread)
    /// is not kept: the next call tries again.
    pub fn global() -> io::Result<Hub> {
        let mut global = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hub) = global.as_ref() {
            return Ok(hub.clone());
        }
        let hub = Hub::start()?;
        *global = Some(hub.clone());
        Ok(hub)
    }

    /// A hub of its own, with its own thread (which lives as long as the process).
    pub fn start() -> io::Result<Hub> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            wake: EventFd::new()?,
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("sandboxd-watch".into())
            .spawn(move || run(&thread_shared))?;
        Ok(Hub { shared })
    }

    /// Starts watching `root` (a directory; a link to one is followed), and with `recursive`
    /// every directory below it, telling `sink`. Every directory is watched when this returns,
    /// and the sink was told [`Sink::ready`]: what happens after is reported. Errors on the root
    /// itself are errors; directories below it that vanish or may not be read are skipped.
    pub fn watch(
        &self,
        root: &Path,
        recursive: bool,
        sink: Box<dyn Sink>,
    ) -> Result<WatchId, Refused> {
        let kernel = match Inotify::new() {
            Ok(kernel) => kernel,
            Err(error) => {
                let error = WatchError::Instances(error);
                return Err(Refused { error, sink });
            }
        };
        let id = lock(&self.shared.state).insert(root, recursive, sink, kernel);
        // Polled from now: events of the directories added below are read as they come.
        self.wake();
        let tree = Tree {
            watch: id,
            abs: root,
            rel: Path::new(""),
            recursive,
            announce: false,
            strict: true,
        };
        if let Err(error) = add_tree(&mut Locked(&self.shared.state), &tree) {
            let sink = lock(&self.shared.state).remove(id);
            self.wake();
            return match sink {
                Some(sink) => Err(Refused { error, sink }),
                // Its sink was done meanwhile (its client left): nothing to tell.
                None => Ok(id),
            };
        }
        lock(&self.shared.state).ready(id);
        // A ready sink asks for ticks (keep-alives, deadlines, a gone client): the thread,
        // woken above before it was ready, must compute its timeout again.
        self.wake();
        Ok(id)
    }

    /// Stops a watch; its sink is dropped without being told. Nothing when it has ended.
    pub fn unwatch(&self, id: WatchId) {
        let sink = lock(&self.shared.state).remove(id);
        // Dropped outside the lock: dropping a stream wakes its connection.
        drop(sink);
        self.wake();
    }

    /// Wakes the thread: to poll a new instance, or to let go of a removed one (which it holds
    /// while it waits, so the instance, and its kernel watches, would live until it woke).
    fn wake(&self) {
        if let Err(error) = self.shared.wake.signal() {
            log::line(format_args!("cannot wake the watcher thread: {error}"));
        }
    }

    /// How many directories the kernel watches for this hub, and how many watches there are.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let state = lock(&self.shared.state);
        (state.watched_dirs(), state.watches())
    }
}

/// The watcher thread: waits for events or the next tick, forever.
fn run(shared: &Shared) {
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let (kernels, timeout) = {
            let state = lock(&shared.state);
            let timeout = state
                .next_tick()
                .map(|at| at.saturating_duration_since(Instant::now()));
            match state.paused {
                // Only the wake-up is waited for: events wait in each instance's queue for
                // whoever reads it next (this image resumed, or the next one).
                true => (Vec::new(), None),
                false => (state.kernels(), timeout),
            }
        };
        let mut fds = vec![shared.wake.as_fd()];
        fds.extend(kernels.iter().map(|(_, kernel)| kernel.as_fd()));
        match poll_readable(&fds, timeout) {
            Ok(ready) => {
                if ready.first() == Some(&true) {
                    let _ = shared.wake.drain();
                }
                for ((id, kernel), ready) in kernels.iter().zip(ready.iter().skip(1)) {
                    if *ready {
                        read_events(shared, *id, kernel, &mut buf);
                    }
                }
            }
            Err(error) => {
                log::line(format_args!("watcher: poll failed: {error}"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        lock(&shared.state).tick(Instant::now());
    }
}

/// Reads and applies what the kernel has queued for watch `id`. A record cut off by the end of
/// a read is carried to the next one (the kernel returns whole records, so it never is).
///
/// Each read is made and applied under the hub's lock, and not once the hub is paused: so an
/// event is either applied before the pause, or still in its queue for the next image.
fn read_events(shared: &Shared, id: WatchId, kernel: &Inotify, buf: &mut [u8]) {
    let mut held = 0;
    for _ in 0..READS_PER_TURN {
        let Some(free) = buf.get_mut(held..) else {
            return;
        };
        let mut state = lock(&shared.state);
        // Nor the queue of a watch removed since the poll (its instance may be carried).
        if state.paused || !state.watches.contains_key(&id) {
            return;
        }
        let filled = match kernel.read(free) {
            Ok(0) => break,
            Ok(n) => held + n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                log::line(format_args!("watcher: reading inotify events: {error}"));
                break;
            }
        };
        let used = {
            let parsed = inotify::parse(&buf[..filled]);
            match parsed {
                Ok((events, used)) => {
                    for event in &events {
                        state.handle(id, event);
                    }
                    used
                }
                Err(error) => {
                    log::line(format_args!("watcher: {error}"));
                    filled
                }
            }
        };
        drop(state);
        buf.copy_within(used..filled, 0);
        held = filled - used;
    }
}

#[cfg(test)]
mod tests;
