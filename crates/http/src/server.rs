//! The threads: workers that wait in one shared epoll and run whichever connection is ready,
//! and a timekeeper that enforces deadlines.
//!
//! Every socket is non-blocking and registered one-shot, so an event hands its connection to
//! exactly one worker, which owns it until it parks it again (see [`crate::conn`] for what a
//! run does). Connections not being run live in [`Slots`]; a token names a slot and its
//! generation, so an event for a closed connection whose slot was reused is recognised and
//! dropped. An event or a wake-up that arrives while the connection is being run is not lost:
//! the slot is marked, and the worker runs the connection again instead of parking it.
//!
//! Work that does not come from a socket (a producer with new bytes for a streamed response,
//! a deadline that passed) reaches the workers through [`Wakeups`], a queue signalled by an
//! eventfd in the same epoll.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::conn::{Conn, Context, Io, Limits, Next, Wait};
use crate::date::DateCache;
use crate::handler::Handler;
use crate::pool::{Pool, STUCK};
use crate::stream::Waker;
use crate::sys::{self, Epoll, WANT_HANGUP, WANT_READ, WANT_WRITE};

const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const FIRST_SLOT: u64 = 2;
/// Readable, one-shot, for the listener and the wake-up eventfd.
const WANT_IN: u32 = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
/// Pause after an accept error that closing an idle connection could not cure.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// A worker's stack: what handlers need, with room for deflate's state (sandboxd's gzip
/// answers): miniz_oxide builds its 64 KiB LZ buffer on the stack before boxing it, which an
/// unoptimized build copies more than once (256 KiB overflowed there; release builds need under
/// 128 KiB). Only the pages a worker touches are resident.
const WORKER_STACK: usize = 512 * 1024;
/// A worker's buffer for request bodies.
const SCRATCH_BYTES: usize = 256 * 1024;
/// A worker's buffer for small answers (a head and an inline body).
const OUT_BYTES: usize = 20 * 1024;

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
    let epoll = Epoll::new()?;
    let wakeups = Arc::new(Wakeups {
        queue: Mutex::new(VecDeque::new()),
        fd: sys::eventfd()?,
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
        timekeeper: Condvar::new(),
        timekeeper_lock: Mutex::new(()),
        pool: Pool::new(config.workers, config.waiting_workers),
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
            self.shared.in_flight.load(Ordering::SeqCst) <= requests
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
    timekeeper: Condvar,
    timekeeper_lock: Mutex<()>,
    pool: Pool,
}

/// A connection and its socket.
struct Connection {
    socket: TcpStream,
    conn: Conn,
    /// Added to the epoll already (later parks modify the registration).
    registered: bool,
}

/// A worker's own reusable state.
struct Worker {
    scratch: Vec<u8>,
    out: Vec<u8>,
    date: DateCache,
    spare: Option<Box<crate::conn::Reading>>,
}

impl<H: Handler> Shared<H> {
    fn work(&self, index: usize) {
        let mut worker = Worker {
            scratch: vec![0; SCRATCH_BYTES],
            out: Vec::with_capacity(OUT_BYTES),
            date: DateCache::new(),
            spare: None,
        };
        loop {
            self.pool.stand_by_if_spare();
            let token = match self.epoll.wait_one(-1) {
                Ok(Some(token)) => token,
                Ok(None) => continue,
                Err(e) => {
                    self.handler
                        .notice(format_args!("epoll_wait failed: {e}; retrying"));
                    thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            };
            if self.pool.run_started(index) {
                let _guard = lock(&self.timekeeper_lock);
                self.timekeeper.notify_all();
            }
            match token {
                LISTENER => self.accept(&mut worker),
                WAKE => match self.wakeups.pop(&self.epoll) {
                    Some(Dispatch::Wake(token)) => {
                        let connection = lock(&self.slots).take(token);
                        if let Some(connection) = connection {
                            self.drive(token, connection, &mut worker);
                        }
                    }
                    Some(Dispatch::Run(token, connection)) => {
                        self.drive(token, *connection, &mut worker)
                    }
                    None => {}
                },
                token => {
                    let connection = lock(&self.slots).take(token);
                    if let Some(connection) = connection {
                        self.drive(token, connection, &mut worker);
                    }
                }
            }
            self.pool.run_ended(index);
        }
    }

    /// Runs a connection until it must wait, then parks it (or closes it).
    fn drive(&self, token: u64, mut connection: Connection, worker: &mut Worker) {
        let wakeups = &self.wakeups;
        let make_waker = || -> Waker {
            let wakeups = Arc::clone(wakeups);
            Box::new(move || wakeups.push(Dispatch::Wake(token)))
        };
        loop {
            let now = Instant::now();
            let mut cx = Context {
                handler: &self.handler,
                limits: &self.limits,
                server: &self.config.server_header,
                date: worker.date.now(),
                now,
                stopping: self.stopping.load(Ordering::Relaxed),
                scratch: &mut worker.scratch,
                out: &mut worker.out,
                waker: &make_waker,
                in_flight: &self.in_flight,
                spare: &mut worker.spare,
            };
            let mut io = SocketIo(&connection.socket);
            let (wait, deadline) = match connection.conn.run(&mut io, &mut cx) {
                Next::Close => {
                    lock(&self.slots).release(token);
                    return;
                }
                Next::Park { wait, deadline } => (wait, deadline),
            };
            let interest = match wait {
                Wait::Read => WANT_READ,
                Wait::Write => WANT_WRITE,
                Wait::Producer => WANT_HANGUP,
            };
            // Armed before it is parked: an event that comes first finds the slot busy and marks
            // it, and the connection is run again below instead of being parked.
            let fd = connection.socket.as_raw_fd();
            let armed = if connection.registered {
                self.epoll.modify(fd, token, interest)
            } else {
                self.epoll.add(fd, token, interest)
            };
            if armed.is_err() {
                lock(&self.slots).release(token);
                return;
            }
            connection.registered = true;
            let evicted = {
                let mut slots = lock(&self.slots);
                match slots.park(token, connection, deadline, interest) {
                    Ok(()) => slots.over_budget(self.config.partial_head_budget),
                    Err(back) => {
                        connection = back;
                        continue;
                    }
                }
            };
            // Closed outside the lock.
            drop(evicted);
            return;
        }
    }

    fn accept(&self, worker: &mut Worker) {
        let accepted = {
            let listener = lock(&self.listener);
            let Some(listener) = listener.as_ref() else {
                return;
            };
            let accepted = listener.accept();
            // Re-armed at once unless accepting itself failed (then: below).
            if accepted.as_ref().map_or_else(is_transient, |_| true) {
                let _ = self.epoll.modify(listener.as_raw_fd(), LISTENER, WANT_IN);
            }
            accepted
        };
        match accepted {
            Ok((socket, _)) => {
                self.accept_error_logged.store(false, Ordering::Relaxed);
                if socket.set_nonblocking(true).is_err() {
                    return;
                }
                // Without TCP_NODELAY small answers wait for delayed ACKs (40 ms).
                let _ = socket.set_nodelay(true);
                let connection = Connection {
                    socket,
                    conn: Conn::new(Instant::now() + self.limits.header_timeout),
                    registered: false,
                };
                let token = lock(&self.slots).reserve();
                self.drive(token, connection, worker);
            }
            Err(e) if is_transient(&e) => {}
            Err(e) => {
                if !self.accept_error_logged.swap(true, Ordering::Relaxed) {
                    self.handler
                        .notice(format_args!("accept failed: {e}; retrying"));
                }
                let freed = is_resource_exhaustion(&e) && {
                    let closed = lock(&self.slots).close_oldest_idle();
                    closed.is_some()
                };
                if freed {
                    self.rearm_listener();
                } else {
                    *lock(&self.accept_paused_until) = Some(Instant::now() + ACCEPT_BACKOFF);
                    self.timekeeper.notify_all();
                }
            }
        }
    }

    fn rearm_listener(&self) {
        if let Some(listener) = lock(&self.listener).as_ref() {
            let _ = self.epoll.modify(listener.as_raw_fd(), LISTENER, WANT_IN);
        }
    }

    /// The timekeeper: hands connections whose deadline passed to the workers, resumes
    /// accepting after a backoff, and while runs are under way wakes standby workers to replace
    /// stuck ones.
    fn keep_time(&self) {
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

/// Work for a worker that did not come from a socket event.
enum Dispatch {
    /// The producer of the connection's streamed answer has bytes (or finished).
    Wake(u64),
    /// A connection taken from its slot because its deadline passed.
    Run(u64, Box<Connection>),
}

/// The queue of [`Dispatch`]es, signalled through an eventfd registered one-shot: each signal
/// wakes one worker, which takes one item and re-arms the eventfd, so further items wake others.
struct Wakeups {
    queue: Mutex<VecDeque<Dispatch>>,
    fd: File,
}

impl Wakeups {
    fn push(&self, dispatch: Dispatch) {
        let mut queue = lock(&self.queue);
        queue.push_back(dispatch);
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    fn pop(&self, epoll: &Epoll) -> Option<Dispatch> {
        let dispatch = {
            let mut queue = lock(&self.queue);
            let dispatch = queue.pop_front();
            if queue.is_empty() {
                let mut counter = [0u8; 8];
                let _ = (&self.fd).read(&mut counter);
            }
            dispatch
        };
        let _ = epoll.modify(self.fd.as_raw_fd(), WAKE, WANT_IN);
        dispatch
    }
}

/// The socket of a connection, non-blocking.
struct SocketIo<'a>(&'a TcpStream);

impl Io for SocketIo<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        sys::recv_nonblocking(self.0.as_raw_fd(), buf)
    }

    fn send(&mut self, buf: &[u8], more: bool) -> io::Result<usize> {
        sys::send(self.0.as_raw_fd(), buf, more)
    }

    fn sendfile(&mut self, file: &File, offset: &mut u64, count: usize) -> io::Result<usize> {
        sys::sendfile(self.0.as_raw_fd(), file.as_raw_fd(), offset, count)
    }

    fn hung_up(&mut self) -> bool {
        sys::is_ready(self.0.as_raw_fd(), WANT_HANGUP)
    }

    fn shutdown_write(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

/// Errors that concern one aborted connection, not the listener.
fn is_transient(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::WouldBlock
        || matches!(
            error.raw_os_error(),
            Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EPERM)
        )
}

fn is_resource_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Connections by slot, while no worker runs them.
#[derive(Default)]
struct Slots {
    entries: Vec<Slot>,
    free: Vec<usize>,
    /// Bytes held by parked incomplete heads.
    partial_bytes: usize,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    state: State,
}

#[derive(Default)]
enum State {
    #[default]
    Free,
    /// A worker runs it; `woken`: an event or wake-up came meanwhile.
    Busy {
        woken: bool,
    },
    Parked(Parked),
}

struct Parked {
    connection: Connection,
    deadline: Option<Instant>,
    interest: u32,
    /// When it was parked: the oldest partial head is closed first.
    since: Instant,
    partial: usize,
}

impl Slots {
    /// A slot for a new connection, busy.
    fn reserve(&mut self) -> u64 {
        let index = self.free.pop().unwrap_or_else(|| {
            self.entries.push(Slot::default());
            self.entries.len() - 1
        });
        let slot = &mut self.entries[index];
        slot.state = State::Busy { woken: false };
        (u64::from(slot.generation) << 32) | (index as u64 + FIRST_SLOT)
    }

    fn slot(&mut self, token: u64) -> Option<&mut Slot> {
        let index = usize::try_from((token & 0xffff_ffff).checked_sub(FIRST_SLOT)?).ok()?;
        let slot = self.entries.get_mut(index)?;
        (u64::from(slot.generation) == token >> 32).then_some(slot)
    }

    /// The parked connection of `token`, now busy; a busy one is marked woken instead.
    fn take(&mut self, token: u64) -> Option<Connection> {
        let slot = self.slot(token)?;
        match std::mem::take(&mut slot.state) {
            State::Parked(parked) => {
                slot.state = State::Busy { woken: false };
                self.partial_bytes -= parked.partial;
                Some(parked.connection)
            }
            State::Busy { .. } => {
                slot.state = State::Busy { woken: true };
                None
            }
            State::Free => None,
        }
    }

    /// Parks a busy connection; gives it back if it was woken meanwhile (run it again).
    fn park(
        &mut self,
        token: u64,
        connection: Connection,
        deadline: Option<Instant>,
        interest: u32,
    ) -> Result<(), Connection> {
        let Some(slot) = self.slot(token) else {
            return Ok(());
        };
        if let State::Busy { woken: true } = slot.state {
            slot.state = State::Busy { woken: false };
            return Err(connection);
        }
        let partial = connection.conn.partial_head_bytes();
        slot.state = State::Parked(Parked {
            connection,
            deadline,
            interest,
            since: Instant::now(),
            partial,
        });
        self.partial_bytes += partial;
        Ok(())
    }

    /// Frees the slot of a connection that is closing.
    fn release(&mut self, token: u64) {
        let index = (token & 0xffff_ffff).wrapping_sub(FIRST_SLOT);
        if let Some(slot) = self.slot(token) {
            slot.state = State::Free;
            slot.generation = slot.generation.wrapping_add(1);
            if let Ok(index) = usize::try_from(index) {
                self.free.push(index);
            }
        }
    }

    /// Takes out the parked connection at `index`, freeing its slot.
    fn remove(&mut self, index: usize) -> Option<Connection> {
        let slot = self.entries.get_mut(index)?;
        let State::Parked(parked) = std::mem::take(&mut slot.state) else {
            return None;
        };
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.partial_bytes -= parked.partial;
        Some(parked.connection)
    }

    /// Over the partial-head budget: the oldest incomplete heads, removed until under it.
    fn over_budget(&mut self, budget: usize) -> Vec<Connection> {
        let mut evicted = Vec::new();
        while self.partial_bytes > budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter_map(|(index, slot)| match &slot.state {
                    State::Parked(p) if p.partial > 0 => Some((p.since, index)),
                    _ => None,
                })
                .min();
            match oldest.and_then(|(_, index)| self.remove(index)) {
                Some(connection) => evicted.push(connection),
                None => break,
            }
        }
        evicted
    }

    /// Removes the idle connection parked longest, to free a descriptor.
    /// Whether a connection is with a worker or parked waiting for (or reading) a head.
    fn any_awaiting_head(&self) -> bool {
        self.entries.iter().any(|slot| match &slot.state {
            State::Free => false,
            State::Busy { .. } => true,
            State::Parked(parked) => parked.connection.conn.awaits_head(),
        })
    }

    fn close_oldest_idle(&mut self) -> Option<Connection> {
        let oldest = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| match &slot.state {
                State::Parked(p) if p.connection.conn.is_idle() => Some((p.since, index)),
                _ => None,
            })
            .min()?;
        self.remove(oldest.1)
    }

    /// Connections whose deadline passed while the peer did nothing, made busy. One whose socket
    /// is ready is waiting for a worker, not for its peer, and is left to the worker.
    fn sweep(&mut self, now: Instant) -> Vec<(u64, Connection)> {
        let mut expired = Vec::new();
        for (index, slot) in self.entries.iter_mut().enumerate() {
            let State::Parked(parked) = &slot.state else {
                continue;
            };
            let due = parked.deadline.is_some_and(|deadline| deadline <= now);
            if !due || sys::is_ready(parked.connection.socket.as_raw_fd(), parked.interest) {
                continue;
            }
            let token = (u64::from(slot.generation) << 32) | (index as u64 + FIRST_SLOT);
            if let State::Parked(parked) =
                std::mem::replace(&mut slot.state, State::Busy { woken: false })
            {
                self.partial_bytes -= parked.partial;
                expired.push((token, parked.connection));
            }
        }
        expired
    }
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (release builds
/// abort on panic, so this only matters in tests).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
