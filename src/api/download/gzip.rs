//! The gzip form of a download: a file compressed piece by piece as the client takes it, on
//! threads of its own, into a streamed (chunked) answer.
//!
//! This module owns the compressing: its threads, the jobs they take turns on, the gzip
//! framing, and the bound on how many compressed downloads run at once. The same threads run
//! the other downloads produced piece by piece ([`Produce`]: a directory as tar, `super::tar`),
//! compressed or not. Whether a request gets
//! the gzip form is the handler's (`encoding`, `headers::compressible`).
//!
//! **Where it runs.** Compressing costs CPU (level 1: about 5 ms per MiB of text here), so it
//! never runs in the HTTP layer's workers: [`THREADS`] threads at nice [`NICE`], as the long
//! calls' (`api::long_calls`), so `/health` and every other route find a worker and preempt
//! them. A download is a *job*: a thread compresses one piece of [`PIECE`] bytes, queues its
//! output on the answer's stream, and goes on with that job while its queue has room for
//! another piece and no other job waits, else takes the next job. A job whose queue is full (a
//! slow or stalled client) is parked: it holds no thread, and the stream calls it back when
//! the connection takes the queue or the client leaves (`StreamSender::wait_for_room`).
//!
//! **Memory.** The compressor and its buffers belong to the thread, not to the download: each
//! piece is compressed by a compressor reset for it, ended by a sync flush (the last by the
//! final block), so a parked job holds only its open file, its CRC and its queue (at most
//! [`QUEUE`] bytes, plus the chunk the connection is writing). A piece starts with an empty
//! dictionary; with 128 KiB pieces that costs 0.4 % of output on text. At most
//! [`MAX_DOWNLOADS`] compressed downloads run at once; past that a request that accepts the
//! file as it is gets it so (zero-copy, no memory), and one that refuses it is 503.
//!
//! **What is sent.** Exactly the bytes the file had up to the size it had when opened, as for
//! the plain answer: bytes appended later are not sent, and a file that shrinks, or a read that
//! fails, cuts the answer (the stream is dropped unfinished, so the connection closes without
//! the chunked body's last chunk and the gzip trailer): a client never gets a valid-looking
//! gzip stream that is short. The gzip header carries no name and no time (so the same file
//! version gives the same bytes), `XFL` 4 (fastest) and `OS` 3 (Unix).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

use crate::http::stream::{self, SendError, StreamSender, StreamSource};

/// Threads compressing downloads: a bound on the CPU compression takes together. One thread
/// compresses text at about twice the speed of `gzip -1` (docs/performance.md), so one
/// download does not need more.
pub const THREADS: usize = 2;
/// The threads' nice value: below the HTTP workers, as the long calls'.
pub const NICE: i32 = 5;
/// Compressed downloads under way at once, past which a request gets the plain file.
pub const MAX_DOWNLOADS: usize = 32;
/// Files smaller than this are sent as they are: with the head, a smaller answer fits in one
/// TCP segment either way, so compressing saves no packet and no round trip.
pub const MIN_SIZE: u64 = 1024;
/// The level: 1, the fastest (docs/performance.md compares it with 6).
const LEVEL: u32 = 1;
/// Bytes of the file compressed in one turn.
pub(crate) const PIECE: usize = 128 << 10;
/// The most a piece's output can take: 9 bits a byte (the longest literal code of deflate's
/// fixed Huffman table, which a compressor that never falls back to stored blocks could use
/// for random data), the sync flush, and the gzip header and trailer.
pub(crate) const ROOM: usize = PIECE + PIECE / 8 + 64;
/// A compressed download's stream queue: room for one piece's output whatever it is, and some
/// of the next so the compressor can work while the connection writes.
pub(crate) const QUEUE: usize = ROOM + (64 << 10);

/// gzip's member header (RFC 1952): magic, deflate, no flags, no time, fastest, Unix.
pub(crate) const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 3];

/// Compressed answers held (a [`Slot`] each): from the request until the connection lets go of
/// the answer.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_DOWNLOADS`] places, given back when dropped.
pub struct Slot(());

impl Slot {
    /// A place for one more compressed download, if there is one (and a thread to compress).
    pub fn take() -> Option<Slot> {
        executor()?;
        ACTIVE
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| {
                (active < MAX_DOWNLOADS).then_some(active + 1)
            })
            .ok()
            .map(|_| Slot(()))
    }

    /// Whether [`Slot::take`] would succeed now (HEAD, which tells what a GET would get).
    pub fn available() -> bool {
        executor().is_some() && ACTIVE.load(Ordering::Acquire) < MAX_DOWNLOADS
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts compressing the first `size` bytes of `file` (`path` names it in the log) and
/// returns the answer's body.
pub fn start(file: File, size: u64, path: PathBuf, slot: Slot) -> StreamSource {
    let (sender, source) = stream::channel(QUEUE);
    // The place is held until the connection lets go of the answer, not only while the job
    // runs: a finished job's last output may still wait in the queue for a stalled client.
    sender.on_release(move || drop(slot));
    submit(Box::new(FileJob {
        file,
        size,
        offset: 0,
        crc: Crc::new(),
        sender: Some(sender),
        pending: Vec::new(),
        path,
    }));
    source
}

/// A download made piece by piece on these threads: the gzip form of a file, a directory as
/// tar. It holds its stream's sender; dropping it unfinished cuts the answer.
pub(crate) trait Produce: Send {
    /// Makes and queues the next piece if its queue has room, using the thread's buffers.
    fn step(&mut self, work: &mut Work) -> Next;
    /// The stream it feeds, `None` once finished or cut.
    fn sender(&self) -> Option<&StreamSender>;
}

/// Hands `producer` to the threads. A producer is only made with a [`Slot`], so the executor
/// runs; were it not running, the producer would be dropped here and its answer cut.
pub(crate) fn submit(producer: Box<dyn Produce>) {
    let Some(executor) = executor() else {
        return;
    };
    let mut jobs = lock(&executor.jobs);
    let id = jobs.next_id;
    jobs.next_id += 1;
    jobs.runnable.push_back(Job { id, producer });
    drop(jobs);
    executor.ready.notify_one();
}

/// A producer and its number among the jobs.
struct Job {
    id: u64,
    producer: Box<dyn Produce>,
}

struct Executor {
    jobs: Mutex<Jobs>,
    ready: Condvar,
}

#[derive(Default)]
struct Jobs {
    /// Jobs with work to do, in turn.
    runnable: VecDeque<Job>,
    /// Jobs waiting for room in their queue, by id, until their stream calls them back.
    parked: HashMap<u64, Job>,
    next_id: u64,
}

static EXECUTOR: OnceLock<Option<Executor>> = OnceLock::new();

/// The executor, its threads started on first use (by a worker that acts as the daemon: the
/// handler starts a job after its `--fs-as-user` switch is undone, and a job only reads the
/// descriptor it was given). `None` if not one thread could be started.
fn executor() -> Option<&'static Executor> {
    EXECUTOR
        .get_or_init(|| {
            let mut started = 0;
            for index in 0..THREADS {
                let spawned = std::thread::Builder::new()
                    .name(format!("sandboxd-gzip-{index}"))
                    .spawn(serve);
                match spawned {
                    Ok(_) => started += 1,
                    Err(e) => crate::log::line(format_args!("cannot start a gzip thread: {e}")),
                }
            }
            (started > 0).then(|| Executor {
                jobs: Mutex::new(Jobs::default()),
                ready: Condvar::new(),
            })
        })
        .as_ref()
}

/// A thread's compressor and buffers, kept from one piece (and one job) to the next.
pub(crate) struct Work {
    pub compressor: Compress,
    /// [`PIECE`] bytes.
    pub input: Vec<u8>,
    pub output: Vec<u8>,
    /// A piece of an archive as it is made (the tar form), before it is compressed.
    pub piece: Vec<u8>,
}

impl Work {
    pub(crate) fn new() -> Work {
        Work {
            compressor: Compress::new(Compression::new(LEVEL), false),
            input: vec![0; PIECE],
            output: Vec::with_capacity(ROOM),
            piece: Vec::new(),
        }
    }
}

fn serve() {
    if let Err(e) = crate::sys::priority::set_thread_nice(NICE) {
        crate::log::line(format_args!(
            "gzip threads run at the workers' priority: {e}"
        ));
    }
    let Some(executor) = EXECUTOR.wait().as_ref() else {
        return;
    };
    let mut work = Work::new();
    loop {
        let mut job = {
            let jobs = lock(&executor.jobs);
            let mut jobs = executor
                .ready
                .wait_while(jobs, |jobs| jobs.runnable.is_empty())
                .unwrap_or_else(|e| e.into_inner());
            match jobs.runnable.pop_front() {
                Some(job) => job,
                None => continue,
            }
        };
        loop {
            match job.producer.step(&mut work) {
                Next::Done => break,
                Next::Wait(bytes) => {
                    park(executor, job, bytes);
                    break;
                }
                Next::More => {
                    let mut jobs = lock(&executor.jobs);
                    if !jobs.runnable.is_empty() {
                        // Others wait: this one goes behind them.
                        jobs.runnable.push_back(job);
                        break;
                    }
                }
            }
        }
    }
}

/// Parks `job` until its queue has room for `bytes`, or runs it again at once if it has. The
/// jobs' lock is held while the callback is registered, so a callback made at once (the
/// connection took the queue meanwhile) finds the job parked.
fn park(executor: &'static Executor, job: Job, bytes: usize) {
    let id = job.id;
    let mut jobs = lock(&executor.jobs);
    let Some(sender) = job.producer.sender() else {
        return;
    };
    let room = sender.wait_for_room(bytes, move || executor.wake(id));
    if room {
        jobs.runnable.push_back(job);
        drop(jobs);
        executor.ready.notify_one();
    } else {
        jobs.parked.insert(id, job);
    }
}

impl Executor {
    /// A parked job's stream has room now, or its client left: the job runs again.
    fn wake(&self, id: u64) {
        let mut jobs = lock(&self.jobs);
        if let Some(job) = jobs.parked.remove(&id) {
            jobs.runnable.push_back(job);
            drop(jobs);
            self.ready.notify_one();
        }
    }
}

/// What a job needs after a step.
pub(crate) enum Next {
    /// Finished, cut, or its client left: drop it.
    Done,
    /// Room for this many bytes in its queue.
    Wait(usize),
    /// Another piece, if it is its turn.
    More,
}

/// The gzip form of one file.
struct FileJob {
    file: File,
    /// How many bytes of the file are sent: its size when opened.
    size: u64,
    /// Bytes of the file compressed so far.
    offset: u64,
    crc: Crc,
    /// `None` once finished.
    sender: Option<StreamSender>,
    /// Compressed bytes the queue could not take (only if a piece outgrew [`ROOM`]).
    pending: Vec<u8>,
    path: PathBuf,
}

impl Produce for FileJob {
    fn sender(&self) -> Option<&StreamSender> {
        self.sender.as_ref()
    }

    /// Compresses and queues the next piece, if its queue has room for it.
    fn step(&mut self, work: &mut Work) -> Next {
        let Some(sender) = &self.sender else {
            return Next::Done;
        };
        if !self.pending.is_empty() {
            match sender.send(&self.pending) {
                Ok(()) => self.pending.clear(),
                Err(SendError::Full) => return Next::Wait(self.pending.len()),
                Err(SendError::Closed) => return Next::Done,
            }
        }
        if sender.is_closed() {
            return Next::Done;
        }
        if sender.queued() + ROOM > QUEUE {
            return Next::Wait(ROOM);
        }
        if let Err(error) = self.compress_piece(work) {
            self.cut(&error);
            return Next::Done;
        }
        let Some(sender) = &self.sender else {
            return Next::Done;
        };
        if self.offset == self.size {
            work.output.extend_from_slice(&self.crc.sum().to_le_bytes());
            work.output
                .extend_from_slice(&self.crc.amount().to_le_bytes());
            // The closing bytes are never refused for a full queue (they fit: room was checked).
            if let Some(sender) = self.sender.take() {
                sender.finish_with(&work.output);
            }
            return Next::Done;
        }
        match sender.send(&work.output) {
            Ok(()) => Next::More,
            Err(SendError::Closed) => Next::Done,
            // Cannot happen while ROOM bounds a piece's output; if it did, the bytes wait in
            // the job until the queue can take them, or the answer is cut if it never could.
            Err(SendError::Full) if work.output.len() > QUEUE => {
                self.cut("a piece's output outgrew the stream's queue");
                Next::Done
            }
            Err(SendError::Full) => {
                std::mem::swap(&mut self.pending, &mut work.output);
                Next::Wait(self.pending.len())
            }
        }
    }
}

impl FileJob {
    /// Reads the next piece and compresses it into `work.output` (after the gzip header for
    /// the first piece).
    fn compress_piece(&mut self, work: &mut Work) -> Result<(), String> {
        let left = self.size - self.offset;
        let len = usize::try_from(left).map_or(PIECE, |left| left.min(PIECE));
        let input = &mut work.input[..len];
        read_exact_at(&self.file, input, self.offset).map_err(|e| match e {
            ReadError::Shrank(at) => {
                let now = self.file.metadata().map_or(at, |m| m.len());
                format!(
                    "the file shrank to {now} bytes while it was sent (it had {} when opened)",
                    self.size
                )
            }
            ReadError::Io(e) => format!("reading at byte {}: {e}", self.offset),
        })?;
        self.crc.update(input);
        work.output.clear();
        if self.offset == 0 {
            work.output.extend_from_slice(&HEADER);
        }
        self.offset += len as u64;
        let flush = if self.offset == self.size {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        work.compressor.reset();
        deflate(&mut work.compressor, input, &mut work.output, flush)
            .map_err(|e| format!("compressing: {e}"))
    }

    /// Ends the answer unfinished (the client sees it cut) and says why in the log.
    fn cut(&mut self, error: &str) {
        crate::log::line(format_args!(
            "gzip download of '{}' cut: {error}",
            self.path.display()
        ));
        // Dropped without `finish`: the connection closes without the last chunk.
        self.sender = None;
    }
}

/// Compresses all of `input` into `output`, growing it as needed, then flushes as `flush` says:
/// a sync flush (the output ends on a byte boundary, the stream goes on) or the final block.
pub(crate) fn deflate(
    compressor: &mut Compress,
    mut input: &[u8],
    output: &mut Vec<u8>,
    flush: FlushCompress,
) -> Result<(), String> {
    let finish = flush == FlushCompress::Finish;
    loop {
        if output.capacity() - output.len() < 1024 {
            output.reserve(PIECE / 4);
        }
        let (in_before, out_before) = (compressor.total_in(), output.len());
        let status = compressor
            .compress_vec(input, output, flush)
            .map_err(|e| e.to_string())?;
        let used = usize::try_from(compressor.total_in() - in_before).unwrap_or(input.len());
        input = &input[used.min(input.len())..];
        let room_left = output.len() < output.capacity();
        match status {
            Status::StreamEnd => return Ok(()),
            // A sync flush is complete once all input is taken and the output was not filled.
            _ if !finish && input.is_empty() && room_left => return Ok(()),
            // No progress with room to make it: the compressor is stuck, which must not loop.
            _ if used == 0 && output.len() == out_before && room_left => {
                return Err(format!("the compressor made no progress ({status:?})"))
            }
            _ => {}
        }
    }
}

pub(crate) enum ReadError {
    /// End of file at this offset, before the size the answer promised.
    Shrank(u64),
    Io(io::Error),
}

/// Fills `buffer` from `file` at `offset` (`pread`, whatever the file's position).
pub(crate) fn read_exact_at(file: &File, buffer: &mut [u8], offset: u64) -> Result<(), ReadError> {
    let mut filled = 0;
    while filled < buffer.len() {
        let at = offset + filled as u64;
        match file.read_at(&mut buffer[filled..], at) {
            Ok(0) => return Err(ReadError::Shrank(at)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use flate2::read::GzDecoder;

    use super::*;

    fn work() -> Work {
        Work::new()
    }

    fn job(contents: &[u8]) -> (FileJob, StreamSource, tempfile::NamedTempFile) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(contents).unwrap();
        let (sender, source) = stream::channel(QUEUE);
        let job = FileJob {
            file: file.reopen().unwrap(),
            size: contents.len() as u64,
            offset: 0,
            crc: Crc::new(),
            sender: Some(sender),
            pending: Vec::new(),
            path: file.path().to_path_buf(),
        };
        (job, source, file)
    }

    /// Every piece's output, then the trailer, as `step` queues them.
    fn compress_all(contents: &[u8]) -> Vec<u8> {
        let (mut job, _source, _file) = job(contents);
        let mut work = work();
        let mut out = Vec::new();
        loop {
            job.compress_piece(&mut work).unwrap();
            assert!(work.output.len() <= ROOM, "{} > {ROOM}", work.output.len());
            out.extend_from_slice(&work.output);
            if job.offset == job.size {
                out.extend_from_slice(&job.crc.sum().to_le_bytes());
                out.extend_from_slice(&job.crc.amount().to_le_bytes());
                return out;
            }
        }
    }

    fn gunzip(gzip: &[u8]) -> Vec<u8> {
        let mut decoder = GzDecoder::new(gzip);
        let mut out = Vec::new();
        decoder.read_to_end(&mut out).expect("valid gzip");
        assert!(decoder.into_inner().is_empty(), "bytes after the member");
        out
    }

    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x853c_49e6_748f_ea9b_u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[5]
            })
            .collect()
    }

    #[test]
    fn pieces_compressed_apart_make_one_valid_member() {
        let text: Vec<u8> = (0..400_000u32)
            .flat_map(|i| format!("line {i} value {}\n", i % 977).into_bytes())
            .collect();
        for len in [
            0,
            1,
            1000,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            3 * PIECE + 17,
            text.len(),
        ] {
            let contents = &text[..len.min(text.len())];
            let gzip = compress_all(contents);
            assert_eq!(&gzip[..10], &HEADER);
            assert!(gunzip(&gzip) == contents, "{len}");
        }
        // Compressed to well under half, pieces and their flushes included.
        assert!(compress_all(&text).len() < text.len() / 3);
    }

    #[test]
    fn incompressible_pieces_stay_within_room() {
        let contents = noise(3 * PIECE + 5);
        let gzip = compress_all(&contents);
        assert!(gunzip(&gzip) == contents);
    }

    #[test]
    fn a_file_that_shrinks_between_pieces_is_an_error() {
        let contents = noise(2 * PIECE + 10);
        let (mut job, _source, file) = job(&contents);
        let mut work = work();
        job.compress_piece(&mut work).unwrap();
        file.as_file().set_len(PIECE as u64 + 100).unwrap();
        let error = job.compress_piece(&mut work).unwrap_err();
        assert_eq!(
            error,
            format!(
                "the file shrank to {} bytes while it was sent (it had {} when opened)",
                PIECE + 100,
                2 * PIECE + 10
            )
        );
    }

    #[test]
    fn a_job_stops_at_a_full_queue_and_when_its_client_leaves() {
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let contents: Vec<u8> = noise(8 * PIECE);
        let (mut job, source, _file) = job(&contents);
        let mut work = work();
        // Nobody takes the queue: one piece of noise fits, the next must wait.
        assert!(matches!(job.step(&mut work), Next::More));
        assert!(matches!(job.step(&mut work), Next::Wait(ROOM)));
        assert_eq!(job.offset, PIECE as u64);
        drop(source);
        assert!(matches!(job.step(&mut work), Next::Done));
        // A small file: one step queues it all and finishes.
        let (mut job, _source, _file) = self::job(&text[..5000]);
        assert!(matches!(job.step(&mut work), Next::Done));
        assert!(job.sender.is_none(), "finished");
    }

    #[test]
    fn places_are_bounded_and_given_back() {
        let held: Vec<Slot> = std::iter::from_fn(Slot::take)
            .take(MAX_DOWNLOADS + 1)
            .collect();
        assert_eq!(held.len(), MAX_DOWNLOADS);
        assert!(!Slot::available());
        drop(held);
        assert!(Slot::available());
        assert!(Slot::take().is_some());
    }
}
