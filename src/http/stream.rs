//! One connection's socket with its read buffer: the bytes read but not yet consumed.
//!
//! The buffer belongs to the worker serving the connection and is reused across connections;
//! bytes left over when a connection goes back to idle (pipelined requests) move into the
//! connection itself, so an idle connection holds no buffer.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::head::MAX_HEAD_BYTES;
use crate::sys::net;

/// Size of a worker's read buffer: one maximal head plus room for the start of a body.
pub const BUFFER_BYTES: usize = MAX_HEAD_BYTES + 16 * 1024;

pub struct Stream {
    pub socket: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    read_timeout: Option<Duration>,
}

impl Stream {
    /// Wraps `socket`, reusing `buf` (any length) and starting with `pending` bytes.
    pub fn new(socket: TcpStream, mut buf: Vec<u8>, pending: &[u8]) -> Stream {
        buf.resize(BUFFER_BYTES.max(pending.len()), 0);
        buf[..pending.len()].copy_from_slice(pending);
        Stream {
            socket,
            buf,
            start: 0,
            end: pending.len(),
            read_timeout: None,
        }
    }

    /// Gives back the socket, the unconsumed bytes, and the buffer for reuse.
    pub fn into_parts(self) -> (TcpStream, Vec<u8>, Vec<u8>) {
        let pending = self.buf[self.start..self.end].to_vec();
        (self.socket, pending, self.buf)
    }

    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more from the socket after the buffered bytes; returns how many (0: end of stream).
    /// Fails with `OutOfMemory` when the buffer is full.
    pub fn fill(&mut self) -> io::Result<usize> {
        if self.end == self.buf.len() && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "read buffer full",
            ));
        }
        let n = retry(|| self.socket.read(&mut self.buf[self.end..]))?;
        self.end += n;
        Ok(n)
    }

    /// Checks, without waiting, whether the peer already sent more bytes; reads them if so.
    /// `Ok(None)`: nothing yet. `Ok(Some(0))`: the peer closed.
    pub fn fill_nonblocking(&mut self) -> io::Result<Option<usize>> {
        if self.end == self.buf.len() {
            return Ok(Some(0));
        }
        match net::recv_nonblocking(self.socket.as_raw_fd(), &mut self.buf[self.end..]) {
            Ok(n) => {
                self.end += n;
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads into `out`: buffered bytes first, then straight from the socket.
    pub fn read_into(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.start < self.end {
            let n = out.len().min(self.end - self.start);
            out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.consume(n);
            return Ok(n);
        }
        retry(|| self.socket.read(out))
    }

    /// Sets the socket's read timeout, skipping the system call when it is unchanged.
    pub fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        let timeout = Some(timeout.max(Duration::from_millis(1)));
        if self.read_timeout != timeout {
            self.socket.set_read_timeout(timeout)?;
            self.read_timeout = timeout;
        }
        Ok(())
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.socket.write_all(bytes)
    }
}

/// Retries a call interrupted by a signal.
fn retry(mut call: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
    loop {
        match call() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
