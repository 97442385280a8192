//! The threads: workers that wait in one shared epoll and run whichever connection is ready,
//! and a timekeeper that enforces deadlines.
//!
//! Every connection's socket is non-blocking and registered once, edge-triggered: parking a
//! connection costs no `epoll_ctl`. An edge comes only when new bytes (or room, or a hang-up)
//! arrive, so a connection is parked waiting for one only when its last read came back short
//! or refused (all there was: the next bytes bring an edge) or its last write was refused; one
//! still ready (a turn's end) goes to the back of its worker's line, run again after that
//! worker's next look at the epoll (as nginx's posted events), so a long download wakes no
//! other thread. Workers take up to
//! [`BATCH`] events per `epoll_wait` and run them one by one; while a worker is stuck in one
//! (a slow disk), the timekeeper hands the rest of its batch to the others. Connections not
//! being run live in [`Slots`]; a token names a slot and its generation, so an event for a
//! closed connection whose slot was reused is recognised and dropped. An event or a wake-up
//! that arrives while the connection is being run is not lost: the slot is marked, and the
//! worker runs the connection again instead of parking it.
//!
//! Work that does not come from a socket (a producer with new bytes for a streamed response,
//! a deadline that passed) reaches the workers through [`Wakeups`], a queue signalled by an
//! eventfd in the same epoll.
//!
//! - [`worker`]: a worker's loop (a batch of events, one at a time) and the run of one
//!   connection, parked again or closed after it; the socket as the connection's
//!   [`Io`](crate::conn::Io).
//! - [`accept`]: accepting connections, and what an accept error costs.
//! - [`slots`]: the parked connections, their tokens, deadlines and the partial-head budget.
//! - [`wakeups`]: the queue of work that does not come from a socket.
//! - [`timekeeper`]: deadlines, the accept backoff, stuck workers (and their batches),
//!   [`Handler::tick`].

mod accept;
mod slots;
#[cfg(test)]
mod tests;
mod timekeeper;
mod wakeups;
mod worker;

use std::collections::VecDeque;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::conn::{Conn, Limits};
use crate::handler::Handler;
use crate::pool::Pool;
use crate::sys::{self, Epoll};
use slots::Slots;
use wakeups::Wakeups;

const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const FIRST_SLOT: u64 = 2;
/// Most events a worker takes from the epoll at once.
const BATCH: usize = 32;
/// Readable, one-shot, for the listener and the wake-up eventfd.
const WANT_IN: u32 = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
/// A worker's stack: what handlers need, with room for deflate's state (sandboxd's gzip
/// answers): miniz_oxide builds its 64 KiB LZ buffer on the stack before boxing it, which an
/// unoptimized build copies more than once (256 KiB overflowed there; release builds need under
/// 128 KiB). Only the pages a worker touches are resident.
const WORKER_STACK: usize = 512 * 1024;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker threads: they run requests, including blocking calls on disks.
    pub workers: usize,
    /// Workers taking events when none is stuck on a disk (the CPUs); the others stand by to
    /// replace one that is (see [`crate::pool`]).
    pub waiting_workers: usize,
    /// From a head's first byte (a new connection's accept) to its end.
    pub header_timeout: Duration,
    /// Between requests.
    pub idle_timeout: Duration,
    /// Longest time without the peer taking any byte of an answer.
    pub send_timeout: Duration,
    /// Longest gap in a request body; also the window of its minimum rate.
    pub body_timeout: Duration,
    /// Most bytes of an unneeded request body discarded to keep the connection alive.
    pub discard_cap: u64,
    /// Most bytes held by all incomplete heads together; past it the oldest is closed.
    pub partial_head_budget: usize,
    /// Most bytes held by all request bodies being collected ([`crate::Action::Collect`])
    /// together; a body that would go past it is refused with [`crate::Error::BodyBudget`].
    pub collect_budget: usize,
    /// The `Server` header of every answer.
    pub server_header: String,
}

/// A running server.
pub struct Server<H> {
    shared: Arc<Shared<H>>,
}

/// Starts the workers and the timekeeper on `listener`.
pub fn start<H: Handler>(
    listener: TcpListener,
    config: Config,
    handler: H,
) -> io::Result<Server<H>> {
    listener.set_nonblocking(true)?;
    let nodelay_inherited = sys::set_listener_nodelay(&listener).is_ok();
    let epoll = Epoll::new()?;
    let wakeups = Arc::new(Wakeups {
        queue: Mutex::new(VecDeque::new()),
        fd: sys::eventfd()?,
        #[cfg(test)]
        pushed: AtomicU64::new(0),
        #[cfg(test)]
        kept: AtomicU64::new(0),
        #[cfg(test)]
        refused_sendfiles: AtomicU64::new(0),
    });
    epoll.add(listener.as_raw_fd(), LISTENER, WANT_IN)?;
    epoll.add(wakeups.fd.as_raw_fd(), WAKE, WANT_IN)?;
    let shared = Arc::new(Shared {
        handler,
        limits: Limits {
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            send_timeout: config.send_timeout,
            body_timeout: config.body_timeout,
            discard_cap: config.discard_cap,
            collect_budget: crate::budget::Budget::new(config.collect_budget),
        },
        epoll,
        listener: Mutex::new(Some(listener)),
        accept_paused_until: Mutex::new(None),
        accept_error_logged: AtomicBool::new(false),
        slots: Mutex::new(Slots::default()),
        wakeups,
        stopping: AtomicBool::new(false),
        in_flight: Arc::new(AtomicUsize::new(0)),
        first_runs: AtomicUsize::new(0),
        nodelay_inherited: AtomicBool::new(nodelay_inherited),
        timekeeper: Condvar::new(),
        timekeeper_lock: Mutex::new(()),
        pool: Pool::new(config.workers, config.waiting_workers),
        batches: (0..config.workers)
            .map(|_| Mutex::new(Vec::with_capacity(BATCH)))
            .collect(),
        config,
    });
    for index in 0..shared.config.workers {
        let shared = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("worker-{index}"))
            .stack_size(WORKER_STACK)
            .spawn(move || shared.work(index))?;
    }
    let keeper = Arc::clone(&shared);
    thread::Builder::new()
        .name("timekeeper".into())
        .stack_size(WORKER_STACK)
        .spawn(move || keeper.keep_time())?;
    Ok(Server { shared })
}

impl<H: Handler> Server<H> {
    /// Stops accepting (the listening socket is closed); requests under way go on, and every
    /// answer from now on closes its connection. Idle keep-alive connections stay open, so a
    /// client probing on one reads the application's answer (a 503) rather than a reset.
    pub fn stop_accepting(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(listener) = lock(&self.shared.listener).take() {
            let _ = self.shared.epoll.delete(listener.as_raw_fd());
        }
        self.shared.timekeeper.notify_all();
    }

    /// Stops accepting but keeps the listening socket, which is handed to the caller: new
    /// connections wait in its backlog. Requests under way go on, and every answer from now on
    /// closes its connection (as after [`stop_accepting`](Self::stop_accepting)). For a live
    /// upgrade, which hands the socket to the next image; [`resume_accepting`](Self::resume_accepting)
    /// undoes it.
    pub fn pause_accepting(&self) -> Option<TcpListener> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let listener = lock(&self.shared.listener).take()?;
        let _ = self.shared.epoll.delete(listener.as_raw_fd());
        Some(listener)
    }

    /// Accepts on `listener` again, and answers keep connections open again.
    pub fn resume_accepting(&self, listener: TcpListener) -> io::Result<()> {
        let nodelay_inherited = sys::set_listener_nodelay(&listener).is_ok();
        self.shared
            .nodelay_inherited
            .store(nodelay_inherited, Ordering::SeqCst);
        self.shared
            .epoll
            .add(listener.as_raw_fd(), LISTENER, WANT_IN)?;
        *lock(&self.shared.listener) = Some(listener);
        self.shared.stopping.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until no request is under way, at most `timeout`. True if drained.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, || {
            self.shared.in_flight.load(Ordering::SeqCst) == 0
        })
    }

    /// After [`pause_accepting`](Self::pause_accepting): waits until at most `requests` are under
    /// way (a request waiting for its own deferred answer counts) and no connection is waiting for or reading a head (an accepted connection whose
    /// client is about to send its request; one that sends nothing holds this until `timeout`).
    /// Then closing every connection loses no request a client had begun to send, but for one
    /// sent on an idle keep-alive connection at that very moment. True if reached.
    pub fn wait_quiet(&self, requests: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, || {
            self.shared.first_runs.load(Ordering::SeqCst) == 0
                && self.shared.in_flight.load(Ordering::SeqCst) <= requests
                && !lock(&self.shared.slots).any_awaiting_head()
        })
    }

    fn wait_until(&self, timeout: Duration, done: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while !done() {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

struct Shared<H> {
    config: Config,
    handler: H,
    limits: Limits,
    epoll: Epoll,
    listener: Mutex<Option<TcpListener>>,
    accept_paused_until: Mutex<Option<Instant>>,
    accept_error_logged: AtomicBool,
    slots: Mutex<Slots>,
    wakeups: Arc<Wakeups>,
    stopping: AtomicBool,
    in_flight: Arc<AtomicUsize>,
    /// Connections accepted whose first run has not ended: neither parked (seen by
    /// [`Server::wait_quiet`] in the slots) nor yet holding a request (`in_flight`).
    first_runs: AtomicUsize,
    /// `TCP_NODELAY` is set on the listener, so accepted sockets have it already.
    nodelay_inherited: AtomicBool,
    timekeeper: Condvar,
    timekeeper_lock: Mutex<()>,
    pool: Pool,
    /// Each worker's events taken but not run yet, in reverse order.
    batches: Vec<Mutex<Vec<u64>>>,
}

/// A connection and its socket.
struct Connection {
    socket: TcpStream,
    conn: Conn,
    /// Added to the epoll already (later parks modify the registration).
    registered: bool,
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (release builds
/// abort on panic, so this only matters in tests).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
