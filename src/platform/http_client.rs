//! A minimal HTTP/1.1 client for the platform's own services on the host (the metadata
//! service, the logs collector): one request per connection (`Connection: close`), a timeout on
//! every socket operation and on the exchange as a whole, an answer bounded in size, read by
//! its `Content-Length` or to the close (a transfer-encoded answer is refused).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Sends `request` on a new connection and returns the answer's status and body (at most
/// `max` bytes of answer in all). `timeout` bounds the connect and the exchange as a whole.
pub fn exchange(
    address: SocketAddr,
    timeout: Duration,
    request: &[u8],
    max: usize,
) -> Result<(u16, Vec<u8>), String> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(|e| e.to_string())?;
    // What is left of `timeout` after the connect bounds the write; the reads share the rest.
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("no answer in time".into());
    }
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    stream.write_all(request).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no complete answer in time".into());
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.len() > max {
            return Err(format!("answer longer than {max} bytes"));
        }
        if body_complete(&answer) {
            break;
        }
    }
    split_answer(&answer)
}

/// Whether `answer` holds a head and the whole body its `Content-Length` announces.
fn body_complete(answer: &[u8]) -> bool {
    let Some(end) = head_end(answer) else {
        return false;
    };
    content_length(&answer[..end]).is_some_and(|length| answer.len() - end >= length)
}

/// The offset after the head's blank line.
fn head_end(answer: &[u8]) -> Option<usize> {
    answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

fn content_length(head: &[u8]) -> Option<usize> {
    String::from_utf8_lossy(head)
        .lines()
        .skip(1)
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
}

/// The status and body of a complete answer (its `Content-Length`, else up to the close).
fn split_answer(answer: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = head_end(answer).ok_or("the answer has no complete head")?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or("the answer has no status")?;
    if head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && !value.trim().eq_ignore_ascii_case("identity")
        })
    }) {
        return Err("a transfer-encoded answer is not supported".into());
    }
    let body = &answer[end..];
    match content_length(&answer[..end]) {
        Some(length) if body.len() < length => Err("the answer's body was cut short".into()),
        Some(length) => Ok((status, body[..length].to_vec())),
        None => Ok((status, body.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_split_by_their_length_and_status() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef";
        assert!(body_complete(ok));
        assert_eq!(split_answer(ok).unwrap(), (200, b"abc".to_vec()));
        let short = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc";
        assert!(!body_complete(short));
        assert!(split_answer(short).is_err());
        assert_eq!(
            split_answer(b"HTTP/1.1 200 OK\r\n\r\nto-the-close").unwrap(),
            (200, b"to-the-close".to_vec())
        );
        assert_eq!(
            split_answer(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n").unwrap(),
            (401, Vec::new())
        );
        assert!(
            split_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc").is_err()
        );
        assert!(split_answer(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
