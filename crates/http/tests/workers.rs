//! Workers through a real server: one blocked in its handler (as on a slow disk) is replaced
//! by a standby worker, so the others' requests are still answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use sandboxd_http::{Action, Config, Error, Handler, Head, Record, Response};

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

fn serve(workers: usize, waiting_workers: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(10);
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
    let server = sandboxd_http::start(listener, config, Blocking).unwrap();
    std::mem::forget(server);
    addr
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
    let addr = serve(3, 1);
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
    let addr = serve(2, 1);
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
