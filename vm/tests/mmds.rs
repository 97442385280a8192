//! The metadata service as the guest sees it at 169.254.169.254:80: a fake of Firecracker's MMDS
//! v2 on the host's 127.0.0.1, reached through QEMU's `guestfwd` (one `socat` per connection).
//! It holds the sandbox's identity and the hash of the token `/init` may set, and counts what it
//! was asked. Nothing here contacts any address: it only listens on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha512};

const SESSION_TOKEN: &str = "vm-mmds-session-token";

#[derive(Default)]
struct State {
    metadata: Value,
    reads: usize,
    /// Requests outside MMDS v2's protocol, described.
    violations: Vec<String>,
}

/// A fake MMDS v2 on 127.0.0.1:0, one thread per connection, for as long as the test runs.
pub struct FakeMmds {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

/// Lower-case hex SHA-512, envd's `keys.HashAccessToken`.
pub fn sha512_hex(text: &str) -> String {
    let digest = Sha512::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// E2B's metadata for sandbox `id` of template `template`, whose `/init` may set `token`.
pub fn metadata(id: &str, template: &str, token: &str) -> Value {
    json!({"instanceID": id, "envID": template, "address": "", "accessTokenHash": sha512_hex(token)})
}

impl FakeMmds {
    pub fn start(metadata: Value) -> FakeMmds {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            metadata,
            ..State::default()
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        FakeMmds { addr, state }
    }

    pub fn set(&self, metadata: Value) {
        self.state.lock().unwrap().metadata = metadata;
    }

    /// How many times the metadata was read.
    pub fn reads(&self) -> usize {
        self.state.lock().unwrap().reads
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    };
    let request_line = head.lines().next().unwrap_or("").to_string();
    let mut state = state.lock().unwrap();
    let (status, body) = if request_line.starts_with("PUT /latest/api/token ") {
        match header("x-metadata-token-ttl-seconds").and_then(|t| t.parse::<u32>().ok()) {
            Some(1..=21600) => (200, SESSION_TOKEN.to_string()),
            _ => (400, "bad ttl".to_string()),
        }
    } else if request_line.starts_with("GET / ") {
        if header("x-metadata-token").as_deref() != Some(SESSION_TOKEN) {
            (401, "no token".to_string())
        } else {
            state.reads += 1;
            (200, state.metadata.to_string())
        }
    } else {
        (405, String::new())
    };
    if status != 200 {
        state.violations.push(format!("{status}: {request_line}"));
    }
    drop(state);
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len()
    );
}
