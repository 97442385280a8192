//! HTTP/1.1 to the guest's daemon through QEMU's `hostfwd` on 127.0.0.1, over plain sockets:
//! one request per connection (`Connection: close`), and Connect server streams (the process
//! service's `Start` and `Connect`) read envelope by envelope as they arrive.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A parsed answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// The request's bytes: `method target`, `headers`, a length when there is a body or a method
/// that takes one.
fn request_bytes(method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a new connection; the answer read to the connection's end, `limit` at most.
pub fn call(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    limit: Duration,
) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, limit)?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    // A server may answer before the body is all sent (a refusal): its answer is read even
    // when the rest of the body could not be written, as curl does.
    let written = stream.write_all(&request_bytes(method, target, headers, body));
    let mut raw = Vec::new();
    let read = stream.read_to_end(&mut raw);
    match parse(&raw, method == "HEAD") {
        Some(reply) => Ok(reply),
        None => Err(written.and(read).err().unwrap_or_else(|| {
            std::io::Error::other(format!(
                "no HTTP answer: {:?}",
                String::from_utf8_lossy(&raw)
            ))
        })),
    }
}

/// A whole answer (the connection closed after it).
fn parse(raw: &[u8], head_only: bool) -> Option<Reply> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_string(), v.trim().to_string()))
        .collect();
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    let rest = &raw[end + 4..];
    if head_only {
        return Some(reply);
    }
    if reply.header("transfer-encoding") == Some("chunked") {
        reply.body = dechunk(rest).0;
    } else {
        reply.body = rest.to_vec();
    }
    Some(reply)
}

/// The data of the complete chunks at the start of `raw`, and how many bytes they took.
fn dechunk(raw: &[u8]) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut at = 0;
    while let Some(line_end) = raw[at..].windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[at..at + line_end]).unwrap_or("");
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let start = at + line_end + 2;
        if raw.len() < start + size + 2 {
            break;
        }
        body.extend_from_slice(&raw[start..start + size]);
        at = start + size + 2;
    }
    (body, at)
}

/// One envelope's message, and whether it ends the stream.
#[derive(Debug)]
pub struct Message {
    pub end: bool,
    pub json: Value,
}

/// A Connect server stream in JSON (`application/connect+json`), read as it arrives.
pub struct Stream {
    socket: TcpStream,
    pub status: u16,
    chunked: bool,
    raw: Vec<u8>,
    body: Vec<u8>,
    closed: bool,
}

impl Stream {
    /// Calls `/<procedure>` with `request` as its one message and `headers`; reads the head.
    pub fn open(
        addr: SocketAddr,
        procedure: &str,
        request: &Value,
        headers: &[(&str, &str)],
    ) -> Stream {
        let message = request.to_string().into_bytes();
        let mut body = vec![0u8];
        body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&message);
        let mut all = vec![
            ("Content-Type", "application/connect+json"),
            ("Connect-Protocol-Version", "1"),
        ];
        all.extend_from_slice(headers);
        let mut socket = TcpStream::connect(addr).expect("connect to the guest");
        socket
            .write_all(&request_bytes(
                "POST",
                &format!("/{procedure}"),
                &all,
                &body,
            ))
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut stream = Stream {
            socket,
            status: 0,
            chunked: false,
            raw: Vec::new(),
            body: Vec::new(),
            closed: false,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let end = loop {
            if let Some(at) = stream.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            assert!(
                !stream.closed && Instant::now() < deadline,
                "no answer head"
            );
            stream.fill();
        };
        let head = parse(&stream.raw[..end + 4], true).expect("an answer head");
        stream.status = head.status;
        stream.chunked = head.header("transfer-encoding") == Some("chunked");
        stream.raw.drain(..end + 4);
        stream
    }

    fn fill(&mut self) {
        let mut buf = [0u8; 65536];
        match self.socket.read(&mut buf) {
            Ok(0) => self.closed = true,
            Ok(n) => self.raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => self.closed = true,
        }
    }

    /// The next message, waiting at most `limit`; `None` when none came or the stream closed.
    pub fn next_within(&mut self, limit: Duration) -> Option<Message> {
        let deadline = Instant::now() + limit;
        loop {
            if self.chunked {
                let (data, used) = dechunk(&self.raw);
                self.body.extend_from_slice(&data);
                self.raw.drain(..used);
            } else {
                self.body.append(&mut self.raw);
            }
            if self.body.len() >= 5 {
                let len = u32::from_be_bytes(self.body[1..5].try_into().unwrap());
                let len = usize::try_from(len).unwrap();
                if self.body.len() >= 5 + len {
                    let end = self.body[0] & 0x02 != 0;
                    let json = serde_json::from_slice(&self.body[5..5 + len]).unwrap();
                    self.body.drain(..5 + len);
                    return Some(Message { end, json });
                }
            }
            if self.closed || Instant::now() >= deadline {
                return None;
            }
            self.fill();
        }
    }
}

/// Output a process sent, and its end.
#[derive(Debug, Default)]
pub struct Output {
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
    /// The `end` event, `None` while the process runs.
    pub end: Option<Value>,
}

impl Output {
    /// Takes what `message` (a process event) says.
    pub fn take(&mut self, message: &Message) {
        let event = &message.json["event"];
        if let Some(pid) = event["start"]["pid"].as_u64() {
            self.pid = u32::try_from(pid).unwrap();
        }
        for (name, text) in [("stdout", &mut self.stdout), ("stderr", &mut self.stderr)] {
            if let Some(data) = event["data"][name].as_str() {
                let bytes = base64_simd::STANDARD.decode_to_vec(data).unwrap();
                text.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
        if !event["end"].is_null() {
            self.end = Some(event["end"].clone());
        }
    }

    pub fn exit_code(&self) -> i64 {
        let end = self.end.as_ref().expect("the process ended");
        end["exitCode"].as_i64().unwrap_or(0)
    }
}

/// `GET /health` again and again on one kept-alive connection: the daemon's own answer time,
/// without the connection setup through QEMU's user network (whose `hostfwd` listens with a
/// backlog of 1, so a burst of connections waits for SYN retransmits).
pub struct KeepAlive {
    socket: TcpStream,
}

impl KeepAlive {
    pub fn open(addr: SocketAddr) -> KeepAlive {
        let socket = TcpStream::connect(addr).expect("connect to the guest");
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        KeepAlive { socket }
    }

    /// One `/health`; its status (an answer without a body, as 204 is).
    pub fn health(&mut self) -> u16 {
        self.socket
            .write_all(b"GET /health HTTP/1.1\r\nHost: guest\r\n\r\n")
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let read = self.socket.read(&mut byte).expect("an answer");
            assert_eq!(read, 1, "the connection closed: {head:?}");
            head.push(byte[0]);
        }
        let reply = parse(&head, true).expect("an answer head");
        assert_eq!(reply.header("content-length"), None, "{reply:?}");
        reply.status
    }
}
