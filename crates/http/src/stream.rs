//! Streamed response bodies: a producer pushes bytes when it has them; the connection sends
//! them as chunks and waits in the event loop, without a worker, while the producer has none.
//!
//! [`channel`] gives the two ends. The [`StreamSender`] belongs to the producer (a process's
//! output, a directory watch, a test): [`send`](StreamSender::send) queues bytes and wakes the
//! connection if it is waiting; [`finish`](StreamSender::finish) ends the body. A sender
//! dropped without `finish` aborts it: the connection closes without the last chunk, so the
//! client sees a truncated body rather than a complete-looking one. The queue is bounded: a
//! client that does not read makes `send` fail with [`SendError::Full`], never grows memory,
//! and the producer decides what that means for it: give up, or hold back and wait for room
//! ([`wait_for_room`](StreamSender::wait_for_room) calls it back when the connection takes the
//! queued bytes or the client leaves). When the client is gone, `send` fails with
//! [`SendError::Closed`]. A producer that counts what its streams hold can learn when the
//! connection lets go of one ([`on_release`](StreamSender::on_release)), finished or not.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Largest queue allocation a stream keeps for reuse.
const RECYCLE_MAX: usize = 512 << 10;

/// Wakes a connection parked while its producer had nothing. Called at most once.
pub(crate) type Waker = Box<dyn FnOnce() + Send>;

thread_local! {
    /// The connections to wake once the [`batched`] call on this thread returns.
    static DEFERRED: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// Runs `produce`, waking the connections its sends made ready only when it returns: a
/// producer that queues several batches in one go (a process's output read while its pipe
/// holds more) hands each connection one larger batch, for one wake-up of a worker, instead
/// of a wake-up per batch. Nested calls join the outermost.
pub fn batched<R>(produce: impl FnOnce() -> R) -> R {
    let outermost = DEFERRED.with(|deferred| {
        let mut deferred = deferred.borrow_mut();
        let outermost = deferred.is_none();
        deferred.get_or_insert_with(Vec::new);
        outermost
    });
    let result = produce();
    if outermost {
        let wakers = DEFERRED.with(|deferred| deferred.borrow_mut().take());
        for wake in wakers.into_iter().flatten() {
            wake();
        }
    }
    result
}

/// Wakes a connection now, or when the [`batched`] call under way on this thread returns.
fn wake_or_defer(wake: Waker) {
    let deferred = DEFERRED.with(|deferred| match deferred.borrow_mut().as_mut() {
        Some(list) => {
            list.push(wake);
            None
        }
        None => Some(wake),
    });
    if let Some(wake) = deferred {
        wake();
    }
}

/// Makes a stream: the producer's end and the response body's end. `capacity`: the most bytes
/// queued and not yet taken by the connection.
pub fn channel(capacity: usize) -> (StreamSender, StreamSource) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queued: Vec::new(),
            spare: Vec::new(),
            capacity,
            end: End::Open,
            source_gone: false,
            waiter: None,
            producer_waiter: None,
            on_release: None,
        }),
    });
    (
        StreamSender {
            shared: Arc::clone(&shared),
            finished: false,
        },
        StreamSource { shared },
    )
}

/// Why bytes could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The client is gone or the connection failed: stop producing.
    Closed,
    /// The client reads slower than the producer writes and the queue is at its capacity.
    Full,
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SendError::Closed => "the client is gone",
            SendError::Full => "the client is not reading fast enough",
        })
    }
}

impl std::error::Error for SendError {}

/// The producer's end.
pub struct StreamSender {
    shared: Arc<Shared>,
    finished: bool,
}

/// The response body's end, given to [`crate::ResponseBody::Stream`].
pub struct StreamSource {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

struct State {
    queued: Vec<u8>,
    /// An empty allocation kept for the next batch (the queue's while the connection writes,
    /// the producer's next buffer): a busy stream then cycles through two or three buffers
    /// and allocates none, also when it idles between bursts. At most [`RECYCLE_MAX`] bytes.
    spare: Vec<u8>,
    capacity: usize,
    end: End,
    /// The connection dropped its end: the client is gone.
    source_gone: bool,
    /// The connection waiting for bytes, if it is.
    waiter: Option<Waker>,
    /// The producer waiting for room, if it is.
    producer_waiter: Option<Waker>,
    /// Called when the connection drops its end.
    on_release: Option<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Finished,
    Aborted,
}

/// What the connection finds when it asks for more.
pub(crate) enum Poll {
    /// Bytes to send (never empty).
    Data(Vec<u8>),
    /// Nothing now; the waker was registered and will be called when there is.
    Pending,
    /// Every byte was taken and the producer finished.
    Finished,
    /// The producer gave up.
    Aborted,
}

impl StreamSender {
    /// Queues `bytes` for the client. Empty input is accepted and sends nothing.
    pub fn send(&self, bytes: &[u8]) -> Result<(), SendError> {
        let waiter = {
            let mut state = self.shared.lock();
            if state.source_gone {
                return Err(SendError::Closed);
            }
            if bytes.is_empty() {
                return Ok(());
            }
            if state.queued.len() + bytes.len() > state.capacity {
                return Err(SendError::Full);
            }
            state.queued.extend_from_slice(bytes);
            state.waiter.take()
        };
        if let Some(wake) = waiter {
            wake_or_defer(wake);
        }
        Ok(())
    }

    /// A buffer to write the next bytes into and queue with [`send_owned`](Self::send_owned):
    /// an allocation the stream kept (empty) when it has one, so a busy producer neither
    /// allocates nor copies.
    pub fn buffer(&self) -> Vec<u8> {
        let mut state = self.shared.lock();
        // The empty queue's allocation if it is the larger: `send_owned` would put it aside.
        if state.queued.is_empty() && state.queued.capacity() > state.spare.capacity() {
            std::mem::take(&mut state.queued)
        } else {
            std::mem::take(&mut state.spare)
        }
    }

    /// Queues `bytes` as [`send`](Self::send) does, taking the buffer: with nothing queued it
    /// becomes the queue (no copy), else it is appended and kept for reuse. Refused, the bytes
    /// come back with why.
    pub fn send_owned(&self, bytes: Vec<u8>) -> Result<(), (SendError, Vec<u8>)> {
        let waiter = {
            let mut state = self.shared.lock();
            if state.source_gone {
                return Err((SendError::Closed, bytes));
            }
            if state.queued.len() + bytes.len() > state.capacity {
                return Err((SendError::Full, bytes));
            }
            let emptied = if state.queued.is_empty() {
                std::mem::replace(&mut state.queued, bytes)
            } else {
                state.queued.extend_from_slice(&bytes);
                bytes
            };
            state.keep(emptied);
            state.waiter.take()
        };
        if let Some(wake) = waiter {
            wake_or_defer(wake);
        }
        Ok(())
    }

    /// Appends to the queue in place: `write` is given the bytes queued and not yet taken (or,
    /// with none, the stream's kept allocation) and appends one piece, or answers false when it
    /// has nothing to send (what it appended is then dropped). The connection meanwhile finds
    /// nothing queued and waits, so `write` may take its time (a `read(2)` straight into the
    /// queue, neither copied afterwards nor read under the stream's lock). Refused as
    /// [`send`](Self::send) refuses; a piece past the capacity is dropped (`Full`).
    pub fn append(&self, write: impl FnOnce(&mut Vec<u8>) -> bool) -> Result<(), SendError> {
        let mut queue = {
            let mut state = self.shared.lock();
            if state.source_gone {
                return Err(SendError::Closed);
            }
            if state.queued.is_empty() && state.spare.capacity() > state.queued.capacity() {
                std::mem::take(&mut state.spare)
            } else {
                std::mem::take(&mut state.queued)
            }
        };
        let before = queue.len();
        if !write(&mut queue) {
            queue.truncate(before);
        }
        let appended = queue.len() > before;
        let waiter = {
            let mut state = self.shared.lock();
            if state.source_gone {
                return Err(SendError::Closed);
            }
            let full = queue.len() > state.capacity;
            if full {
                queue.truncate(before);
            }
            // Bytes another thread queued meanwhile came later: after ours.
            let later = std::mem::replace(&mut state.queued, queue);
            state.queued.extend_from_slice(&later);
            state.keep(later);
            if full {
                return Err(SendError::Full);
            }
            if appended {
                state.waiter.take()
            } else {
                None
            }
        };
        if let Some(wake) = waiter {
            wake_or_defer(wake);
        }
        Ok(())
    }

    /// True once the client is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().source_gone
    }

    /// Bytes queued and not yet taken by the connection.
    pub fn queued(&self) -> usize {
        self.shared.lock().queued.len()
    }

    /// How many bytes more the queue takes now.
    pub fn room(&self) -> usize {
        let state = self.shared.lock();
        state.capacity.saturating_sub(state.queued.len())
    }

    /// Whether `bytes` more would fit in the queue now (or the client is gone, so a send would
    /// fail at once). If not, `wake` is kept and called once, when the connection takes the
    /// queued bytes or the client leaves, replacing any callback kept before.
    pub fn wait_for_room(&self, bytes: usize, wake: impl FnOnce() + Send + 'static) -> bool {
        let mut state = self.shared.lock();
        if state.source_gone || state.queued.len().saturating_add(bytes) <= state.capacity {
            return true;
        }
        state.producer_waiter = Some(Box::new(wake));
        false
    }

    /// Calls `released` once, when the connection drops the body's end: every byte sent, or the
    /// answer cut, or the client gone; at once if it already has. The call outlives this sender
    /// (a finished body may still be being sent), so a producer can bound how many bodies are
    /// held, not only how many it is producing. Replaces any callback kept before.
    pub fn on_release(&self, released: impl FnOnce() + Send + 'static) {
        let mut state = self.shared.lock();
        if state.source_gone {
            drop(state);
            released();
        } else {
            state.on_release = Some(Box::new(released));
        }
    }

    /// Ends the body once the queued bytes are sent.
    pub fn finish(self) {
        self.finish_with(&[]);
    }

    /// Ends the body with `last` after the queued bytes, even past the capacity: a producer's
    /// closing words (a protocol's end-of-stream message) are never refused for a full queue.
    pub fn finish_with(mut self, last: &[u8]) {
        self.finished = true;
        self.shared.lock().queued.extend_from_slice(last);
        self.shared.end(End::Finished);
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.end(End::Aborted);
        }
    }
}

impl StreamSource {
    /// Takes what is queued, or registers `waker` (made only when needed) to be called when
    /// there is more.
    pub(crate) fn poll(&self, waker: impl FnOnce() -> Waker) -> Poll {
        let mut state = self.shared.lock();
        if !state.queued.is_empty() {
            let spare = std::mem::take(&mut state.spare);
            let data = std::mem::replace(&mut state.queued, spare);
            let producer = state.producer_waiter.take();
            drop(state);
            if let Some(wake) = producer {
                wake();
            }
            return Poll::Data(data);
        }
        match state.end {
            End::Finished => Poll::Finished,
            End::Aborted => Poll::Aborted,
            End::Open => {
                state.waiter = Some(waker());
                Poll::Pending
            }
        }
    }
}

impl StreamSource {
    /// Gives back a buffer [`poll`](Self::poll) handed out, once its bytes were written: it
    /// becomes the queue again if the queue is still empty, else the spare, so a busy stream
    /// reuses its allocations instead of making new ones for every batch (musl's allocator
    /// maps a block over 128 KiB afresh, and faults it in again, on each use).
    pub(crate) fn recycle(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() > RECYCLE_MAX {
            return;
        }
        buffer.clear();
        let mut state = self.shared.lock();
        if state.source_gone {
            return;
        }
        if state.queued.is_empty() && buffer.capacity() > state.queued.capacity() {
            buffer = std::mem::replace(&mut state.queued, buffer);
        }
        state.keep(buffer);
    }
}

impl State {
    /// Keeps `buffer` (empty) as the spare if it is larger than the one kept, and not over
    /// [`RECYCLE_MAX`]: what a stream keeps is bounded.
    fn keep(&mut self, mut buffer: Vec<u8>) {
        buffer.clear();
        if buffer.capacity() > self.spare.capacity() && buffer.capacity() <= RECYCLE_MAX {
            self.spare = buffer;
        }
    }
}

impl Drop for StreamSource {
    fn drop(&mut self) {
        let (producer, released) = {
            let mut state = self.shared.lock();
            state.source_gone = true;
            state.queued = Vec::new();
            state.spare = Vec::new();
            state.waiter = None;
            (state.producer_waiter.take(), state.on_release.take())
        };
        if let Some(wake) = producer {
            wake();
        }
        if let Some(released) = released {
            released();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn end(&self, end: End) {
        let waiter = {
            let mut state = self.lock();
            state.end = end;
            state.waiter.take()
        };
        if let Some(wake) = waiter {
            wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting_waker(count: &Arc<AtomicUsize>) -> impl FnOnce() -> Waker {
        let count = Arc::clone(count);
        move || {
            Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            })
        }
    }

    #[test]
    fn bytes_pass_in_order_and_a_waiting_source_is_woken_once() {
        let (sender, source) = channel(16);
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Pending));
        sender.send(b"ab").unwrap();
        sender.send(b"cd").unwrap();
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Data(d) if d == b"abcd"));
        sender.finish();
        assert!(matches!(
            source.poll(counting_waker(&wakes)),
            Poll::Finished
        ));
    }

    #[test]
    fn a_full_queue_and_a_gone_client_are_reported() {
        let (sender, source) = channel(4);
        sender.send(b"1").unwrap();
        assert_eq!(sender.room(), 3);
        sender.send(b"234").unwrap();
        assert_eq!(sender.send(b"5"), Err(SendError::Full));
        assert_eq!((sender.queued(), sender.room()), (4, 0));
        drop(source);
        assert!(sender.is_closed());
        assert_eq!(sender.send(b"5"), Err(SendError::Closed));
    }

    #[test]
    fn a_producer_waiting_for_room_is_called_back_when_the_queue_is_taken() {
        let (sender, source) = channel(8);
        let room = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&room);
        assert!(sender.wait_for_room(8, || unreachable!("room now")));
        sender.send(b"123456").unwrap();
        assert!(!sender.wait_for_room(4, move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Data(d) if d == b"123456"));
        assert_eq!(room.load(Ordering::SeqCst), 1);
        assert!(sender.wait_for_room(8, || unreachable!("room now")));
        // A client that leaves also calls the producer back.
        sender.send(b"12345678").unwrap();
        let count = Arc::clone(&room);
        assert!(!sender.wait_for_room(1, move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        drop(source);
        assert_eq!(room.load(Ordering::SeqCst), 2);
        assert!(sender.wait_for_room(1, || unreachable!("gone: a send fails at once")));
    }

    #[test]
    fn a_recycled_buffer_becomes_the_queue_when_it_is_empty() {
        let (sender, source) = channel(64);
        let wakes = Arc::new(AtomicUsize::new(0));
        sender.send(&[7; 40]).unwrap();
        let Poll::Data(taken) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        let capacity = taken.capacity();
        source.recycle(taken);
        sender.send(b"next").unwrap();
        let Poll::Data(again) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(again, b"next");
        assert_eq!(again.capacity(), capacity, "the same allocation");
        // Not a buffer over the bound.
        source.recycle(Vec::with_capacity(RECYCLE_MAX + 1));
        assert!(source.shared.lock().queued.capacity() <= RECYCLE_MAX);
        // Not when bytes were queued meanwhile: they stay, in order.
        sender.send(b"a").unwrap();
        source.recycle(vec![0; 10]);
        let Poll::Data(kept) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(kept, b"a");
    }

    #[test]
    fn a_busy_stream_cycles_its_buffers_and_owned_sends_are_not_copied() {
        let (sender, source) = channel(1 << 20);
        let wakes = Arc::new(AtomicUsize::new(0));
        let mut first = sender.buffer();
        assert_eq!(first.capacity(), 0, "nothing kept yet");
        first.extend_from_slice(&[1; 1000]);
        let address = first.as_ptr();
        sender.send_owned(first).unwrap();
        let Poll::Data(taken) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(taken.as_ptr(), address, "the producer's buffer, not a copy");
        // While the connection writes it, the producer queues more: appended to the queue,
        // the buffer it came in is kept as the spare...
        let mut second = sender.buffer();
        second.extend_from_slice(&[2; 500]);
        sender.send_owned(second).unwrap();
        sender.send(&[3; 10]).unwrap();
        // ...and the written batch, given back, is kept for the next one.
        source.recycle(taken);
        let Poll::Data(next) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(next.len(), 510);
        assert_eq!((next[0], next[509]), (2, 3));
        // In turn, as a producer and a connection at work: the producer writing a piece while
        // the connection writes the last, each piece the size of the first. After the first
        // turns, no new allocation: the same few buffers go round.
        let mut writing = next;
        let mut seen = std::collections::HashSet::new();
        let mut made = 0;
        for turn in 0..50 {
            if turn == 4 {
                made = crate::sys::counting::made();
            }
            let mut piece = sender.buffer();
            piece.extend_from_slice(&[5; 1000]);
            sender.send_owned(piece).unwrap();
            source.recycle(writing);
            let Poll::Data(taken) = source.poll(counting_waker(&wakes)) else {
                panic!("data");
            };
            assert_eq!(taken.len(), 1000);
            if turn >= 2 {
                seen.insert(taken.as_ptr() as usize);
            }
            writing = taken;
        }
        assert!(seen.len() <= 3, "{} buffers", seen.len());
        assert_eq!(
            crate::sys::counting::made(),
            made,
            "allocations after the first turns"
        );
        // Refused bytes come back.
        let (tiny, _tiny_source) = channel(4);
        let Err((SendError::Full, back)) = tiny.send_owned(vec![9; 5]) else {
            panic!("full");
        };
        assert_eq!(back, [9; 5]);
    }

    #[test]
    fn appends_go_into_the_queue_in_place_and_nothing_is_queued_for_a_refused_piece() {
        let (sender, source) = channel(16);
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Pending));
        sender.send(b"ab").unwrap();
        let mut address = 0;
        sender
            .append(|queue| {
                assert_eq!(queue, b"ab", "the queue itself, not a copy");
                address = queue.as_ptr() as usize;
                queue.extend_from_slice(b"cd");
                true
            })
            .unwrap();
        // Nothing to send: neither bytes nor a wake-up.
        sender
            .append(|queue| {
                queue.extend_from_slice(b"half");
                false
            })
            .unwrap();
        assert_eq!(
            sender.append(|queue| {
                queue.extend_from_slice(&[0; 13]);
                true
            }),
            Err(SendError::Full)
        );
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        let Poll::Data(taken) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(
            (&taken[..], taken.as_ptr() as usize),
            (&b"abcd"[..], address)
        );
        // With nothing queued, the allocation given back is the one written into.
        let capacity = taken.capacity();
        source.recycle(taken);
        sender
            .append(|queue| {
                assert_eq!((queue.len(), queue.capacity()), (0, capacity));
                queue.push(b'e');
                true
            })
            .unwrap();
        drop(source);
        assert_eq!(
            sender.append(|_| unreachable!("gone")),
            Err(SendError::Closed)
        );
    }

    #[test]
    fn batched_sends_wake_the_connection_once_when_the_batch_ends() {
        let (sender, source) = channel(1 << 20);
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Pending));
        batched(|| {
            sender.send(b"one").unwrap();
            batched(|| sender.send_owned(b" two".to_vec()).unwrap());
            sender.send(b" three").unwrap();
            assert_eq!(wakes.load(Ordering::SeqCst), 0, "not before the batch ends");
        });
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        let Poll::Data(all) = source.poll(counting_waker(&wakes)) else {
            panic!("data");
        };
        assert_eq!(all, b"one two three");
        // Outside a batch: at once.
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Pending));
        sender.send(b"x").unwrap();
        assert_eq!(wakes.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn release_is_told_when_the_source_goes_even_after_the_sender() {
        let released = Arc::new(AtomicUsize::new(0));
        let (sender, source) = channel(16);
        let count = Arc::clone(&released);
        sender.on_release(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        sender.send(b"last").unwrap();
        sender.finish();
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "still held by the connection"
        );
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Data(_)));
        drop(source);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // Asked after the source is gone: called at once.
        let (sender, source) = channel(16);
        drop(source);
        let count = Arc::clone(&released);
        sender.on_release(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(released.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_dropped_sender_aborts_and_wakes() {
        let (sender, source) = channel(4);
        let wakes = Arc::new(AtomicUsize::new(0));
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Pending));
        drop(sender);
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert!(matches!(source.poll(counting_waker(&wakes)), Poll::Aborted));
    }
}
