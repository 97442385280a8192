//! Starting the writeback of files an archive upload made, on a thread of its own: the
//! worker that unpacks hands each finished file over ([`hand_over`]) and goes on with the next
//! member, while this thread starts its pages towards the device (`sync_file_range`, which on
//! ext4 also allocates its blocks) and closes it. The commit's `syncfs` is what makes the tree
//! durable; by then most of it is written. A file the thread cannot take at once (its queue
//! full, or no thread) is started and closed by the worker itself, so nothing waits on it.
//!
//! The thread starts with the credentials of the thread that creates it, so it is started
//! ([`start`]) before a request switches to a user (`fs::as_user`); what it does (start I/O on
//! an open descriptor, close it) needs no permission either way.

use std::fs::File;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::OnceLock;

use crate::sys::file::start_writeback;

/// Files handed over and not yet taken: beyond this the worker does the work itself, so a
/// slow device holds at most this many descriptors.
const QUEUE: usize = 256;

static THREAD: OnceLock<Option<SyncSender<File>>> = OnceLock::new();

/// Starts the thread, if it has not started (once; a failure to start leaves the work to the
/// workers).
pub fn start() {
    THREAD.get_or_init(|| {
        let (queue, files) = mpsc::sync_channel::<File>(QUEUE);
        std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                for file in files {
                    start_writeback(&file);
                }
            })
            .ok()
            .map(|_| queue)
    });
}

/// Starts `file`'s writeback and closes it: on the thread when it can take it now, else here.
pub fn hand_over(file: File) {
    let file = match THREAD.get() {
        Some(Some(queue)) => match queue.try_send(file) {
            Ok(()) => return,
            Err(TrySendError::Full(file) | TrySendError::Disconnected(file)) => file,
        },
        _ => file,
    };
    start_writeback(&file);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn files_handed_over_keep_their_bytes_and_are_closed() {
        start();
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(QUEUE * 2) {
            let mut file = File::create(dir.path().join(format!("f{i}"))).unwrap();
            file.write_all(format!("file {i}").as_bytes()).unwrap();
            hand_over(file);
        }
        for i in 0..(QUEUE * 2) {
            let got = std::fs::read_to_string(dir.path().join(format!("f{i}"))).unwrap();
            assert_eq!(got, format!("file {i}"));
        }
    }
}
