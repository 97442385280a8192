//! A response as the tests read it off a socket: status, headers and body, and the checks of
//! SPEC §2's error answers.

use std::io::BufRead;
use std::net::TcpStream;

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    /// Asserts an SPEC §2 error: status, JSON content type, `code`, and the exact message.
    pub fn assert_error(&self, status: u16, message: &str) {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        let json = self.json();
        assert_eq!(json["code"], status);
        assert_eq!(json["message"], message);
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Whether anything (an answer, or the end) has arrived on `stream`, without waiting for it.
pub fn answered_yet(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let peeked = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false).unwrap();
    match peeked {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("peek: {e}"),
    }
}

/// Reads one response from `reader`. `head_only`: the request was HEAD (no body follows).
pub fn read_reply(reader: &mut impl BufRead, head_only: bool) -> Option<Reply> {
    let mut status_line = String::new();
    if reader.read_line(&mut status_line).ok()? == 0 {
        return None;
    }
    let status: u16 = status_line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.to_string(), value.trim().to_string()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if status == 100 {
        return Some(reply);
    }
    let no_body = head_only || status == 204 || status == 304;
    match reply
        .header("content-length")
        .map(|v| v.parse::<usize>().unwrap())
    {
        _ if no_body => {}
        Some(len) => {
            reply.body.resize(len, 0);
            std::io::Read::read_exact(reader, &mut reply.body).ok()?;
        }
        None => {
            std::io::Read::read_to_end(reader, &mut reply.body).ok()?;
        }
    }
    Some(reply)
}
