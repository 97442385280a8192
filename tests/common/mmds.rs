//! A fake of Firecracker's metadata service (MMDS v2) on 127.0.0.1:0: a session token by `PUT
//! /latest/api/token`, the metadata by `GET /` as JSON; it can stall or answer garbage, and it
//! counts reads and requests outside the protocol. The host tests give its address to the daemon
//! (`--mmds-address`); the VM tests (vm/tests/) forward the guest's metadata address to it (`guestfwd`). It
//! only listens on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha512};

const MMDS_TOKEN: &str = "mmds-session-token-1";

/// What the fake serves and what it saw.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) metadata: serde_json::Value,
    /// Accept connections but never answer.
    pub(crate) stall: bool,
    /// Answer each request this late.
    pub(crate) late: Duration,
    /// Answer the metadata with this text instead of the JSON.
    pub(crate) garbage: Option<&'static str>,
    /// Requests that broke MMDS v2's protocol, described.
    violations: Vec<String>,
    metadata_reads: usize,
    /// Connections accepted.
    connections: usize,
}

/// A fake MMDS v2 on 127.0.0.1:0, one thread per connection.
pub(crate) struct FakeMmds {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl FakeMmds {
    pub(crate) fn start(metadata: serde_json::Value) -> FakeMmds {
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

    pub(crate) fn set(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap());
    }

    pub(crate) fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    pub(crate) fn reads(&self) -> usize {
        self.state.lock().unwrap().metadata_reads
    }

    pub(crate) fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }
}

/// One connection: checks the request against MMDS v2 and answers it, or stalls.
fn serve(mut stream: TcpStream, state: &Mutex<State>) {
    state.lock().unwrap().connections += 1;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let (stall, late) = {
        let state = state.lock().unwrap();
        (state.stall, state.late)
    };
    if stall {
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    std::thread::sleep(late);
    let head = String::from_utf8_lossy(&head).to_string();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    };
    let request_line = head.lines().next().unwrap_or("").to_string();
    let (status, body) = if request_line.starts_with("PUT /latest/api/token ") {
        match header("x-metadata-token-ttl-seconds").and_then(|t| t.parse::<u32>().ok()) {
            Some(1..=21600) => (200, MMDS_TOKEN.to_string()),
            _ => (400, "bad ttl".to_string()),
        }
    } else if request_line.starts_with("GET / ") {
        let mut state = state.lock().unwrap();
        if header("x-metadata-token").as_deref() != Some(MMDS_TOKEN) {
            (401, "no token".to_string())
        } else if header("accept").as_deref() != Some("application/json") {
            (406, "json only".to_string())
        } else {
            state.metadata_reads += 1;
            match state.garbage {
                Some(text) => (200, text.to_string()),
                None => (200, state.metadata.to_string()),
            }
        }
    } else {
        (405, String::new())
    };
    if status != 200 {
        state
            .lock()
            .unwrap()
            .violations
            .push(format!("{status}: {request_line}"));
    }
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len()
    );
}

pub(crate) fn sha512_hex(text: &str) -> String {
    Sha512::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
