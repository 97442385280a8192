//! Request lines held per thread and written in batches: one `write(2)` for many lines instead
//! of one per request (a keep-alive `/health` made five system calls, one of them this write).
//!
//! Each thread that logs a request appends its line to a buffer of its own, registered here. A
//! buffer is written out when the next line would not fit ([`FLUSH_AT`]), when its worker is
//! about to wait for events with none ready ([`flush_mine`], through the HTTP layer's
//! `Handler::idle`), by the timekeeper on each of its rounds, at most a second apart
//! ([`flush_all`], through `Handler::tick`), and before any other line, at exit and before a
//! live upgrade's `execve` (also [`flush_all`]). So a line is at most a second late, lines of
//! one thread keep their order, and a worker stuck in a long call (a slow disk) holds nobody's
//! lines: its buffer's lock is held only while appending or writing, so the timekeeper takes
//! it and writes what it holds. Lines of different threads may leave in a different order than
//! their timestamps, within that second, as nginx's buffered access log does.

use std::sync::{Arc, Mutex, MutexGuard};

/// A buffer is written once it holds this much (a `/health` line is about 70 bytes).
pub(super) const FLUSH_AT: usize = 16 * 1024;

type Shared = Arc<Mutex<Vec<u8>>>;

/// Every thread's buffer.
static BUFFERS: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

/// The calling thread's buffer, registered on its first line; written out when the thread ends.
struct Mine(Shared);

impl Drop for Mine {
    fn drop(&mut self) {
        flush(&self.0);
        lock(&BUFFERS).retain(|other| !Arc::ptr_eq(other, &self.0));
    }
}

thread_local! {
    static MINE: Mine = {
        let buffer = Arc::new(Mutex::new(Vec::with_capacity(FLUSH_AT)));
        lock(&BUFFERS).push(Arc::clone(&buffer));
        Mine(buffer)
    };
}

/// Appends `line` (whole lines, newline included) to the thread's buffer, writing the buffer
/// first if the line would not fit. Written at once when the thread's buffer is gone (the
/// thread is ending).
pub(super) fn append(line: &[u8], write: fn(&[u8])) {
    if MINE.try_with(|mine| push(&mine.0, line, write)).is_err() {
        write(line);
    }
}

fn push(buffer: &Mutex<Vec<u8>>, line: &[u8], write: fn(&[u8])) {
    let mut buffer = lock(buffer);
    if buffer.len() + line.len() > FLUSH_AT && !buffer.is_empty() {
        write(&buffer);
        buffer.clear();
    }
    if line.len() >= FLUSH_AT {
        write(line);
    } else {
        buffer.extend_from_slice(line);
    }
}

/// Writes the calling thread's buffered lines.
pub(super) fn flush_mine(write: fn(&[u8])) {
    let _ = MINE.try_with(|mine| flush_with(&mine.0, write));
}

/// Writes every thread's buffered lines, each buffer under its lock (so in order with what its
/// thread appends next).
pub(super) fn flush_all(write: fn(&[u8])) {
    let buffers: Vec<Shared> = lock(&BUFFERS).clone();
    for buffer in &buffers {
        flush_with(buffer, write);
    }
}

fn flush(buffer: &Mutex<Vec<u8>>) {
    flush_with(buffer, super::write_stderr);
}

fn flush_with(buffer: &Mutex<Vec<u8>>, write: fn(&[u8])) {
    let mut buffer = lock(buffer);
    if !buffer.is_empty() {
        write(&buffer);
        buffer.clear();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;

    /// What each test's writer wrote, by test: the writers are plain functions.
    static FULL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    static STUCK: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

    fn lines(writes: &Mutex<Vec<Vec<u8>>>) -> Vec<String> {
        let writes = lock(writes);
        let text: Vec<u8> = writes.concat();
        String::from_utf8_lossy(&text)
            .lines()
            .map(String::from)
            .collect()
    }

    #[test]
    fn lines_wait_for_a_full_buffer_or_a_flush_and_keep_their_order() {
        fn write(bytes: &[u8]) {
            lock(&FULL).push(bytes.to_vec());
        }
        let buffer = Mutex::new(Vec::new());
        let line = |n: usize| format!("{n:05} {}\n", "x".repeat(100));
        let per_buffer = FLUSH_AT / line(0).len();
        for n in 0..per_buffer {
            push(&buffer, line(n).as_bytes(), write);
        }
        assert_eq!(
            lock(&FULL).len(),
            0,
            "nothing written before the buffer is full"
        );
        push(&buffer, line(per_buffer).as_bytes(), write);
        assert_eq!(lock(&FULL).len(), 1, "one write for a full buffer");
        flush_with(&buffer, write);
        flush_with(&buffer, write);
        assert_eq!(lock(&FULL).len(), 2, "an empty buffer is not written");
        let expected: Vec<String> = (0..=per_buffer)
            .map(|n| line(n).trim_end().to_string())
            .collect();
        assert_eq!(lines(&FULL), expected);
        // A line longer than a buffer goes out at once, after what was buffered.
        push(&buffer, b"short\n", write);
        let long = format!("{}\n", "y".repeat(FLUSH_AT));
        push(&buffer, long.as_bytes(), write);
        assert_eq!(lock(&FULL).len(), 4);
        assert_eq!(lines(&FULL)[per_buffer + 1..], ["short", long.trim_end()]);
    }

    #[test]
    fn a_thread_stuck_in_a_long_call_holds_no_line_back() {
        fn write(bytes: &[u8]) {
            lock(&STUCK).push(bytes.to_vec());
        }
        let (appended, stuck) = mpsc::channel();
        let (release, wait) = mpsc::channel::<()>();
        let worker = thread::spawn(move || {
            append(b"", write);
            let mine = MINE.with(|mine| Arc::clone(&mine.0));
            push(&mine, b"stuck-1\nstuck-2\n", write);
            appended.send(Arc::clone(&mine)).unwrap();
            // A slow disk call: the thread neither flushes nor goes idle.
            wait.recv().unwrap();
            push(&mine, b"stuck-3\n", write);
            flush_with(&mine, write);
        });
        let mine = stuck.recv().unwrap();
        assert!(
            lock(&BUFFERS).iter().any(|b| Arc::ptr_eq(b, &mine)),
            "the thread's buffer is registered for the timekeeper's rounds"
        );
        flush_with(&mine, write);
        assert_eq!(lines(&STUCK), ["stuck-1", "stuck-2"]);
        release.send(()).unwrap();
        worker.join().unwrap();
        assert_eq!(lines(&STUCK), ["stuck-1", "stuck-2", "stuck-3"]);
        assert!(
            !lock(&BUFFERS).iter().any(|b| Arc::ptr_eq(b, &mine)),
            "an ended thread's buffer is unregistered"
        );
    }
}
