//! The processes the daemon starts for its clients (SPEC §9b's `process.Process`): one table
//! and one I/O thread for all of them, however many there are.
//!
//! A process is started from a [`Spec`] (`spawn`: environment, user, pipes or a terminal) and
//! kept in the table (`table`) until its end has been told. Who hears of it is a
//! [`Subscriber`]: the `Start` stream that made it and any `Connect` streams attached later,
//! each told its output in order and then its end. Connect, JSON and keep-alives are the
//! subscribers' business (`api::process`); this module knows processes.
//!
//! **The I/O thread** (`io`) waits in `poll(2)` on every output pipe and terminal master that
//! has room to go somewhere, on the input pipes that have bytes waiting for them, and on an
//! eventfd workers signal; with a timeout for the earliest moment anyone asked for (a
//! keep-alive, a deadline, a kill). It reads output in chunks of up to [`CHUNK`] bytes and hands
//! each to every subscriber. A subscriber that has no room for a chunk holds its process's
//! output back: the thread stops reading that process (whose writes then wait, as with any slow
//! reader of a pipe) until the subscriber's queue is taken, and the subscriber itself decides
//! when waiting has lasted too long. A process with no subscriber at all has its output read
//! and dropped, so it never blocks. Memory per subscriber is its queue; per process, at most
//! [`table::INPUT_MAX`] of input waiting for its pipe.
//!
//! **Reaping** is `reaper`'s: the daemon's main thread reaps every child (ours and, as PID 1,
//! the orphans the sandbox leaves) on `SIGCHLD` and hands our exits to the table; starts hold
//! off the reaper until the new process is in the table, so no exit is missed. The I/O thread
//! also asks for the exit of a process whose outputs have all closed (without `SIGCHLD`
//! handling, as in unit tests, that is what reaps).
//!
//! Workers never wait for the thread: they change the table under its lock (add a process or a
//! subscriber, queue input, signal) and signal the eventfd. The thread never waits for a
//! client: subscribers must return at once.

pub mod claimed;
mod error;
pub mod exit;
pub mod handover;
mod io;
pub mod reaper;
pub mod spawn;
mod table;

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use error::ProcError;
pub use exit::Exit;
pub use spawn::{Config, OutputKind, Spec};
pub use table::Selector;

use crate::sys::poll::EventFd;
use crate::sys::process as sysproc;
use crate::sys::pty::{self, WindowSize};
use table::{Output, Process, Table, INPUT_MAX};

/// The most output bytes read, and handed to subscribers, at once.
pub const CHUNK: usize = 64 << 10;
/// After SIGTERM to the daemon: how long streams may wait for their processes' ends before
/// they are ended (`unavailable`), so the drain is not held by a process that ignores SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Someone told of a process's output and end: a `Start` or `Connect` stream. Called on the
/// I/O thread under the hub's lock (or by a worker under it when attached): every method must
/// return without waiting for anyone.
pub trait Subscriber: Send {
    /// Whether a chunk of up to [`CHUNK`] bytes can be taken now. If not, the subscriber calls
    /// `wake` once it may have room (or is gone); until then its process's output waits.
    fn ready(&mut self, wake: &Wake) -> bool;
    /// Output, in order; false when the subscriber is done (it has ended its side itself).
    fn output(&mut self, kind: OutputKind, bytes: &[u8]) -> bool;
    /// Whether it takes output through [`Subscriber::output_read`] when it is alone.
    fn reads_output(&self) -> bool {
        false
    }
    /// As [`Subscriber::ready`], for a read by [`Subscriber::output_read`] (which may ask for
    /// less than a chunk, as much as it has room for).
    fn ready_to_read(&mut self, wake: &Wake) -> bool {
        self.ready(wake)
    }
    /// Output read straight into the subscriber's own buffer: `read` appends at most as many
    /// bytes as it is asked for (and at most [`CHUNK`]) to the buffer it is given and answers
    /// how many (0: none, and nothing is to be sent). Called at most once per chunk, as
    /// [`Subscriber::output`] otherwise.
    fn output_read(
        &mut self,
        kind: OutputKind,
        read: &mut dyn FnMut(&mut Vec<u8>, usize) -> usize,
    ) -> bool {
        let mut bytes = Vec::new();
        let n = read(&mut bytes, CHUNK);
        n == 0 || self.output(kind, &bytes)
    }
    /// When it next wants [`Subscriber::tick`]; `None`: never.
    fn next_tick(&self) -> Option<Instant>;
    /// The moment asked for (or a later one) has come; false when done.
    fn tick(&mut self, now: Instant) -> bool;
    /// The process ended: its last word.
    fn end(self: Box<Self>, exit: Exit);
    /// The hub ends the subscription before the process ended.
    fn abort(self: Box<Self>, why: Abort);
}

/// Why the hub ends a subscription before its process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// The daemon shuts down.
    Shutdown,
    /// The daemon is being upgraded (`handover`): the process lives on, and the next image
    /// takes its subscribers back through `Connect`.
    Upgrade,
}

/// Wakes the I/O thread (a subscriber's queue was taken, a client left).
#[derive(Clone)]
pub struct Wake(Arc<EventFd>);

impl Wake {
    pub fn wake(&self) {
        // A full counter is readable anyway; any other failure leaves the thread to its
        // next timeout.
        let _ = self.0.signal();
    }
}

/// What a `Connect` found.
pub enum Attached<S> {
    /// A live process, now with the new subscriber.
    Live,
    /// A process that ended lately: its pid, its end, and the subscriber given back.
    Ended(u32, Exit, S),
}

/// A live process, as `List` shows it.
pub struct Listed {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: Config,
}

/// The process table, its I/O thread and its eventfd. Clones share them.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

struct Shared {
    wake: Arc<EventFd>,
    state: Mutex<State>,
}

struct State {
    table: Table,
    /// When the daemon began shutting down.
    shutdown: Option<Instant>,
    /// The table is being handed over (`handover`): nothing reads, writes, reaps or changes it.
    upgrading: bool,
}

impl State {
    /// Why the table may not be changed now.
    fn refusal(&self) -> Option<ProcError> {
        if self.shutdown.is_some() {
            Some(ProcError::ShuttingDown)
        } else if self.upgrading {
            Some(ProcError::Upgrading)
        } else {
            None
        }
    }
}

/// The daemon's hub, started by the first process.
static GLOBAL: Mutex<Option<Hub>> = Mutex::new(None);

impl Hub {
    /// The daemon's hub, started on first use; a failure to start is not kept.
    pub fn global() -> std::io::Result<Hub> {
        let mut global = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hub) = global.as_ref() {
            return Ok(hub.clone());
        }
        let hub = Hub::start_thread()?;
        *global = Some(hub.clone());
        Ok(hub)
    }

    /// The daemon's hub if it was started.
    pub fn running() -> Option<Hub> {
        GLOBAL.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A hub of its own, with its own thread (which lives as long as the process).
    fn start_thread() -> std::io::Result<Hub> {
        Hub::start_with(Table::default())
    }

    /// A hub of its own with `table`, and its thread.
    fn start_with(table: Table) -> std::io::Result<Hub> {
        let shared = Arc::new(Shared {
            wake: Arc::new(EventFd::new()?),
            state: Mutex::new(State {
                table,
                shutdown: None,
                upgrading: false,
            }),
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("sandboxd-proc".into())
            .spawn(move || io::run(&thread_shared))?;
        Ok(Hub { shared })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        Wake(Arc::clone(&self.shared.wake)).wake();
    }

    /// Starts a process. `subscribe` makes its first subscriber from its pid, before any of its
    /// output is read (the `Start` stream queues its start event there). With `kill_after`, the
    /// process group is killed (`SIGKILL`) when that time has passed, as envd kills a process
    /// when its `Start` call's deadline passes.
    pub fn start(
        &self,
        spec: &Spec,
        kill_after: Option<Duration>,
        subscribe: impl FnOnce(u32) -> Box<dyn Subscriber>,
    ) -> Result<u32, ProcError> {
        if let Some(refused) = self.lock().refusal() {
            return Err(refused);
        }
        // Held until the process is in the table: its exit cannot be reaped before.
        let spawning = reaper::spawning();
        let spawned = spawn::spawn(spec).map_err(ProcError::Spawn)?;
        let pid = spawned.pid;
        let now = Instant::now();
        let process = Process {
            pid,
            tag: spec.tag.clone(),
            config: spec.config.clone(),
            outputs: spawned
                .outputs
                .into_iter()
                .map(|(kind, file)| Output {
                    kind,
                    file: Some(file),
                    rest_until: None,
                })
                .collect(),
            input: spawned.input,
            pending_input: Default::default(),
            close_input: false,
            terminal: spawned.terminal,
            subscribers: vec![subscribe(pid)],
            exit: None,
            cut: false,
            kill_at: kill_after.and_then(|after| now.checked_add(after)),
            reap_retry: None,
            hold_until: None,
        };
        let mut state = self.lock();
        let key = state.table.insert(process);
        if state.upgrading {
            // An upgrade began meanwhile: it carries this process too, and its stream is
            // ended as the others were (`handover::prepare`).
            if let Some(process) = state.table.processes.get_mut(&key) {
                for subscriber in process.subscribers.drain(..) {
                    subscriber.abort(Abort::Upgrade);
                }
                process.hold_until = Some(now + handover::HOLD);
            }
        }
        drop(state);
        drop(spawning);
        self.wake();
        Ok(pid)
    }

    /// Attaches `subscriber` to a live process (`started` is called with its pid first, before
    /// any more of its output is read), or finds the end of one that ended lately.
    pub fn attach<S: Subscriber + 'static>(
        &self,
        selector: &Selector,
        mut subscriber: S,
        started: impl FnOnce(&mut S, u32),
    ) -> Result<Attached<S>, ProcError> {
        let mut state = self.lock();
        if let Some(refused) = state.refusal() {
            return Err(refused);
        }
        if let Some(process) = state.table.find(selector) {
            started(&mut subscriber, process.pid);
            process.subscribers.push(Box::new(subscriber));
            process.hold_until = None;
            drop(state);
            self.wake();
            return Ok(Attached::Live);
        }
        match state.table.retained(selector, Instant::now()) {
            Some(ended) => Ok(Attached::Ended(ended.pid, ended.exit, subscriber)),
            None => Err(ProcError::NotFound(selector.clone())),
        }
    }

    /// The live processes, by pid.
    pub fn list(&self) -> Vec<Listed> {
        self.lock()
            .table
            .processes
            .values()
            .map(|p| Listed {
                pid: p.pid,
                tag: p.tag.clone(),
                config: p.config.clone(),
            })
            .collect()
    }

    /// Sends `signal` to the process's group: everything it started that stayed in it. After
    /// `SIGKILL` or `SIGTERM` its end is told at its exit, without waiting for descendants in
    /// other groups that keep its outputs open (envd stops waiting for output too).
    ///
    /// A process whose exit was reaped (listed because a descendant holds its outputs) is
    /// never signalled: its pid, and so the id of its group once the group's last member
    /// leaves, may already be another process's, and that cannot be ruled out atomically. The
    /// call then succeeds without signalling anything; after `SIGKILL` or `SIGTERM` its end
    /// (the exit it had) is told at once. Under the lock, an entry without an exit is not
    /// reaped (the reaper hands exits over under it, `reaper`), so its pid is still its own.
    pub fn signal(&self, selector: &Selector, signal: libc::c_int) -> Result<(), ProcError> {
        let mut state = self.lock();
        if state.upgrading {
            return Err(ProcError::Upgrading);
        }
        let process = state
            .table
            .find(selector)
            .ok_or_else(|| ProcError::NotFound(selector.clone()))?;
        if process.exit.is_none() {
            match sysproc::kill_group(process.pid, signal) {
                Ok(()) => {}
                // Every member has exited (the leader not yet reaped): nothing to signal.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(ProcError::Io(e)),
            }
        }
        if signal == libc::SIGKILL || signal == libc::SIGTERM {
            process.cut = true;
            process.expect_exit(Instant::now());
        }
        drop(state);
        self.wake();
        Ok(())
    }

    /// Queues input for a process's stdin (`to_terminal`: its terminal), writing at once what
    /// the pipe takes; the rest is written by the I/O thread as the process reads. In order,
    /// never blocking.
    pub fn write_input(
        &self,
        selector: &Selector,
        bytes: &[u8],
        to_terminal: bool,
    ) -> Result<(), ProcError> {
        let mut state = self.lock();
        if state.upgrading {
            return Err(ProcError::Upgrading);
        }
        let process = state
            .table
            .find(selector)
            .ok_or_else(|| ProcError::NotFound(selector.clone()))?;
        if to_terminal != process.terminal.is_some() {
            return Err(ProcError::WrongInput { to_terminal });
        }
        let input = match &process.input {
            Some(input) if !process.close_input => Arc::clone(input),
            _ => return Err(ProcError::NoStdin),
        };
        if process.pending_input.len().saturating_add(bytes.len()) > INPUT_MAX {
            return Err(ProcError::InputFull);
        }
        let mut rest = bytes;
        if process.pending_input.is_empty() {
            while !rest.is_empty() {
                match (&*input).write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(ProcError::Io(e)),
                }
            }
        }
        if !rest.is_empty() {
            process.pending_input.extend(rest);
            drop(state);
            self.wake();
        }
        Ok(())
    }

    /// Closes a process's stdin (after the input still waiting for it), so it reads end of
    /// file. Nothing when already closed or never opened; an error for a terminal.
    pub fn close_stdin(&self, selector: &Selector) -> Result<(), ProcError> {
        let mut state = self.lock();
        if state.upgrading {
            return Err(ProcError::Upgrading);
        }
        let process = state
            .table
            .find(selector)
            .ok_or_else(|| ProcError::NotFound(selector.clone()))?;
        if process.terminal.is_some() {
            return Err(ProcError::TerminalStdin);
        }
        if process.pending_input.is_empty() {
            process.input = None;
        } else {
            process.close_input = true;
        }
        Ok(())
    }

    /// Sets the window size of a process's terminal.
    pub fn resize(&self, selector: &Selector, size: WindowSize) -> Result<(), ProcError> {
        let mut state = self.lock();
        if state.upgrading {
            return Err(ProcError::Upgrading);
        }
        let process = state
            .table
            .find(selector)
            .ok_or_else(|| ProcError::NotFound(selector.clone()))?;
        let terminal = process.terminal.as_ref().ok_or(ProcError::NotATerminal)?;
        pty::set_window_size(terminal.as_fd(), size).map_err(ProcError::Io)
    }

    /// The daemon shuts down: `SIGTERM` to every process group, no new process or subscriber,
    /// and within [`SHUTDOWN_GRACE`] every subscriber still waiting is ended.
    pub fn shutdown(&self) {
        let mut state = self.lock();
        if state.shutdown.is_some() {
            return;
        }
        state.shutdown = Some(Instant::now());
        for process in state.table.processes.values_mut() {
            if process.exit.is_none() {
                let _ = sysproc::kill_group(process.pid, libc::SIGTERM);
                process.expect_exit(Instant::now());
            }
        }
        drop(state);
        self.wake();
    }

    /// Reaps every child that has exited (`reaper::reap_all`), handing each exit of ours to its
    /// entry under the same hold of the lock as the wait: whoever holds the lock never sees a
    /// reaped process without its exit, so never signals a pid that may be reused.
    fn reap_all(&self) {
        let mut state = self.lock();
        let mut ours = false;
        while let Some((pid, status)) = sysproc::wait_any() {
            if state.table.exited(pid, Exit(status)) {
                ours = true;
            } else {
                claimed::offer(pid, status);
            }
        }
        drop(state);
        if ours {
            self.wake();
        }
    }
}

#[cfg(test)]
mod tests;
