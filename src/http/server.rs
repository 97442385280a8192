//! The event loop and the worker pool.
//!
//! One thread accepts connections and watches idle ones with epoll; a connection is handed to
//! the bounded ready queue only when it has bytes to read, so idle keep-alive connections (a
//! proxy's pool, an SDK's) cost a descriptor, never a worker, and cannot starve anyone. A
//! connection whose head is incomplete is parked too, until its header deadline. A fixed
//! pool of workers takes ready connections one at a time and gives them back when they fall idle.
//!
//! The loop never blocks and never stops: a full queue is answered 503 and closed; accept errors
//! (`EMFILE`, `ENFILE`, `ENOBUFS`, ...) are logged once per burst and retried after a short
//! backoff, after first closing the oldest idle connection to free a descriptor.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::connection::{self, Conn, Outcome, Scratch};
use super::date;
use super::response::{self, Response, WriteOptions};
use super::Handler;
use crate::error::ApiError;
use crate::log;
use crate::sys::net::{self, Epoll, Event, EPOLL_READ, EPOLL_READ_ONESHOT};

const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const FIRST_SLOT: u64 = 2;
/// Pause after an accept error that closing an idle connection could not cure.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
const WORKER_STACK: usize = 256 * 1024;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub workers: usize,
    /// Ready connections waiting for a worker before new ones are answered 503.
    pub queue_capacity: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub send_timeout: Duration,
    pub body_timeout: Duration,
}

/// State shared by the event loop, the workers and the [`ServerHandle`].
pub struct Shared<H> {
    pub config: ServerConfig,
    pub handler: H,
    pub stopping: AtomicBool,
    epoll: Epoll,
    wake: File,
    slots: Mutex<Slots>,
    queue: Mutex<VecDeque<Conn>>,
    ready: Condvar,
    /// Connections held by workers right now.
    active: AtomicUsize,
}

/// Controls a running server.
pub struct ServerHandle<H> {
    shared: Arc<Shared<H>>,
}

/// Starts the event loop and the workers on `listener`.
pub fn start<H: Handler>(
    listener: TcpListener,
    config: ServerConfig,
    handler: H,
) -> io::Result<ServerHandle<H>> {
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        handler,
        stopping: AtomicBool::new(false),
        epoll: Epoll::new()?,
        wake: net::eventfd()?,
        slots: Mutex::new(Slots::default()),
        queue: Mutex::new(VecDeque::with_capacity(config.queue_capacity)),
        ready: Condvar::new(),
        active: AtomicUsize::new(0),
        config,
    });
    shared
        .epoll
        .add(listener.as_raw_fd(), LISTENER, EPOLL_READ)?;
    shared
        .epoll
        .add(shared.wake.as_raw_fd(), WAKE, EPOLL_READ)?;
    for index in 0..shared.config.workers {
        let shared = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("worker-{index}"))
            .stack_size(WORKER_STACK)
            .spawn(move || shared.work())?;
    }
    let loop_shared = Arc::clone(&shared);
    thread::Builder::new()
        .name("event-loop".into())
        .stack_size(WORKER_STACK)
        .spawn(move || EventLoop::new(loop_shared, listener).run())?;
    Ok(ServerHandle { shared })
}

impl<H: Handler> ServerHandle<H> {
    /// Stops accepting: the listening socket is closed; requests already under way go on, and
    /// every response from now on closes its connection.
    pub fn stop_accepting(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = (&self.shared.wake).write(&1u64.to_ne_bytes());
    }

    /// Waits until no request is being served or queued, at most `timeout`. True if drained.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let idle = lock(&self.shared.queue).is_empty()
                && self.shared.active.load(Ordering::SeqCst) == 0;
            if idle {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl<H: Handler> Shared<H> {
    fn work(&self) {
        let mut scratch = Scratch::default();
        loop {
            let conn = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(conn) = queue.pop_front() {
                        self.active.fetch_add(1, Ordering::SeqCst);
                        break conn;
                    }
                    queue = self.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
                }
            };
            if let Outcome::Park(conn) = connection::serve(conn, self, &mut scratch) {
                if !self.stopping.load(Ordering::Relaxed) {
                    // A head under way keeps its header deadline; between requests, idle.
                    let deadline = conn
                        .head_deadline
                        .unwrap_or_else(|| Instant::now() + self.config.idle_timeout);
                    self.park(conn, deadline, false);
                }
            }
            self.active.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Watches `conn` until it is readable or `deadline` passes. `new`: first registration.
    fn park(&self, conn: Conn, deadline: Instant, new: bool) {
        let fd = conn.socket.as_raw_fd();
        let token = lock(&self.slots).insert(conn, deadline);
        let registered = if new {
            self.epoll.add(fd, token, EPOLL_READ_ONESHOT)
        } else {
            self.epoll.modify(fd, token, EPOLL_READ_ONESHOT)
        };
        if registered.is_err() {
            drop(lock(&self.slots).take(token));
        }
    }

    /// Queues a readable connection for a worker, or answers 503 when the queue is full.
    fn dispatch(&self, conn: Conn) {
        let mut queue = lock(&self.queue);
        if queue.len() >= self.config.queue_capacity {
            drop(queue);
            reject_busy(conn);
            return;
        }
        queue.push_back(conn);
        drop(queue);
        self.ready.notify_one();
    }
}

/// Answers 503 without ever blocking the loop, then closes.
fn reject_busy(conn: Conn) {
    let error = ApiError::new(503, "server busy: too many requests waiting, try again");
    let mut head = Vec::new();
    let options = WriteOptions {
        date: &date::format(date::now_unix()),
        head_only: false,
        keep_alive: false,
        announce_keep_alive: false,
    };
    response::serialize(Response::from(error), &options, &mut head);
    let _ = net::send_nonblocking(conn.socket.as_raw_fd(), &head);
}

struct EventLoop<H> {
    shared: Arc<Shared<H>>,
    listener: Option<TcpListener>,
    accept_paused_until: Option<Instant>,
    accept_error_logged: bool,
    next_sweep: Instant,
    sweep_every: Duration,
}

impl<H: Handler> EventLoop<H> {
    fn new(shared: Arc<Shared<H>>, listener: TcpListener) -> EventLoop<H> {
        let config = &shared.config;
        let shortest = config.header_timeout.min(config.idle_timeout);
        let sweep_every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        EventLoop {
            shared,
            listener: Some(listener),
            accept_paused_until: None,
            accept_error_logged: false,
            next_sweep: Instant::now() + sweep_every,
            sweep_every,
        }
    }

    fn run(mut self) {
        let mut events: Vec<Event> = Vec::with_capacity(256);
        loop {
            let now = Instant::now();
            let wake_at = match self.accept_paused_until {
                Some(resume) => resume.min(self.next_sweep),
                None => self.next_sweep,
            };
            let timeout = wake_at.saturating_duration_since(now).as_millis() as i32 + 1;
            events.clear();
            if let Err(e) = self.shared.epoll.wait(&mut events, timeout) {
                log::line(format_args!("epoll_wait failed: {e}"));
                thread::sleep(ACCEPT_BACKOFF);
            }
            for event in &events {
                match event.token {
                    LISTENER => self.accept_burst(),
                    WAKE => self.woken(),
                    token => self.readable(token),
                }
            }
            let now = Instant::now();
            if self.accept_paused_until.is_some_and(|resume| now >= resume) {
                self.resume_accepting();
            }
            if now >= self.next_sweep {
                lock(&self.shared.slots).close_expired(now);
                self.next_sweep = now + self.sweep_every;
            }
        }
    }

    fn accept_burst(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        loop {
            match listener.accept() {
                Ok((socket, _)) => {
                    self.accept_error_logged = false;
                    // Without TCP_NODELAY small responses wait for delayed ACKs (40 ms).
                    let _ = socket.set_nodelay(true);
                    let _ = socket.set_write_timeout(Some(self.shared.config.send_timeout));
                    let deadline = Instant::now() + self.shared.config.header_timeout;
                    let conn = Conn {
                        socket,
                        pending: Vec::new(),
                        head_deadline: Some(deadline),
                    };
                    self.shared.park(conn, deadline, true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if is_transient(&e) => continue,
                Err(e) => {
                    if !self.accept_error_logged {
                        log::line(format_args!("accept failed: {e}; retrying"));
                        self.accept_error_logged = true;
                    }
                    if is_resource_exhaustion(&e) && lock(&self.shared.slots).close_oldest() {
                        continue;
                    }
                    self.pause_accepting();
                    return;
                }
            }
        }
    }

    fn pause_accepting(&mut self) {
        if let Some(listener) = &self.listener {
            let _ = self.shared.epoll.delete(listener.as_raw_fd());
            self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
        }
    }

    fn resume_accepting(&mut self) {
        self.accept_paused_until = None;
        if let Some(listener) = &self.listener {
            if self
                .shared
                .epoll
                .add(listener.as_raw_fd(), LISTENER, EPOLL_READ)
                .is_err()
            {
                self.pause_accepting();
            }
        }
    }

    fn woken(&mut self) {
        let mut counter = [0u8; 8];
        let _ = (&self.shared.wake).read(&mut counter);
        if self.shared.stopping.load(Ordering::SeqCst) {
            if let Some(listener) = self.listener.take() {
                let _ = self.shared.epoll.delete(listener.as_raw_fd());
            }
            self.accept_paused_until = None;
        }
    }

    fn readable(&mut self, token: u64) {
        let conn = lock(&self.shared.slots).take(token);
        if let Some(conn) = conn {
            self.shared.dispatch(conn);
        }
    }
}

/// Errors that concern one aborted connection, not the listener.
fn is_transient(error: &io::Error) -> bool {
    matches!(
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

/// Parked connections by slot; a token is the slot index plus a generation, so a stale event
/// for a reused slot is recognised and ignored.
#[derive(Default)]
struct Slots {
    entries: Vec<Slot>,
    free: Vec<usize>,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    parked: Option<(Conn, Instant)>,
}

impl Slots {
    fn insert(&mut self, conn: Conn, deadline: Instant) -> u64 {
        let index = self.free.pop().unwrap_or_else(|| {
            self.entries.push(Slot::default());
            self.entries.len() - 1
        });
        let slot = &mut self.entries[index];
        slot.generation = slot.generation.wrapping_add(1);
        slot.parked = Some((conn, deadline));
        (u64::from(slot.generation) << 32) | (index as u64 + FIRST_SLOT)
    }

    fn take(&mut self, token: u64) -> Option<Conn> {
        let index = usize::try_from((token & 0xffff_ffff).checked_sub(FIRST_SLOT)?).ok()?;
        let slot = self.entries.get_mut(index)?;
        if u64::from(slot.generation) != token >> 32 {
            return None;
        }
        let (conn, _) = slot.parked.take()?;
        self.free.push(index);
        Some(conn)
    }

    /// Closes connections idle (or silent) past their deadline.
    fn close_expired(&mut self, now: Instant) {
        for (index, slot) in self.entries.iter_mut().enumerate() {
            if slot
                .parked
                .as_ref()
                .is_some_and(|(_, deadline)| *deadline <= now)
            {
                slot.parked = None;
                self.free.push(index);
            }
        }
    }

    /// Closes the idle connection closest to its deadline; false if there is none.
    fn close_oldest(&mut self) -> bool {
        let oldest = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| slot.parked.as_ref().map(|(_, d)| (*d, index)))
            .min();
        match oldest {
            Some((_, index)) => {
                self.entries[index].parked = None;
                self.free.push(index);
                true
            }
            None => false,
        }
    }
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (release builds
/// abort on panic, so this only matters in tests).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
