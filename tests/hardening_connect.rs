//! Issue 21, the Connect/HTTP side: the HTTP layer's refusals on Connect paths in Connect's
//! error form, a streaming call's caller errors as its end-of-stream message, the global budget
//! of collected bodies, StreamInput applying a large data message as it arrives, and long calls
//! (ListDir of a big tree) that cannot take every worker.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::connect::{envelope, unary, Stream, AS_USER};
use crate::common::{self, builder, read_reply, Daemon, Reply, TOKEN};

const MIB: usize = 1 << 20;

fn connect_head(procedure: &str, content_type: &str, extra: &str) -> String {
    format!(
        "POST /{procedure} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: {content_type}\r\n{extra}\r\n"
    )
}

/// The Connect error of a unary answer: its status and code.
fn unary_error(reply: &Reply) -> (u16, String) {
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let body = reply.json();
    (
        reply.status,
        body["code"].as_str().unwrap_or("none").to_string(),
    )
}

/// The end-of-stream error of a whole streamed answer (chunked, envelopes inside).
fn stream_end_error(reply: &Reply) -> (String, String) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/connect+json")
    );
    let body = dechunk(&reply.body);
    assert!(body.len() >= 5, "{body:?}");
    assert_eq!(body[0], 2, "only the end-of-stream message: {body:?}");
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(body.len(), 5 + len, "one envelope");
    let json: Value = serde_json::from_slice(&body[5..]).unwrap();
    let error = &json["error"];
    (
        error["code"].as_str().unwrap_or("none").to_string(),
        error["message"].as_str().unwrap_or("").to_string(),
    )
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap(), 16)
            .expect("hex size");
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

#[test]
fn a_body_over_4_mib_on_a_connect_path_is_resource_exhausted() {
    let daemon = common::start();
    let request = connect_head(
        "filesystem.Filesystem/Stat",
        "application/json",
        &format!("Content-Length: {}\r\n", 4 * MIB + 1),
    );
    let (status, code) = unary_error(&daemon.raw(request.as_bytes()));
    assert_eq!((status, code.as_str()), (429, "resource_exhausted"));
    // A streaming call learns it from its end-of-stream message.
    let request = connect_head(
        "filesystem.Filesystem/WatchDir",
        "application/connect+json",
        &format!("Content-Length: {}\r\n", 4 * MIB + 1),
    );
    let (code, message) = stream_end_error(&daemon.raw(request.as_bytes()));
    assert_eq!(code, "resource_exhausted");
    assert!(message.contains("at most 4 MiB"), "{message}");
    // The file routes keep their own form.
    let reply = daemon.raw(
        format!(
            "POST /files/compose HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Length: {}\r\n\r\n",
            2 * MIB
        )
        .as_bytes(),
    );
    assert_eq!(reply.status, 413);
    assert_eq!(reply.json()["code"], 413);
}

#[test]
fn a_stalled_body_is_deadline_exceeded_and_bad_chunking_invalid_argument() {
    let daemon = builder().arg("--body-timeout").arg("1").start();
    let mut socket = daemon.connect();
    let head = connect_head(
        "filesystem.Filesystem/Stat",
        "application/json",
        "Content-Length: 100\r\n",
    );
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(b"{\"pa").unwrap();
    let reply = read_reply(&mut BufReader::new(socket), false).expect("an answer");
    let (status, code) = unary_error(&reply);
    assert_eq!((status, code.as_str()), (504, "deadline_exceeded"));

    let head = connect_head(
        "filesystem.Filesystem/Stat",
        "application/json",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n",
    );
    let reply = daemon.raw(format!("{head}zz\r\n").as_bytes());
    let (status, code) = unary_error(&reply);
    assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .contains("invalid chunk size"));
}

/// A WatchDir of `/` with `authorization`: its answer is 200, and its one message the end of
/// the stream with an error; that error's code and message.
fn watch_dir_error(daemon: &Daemon, authorization: &str) -> (String, String) {
    let mut stream = Stream::open(
        daemon,
        "filesystem.Filesystem/WatchDir",
        &json!({"path": "/"}),
        &[("Authorization", authorization)],
    );
    assert_eq!(stream.status, 200);
    Stream::end_error(&stream.next()).expect("an error")
}

#[test]
fn watch_dir_caller_errors_end_the_stream() {
    let daemon = common::start();
    // base64("nobody:"): a user the passwd file does not know.
    let (code, message) = watch_dir_error(&daemon, "Basic bm9ib2R5Og==");
    assert_eq!(code, "unauthenticated");
    assert!(message.contains("nobody"), "{message}");
    // A malformed Authorization header, too.
    let (code, _) = watch_dir_error(&daemon, "Basic !!!");
    assert_eq!(code, "unauthenticated");
    // The passwd file gone: the caller cannot be known.
    std::fs::remove_file(daemon.dir.path().join("passwd")).unwrap();
    let (code, _) = watch_dir_error(&daemon, AS_USER);
    assert_ne!(code, "none");
}

/// Opens a unary call declaring a 4 MiB body, sends `Expect: 100-continue` and waits for the
/// `100 Continue`: the body's bytes are reserved then.
fn hold_a_4_mib_body(daemon: &Daemon) -> TcpStream {
    let mut socket = daemon.connect();
    let head = connect_head(
        "filesystem.Filesystem/Stat",
        "application/json",
        &format!("Content-Length: {}\r\nExpect: 100-continue\r\n", 4 * MIB),
    );
    socket.write_all(head.as_bytes()).unwrap();
    let mut line = [0u8; 25];
    socket.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"HTTP/1.1 100 Continue\r\n\r\n");
    socket.write_all(&[b' '; 1000]).unwrap();
    socket
}

#[test]
fn collected_bodies_share_a_64_mib_budget() {
    let daemon = common::start();
    let holders: Vec<TcpStream> = (0..16).map(|_| hold_a_4_mib_body(&daemon)).collect();
    // 16 x 4 MiB hold the whole budget: a small call is refused, in Connect's form.
    let reply = unary(
        &daemon,
        "filesystem.Filesystem/Stat",
        &[],
        &json!({"path": "/"}),
    );
    let (status, code) = unary_error(&reply);
    assert_eq!((status, code.as_str()), (429, "resource_exhausted"));
    assert!(reply.json()["message"].as_str().unwrap().contains("64 MiB"));
    // Routes with no body are not concerned.
    assert_eq!(daemon.get("/health").status, 204);
    drop(holders);
    // Once they left, the budget is back (the daemon sees them leave as it reads).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = unary(
            &daemon,
            "filesystem.Filesystem/Stat",
            &[],
            &json!({"path": "/"}),
        );
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 429, "{}", reply.text());
        assert!(Instant::now() < deadline, "the budget was never released");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn b64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

fn chunk(socket: &mut TcpStream, bytes: &[u8]) {
    socket
        .write_all(format!("{:x}\r\n", bytes.len()).as_bytes())
        .unwrap();
    socket.write_all(bytes).unwrap();
    socket.write_all(b"\r\n").unwrap();
}

/// Reads a Start stream's stdout until `want` bytes came.
fn read_stdout(output: &mut Stream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < want {
        let Some(message) = output.next_within(Duration::from_secs(10)) else {
            panic!("only {} of {want} bytes of stdout came", got.len());
        };
        assert!(!message.end, "{message:?}");
        if let Some(data) = message.json["event"]["data"]["stdout"].as_str() {
            got.extend(base64_simd::STANDARD.decode_to_vec(data).unwrap());
        }
    }
    got
}

#[test]
fn stream_input_applies_a_large_data_message_as_it_arrives() {
    let daemon = common::start();
    let mut output = Stream::open(
        &daemon,
        "process.Process/Start",
        &json!({"process": {"cmd": "cat"}, "stdin": true}),
        &[],
    );
    assert_eq!(output.status, 200);
    let pid = output.next().json["event"]["start"]["pid"]
        .as_u64()
        .expect("a start event");
    let mut socket = daemon.connect();
    let head = connect_head(
        "process.Process/StreamInput",
        "application/connect+json",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n",
    );
    socket.write_all(head.as_bytes()).unwrap();
    chunk(
        &mut socket,
        &envelope(
            0,
            json!({"start": {"process": {"pid": pid}}})
                .to_string()
                .as_bytes(),
        ),
    );
    // One data message of ~1.3 MiB whose first 600 KiB are sent, then nothing more for now.
    let input: Vec<u8> = (0..(MIB + 3)).map(common::low_byte).collect();
    let message = json!({"data": {"input": {"stdin": b64(&input)}}}).to_string();
    let whole = envelope(0, message.as_bytes());
    let sent = 600 << 10;
    for piece in whole[..sent].chunks(64 << 10) {
        chunk(&mut socket, piece);
    }
    // Most of what was sent reached the process before the message is complete.
    let early = read_stdout(&mut output, 400 << 10);
    assert_eq!(early[..], input[..early.len()]);
    for piece in whole[sent..].chunks(64 << 10) {
        chunk(&mut socket, piece);
    }
    socket.write_all(b"0\r\n\r\n").unwrap();
    let reply = read_reply(&mut BufReader::new(socket), false).unwrap();
    assert_eq!(reply.status, 200);
    let mut expected = envelope(0, b"{}");
    expected.extend(envelope(2, b"{}"));
    assert_eq!(
        dechunk(&reply.body),
        expected,
        "the empty answer, then a clean end"
    );
    let rest = read_stdout(&mut output, input.len() - early.len());
    let mut all = early;
    all.extend(rest);
    assert_eq!(all.len(), input.len());
    assert!(all == input, "stdin arrived intact");
}

#[test]
fn a_large_message_of_another_shape_is_refused_not_held() {
    let daemon = common::start();
    let mut socket = daemon.connect();
    let head = connect_head(
        "process.Process/StreamInput",
        "application/connect+json",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n",
    );
    socket.write_all(head.as_bytes()).unwrap();
    chunk(
        &mut socket,
        &envelope(0, br#"{"start":{"process":{"pid":4194304}}}"#),
    );
    // A 1 MiB message that is not a data event: refused as soon as its shape shows.
    let message = format!("{{\"keepalive\":{{}},\"x\":\"{}\"}}", "a".repeat(MIB));
    chunk(&mut socket, &envelope(0, message.as_bytes()));
    let reply = read_reply(&mut BufReader::new(socket), false).unwrap();
    let (code, message) = stream_end_error(&reply);
    assert_eq!(code, "invalid_argument");
    assert!(message.contains("data event"), "{message}");
}

/// A tree of `dirs` directories of `files` empty files each, under the daemon's root home.
fn big_tree(daemon: &Daemon, dirs: usize, files: usize) -> std::path::PathBuf {
    let root = daemon.dir.path().join("root/tree");
    for d in 0..dirs {
        let dir = root.join(format!("d{d:04}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..files {
            std::fs::File::create(dir.join(format!("f{f:05}"))).unwrap();
        }
    }
    root
}

#[test]
fn health_is_answered_while_long_calls_run() {
    let daemon = common::start();
    let root = big_tree(&daemon, 100, 1000);
    let root = root.to_str().unwrap().to_string();
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let addr = daemon.addr;
            let root = root.clone();
            std::thread::spawn(move || {
                let body = json!({"path": root, "depth": 2}).to_string();
                let mut socket = TcpStream::connect(addr).unwrap();
                socket
                    .set_read_timeout(Some(Duration::from_secs(300)))
                    .unwrap();
                let head = format!(
                    "POST /filesystem.Filesystem/ListDir HTTP/1.1\r\nHost: t\r\n\
                     X-Access-Token: {TOKEN}\r\nContent-Type: application/json\r\n\
                     Authorization: Basic cm9vdDo=\r\nConnection: close\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                socket.write_all(head.as_bytes()).unwrap();
                read_reply(&mut BufReader::new(socket), false).expect("an answer")
            })
        })
        .collect();
    // The calls are under way (each takes far longer than this).
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        common::assert_health_within(&daemon, Duration::from_secs(2));
    }
    for caller in callers {
        let reply = caller.join().unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let entries = reply.json()["entries"].as_array().unwrap().len();
        assert_eq!(entries, 100 + 100 * 1000);
    }
    // CORS headers set when the call began reach the deferred answer. (After the long calls:
    // behind them in the executor's queue it could outwait the harness's read timeout on a
    // loaded machine.)
    let reply = unary(
        &daemon,
        "filesystem.Filesystem/ListDir",
        &[
            ("Origin", "https://e2b.dev"),
            ("Authorization", "Basic cm9vdDo="),
        ],
        &json!({"path": root.clone() + "/d0000"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
    assert_eq!(reply.json()["entries"].as_array().unwrap().len(), 1000);
}
