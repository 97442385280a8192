//! Request bodies: framing by `Content-Length` or chunked encoding, `Expect: 100-continue`.
//!
//! A [`Body`] reads exactly the body of one request from the connection and never past it, so
//! the next pipelined request stays in the buffer. Nothing is allocated by a declared length.
//! After the handler, the layer discards what it left unread, up to a cap.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use super::chunked::{ChunkedDecoder, Next};
use super::stream::Stream;

/// How a request body is delimited.
#[derive(Debug, Clone)]
pub enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
}

/// Why the framing headers were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramingError {
    BadContentLength,
    UnsupportedTransferEncoding,
    Conflicting,
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FramingError::BadContentLength => "invalid Content-Length header",
            FramingError::UnsupportedTransferEncoding => {
                "unsupported Transfer-Encoding: only chunked is accepted"
            }
            FramingError::Conflicting => "both Content-Length and Transfer-Encoding sent",
        })
    }
}

impl Framing {
    /// Decides the framing from the `Content-Length` and `Transfer-Encoding` values sent.
    pub fn from_headers<'a>(
        content_lengths: impl Iterator<Item = &'a [u8]>,
        transfer_encodings: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Framing, FramingError> {
        let mut length: Option<u64> = None;
        for value in content_lengths {
            let parsed = parse_length(value).ok_or(FramingError::BadContentLength)?;
            if length.is_some_and(|l| l != parsed) {
                return Err(FramingError::BadContentLength);
            }
            length = Some(parsed);
        }
        let codings: Vec<&[u8]> = transfer_encodings
            .flat_map(|v| v.split(|&b| b == b','))
            .map(|c| c.trim_ascii())
            .filter(|c| !c.is_empty())
            .collect();
        match (codings.as_slice(), length) {
            ([], length) => Ok(Framing::Length(length.unwrap_or(0))),
            ([_, ..], Some(_)) => Err(FramingError::Conflicting),
            ([coding], None) if coding.eq_ignore_ascii_case(b"chunked") => {
                Ok(Framing::Chunked(ChunkedDecoder::default()))
            }
            _ => Err(FramingError::UnsupportedTransferEncoding),
        }
    }
}

fn parse_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// Slowest average body rate accepted once the body timeout has passed since the first read (the
/// default of Apache's mod_reqtimeout). The per-read timeout alone would let a client that sends
/// a byte just before each timeout hold a worker forever.
pub const MIN_BODY_RATE: u64 = 500;

/// The body of the request being handled. Reading it sends `100 Continue` first when the client
/// asked for it; a body never read is never asked for.
pub struct Body<'a> {
    stream: &'a mut Stream,
    framing: Framing,
    expects_continue: bool,
    timeout: Duration,
    /// When the first body byte was asked for, and how many arrived since (for the minimum rate).
    started: Option<Instant>,
    received: u64,
    /// Set when the stream can no longer be trusted to be at a request boundary.
    broken: bool,
}

impl<'a> Body<'a> {
    pub fn new(
        stream: &'a mut Stream,
        framing: Framing,
        expects_continue: bool,
        timeout: Duration,
    ) -> Body<'a> {
        Body {
            stream,
            framing,
            expects_continue,
            timeout,
            started: None,
            received: 0,
            broken: false,
        }
    }

    /// The declared length, when framed by `Content-Length`.
    pub fn declared_length(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            Framing::Chunked(_) => None,
        }
    }

    /// True when every byte of the body has been read.
    pub fn is_complete(&self) -> bool {
        match &self.framing {
            Framing::Length(remaining) => *remaining == 0,
            Framing::Chunked(decoder) => decoder.is_done(),
        }
    }

    /// Reads the whole body if it is at most `limit` bytes. `Ok(None)`: it is larger (the
    /// connection will be closed). The buffer grows with what arrives, not with what was declared.
    pub fn read_to_end_limited(&mut self, limit: usize) -> io::Result<Option<Vec<u8>>> {
        if self.declared_length().is_some_and(|n| n > limit as u64) {
            return Ok(None);
        }
        let mut out = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = self.read(&mut chunk)?;
            if n == 0 {
                return Ok(Some(out));
            }
            if out.len() + n > limit {
                return Ok(None);
            }
            out.extend_from_slice(&chunk[..n]);
        }
    }

    /// Discards the unread body up to `cap` bytes. True when the connection is still at a
    /// request boundary and may be reused.
    pub(crate) fn finish(&mut self, cap: u64) -> bool {
        if self.is_complete() {
            return !self.broken;
        }
        if self.broken || self.expects_continue {
            // A client waiting for 100 Continue that was never sent may or may not send the
            // body now: the stream position is unknowable, so the connection must close.
            return false;
        }
        if self.declared_length().is_some_and(|n| n > cap) {
            return false;
        }
        let mut discarded = 0u64;
        let mut scratch = [0u8; 8192];
        while discarded <= cap {
            match self.read(&mut scratch) {
                Ok(0) => return self.is_complete() && !self.broken,
                Ok(n) => discarded += n as u64,
                Err(_) => return false,
            }
        }
        false
    }

    fn send_continue_once(&mut self) -> io::Result<()> {
        if self.expects_continue {
            self.expects_continue = false;
            if !self.is_complete() {
                self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
            }
        }
        Ok(())
    }

    /// A read timeout surfaces as `EAGAIN` ("Resource temporarily unavailable"): say what it means.
    fn explain(&self, error: io::Error) -> io::Error {
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                if error.raw_os_error().is_some() =>
            {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no request body bytes for {:?}", self.timeout),
                )
            }
            _ => error,
        }
    }

    /// Fails once the body has taken longer than the timeout at less than [`MIN_BODY_RATE`].
    fn check_rate(&mut self) -> io::Result<()> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let elapsed = started.elapsed();
        if elapsed > self.timeout && self.received < MIN_BODY_RATE * elapsed.as_secs() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("request body slower than {MIN_BODY_RATE} bytes/s"),
            ));
        }
        Ok(())
    }

    fn read_framed(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.send_continue_once()?;
        self.check_rate()?;
        self.stream.set_read_timeout(self.timeout)?;
        match &mut self.framing {
            Framing::Length(remaining) => {
                let want = out
                    .len()
                    .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                if want == 0 {
                    return Ok(0);
                }
                let n = self.stream.read_into(&mut out[..want])?;
                if n == 0 {
                    return Err(truncated());
                }
                *remaining -= n as u64;
                Ok(n)
            }
            Framing::Chunked(decoder) => loop {
                let (used, next) = decoder
                    .advance(self.stream.buffered())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                self.stream.consume(used);
                match next {
                    Next::Done => return Ok(0),
                    Next::Data(remaining) => {
                        let want = out
                            .len()
                            .min(usize::try_from(remaining).unwrap_or(usize::MAX));
                        let n = self.stream.read_into(&mut out[..want])?;
                        if n == 0 {
                            return Err(truncated());
                        }
                        decoder.consumed_data(n as u64);
                        return Ok(n);
                    }
                    Next::NeedMore => {
                        if self.stream.fill()? == 0 {
                            return Err(truncated());
                        }
                    }
                }
            },
        }
    }
}

impl Read for Body<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let result = self.read_framed(out).map_err(|e| self.explain(e));
        match &result {
            Ok(n) => self.received += *n as u64,
            Err(_) => self.broken = true,
        }
        result
    }
}

fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed before the end of the request body",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(lengths: &[&str], encodings: &[&str]) -> Result<Framing, FramingError> {
        Framing::from_headers(
            lengths.iter().map(|s| s.as_bytes()),
            encodings.iter().map(|s| s.as_bytes()),
        )
    }

    #[test]
    fn content_length_values() {
        assert!(matches!(framing(&[], &[]), Ok(Framing::Length(0))));
        assert!(matches!(framing(&["42"], &[]), Ok(Framing::Length(42))));
        assert!(matches!(
            framing(&[" 7 ", "7"], &[]),
            Ok(Framing::Length(7))
        ));
        assert!(matches!(
            framing(&["18446744073709551615"], &[]),
            Ok(Framing::Length(u64::MAX))
        ));
        for bad in ["18446744073709551616", "-1", "+1", "1e3", "", "0x10", "1 2"] {
            assert_eq!(
                framing(&[bad], &[]).unwrap_err(),
                FramingError::BadContentLength,
                "{bad}"
            );
        }
        assert_eq!(
            framing(&["1", "2"], &[]).unwrap_err(),
            FramingError::BadContentLength
        );
    }

    #[test]
    fn transfer_encoding_values() {
        assert!(matches!(
            framing(&[], &["Chunked"]),
            Ok(Framing::Chunked(_))
        ));
        assert_eq!(
            framing(&["5"], &["chunked"]).unwrap_err(),
            FramingError::Conflicting
        );
        assert_eq!(
            framing(&[], &["gzip, chunked"]).unwrap_err(),
            FramingError::UnsupportedTransferEncoding
        );
        assert_eq!(
            framing(&[], &["identity"]).unwrap_err(),
            FramingError::UnsupportedTransferEncoding
        );
    }
}
