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

/// What the thread is given: a file, or a request to say when everything before it is done.
enum Item {
    File(File),
    Drained(SyncSender<()>),
}

static THREAD: OnceLock<Option<SyncSender<Item>>> = OnceLock::new();

/// Starts the thread, if it has not started (once; a failure to start leaves the work to the
/// workers).
pub fn start() {
    THREAD.get_or_init(|| {
        let (queue, files) = mpsc::sync_channel::<Item>(QUEUE);
        std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                for item in files {
                    match item {
                        Item::File(file) => start_writeback(&file),
                        Item::Drained(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .ok()
            .map(|_| queue)
    });
}

/// Starts `file`'s writeback and closes it: on the thread when it can take it now, else here.
pub fn hand_over(file: File) {
    let file = match THREAD.get() {
        Some(Some(queue)) => match queue.try_send(Item::File(file)) {
            Ok(()) => return,
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => match item {
                Item::File(file) => file,
                Item::Drained(_) => return,
            },
        },
        _ => file,
    };
    start_writeback(&file);
}

/// Waits until every file handed over so far is closed: an upload answers only then, so no
/// file it made is still open for writing (`execve` of it would fail with `ETXTBSY`).
pub fn drain() {
    let Some(Some(queue)) = THREAD.get() else {
        return;
    };
    let (done, wait) = mpsc::sync_channel(1);
    if queue.send(Item::Drained(done)).is_ok() {
        let _ = wait.recv();
    }
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
        drain();
        for i in 0..(QUEUE * 2) {
            let got = std::fs::read_to_string(dir.path().join(format!("f{i}"))).unwrap();
            assert_eq!(got, format!("file {i}"));
        }
    }
}
