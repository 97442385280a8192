//! Connect calls as the SDKs make them, over plain sockets: unary calls in JSON, and server
//! streams read as they arrive, envelope by envelope, whatever the pieces the bytes come in
//! (JSON messages, or the raw envelopes of any codec: `open_raw`, `next_envelope_within`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Daemon, Reply, TOKEN};

/// `base64("user:")`, as the SDKs send the user.
pub const AS_USER: &str = "Basic dXNlcjo=";
/// How long a stream's next message is waited for by default.
pub const WAIT: Duration = Duration::from_secs(10);

/// One envelope: flags, big-endian length, message.
pub fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A unary call to `/<procedure>` with the token and `headers`.
pub fn unary(daemon: &Daemon, procedure: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![
        ("X-Access-Token", TOKEN),
        ("Content-Type", "application/json"),
    ];
    all.extend_from_slice(headers);
    daemon.call_with(
        "POST",
        &format!("/{procedure}"),
        &all,
        body.to_string().as_bytes(),
    )
}

/// One message of a stream: its JSON, and whether it is the end-of-stream one.
#[derive(Debug)]
pub struct Message {
    pub end: bool,
    pub json: Value,
}

/// One envelope of a stream: its flags and its message's bytes, in whatever codec.
#[derive(Debug)]
pub struct Envelope {
    pub flags: u8,
    pub message: Vec<u8>,
}

/// A server-streaming call, read as it arrives.
pub struct Stream {
    pub socket: TcpStream,
    pub status: u16,
    headers: Vec<(String, String)>,
    chunked: bool,
    raw: Vec<u8>,
    body: Vec<u8>,
    ended: bool,
}

impl Stream {
    /// Calls `/<procedure>` with `request` as its one enveloped message, the token and
    /// `headers`, and reads the answer's head.
    pub fn open(
        daemon: &Daemon,
        procedure: &str,
        request: &Value,
        headers: &[(&str, &str)],
    ) -> Stream {
        let body = envelope(0, request.to_string().as_bytes());
        Stream::open_raw(
            daemon,
            procedure,
            "application/connect+json",
            &body,
            headers,
        )
    }

    /// Calls `/<procedure>` with `body` (its envelopes, as they are) sent as `content_type`,
    /// the token and `headers`, and reads the answer's head.
    pub fn open_raw(
        daemon: &Daemon,
        procedure: &str,
        content_type: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Stream {
        let mut head = format!(
            "POST /{procedure} HTTP/1.1\r\nHost: test\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Type: {content_type}\r\nConnect-Protocol-Version: 1\r\n\
             Content-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut socket = daemon.connect();
        socket.write_all(head.as_bytes()).unwrap();
        socket.write_all(body).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut stream = Stream {
            socket,
            status: 0,
            headers: Vec::new(),
            chunked: false,
            raw: Vec::new(),
            body: Vec::new(),
            ended: false,
        };
        let deadline = Instant::now() + WAIT;
        let end = loop {
            if let Some(at) = stream.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            assert!(Instant::now() < deadline, "no answer head");
            stream.fill();
        };
        let head = String::from_utf8(stream.raw[..end].to_vec()).unwrap();
        stream.raw.drain(..end + 4);
        let mut lines = head.split("\r\n");
        stream.status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        for line in lines {
            let (name, value) = line.split_once(':').unwrap();
            stream
                .headers
                .push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        stream.chunked = stream.header("transfer-encoding") == Some("chunked");
        stream
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str())
    }

    /// Reads what has arrived (at most 100 ms of waiting).
    fn fill(&mut self) -> usize {
        let mut buf = vec![0u8; 1 << 20];
        match self.socket.read(&mut buf) {
            Ok(0) => {
                self.ended = true;
                0
            }
            Ok(n) => {
                self.raw.extend_from_slice(&buf[..n]);
                n
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                0
            }
            Err(_) => {
                self.ended = true;
                0
            }
        }
    }

    /// Moves the complete chunks of `raw` to `body`.
    fn dechunk(&mut self) {
        if !self.chunked {
            self.body.append(&mut self.raw);
            return;
        }
        let mut at = 0;
        while let Some(line_end) = self.raw[at..].windows(2).position(|w| w == b"\r\n") {
            let size = std::str::from_utf8(&self.raw[at..at + line_end]).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let start = at + line_end + 2;
            if self.raw.len() < start + size + 2 {
                break;
            }
            self.body.extend_from_slice(&self.raw[start..start + size]);
            at = start + size + 2;
        }
        self.raw.drain(..at);
    }

    /// The next message, waiting at most `limit`.
    pub fn next_within(&mut self, limit: Duration) -> Option<Message> {
        let envelope = self.next_envelope_within(limit)?;
        let json = serde_json::from_slice(&envelope.message).unwrap();
        Some(Message {
            end: envelope.flags & 0x02 != 0,
            json,
        })
    }

    /// The next envelope as it came (any codec), waiting at most `limit`.
    pub fn next_envelope_within(&mut self, limit: Duration) -> Option<Envelope> {
        let deadline = Instant::now() + limit;
        loop {
            self.dechunk();
            if self.body.len() >= 5 {
                let len = u32::from_be_bytes(self.body[1..5].try_into().unwrap()) as usize;
                if self.body.len() >= 5 + len {
                    let flags = self.body[0];
                    let message = self.body[5..5 + len].to_vec();
                    self.body.drain(..5 + len);
                    return Some(Envelope { flags, message });
                }
            }
            if self.ended || Instant::now() >= deadline {
                return None;
            }
            self.fill();
        }
    }

    pub fn next(&mut self) -> Message {
        self.next_within(WAIT).expect("a message within 10 s")
    }

    /// The end-of-stream message's error as (code, message), `None` for a clean end.
    pub fn end_error(message: &Message) -> Option<(String, String)> {
        assert!(message.end, "not the end of the stream: {message:?}");
        let error = message.json.get("error")?;
        let text = |v: &Value| v.as_str().unwrap_or("none").to_string();
        Some((text(&error["code"]), text(&error["message"])))
    }
}
