//! A worker: takes one ready connection at a time from the shared epoll (or the wake-up
//! queue), runs it as far as it goes without waiting, and parks it again or closes it; and the
//! socket as the connection state machine's [`Io`].

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
use super::{lock, Connection, Shared, LISTENER, WAKE};
use crate::conn::{Context, Io, Next, Wait};
use crate::date::DateCache;
use crate::handler::Handler;
use crate::stream::Waker;
use crate::sys::{self, WANT_HANGUP, WANT_READ, WANT_WRITE};

/// A worker's buffer for request bodies.
const SCRATCH_BYTES: usize = 256 * 1024;
/// A worker's buffer for small answers (a head and an inline body).
const OUT_BYTES: usize = 20 * 1024;

/// A worker's own reusable state.
pub(super) struct Worker {
    scratch: Vec<u8>,
    out: Vec<u8>,
    date: DateCache,
    spare: Option<Box<crate::conn::Reading>>,
}

impl<H: Handler> Shared<H> {
    pub(super) fn work(&self, index: usize) {
        let mut worker = Worker {
            scratch: vec![0; SCRATCH_BYTES],
            out: Vec::with_capacity(OUT_BYTES),
            date: DateCache::new(),
            spare: None,
        };
        // Requests were run since the handler was last told the worker is idle.
        let mut ran = false;
        loop {
            if ran && self.pool.may_stand_by() {
                ran = false;
                self.handler.idle();
            }
            self.pool.stand_by_if_spare();
            // After a run, first a look without waiting: only when nothing is ready is the
            // handler told, before the worker blocks.
            let waited = match self.epoll.wait_one(if ran { 0 } else { -1 }) {
                Ok(None) if ran => {
                    ran = false;
                    self.handler.idle();
                    continue;
                }
                waited => waited,
            };
            let token = match waited {
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
            ran = true;
        }
    }

    /// Runs a connection until it must wait, then parks it (or closes it).
    pub(super) fn drive(&self, token: u64, mut connection: Connection, worker: &mut Worker) {
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
