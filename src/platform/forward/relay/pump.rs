//! One forwarded connection and the moving of its bytes: a [`Pair`] of sockets, a [`Flow`] per
//! direction, and [`Pair::step`], which moves both directions as far as they go without
//! waiting (read/write through the shared scratch buffer; `splice` through the direction's
//! pipe once it is a bulk transfer and the relay's share of descriptors allows the pipe).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use super::share::Share;
use super::{PIPE_BYTES, TURN_BYTES};
use crate::sys::epoll::{ENDED, READABLE, WRITABLE};
use crate::sys::net::splice;

/// One direction of a connection.
#[derive(Default)]
pub(super) struct Flow {
    /// Read but not yet written.
    pub(super) pending: Vec<u8>,
    /// A bulk direction's pipe (read end, write end): bytes then move by `splice`, socket to
    /// pipe to socket, without a copy through the daemon's memory. Made when a read fills the
    /// whole scratch buffer, kept while the connection lasts.
    pub(super) pipe: Option<(OwnedFd, OwnedFd)>,
    /// Bytes in the pipe, not yet spliced on.
    pub(super) in_pipe: usize,
    /// The source ended (or failed to be read from).
    pub(super) eof: bool,
    /// The end was passed on.
    pub(super) shut: bool,
    /// The source was read dry: nothing is tried on it until epoll reports it readable again
    /// (a short read empties a TCP socket, and what arrives after it is a new edge).
    pub(super) src_idle: bool,
    /// The source reported its end (or an error): read on until it, whatever a read's size.
    pub(super) src_ending: bool,
    /// The destination refused a write: nothing is written until it is reported writable.
    pub(super) dst_full: bool,
}

pub(super) struct Pair {
    pub(super) port: u16,
    pub(super) client: TcpStream,
    pub(super) upstream: TcpStream,
    pub(super) connected: bool,
    /// Client to upstream, upstream to client.
    pub(super) flows: [Flow; 2],
    /// Its last event (the relay's clock, read once a turn): the connection idle longest is
    /// the one given up when the HTTP server needs a descriptor.
    pub(super) last_active: Instant,
}

pub(super) enum Progress {
    /// Both directions wait for readiness (or have ended).
    Waiting,
    /// The turn's bytes ran out with more to move.
    More,
    /// Closed both ways, or the upstream could not be reached: close the pair.
    Finished,
    /// Moving bytes failed: close the pair with a reset both ways (a peer must not take the
    /// cut stream for a whole one).
    Failed,
}

impl Pair {
    /// A connection just accepted (or taken back), its two sockets.
    pub(super) fn new(port: u16, client: TcpStream, upstream: TcpStream, connected: bool) -> Pair {
        Pair {
            port,
            client,
            upstream,
            connected,
            flows: Default::default(),
            last_active: Instant::now(),
        }
    }

    /// Takes in what epoll reported of one of its sockets (`upstream`: that one, else the
    /// client's): the direction it is the source of may be read, the one it is the
    /// destination of written.
    pub(super) fn note(&mut self, upstream: bool, ready: u32) {
        let [to_upstream, to_client] = &mut self.flows;
        let (from, to) = if upstream {
            (to_client, to_upstream)
        } else {
            (to_upstream, to_client)
        };
        if ready & READABLE != 0 {
            from.src_idle = false;
        }
        if ready & ENDED != 0 {
            from.src_ending = true;
        }
        if ready & WRITABLE != 0 {
            to.dst_full = false;
        }
    }

    /// The descriptors it holds: its two sockets and its pipes' ends.
    pub(super) fn descriptors(&self) -> usize {
        2 + 2 * self.flows.iter().filter(|f| f.pipe.is_some()).count()
    }

    /// Moves both directions as far as they go now; pipes for bulk directions come from
    /// `share`.
    pub(super) fn step(&mut self, scratch: &mut [u8], share: &mut Share) -> Progress {
        if !self.connected {
            match self.upstream.take_error() {
                Ok(None) => {}
                _ => return Progress::Finished,
            }
            // Connected once the peer address is known; until then still under way.
            if self.upstream.peer_addr().is_err() {
                return Progress::Waiting;
            }
            self.connected = true;
        }
        let mut budget = TURN_BYTES;
        let [to_upstream, to_client] = &mut self.flows;
        let a = pump(
            &self.client,
            &self.upstream,
            to_upstream,
            scratch,
            &mut budget,
            share,
        );
        let b = pump(
            &self.upstream,
            &self.client,
            to_client,
            scratch,
            &mut budget,
            share,
        );
        match (a, b) {
            (Err(_), _) | (_, Err(_)) => Progress::Failed,
            _ if to_upstream.shut && to_client.shut => Progress::Finished,
            (Ok(true), _) | (_, Ok(true)) => Progress::More,
            _ => Progress::Waiting,
        }
    }
}

/// Moves bytes from `src` to `dst` until one would wait, the source ends (passed on as a
/// half-close) or `budget` runs out (then `Ok(true)`). An error means the pair is done. A side
/// known to be dry or full is not asked again before its event (no system call that would
/// only say `EAGAIN`: a small exchange costs a read and a write per direction).
fn pump(
    mut src: &TcpStream,
    mut dst: &TcpStream,
    flow: &mut Flow,
    scratch: &mut [u8],
    budget: &mut usize,
    share: &mut Share,
) -> io::Result<bool> {
    loop {
        if (flow.in_pipe > 0 || !flow.pending.is_empty()) && flow.dst_full {
            return Ok(false);
        }
        if flow.in_pipe > 0 {
            let Some((pipe, _)) = &flow.pipe else {
                return Err(io::Error::other("bytes counted in a pipe that is gone"));
            };
            match splice(pipe.as_fd(), dst.as_fd(), flow.in_pipe) {
                Ok(n) => {
                    flow.in_pipe = flow.in_pipe.saturating_sub(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.dst_full = true;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        if !flow.pending.is_empty() {
            match dst.write(&flow.pending) {
                Ok(n) if n == flow.pending.len() => {
                    // Nothing held while nothing waits.
                    flow.pending = Vec::new();
                    continue;
                }
                Ok(n) => {
                    flow.pending.drain(..n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.dst_full = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if flow.eof {
            if !flow.shut {
                flow.shut = true;
                dst.shutdown(Shutdown::Write)?;
            }
            return Ok(false);
        }
        if *budget == 0 {
            return Ok(true);
        }
        if flow.src_idle {
            return Ok(false);
        }
        if let Some((_, pipe)) = &flow.pipe {
            // The pipe is empty here: `WouldBlock` means the source has nothing.
            match splice(src.as_fd(), pipe.as_fd(), PIPE_BYTES) {
                // The end of the stream, or data the kernel would not splice while the peer's
                // end was already queued (`tcp_splice_read` answers 0 then): the read below
                // tells which, so no byte is taken for an end.
                Ok(0) => {}
                Ok(n) => {
                    flow.in_pipe = n;
                    *budget = budget.saturating_sub(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    flow.src_idle = true;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        let read = match src.read(scratch) {
            Ok(0) => {
                flow.eof = true;
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                flow.src_idle = true;
                return Ok(false);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Short of the buffer: the socket is empty now (unless its end is queued behind).
        if read < scratch.len() && !flow.src_ending {
            flow.src_idle = true;
        }
        *budget = budget.saturating_sub(read);
        if read == scratch.len() && flow.pipe.is_none() {
            // A bulk transfer: splice from now on (without a pipe, past the share or none to
            // be had, reads go on as before).
            flow.pipe = share.pipe(PIPE_BYTES);
        }
        let written = match dst.write(&scratch[..read]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                flow.dst_full = true;
                0
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        if written < read {
            flow.pending.extend_from_slice(&scratch[written..read]);
            flow.pending.shrink_to_fit();
        }
    }
}
