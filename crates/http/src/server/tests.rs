//! The server through real sockets: workers blocked in their handler (as on a slow disk) are
//! replaced by standby ones, and the events they took are handed to others; and no allocation
//! per keep-alive request once the workers are warm. The crate's unit tests run on a counting
//! allocator (`sys::counting`); the handler's `log`, called on the worker after each answer,
//! adds what its thread allocated since its previous request, so everything a worker does
//! between two requests is counted: the wait for events, the read, the head, the handler's
//! answer, the head written, the send.

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::sys::counting;
use crate::{Action, Config, Error, Handler, Head, Record, Response, ResponseBody};

fn serve<H: Handler>(workers: usize, waiting_workers: usize, handler: H) -> SocketAddr {
    let (addr, server) = start(workers, waiting_workers, handler);
    std::mem::forget(server);
    addr
}

fn start<H: Handler>(
    workers: usize,
    waiting_workers: usize,
    handler: H,
) -> (SocketAddr, super::Server<H>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(30);
    let config = Config {
        workers,
        waiting_workers,
        header_timeout: timeout,
        idle_timeout: timeout,
        send_timeout: timeout,
        body_timeout: timeout,
        discard_cap: 1 << 20,
        partial_head_budget: 1 << 20,
        collect_budget: 1 << 20,
        server_header: "test".into(),
    };
    (addr, super::start(listener, config, handler).unwrap())
}

/// How long `/block` holds its worker.
const BLOCK: Duration = Duration::from_millis(1500);

/// `/block`: sleeps in the handler, then 204; anything else: 204 at once.
struct Blocking;

impl Handler for Blocking {
    fn begin(&self, head: &Head) -> Action {
        if head.path() == "/block" {
            thread::sleep(BLOCK);
        }
        Action::Respond(Response::empty(204))
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::empty(error.status())
    }

    fn log(&self, _record: &Record<'_>) {}

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut socket = TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn workers_blocked_in_their_handler_are_replaced_by_standby_ones() {
    // One worker takes events; two stand by.
    let addr = serve(3, 1, Blocking);
    let blocked: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(addr, "/block")))
        .collect();
    thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    let answer = get(addr, "/health");
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    assert!(
        took < BLOCK / 3,
        "answered after {took:?}: no standby worker replaced the blocked ones"
    );
    for blocked in blocked {
        assert!(blocked.join().unwrap().starts_with("HTTP/1.1 204"));
    }
}

/// One request on a new keep-alive connection, so that it is registered and parked.
fn keep_alive(addr: SocketAddr) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    read_answer(&mut socket);
    socket
}

fn read_answer(socket: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        assert_eq!(socket.read(&mut byte).unwrap(), 1, "closed");
        answer.push(byte[0]);
    }
    String::from_utf8(answer).unwrap()
}

#[test]
fn events_taken_by_a_worker_that_blocks_are_handed_to_another() {
    // One worker takes events, in batches; one stands by.
    let addr = serve(2, 1, Blocking);
    let (mut blocking, mut quick) = (keep_alive(addr), keep_alive(addr));
    for _ in 0..3 {
        // Both requests reach the waiting worker's next batch (most often): the first blocks
        // it, and the second's event is handed to the standby worker instead of waiting.
        blocking
            .write_all(b"GET /block HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        quick
            .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let started = Instant::now();
        assert!(read_answer(&mut quick).starts_with("HTTP/1.1 204"));
        let took = started.elapsed();
        assert!(
            took < BLOCK / 3,
            "answered after {took:?}, behind the blocked request"
        );
        assert!(read_answer(&mut blocking).starts_with("HTTP/1.1 204"));
    }
}

/// How long `/sleep` holds its worker.
const SLEEP: Duration = Duration::from_millis(300);

/// `/sleep`: sleeps in the handler, then 204; anything else: 204 at once. Keeps every log
/// record's target, duration and time.
#[derive(Default)]
struct Timed {
    records: Mutex<Vec<(String, Duration, SystemTime)>>,
}

impl Handler for &'static Timed {
    fn begin(&self, head: &Head) -> Action {
        if head.path() == "/sleep" {
            thread::sleep(SLEEP);
        }
        Action::Respond(Response::empty(204))
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::empty(error.status())
    }

    fn log(&self, record: &Record<'_>) {
        let mut records = self.records.lock().unwrap();
        records.push((record.target.to_string(), record.duration, record.at));
    }

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

impl Timed {
    /// The duration and time logged for `target`, once it is.
    fn logged(&self, target: &str) -> (Duration, SystemTime) {
        for _ in 0..500 {
            let records = self.records.lock().unwrap();
            if let Some((_, took, at)) = records.iter().find(|(t, _, _)| t == target) {
                return (*took, *at);
            }
            drop(records);
            thread::sleep(Duration::from_millis(10));
        }
        panic!("{target} was not logged");
    }
}

#[test]
fn a_log_records_time_and_duration_are_its_own_when_runs_before_it_took_long() {
    // One worker: what reaches it while it sleeps waits for it, in its next batch.
    let handler: &'static Timed = Box::leak(Box::default());
    let addr = serve(1, 1, handler);
    let (mut first, mut long, mut quick) = (keep_alive(addr), keep_alive(addr), keep_alive(addr));
    let sent = SystemTime::now();
    first
        .write_all(b"GET /sleep HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    thread::sleep(SLEEP / 3);
    long.write_all(b"GET /sleep?second HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    thread::sleep(Duration::from_millis(5));
    quick
        .write_all(b"GET /quick HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    for socket in [&mut first, &mut long, &mut quick] {
        assert!(read_answer(socket).starts_with("HTTP/1.1 204"));
    }
    let answered = SystemTime::now();

    // Each request's time is the wall clock at its end, its duration its own run's.
    let (first_took, first_at) = handler.logged("/sleep");
    let (long_took, long_at) = handler.logged("/sleep?second");
    let (quick_took, quick_at) = handler.logged("/quick");
    for took in [first_took, long_took] {
        assert!(took >= SLEEP && took < 2 * SLEEP, "{took:?}");
    }
    assert!(
        quick_took < SLEEP / 3,
        "the quick request counts the wait behind the others: {quick_took:?}"
    );
    // One worker: each waited for the runs before it, which its own time and duration show
    // (the order of the two behind `first` is the epoll's).
    assert!(
        first_at >= sent + SLEEP && long_at >= first_at + SLEEP && quick_at >= first_at,
        "times early: {first_at:?} {long_at:?} {quick_at:?}, sent {sent:?}"
    );
    let slack = Duration::from_millis(50);
    assert!(
        long_at.max(quick_at) <= answered + slack,
        "{long_at:?}, {quick_at:?} after the answers came at {answered:?}"
    );
}

thread_local! {
    /// The thread's allocations already added to `ON_WORKERS`.
    static REPORTED: Cell<u64> = const { Cell::new(0) };
    /// The thread has logged a request before: it is warm.
    static WARM: Cell<bool> = const { Cell::new(false) };
}

/// Answers as sandboxd's `/health` does (204 with a header), counting the workers'
/// allocations.
#[derive(Default)]
struct Health {
    on_workers: AtomicU64,
    /// The part of `on_workers` made by threads up to their first request's log: a worker
    /// that took no request while the others warmed up starts cold later.
    cold: AtomicU64,
    logged: AtomicU64,
}

impl Handler for &'static Health {
    fn begin(&self, _head: &Head) -> Action {
        Action::Respond(Response::empty(204).with_header("Cache-Control", "no-store"))
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::empty(error.status())
    }

    fn log(&self, _record: &Record<'_>) {
        let made = counting::made();
        let before = REPORTED.with(|reported| reported.replace(made));
        self.on_workers.fetch_add(made - before, Ordering::SeqCst);
        if !WARM.with(|warm| warm.replace(true)) {
            self.cold.fetch_add(made - before, Ordering::SeqCst);
        }
        self.logged.fetch_add(1, Ordering::SeqCst);
    }

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

/// `rounds` requests on each connection in turn.
fn requests(connections: &mut [TcpStream], rounds: usize) {
    const REQUEST: &[u8] = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut answer = [0u8; 512];
    for _ in 0..rounds {
        for connection in connections.iter_mut() {
            connection.write_all(REQUEST).unwrap();
            let mut read = 0;
            while !answer[..read].ends_with(b"\r\n\r\n") {
                let n = connection.read(&mut answer[read..]).unwrap();
                assert!(n > 0, "closed");
                read += n;
            }
            assert!(answer.starts_with(b"HTTP/1.1 204 No Content\r\n"));
        }
    }
}

/// Waits until `n` requests were logged (a log comes after its answer is sent).
fn logged(handler: &Health, n: u64) {
    for _ in 0..1000 {
        if handler.logged.load(Ordering::SeqCst) >= n {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "{} requests logged of {n}",
        handler.logged.load(Ordering::SeqCst)
    );
}

#[test]
fn a_warm_worker_answers_keep_alive_requests_without_allocating() {
    let handler: &'static Health = Box::leak(Box::default());
    let addr = serve(2, 2, handler);
    let mut connections: Vec<TcpStream> =
        (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    requests(&mut connections, 50);
    logged(handler, 200);
    let warm = handler.on_workers.load(Ordering::SeqCst);
    let cold = handler.cold.load(Ordering::SeqCst);
    assert!(warm > 0, "the count works: the first requests allocate");

    requests(&mut connections, 500);
    // One more round, so that what each worker did after its last counted request (waiting
    // for the next) is counted too.
    requests(&mut connections, 1);
    logged(handler, 2204);
    // A worker's first request (and its thread's start) is not a warm worker's.
    let started_cold = handler.cold.load(Ordering::SeqCst) - cold;
    let made = handler.on_workers.load(Ordering::SeqCst) - warm - started_cold;
    assert_eq!(made, 0, "allocations in 2,004 keep-alive requests");
}

/// `/file`: the file of [`FILE_BYTES`] bytes.
struct Files(File);

/// Many turns' worth (`conn::TURN_BYTES`).
const FILE_BYTES: usize = 64 << 20;

impl Handler for Files {
    fn begin(&self, _head: &Head) -> Action {
        let file = self.0.try_clone().unwrap();
        Action::Respond(Response::new(
            200,
            ResponseBody::File {
                file,
                offset: 0,
                len: FILE_BYTES as u64,
            },
        ))
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::empty(error.status())
    }

    fn log(&self, _record: &Record<'_>) {}

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

#[test]
fn a_long_file_send_wakes_no_other_worker_at_its_turns_ends() {
    let (addr, server) = start(2, 2, Files(file_of(FILE_BYTES)));
    let wakeups = &server.shared.wakeups;
    // On one connection, whose buffers grow, until some run ended its turn (sent a turn's
    // bytes without the socket filling up), which depends on how fast this side reads.
    let mut socket = TcpStream::connect(addr).unwrap();
    let mut body = vec![0u8; 4 << 20];
    for _ in 0..32 {
        download(&mut socket, &mut body);
        if wakeups.kept.load(Ordering::SeqCst) + wakeups.pushed.load(Ordering::SeqCst) > 0 {
            break;
        }
    }
    assert!(
        wakeups.kept.load(Ordering::SeqCst) > 0,
        "no run was still ready at its turn's end"
    );
    // Run again by its own worker; the wake-up queue (an eventfd write waking another worker)
    // is for other threads' work only.
    assert_eq!(wakeups.pushed.load(Ordering::SeqCst), 0);
}

#[test]
fn a_lone_download_with_a_waiting_worker_free_wakes_no_timekeeper() {
    let (addr, server) = start(4, 2, Files(file_of(FILE_BYTES)));
    // Slow reads, so that runs (and the first, before the socket's buffers grow) outlast the
    // time that marks a worker stuck.
    let mut socket = TcpStream::connect(addr).unwrap();
    let mut body = vec![0u8; 64 << 10];
    for _ in 0..2 {
        download(&mut socket, &mut body);
    }
    // The other waiting worker was free throughout: no run was watched, so the timekeeper was
    // never told to look (every `STUCK` while the download's runs kept starting before).
    assert_eq!(server.shared.pool.watched_runs.load(Ordering::SeqCst), 0);
}

#[test]
fn a_short_send_into_a_full_socket_waits_for_room_without_another_call() {
    let (addr, server) = start(2, 2, Files(file_of(FILE_BYTES)));
    // A pause after each MiB read: the socket fills up over and over.
    let mut socket = TcpStream::connect(addr).unwrap();
    let mut body = vec![0u8; 1 << 20];
    download_pausing(&mut socket, &mut body, Duration::from_millis(2));
    // A short `sendfile` whose socket is full is the last until room is reported; before,
    // every fill took one more call, refused.
    assert_eq!(
        server
            .shared
            .wakeups
            .refused_sendfiles
            .load(Ordering::SeqCst),
        0
    );
}

/// Asks for `/file` on `socket` and reads the answer, `body` at a time.
fn download(socket: &mut TcpStream, body: &mut [u8]) {
    download_pausing(socket, body, Duration::ZERO);
}

/// [`download`], pausing after each read.
fn download_pausing(socket: &mut TcpStream, body: &mut [u8], pause: Duration) {
    socket
        .write_all(b"GET /file HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    read_answer(socket);
    let mut received = 0;
    while received < FILE_BYTES {
        let want = (FILE_BYTES - received).min(body.len());
        let n = socket.read(&mut body[..want]).unwrap();
        assert!(n > 0, "closed after {received} bytes");
        received += n;
        thread::sleep(pause);
    }
}

/// A file of `bytes` sevens.
fn file_of(bytes: usize) -> File {
    let mut file = tempfile();
    let block = vec![7u8; 1 << 20];
    for _ in 0..bytes >> 20 {
        file.write_all(&block).unwrap();
    }
    file
}

/// An unnamed file in the temporary directory, removed when closed.
fn tempfile() -> File {
    let path = std::env::temp_dir().join(format!(
        "sandboxd-http-test-{}-{:?}",
        std::process::id(),
        thread::current().id()
    ));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}
