//! The I/O thread: one `poll(2)` over every process's pipes and terminals, forever.
//!
//! Each turn: under the lock, list what to wait for (the outputs of processes whose
//! subscribers all have room, the inputs with bytes waiting) and the earliest moment anyone
//! asked for; unlock and poll (holding clones of the files, so none closes under the poll);
//! lock again and read each ready output ([`READS_PER_TURN`] chunks at most, so one busy
//! process does not starve the others), write each ready input, then the housekeeping: ask for
//! the exits of processes whose outputs closed, tick the subscribers that asked, kill processes
//! whose deadline passed, and tell the end of every finished process and drop it.
//!
//! An output just emptied by a small read rests for [`REST`] before it is polled again, so a
//! fast writer's small writes travel as a few large events.
//!
//! A subscriber without room stops its process's output from being polled; its queue being
//! taken (or its client leaving) signals the eventfd, and the next turn polls the output again.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::table::{Key, Process, REAP_RETRY_MAX};
use super::{Abort, Exit, OutputKind, Shared, State, Wake, SHUTDOWN_GRACE};
use crate::log;
use crate::sys::poll::{poll_ready, Interest};
use crate::sys::process as sysproc;

/// Chunks read from one output per turn.
const READS_PER_TURN: usize = 16;
/// After a read that emptied an output and got less than a chunk, how long it is left alone: a
/// process writing a stream of small pieces (a program's 4 or 8 KiB `write`s, faster than one
/// event each can be sent) has them read together from its pipe a moment later, as a few large
/// events, instead of one event, one wake-up of a worker and one socket write per piece. What a
/// process prints after a pause is read at once; only output following a small read within
/// this time waits for it. A read of a whole chunk or more is not followed by a rest.
const REST: Duration = Duration::from_millis(1);
/// Output tells the port forwarder at most this often (`platform::forward::activity`).
const ACTIVITY_EVERY: Duration = Duration::from_millis(500);

enum Slot {
    Output(usize),
    Input,
}

/// A descriptor waited for this turn.
struct Watched {
    key: Key,
    slot: Slot,
    file: Arc<File>,
    interest: Interest,
}

pub(super) fn run(shared: &Shared) {
    let wake = Wake(Arc::clone(&shared.wake));
    let mut buf = Vec::with_capacity(super::CHUNK);
    let mut last_activity: Option<Instant> = None;
    loop {
        let (watched, next) = plan(&mut lock(shared), &wake);
        let timeout = next.map(|at| at.saturating_duration_since(Instant::now()));
        let polled = {
            let mut fds: Vec<(BorrowedFd<'_>, Interest)> = Vec::with_capacity(watched.len() + 1);
            fds.push((shared.wake.as_fd(), Interest::Read));
            fds.extend(watched.iter().map(|w| (w.file.as_fd(), w.interest)));
            poll_ready(&fds, timeout)
        };
        let ready = match polled {
            Ok(ready) => ready,
            Err(error) => {
                log::line(format_args!("process I/O: poll failed: {error}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if ready.first() == Some(&true) {
            let _ = shared.wake.drain();
        }
        let output = watched
            .iter()
            .zip(ready.iter().skip(1))
            .any(|(watch, ready)| *ready && matches!(watch.slot, Slot::Output(_)));
        if output && last_activity.is_none_or(|at| at.elapsed() >= ACTIVITY_EVERY) {
            last_activity = Some(Instant::now());
            crate::platform::forward::activity();
        }
        // The streams' connections are woken once this turn's reads are queued, each for one
        // batch of all it got (`http::stream::batched`), after the lock is let go.
        crate::http::stream::batched(|| {
            let mut state = lock(shared);
            let now = Instant::now();
            if state.upgrading {
                // The table is being handed over: what the poll found waits for the next image.
                return;
            }
            for (watch, _) in watched
                .iter()
                .zip(ready.iter().skip(1))
                .filter(|(_, ready)| **ready)
            {
                let Some(process) = state.table.processes.get_mut(&watch.key) else {
                    continue;
                };
                match watch.slot {
                    // Held since the poll began (an upgrade that failed meanwhile): its output
                    // waits for its subscribers to come back.
                    Slot::Output(_) if process.held(now) => {}
                    Slot::Output(index) => read_output(process, index, &mut buf, &wake),
                    Slot::Input => write_input(process),
                }
            }
            // Dropped under the lock: an input closed by a worker meanwhile really closes now.
            drop(watched);
            housekeeping(&mut state, Instant::now(), &wake, &mut buf);
        });
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What to wait for this turn, and until when at most.
fn plan(state: &mut State, wake: &Wake) -> (Vec<Watched>, Option<Instant>) {
    let mut watched = Vec::new();
    let mut next: Option<Instant> = None;
    if state.upgrading {
        // Only the eventfd, until the `execve` (or `resume`).
        return (watched, next);
    }
    let now = Instant::now();
    let mut earliest = |at: Option<Instant>| {
        if let Some(at) = at {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    };
    let mut anyone_listens = false;
    for (key, process) in &mut state.table.processes {
        if process.held(now) {
            earliest(process.hold_until);
        } else if all_ready(process, wake) {
            for (index, output) in process.outputs.iter().enumerate() {
                if let Some(at) = output.rest_until.filter(|at| *at > now) {
                    earliest(Some(at));
                    continue;
                }
                if let Some(file) = &output.file {
                    watched.push(Watched {
                        key: *key,
                        slot: Slot::Output(index),
                        file: Arc::clone(file),
                        interest: Interest::Read,
                    });
                }
            }
        }
        if let (false, Some(input)) = (process.pending_input.is_empty(), &process.input) {
            watched.push(Watched {
                key: *key,
                slot: Slot::Input,
                file: Arc::clone(input),
                interest: Interest::Write,
            });
        }
        if process.exit.is_none() {
            earliest(process.kill_at);
            earliest(process.reap_retry.map(|(at, _)| at));
        }
        for subscriber in &process.subscribers {
            earliest(subscriber.next_tick());
        }
        anyone_listens |= !process.subscribers.is_empty();
    }
    if anyone_listens {
        earliest(state.shutdown.map(|at| at + SHUTDOWN_GRACE));
    }
    (watched, next)
}

/// Whether every subscriber has room for a chunk, or a lone one that reads it itself for a
/// read (those without are asked to wake us).
fn all_ready(process: &mut Process, wake: &Wake) -> bool {
    if let [only] = process.subscribers.as_mut_slice() {
        if only.reads_output() {
            return only.ready_to_read(wake);
        }
    }
    let mut ready = true;
    for subscriber in &mut process.subscribers {
        ready &= subscriber.ready(wake);
    }
    ready
}

fn deliver(process: &mut Process, kind: OutputKind, bytes: &[u8]) {
    process.subscribers.retain_mut(|s| s.output(kind, bytes));
}

/// Reads what one output holds, while its subscribers have room: each chunk as full as the
/// descriptor allows now, so a fast writer's small writes travel as few large events. A lone
/// subscriber that can takes each chunk read straight into its queue
/// ([`Subscriber::output_read`]); otherwise it is read into `buf` and handed to each.
fn read_output(process: &mut Process, index: usize, buf: &mut Vec<u8>, wake: &Wake) {
    let mut read = 0;
    for _ in 0..READS_PER_TURN {
        if !all_ready(process, wake) {
            return;
        }
        let Some(output) = process.outputs.get(index) else {
            return;
        };
        let (kind, Some(file)) = (output.kind, output.file.clone()) else {
            return;
        };
        let pid = process.pid;
        let (mut filled, mut after) = (0, Filled::Full);
        let mut read_chunk = |out: &mut Vec<u8>, max: usize| {
            (filled, after) = fill(&file, out, max.min(super::CHUNK), kind, pid);
            filled
        };
        match process.subscribers.as_mut_slice() {
            [only] if only.reads_output() => {
                if !only.output_read(kind, &mut read_chunk) {
                    process.subscribers.clear();
                }
            }
            _ => {
                buf.clear();
                read_chunk(buf, super::CHUNK);
                if filled > 0 {
                    deliver(process, kind, buf);
                }
            }
        }
        read += filled;
        match after {
            Filled::Full => {}
            Filled::Drained => {
                // Only after a small read: a writer that filled a chunk before the pipe emptied
                // is read as fast as it writes (a rest would cap it at a pipe per rest).
                if read > 0 && read < super::CHUNK {
                    if let Some(output) = process.outputs.get_mut(index) {
                        output.rest_until = Some(Instant::now() + REST);
                    }
                }
                return;
            }
            Filled::End => return close_output(process, index),
        }
    }
}

/// Why [`fill`] stopped.
enum Filled {
    /// The buffer is full; there may be more.
    Full,
    /// Nothing more for now.
    Drained,
    /// End of file (or an error, which ends the output too).
    End,
}

/// Appends to `buf` what `file` holds, until `max` bytes were read, the descriptor has nothing
/// more now, or it ends: how many, and why it stopped.
fn fill(file: &File, buf: &mut Vec<u8>, max: usize, kind: OutputKind, pid: u32) -> (usize, Filled) {
    let mut filled = 0;
    while filled < max {
        match crate::sys::pread::append(file, buf, max - filled) {
            Ok(0) => return (filled, Filled::End),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (filled, Filled::Drained),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // A terminal's master reads EIO once no slave is open: its end of file.
                if !(kind == OutputKind::Pty && e.raw_os_error() == Some(libc::EIO)) {
                    log::line(format_args!("process {pid}: reading its output: {e}"));
                }
                return (filled, Filled::End);
            }
        }
    }
    (filled, Filled::Full)
}

fn close_output(process: &mut Process, index: usize) {
    if let Some(output) = process.outputs.get_mut(index) {
        output.file = None;
    }
    if !process.outputs_open() {
        process.expect_exit(Instant::now());
    }
}

/// Writes the input waiting for a process, as far as its pipe takes it.
fn write_input(process: &mut Process) {
    let Some(input) = process.input.clone() else {
        process.pending_input.clear();
        return;
    };
    while !process.pending_input.is_empty() {
        let (front, _) = process.pending_input.as_slices();
        match (&*input).write(front) {
            Ok(n) => {
                process.pending_input.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // The process closed its end (EPIPE): nobody will read what waits.
                process.pending_input.clear();
                if process.terminal.is_none() {
                    process.input = None;
                }
            }
        }
    }
    if process.close_input {
        process.input = None;
        process.close_input = false;
    }
}

/// Everything that is not reading or writing: exits, ticks, kills, ends, the shutdown.
fn housekeeping(state: &mut State, now: Instant, wake: &Wake, buf: &mut Vec<u8>) {
    let mut finished = Vec::new();
    for (key, process) in &mut state.table.processes {
        if let (None, Some((at, interval))) = (process.exit, process.reap_retry) {
            if at <= now {
                reap(process, now, interval);
            }
        }
        process
            .subscribers
            .retain_mut(|s| s.next_tick().is_none_or(|at| at > now) || s.tick(now));
        // After the ticks: a `Start` stream whose deadline is this one ends with
        // `deadline_exceeded` before its process's end could be told.
        if process.kill_at.is_some_and(|at| at <= now) {
            process.kill_at = None;
            if process.exit.is_none() {
                let _ = sysproc::kill_group(process.pid, libc::SIGKILL);
                process.cut = true;
                process.expect_exit(now);
            }
        }
        if process.finished() && !process.held(now) {
            finished.push(*key);
        }
    }
    for key in finished {
        if let Some(process) = state.table.processes.get_mut(&key) {
            // Signalled: what its outputs hold now is still told.
            for index in 0..process.outputs.len() {
                read_output(process, index, buf, wake);
            }
        }
        if let Some(process) = state.table.remove(key, now) {
            let Some(exit) = process.exit else { continue };
            for subscriber in process.subscribers {
                subscriber.end(exit);
            }
        }
    }
    if state.shutdown.is_some_and(|at| at + SHUTDOWN_GRACE <= now) {
        for process in state.table.processes.values_mut() {
            for subscriber in process.subscribers.drain(..) {
                subscriber.abort(Abort::Shutdown);
            }
        }
    }
}

/// Asks whether a process whose outputs closed has exited; if not, asks again later.
fn reap(process: &mut Process, now: Instant, interval: Duration) {
    match sysproc::wait_pid(process.pid) {
        Ok(Some(status)) => {
            process.exit = Some(Exit(status));
            process.reap_retry = None;
        }
        // Still running (it closed its outputs), or just reaped by the reaper, whose hand-over
        // is on its way.
        Ok(None) | Err(_) => {
            process.reap_retry = Some((now + interval, (interval * 2).min(REAP_RETRY_MAX)));
        }
    }
}
