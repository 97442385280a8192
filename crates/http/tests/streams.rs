//! Streamed responses through a real server: a test producer feeds chunks over time while the
//! connection waits in the event loop, not in a worker.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use sandboxd_http::stream::{channel, SendError};
use sandboxd_http::{Action, Config, Error, Handler, Head, Record, Response, ResponseBody};

/// `/stream/N`: N chunks of `chunk-i\n`, 20 ms apart, from a producer thread; `/abort`: one
/// chunk, then the producer gives up; `/forever`: a chunk every 20 ms until the client is gone,
/// then the producer reports it; `/idle`: one chunk, then nothing, looking every 20 ms whether
/// the client is gone and reporting it; anything else: 204.
struct Streams {
    gone: Mutex<mpsc::Sender<SendError>>,
}

impl Handler for Streams {
    fn begin(&self, head: &Head) -> Action {
        let path = head.path().to_string();
        let (sender, source) = channel(64 * 1024);
        let gone = self.gone.lock().unwrap().clone();
        match path.as_str() {
            "/abort" => {
                thread::spawn(move || {
                    sender.send(b"partial").unwrap();
                    thread::sleep(Duration::from_millis(20));
                    drop(sender);
                });
            }
            "/idle" => {
                thread::spawn(move || {
                    // The client may be gone before the first chunk is queued: that is the
                    // answer too.
                    if let Err(error) = sender.send(b"first\n") {
                        let _ = gone.send(error);
                        return;
                    }
                    for _ in 0..500 {
                        thread::sleep(Duration::from_millis(20));
                        if sender.is_closed() {
                            let _ = gone.send(SendError::Closed);
                            return;
                        }
                    }
                });
            }
            "/forever" => {
                thread::spawn(move || loop {
                    if let Err(error) = sender.send(b"tick\n") {
                        let _ = gone.send(error);
                        return;
                    }
                    thread::sleep(Duration::from_millis(20));
                });
            }
            path if path.starts_with("/stream/") => {
                let count: usize = path["/stream/".len()..].parse().unwrap_or(0);
                thread::spawn(move || {
                    for i in 0..count {
                        thread::sleep(Duration::from_millis(20));
                        sender.send(format!("chunk-{i}\n").as_bytes()).unwrap();
                    }
                    sender.finish();
                });
            }
            _ => return Action::Respond(Response::empty(204)),
        }
        Action::Respond(Response::new(200, ResponseBody::Stream(source)))
    }

    fn refused(&self, _head: Option<&Head>, error: &Error) -> Response {
        Response::new(
            error.status(),
            ResponseBody::Bytes(error.to_string().into_bytes()),
        )
    }

    fn log(&self, _record: &Record<'_>) {}

    fn notice(&self, _message: std::fmt::Arguments<'_>) {}
}

fn serve(workers: usize) -> (std::net::SocketAddr, mpsc::Receiver<SendError>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let config = Config {
        workers,
        waiting_workers: 1,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        send_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        discard_cap: 1 << 20,
        partial_head_budget: 1 << 20,
        collect_budget: 1 << 20,
        server_header: "test".into(),
    };
    let server = sandboxd_http::start(
        listener,
        config,
        Streams {
            gone: Mutex::new(tx),
        },
    )
    .unwrap();
    std::mem::forget(server);
    (addr, rx)
}

fn get(addr: std::net::SocketAddr, path: &str) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    BufReader::new(stream)
}

/// Reads a head, then a chunked body; `None` when the body ends without its last chunk.
fn read_chunked(reader: &mut BufReader<TcpStream>) -> (String, Option<Vec<u8>>) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        head.push_str(&line);
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        if reader.read_line(&mut size).unwrap_or(0) == 0 {
            return (head, None);
        }
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut chunk = vec![0; n + 2];
        if reader.read_exact(&mut chunk).is_err() {
            return (head, None);
        }
        if n == 0 {
            return (head, Some(body));
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn a_producer_feeds_a_chunked_answer_over_time() {
    let (addr, _) = serve(1);
    let mut reader = get(addr, "/stream/5");
    let (head, body) = read_chunked(&mut reader);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Transfer-Encoding: chunked\r\n"), "{head}");
    let expected: String = (0..5).map(|i| format!("chunk-{i}\n")).collect();
    assert_eq!(String::from_utf8(body.unwrap()).unwrap(), expected);
    // The connection is kept: a second request on it is answered.
    reader
        .get_mut()
        .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 204"), "{status}");
}

#[test]
fn waiting_streams_hold_no_worker() {
    // Two workers, a hundred streams each waiting for its producer most of the time.
    let (addr, _) = serve(2);
    let readers: Vec<_> = (0..100).map(|_| get(addr, "/stream/20")).collect();
    thread::sleep(Duration::from_millis(100));
    for _ in 0..5 {
        let started = Instant::now();
        let mut reader = get(addr, "/");
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 204"), "{status}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
    for mut reader in readers {
        let (_, body) = read_chunked(&mut reader);
        assert_eq!(body.unwrap().iter().filter(|&&b| b == b'\n').count(), 20);
    }
}

#[test]
fn an_aborted_producer_ends_the_answer_without_its_last_chunk() {
    let (addr, _) = serve(1);
    let mut reader = get(addr, "/abort");
    let (head, body) = read_chunked(&mut reader);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, None, "a truncated body, never a complete-looking one");
}

/// Opens `path`, reads the status line, leaves, and waits for the producer to hear of it.
fn leave_and_expect_closed(path: &str, what: &str) {
    let (addr, gone) = serve(1);
    let mut reader = get(addr, path);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    drop(reader);
    let error = gone.recv_timeout(Duration::from_secs(5)).expect(what);
    assert_eq!(error, SendError::Closed);
}

#[test]
fn the_producer_learns_that_the_client_left() {
    leave_and_expect_closed("/forever", "producer told");
}

#[test]
fn a_producer_with_nothing_to_send_learns_that_the_client_left() {
    leave_and_expect_closed("/idle", "the connection closed while the producer was idle");
}

#[test]
fn http_1_0_streams_end_by_closing() {
    let (addr, _) = serve(1);
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /stream/3 HTTP/1.0\r\n\r\n").unwrap();
    let mut all = String::new();
    stream.read_to_string(&mut all).unwrap();
    assert!(all.contains("Connection: close\r\n"), "{all}");
    assert!(!all.contains("chunked"), "{all}");
    assert!(
        all.ends_with("\r\n\r\nchunk-0\nchunk-1\nchunk-2\n"),
        "{all}"
    );
}
