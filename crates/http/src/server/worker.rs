//! A worker: takes one ready connection at a time from the shared epoll (or the wake-up
//! queue), runs it as far as it goes without waiting, and parks it again or closes it; and the
//! socket as the connection state machine's [`Io`].

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::accept::ACCEPT_BACKOFF;
use super::wakeups::Dispatch;
use super::{lock, Connection, Shared, BATCH, LISTENER, WAKE, WANT_IN};
use crate::clock::Wall;
use crate::conn::{Context, Io, Next, Wait};
use crate::date::DateCache;
use crate::handler::Handler;
use crate::stream::Waker;
use crate::sys::{self, EDGE, WANT_HANGUP, WANT_READ, WANT_WRITE};

/// A worker's buffer for request bodies.
const SCRATCH_BYTES: usize = 256 * 1024;
/// A worker's buffer for small answers (a head and an inline body).
const OUT_BYTES: usize = 20 * 1024;

/// A worker's own reusable state.
pub(super) struct Worker {
    scratch: Vec<u8>,
    out: Vec<u8>,
    date: DateCache,
    wall: Wall,
    spare: Option<Box<crate::conn::Reading>>,
    /// Connections this worker parked still ready (a turn's end), run again after its next
    /// look at the epoll: no other thread is woken for them.
    again: Vec<u64>,
    /// A request was logged since the handler was last told the worker is idle.
    logged: Cell<bool>,
}

impl<H: Handler> Shared<H> {
    pub(super) fn work(&self, index: usize) {
        let mut worker = Worker {
            scratch: vec![0; SCRATCH_BYTES],
            out: Vec::with_capacity(OUT_BYTES),
            date: DateCache::new(&self.config.server_header),
            wall: Wall::new(),
            spare: None,
            again: Vec::with_capacity(BATCH),
            logged: Cell::new(false),
        };
        let mut waited = Vec::with_capacity(BATCH);
        loop {
            // A worker holding connections to run again never stands by.
            let holding = !worker.again.is_empty();
            let logged = worker.logged.get();
            if logged && !holding && self.pool.may_stand_by() {
                worker.logged.set(false);
                self.handler.idle();
            }
            if !holding {
                self.pool.stand_by_if_spare();
            }
            // After a batch that logged requests, first a look without waiting: only when
            // nothing is ready is the handler told, before the worker blocks. After one that
            // logged none (a download's sends) the handler has nothing to do: the worker
            // blocks at once.
            waited.clear();
            match self
                .epoll
                .wait(&mut waited, if logged || holding { 0 } else { -1 })
            {
                Ok(0) if holding => {}
                Ok(0) if logged => {
                    worker.logged.set(false);
                    self.handler.idle();
                    continue;
                }
                Ok(0) => continue,
                Ok(_) => {}
                Err(e) => {
                    self.handler
                        .notice(format_args!("epoll_wait failed: {e}; retrying"));
                    thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            }
            // Taken one at a time from the worker's batch, in the order they came, the ones to
            // run again last; while it is stuck in one, the timekeeper hands the rest to others
            // (`hand_over_batch`). The batch is kept in reverse order.
            {
                // A connection to run again that the epoll reported too is run once, in the
                // epoll's order.
                worker.again.retain(|token| !waited.contains(token));
                let mut batch = lock(&self.batches[index]);
                batch.extend(worker.again.drain(..).rev());
                batch.extend(waited.drain(..).rev());
            }
            loop {
                let (next, left) = {
                    let mut batch = lock(&self.batches[index]);
                    (batch.pop(), !batch.is_empty())
                };
                let Some(token) = next else {
                    break;
                };
                let holding = left || !worker.again.is_empty();
                self.run_one(index, token, holding, &mut worker);
            }
        }
    }

    /// Runs one event, `holding` others (taken, not yet run).
    fn run_one(&self, index: usize, token: u64, holding: bool, worker: &mut Worker) {
        // A connection is taken from its slot before the run counts as under way: an event
        // for one that another worker is running only marks its slot, and is no run (counted,
        // it made a lone download's run look like one of two under way, and watched).
        let connection = match token {
            LISTENER => None,
            WAKE => match self.wakeups.pop(&self.epoll) {
                Some(Dispatch::Wake(token)) => match lock(&self.slots).take(token) {
                    Some(connection) => Some((token, connection)),
                    None => return,
                },
                Some(Dispatch::Run(token, connection)) => Some((token, *connection)),
                None => return,
            },
            token => match lock(&self.slots).take(token) {
                Some(connection) => Some((token, connection)),
                None => return,
            },
        };
        // The run's one reading of the clock, for the watch and for the connection's run.
        let now = Instant::now();
        if self.pool.run_started(index, holding, now) {
            let _guard = lock(&self.timekeeper_lock);
            self.timekeeper.notify_all();
        }
        match connection {
            Some((token, connection)) => self.drive(token, connection, worker, now),
            None => self.accept(worker, now),
        }
        self.pool.run_ended(index);
    }

    /// The events a stuck worker took but has not run, handed to the others: a connection's
    /// as a wake-up, the listener and the wake-up eventfd re-armed (their registration is
    /// one-shot, and the event was taken).
    pub(super) fn hand_over_batch(&self, index: usize) {
        let tokens: Vec<u64> = {
            let mut batch = lock(&self.batches[index]);
            if batch.is_empty() {
                return;
            }
            batch.drain(..).rev().collect()
        };
        for token in tokens {
            match token {
                LISTENER => self.rearm_listener(),
                WAKE => {
                    let _ = self
                        .epoll
                        .modify(self.wakeups.fd.as_raw_fd(), WAKE, WANT_IN);
                }
                token => self.wakeups.push(Dispatch::Wake(token)),
            }
        }
    }

    /// Runs a connection until it must wait, then parks it (or closes it). `now`: the clock
    /// read as the run started.
    pub(super) fn drive(
        &self,
        token: u64,
        mut connection: Connection,
        worker: &mut Worker,
        now: Instant,
    ) {
        let wakeups = &self.wakeups;
        let make_waker = || -> Waker {
            let wakeups = Arc::clone(wakeups);
            Box::new(move || wakeups.push(Dispatch::Wake(token)))
        };
        let mut now = Some(now);
        loop {
            let now = now.take().unwrap_or_else(Instant::now);
            let mut cx = Context {
                handler: &self.handler,
                limits: &self.limits,
                server_and_date: worker.date.at(worker.wall.at(now)),
                now,
                wall: &worker.wall,
                stopping: self.stopping.load(Ordering::Relaxed),
                scratch: &mut worker.scratch,
                out: &mut worker.out,
                waker: &make_waker,
                in_flight: &self.in_flight,
                spare: &mut worker.spare,
                logged: &worker.logged,
            };
            let mut io = SocketIo {
                socket: &connection.socket,
                drained: false,
                write_blocked: false,
                #[cfg(test)]
                refused: 0,
            };
            let next = connection.conn.run(&mut io, &mut cx);
            #[cfg(test)]
            self.wakeups
                .refused_sendfiles
                .fetch_add(io.refused, Ordering::SeqCst);
            let (wait, deadline) = match next {
                Next::Close => {
                    lock(&self.slots).release(token);
                    return;
                }
                Next::Park { wait, deadline } => (wait, deadline),
            };
            // The registration is edge-triggered: an edge comes only after the socket ran dry
            // (a read short of the buffer or refused, a write refused). A connection still
            // ready for what it waits for (a turn's end: see `TURN_BYTES`) goes to the back of
            // this worker's line instead, behind whatever its next look at the epoll finds.
            let (interest, ready) = match wait {
                Wait::Read => (WANT_READ, !io.drained),
                Wait::Write => (WANT_WRITE, !io.write_blocked),
                Wait::Producer => (WANT_HANGUP, false),
            };
            // Registered once, before it is first parked: an edge that comes before it is
            // parked finds the slot busy and marks it, and the connection is run again below.
            if !connection.registered {
                if self
                    .epoll
                    .add(connection.socket.as_raw_fd(), token, EDGE)
                    .is_err()
                {
                    lock(&self.slots).release(token);
                    return;
                }
                connection.registered = true;
            }
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
            if ready {
                worker.again.push(token);
                #[cfg(test)]
                self.wakeups.kept.fetch_add(1, Ordering::SeqCst);
            }
            // Closed outside the lock.
            drop(evicted);
            return;
        }
    }
}

/// The socket of a connection, non-blocking, and what one run learnt of its readiness.
struct SocketIo<'a> {
    socket: &'a TcpStream,
    /// The last read found no more bytes waiting (refused, or short of the buffer: all there
    /// was), so the next bytes bring an edge.
    drained: bool,
    /// A write was refused for want of room, so room brings an edge.
    write_blocked: bool,
    /// `sendfile` calls refused for want of room.
    #[cfg(test)]
    refused: u64,
}

impl Io for SocketIo<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = sys::recv_nonblocking(self.socket.as_raw_fd(), buf);
        self.drained = !matches!(read, Ok(n) if n == buf.len() && n > 0);
        read
    }

    fn send(&mut self, buf: &[u8], more: bool) -> io::Result<usize> {
        let sent = sys::send(self.socket.as_raw_fd(), buf, more);
        self.note_write(&sent);
        sent
    }

    fn send_vectored(&mut self, bufs: &[io::IoSlice<'_>], more: bool) -> io::Result<usize> {
        let sent = sys::send_vectored(self.socket.as_raw_fd(), bufs, more);
        self.note_write(&sent);
        sent
    }

    fn sendfile(&mut self, file: &File, offset: &mut u64, count: usize) -> io::Result<usize> {
        let sent = sys::sendfile(self.socket.as_raw_fd(), file.as_raw_fd(), offset, count);
        self.note_write(&sent);
        #[cfg(test)]
        {
            self.refused += u64::from(self.write_blocked);
        }
        sent
    }

    fn cork(&mut self, on: bool) -> io::Result<()> {
        sys::set_cork(self.socket.as_raw_fd(), on)
    }

    fn hung_up(&mut self) -> bool {
        sys::is_ready(self.socket.as_raw_fd(), WANT_HANGUP)
    }

    fn full(&mut self) -> bool {
        // A socket found not writable is marked to report room (`tcp_poll` sets `SOCK_NOSPACE`),
        // so the edge comes.
        let full = !sys::is_ready(self.socket.as_raw_fd(), WANT_WRITE);
        self.write_blocked |= full;
        full
    }

    fn shutdown_write(&mut self) {
        let _ = self.socket.shutdown(Shutdown::Write);
    }

    fn drained(&self) -> bool {
        self.drained
    }
}

impl SocketIo<'_> {
    fn note_write(&mut self, sent: &io::Result<usize>) {
        self.write_blocked = matches!(sent, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    }
}
