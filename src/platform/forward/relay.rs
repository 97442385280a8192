//! The relay: the forward listeners and every forwarded connection, in one thread's epoll.
//!
//! Each accepted connection is joined to a new non-blocking connection to the loopback
//! listener, and bytes flow both ways as each side is ready: read into one scratch buffer
//! shared by all connections, written straight on; only what the other side could not take at
//! once is kept (at most one read per direction), and its side is not read again until that is
//! written, so a peer that stops reading holds that much memory and nothing else waits on it.
//! A direction whose read fills the whole scratch buffer is a bulk transfer: it gets a pipe and
//! moves by `splice` from then on (socket to pipe to socket, no copy through the daemon's
//! memory: half the CPU per GiB, docs/performance.md), the pipe holding what the other side
//! has not taken yet. Small exchanges never make a pipe, so an idle connection holds two
//! descriptors, a bulk one up to six.
//! Registrations are edge-triggered: each readiness change is reported once, and every event
//! moves a connection as far as it can go (within [`TURN_BYTES`], then it waits its turn
//! behind the others). An end of stream on one side is passed on as a half-close of the other
//! (`shutdown(SHUT_WR)`, after what was pending); when both directions have ended both sockets
//! are closed together, and when either side fails both are reset, so that a peer never takes
//! a cut stream for a whole one (a clean close after a failure looked like a complete transfer).
//!
//! Across a live upgrade ([`carried`]) the relay is parked between two turns and its
//! listeners, connections and pipes cross the `execve` as descriptors.

mod carried;

pub use carried::Restored;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::log;
use crate::sys::epoll::{Epoll, EDGE_ALL, EDGE_IN};
use crate::sys::net::{connect_nonblocking, reset_on_close, splice, splice_pipe};

/// The scratch buffer every transfer reads into.
const SCRATCH: usize = 128 << 10;
/// The size asked for a bulk direction's pipe.
const PIPE_BYTES: usize = 256 << 10;
/// Most bytes one connection moves per turn before others get theirs.
const TURN_BYTES: usize = 4 << 20;
/// Most connections one listener accepts per turn.
const ACCEPTS_PER_TURN: usize = 64;
/// The token of the supervisor's eventfd.
pub const WAKE: u64 = 0;
const LISTENER: u64 = 1 << 63;
/// Refusals of one port are logged at most this often (the rest are counted in the next line).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// What the supervisor asks of the relay.
pub enum Command {
    /// Serve `listener` (bound on the forward address), joining each connection to `upstream`.
    Open {
        listener: TcpListener,
        upstream: SocketAddr,
    },
    /// Close the listener of this port and every connection it accepted.
    Close { port: u16 },
}

struct Port {
    port: u16,
    listener: TcpListener,
    upstream: SocketAddr,
    open: usize,
    refused_unlogged: u64,
    last_refusal_log: Option<Instant>,
    /// The upstream's refusal was logged; said again only after a connection got through.
    unreachable_said: bool,
}

/// One direction of a connection.
#[derive(Default)]
struct Flow {
    /// Read but not yet written.
    pending: Vec<u8>,
    /// A bulk direction's pipe (read end, write end): bytes then move by `splice`, socket to
    /// pipe to socket, without a copy through the daemon's memory. Made when a read fills the
    /// whole scratch buffer, kept while the connection lasts.
    pipe: Option<(OwnedFd, OwnedFd)>,
    /// Bytes in the pipe, not yet spliced on.
    in_pipe: usize,
    /// The source ended (or failed to be read from).
    eof: bool,
    /// The end was passed on.
    shut: bool,
}

struct Pair {
    port: u16,
    client: TcpStream,
    upstream: TcpStream,
    connected: bool,
    /// Client to upstream, upstream to client.
    flows: [Flow; 2],
}

enum Progress {
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

pub struct Relay {
    epoll: Epoll,
    /// Few (the cap on ports): searched in order.
    ports: Vec<Port>,
    /// Indexed by a connection's number, which its sockets' tokens carry; `None` is free.
    pairs: Vec<Option<Pair>>,
    free: Vec<usize>,
    scratch: Box<[u8]>,
    /// Tokens with work left over from the last turn.
    again: Vec<u64>,
    events: Vec<u64>,
    per_port: usize,
}

impl Relay {
    pub fn new(per_port: usize) -> io::Result<Relay> {
        Ok(Relay {
            epoll: Epoll::new()?,
            ports: Vec::new(),
            pairs: Vec::new(),
            free: Vec::new(),
            scratch: vec![0; SCRATCH].into_boxed_slice(),
            again: Vec::new(),
            events: Vec::with_capacity(256),
            per_port,
        })
    }

    /// Registers the supervisor's eventfd under [`WAKE`].
    pub fn watch_wake(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        self.epoll.add(fd, WAKE, EDGE_IN)
    }

    pub fn apply(&mut self, command: Command) {
        match command {
            Command::Open { listener, upstream } => self.open(listener, upstream),
            Command::Close { port } => self.close_port(port),
        }
    }

    fn open(&mut self, listener: TcpListener, upstream: SocketAddr) {
        let port = upstream.port();
        if let Err(e) = listener.set_nonblocking(true).and_then(|()| {
            self.epoll
                .add(listener.as_fd(), LISTENER | u64::from(port), EDGE_IN)
        }) {
            log::line(format_args!(
                "forward :{port}: cannot watch its listener: {e}"
            ));
            return;
        }
        self.ports.retain(|p| p.port != port);
        self.ports.push(Port {
            port,
            listener,
            upstream,
            open: 0,
            refused_unlogged: 0,
            last_refusal_log: None,
            unreachable_said: false,
        });
    }

    fn close_port(&mut self, port: u16) {
        self.ports.retain(|p| p.port != port);
        for (index, slot) in self.pairs.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|pair| pair.port == port) {
                *slot = None;
                self.free.push(index);
            }
        }
    }

    /// Waits at most `timeout` (none if work is left over) and moves what is ready; true when
    /// the supervisor's eventfd fired.
    pub fn turn(&mut self, timeout: Option<Duration>) -> bool {
        let timeout = if self.again.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        let mut events = std::mem::take(&mut self.events);
        if let Err(e) = self.epoll.wait(&mut events, timeout) {
            log::line(format_args!("forward: epoll_wait failed: {e}"));
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut tokens: Vec<u64> = std::mem::take(&mut self.again);
        tokens.extend_from_slice(&events);
        self.events = events;
        let mut woke = false;
        for token in tokens {
            if token == WAKE {
                woke = true;
            } else if token & LISTENER != 0 {
                self.accept(u16::try_from(token & 0xffff).unwrap_or(0));
            } else {
                self.drive(pair_index(token));
            }
        }
        woke
    }

    fn accept(&mut self, port: u16) {
        for _ in 0..ACCEPTS_PER_TURN {
            let Some(entry) = self.ports.iter_mut().find(|p| p.port == port) else {
                return;
            };
            let client = match entry.listener.accept() {
                Ok((client, _)) => client,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: tried again next turn, not in a loop now.
                    log::line(format_args!("forward :{port}: accept failed: {e}"));
                    return;
                }
            };
            if entry.open >= self.per_port {
                entry.refused_unlogged += 1;
                let now = Instant::now();
                if entry
                    .last_refusal_log
                    .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_EVERY)
                {
                    log::line(format_args!(
                        "forward :{port}: refused {} connection(s): {} open, the cap per port",
                        entry.refused_unlogged, self.per_port
                    ));
                    entry.refused_unlogged = 0;
                    entry.last_refusal_log = Some(now);
                }
                continue;
            }
            let upstream = entry.upstream;
            let joined = connect_nonblocking(upstream).and_then(|(stream, connected)| {
                client.set_nonblocking(true)?;
                let _ = client.set_nodelay(true);
                let _ = stream.set_nodelay(true);
                Ok((stream, connected))
            });
            let (stream, connected) = match joined {
                Ok(joined) => joined,
                // The server is gone or refuses: the client is closed (the next scan
                // removes the forward when the listener is gone).
                Err(e) => {
                    if !entry.unreachable_said {
                        entry.unreachable_said = true;
                        log::line(format_args!(
                            "forward :{port}: cannot reach {upstream}: {e}"
                        ));
                    }
                    continue;
                }
            };
            entry.unreachable_said = false;
            let pair = Pair {
                port,
                client,
                upstream: stream,
                connected,
                flows: Default::default(),
            };
            if let Err(e) = place(&self.epoll, &mut self.pairs, &mut self.free, pair) {
                log::line(format_args!(
                    "forward :{port}: cannot watch a connection: {e}"
                ));
                continue;
            }
            entry.open += 1;
        }
        self.again.push(LISTENER | u64::from(port));
    }

    /// Moves the connection numbered `index` on. A token of a connection closed earlier in
    /// the same turn may name its slot's next occupant: a step too many, which finds nothing
    /// ready.
    fn drive(&mut self, index: usize) {
        let Some(Some(pair)) = self.pairs.get_mut(index) else {
            return;
        };
        let token = pair_token(index);
        let progress = pair.step(&mut self.scratch);
        match progress {
            Progress::Waiting => {}
            Progress::More => {
                if !self.again.contains(&token) {
                    self.again.push(token);
                }
            }
            Progress::Finished | Progress::Failed => {
                if matches!(progress, Progress::Failed) {
                    let _ = reset_on_close(&pair.client);
                    let _ = reset_on_close(&pair.upstream);
                }
                let port = pair.port;
                self.pairs[index] = None;
                self.free.push(index);
                if let Some(entry) = self.ports.iter_mut().find(|p| p.port == port) {
                    entry.open = entry.open.saturating_sub(1);
                }
            }
        }
    }

    /// Connections open through the forwards (for tests).
    #[cfg(test)]
    fn open_pairs(&self) -> usize {
        self.pairs.iter().flatten().count()
    }
}

/// Watches `pair`'s two sockets and keeps it in a free slot of `pairs`; its token.
fn place(
    epoll: &Epoll,
    pairs: &mut Vec<Option<Pair>>,
    free: &mut Vec<usize>,
    pair: Pair,
) -> io::Result<u64> {
    let index = free.pop().unwrap_or(pairs.len());
    let token = pair_token(index);
    if let Err(e) = epoll
        .add(pair.client.as_fd(), token, EDGE_ALL)
        .and_then(|()| epoll.add(pair.upstream.as_fd(), token | 1, EDGE_ALL))
    {
        if index < pairs.len() {
            free.push(index);
        }
        return Err(e);
    }
    match pairs.get_mut(index) {
        Some(slot) => *slot = Some(pair),
        None => pairs.push(Some(pair)),
    }
    Ok(token)
}

/// The token of the client side of the connection numbered `index`; its upstream side's is the
/// next one. Never [`WAKE`], never with the [`LISTENER`] bit (far more connections than fit in
/// memory).
fn pair_token(index: usize) -> u64 {
    u64::try_from(index).map_or(0, |i| (i + 1) << 1)
}

/// The number of the connection a token of [`pair_token`] names.
fn pair_index(token: u64) -> usize {
    usize::try_from((token >> 1).saturating_sub(1)).unwrap_or(usize::MAX)
}

impl Pair {
    fn step(&mut self, scratch: &mut [u8]) -> Progress {
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
        );
        let b = pump(
            &self.upstream,
            &self.client,
            to_client,
            scratch,
            &mut budget,
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
/// half-close) or `budget` runs out (then `Ok(true)`). An error means the pair is done.
fn pump(
    mut src: &TcpStream,
    mut dst: &TcpStream,
    flow: &mut Flow,
    scratch: &mut [u8],
    budget: &mut usize,
) -> io::Result<bool> {
    loop {
        if flow.in_pipe > 0 {
            let Some((pipe, _)) = &flow.pipe else {
                return Err(io::Error::other("bytes counted in a pipe that is gone"));
            };
            match splice(pipe.as_fd(), dst.as_fd(), flow.in_pipe) {
                Ok(n) => {
                    flow.in_pipe = flow.in_pipe.saturating_sub(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
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
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
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
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        let read = match src.read(scratch) {
            Ok(0) => {
                flow.eof = true;
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        *budget = budget.saturating_sub(read);
        if read == scratch.len() && flow.pipe.is_none() {
            // A bulk transfer: splice from now on (without a pipe, reads go on as before).
            flow.pipe = splice_pipe(PIPE_BYTES).ok();
        }
        let written = match dst.write(&scratch[..read]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        if written < read {
            flow.pending.extend_from_slice(&scratch[written..read]);
            flow.pending.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Shutdown;

    /// A relay forwarding a listener of its own on 127.0.0.1 to `upstream`; its address.
    fn relay_to(upstream: SocketAddr, per_port: usize) -> (Relay, SocketAddr) {
        let mut relay = Relay::new(per_port).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let front = listener.local_addr().unwrap();
        // The relay keys ports by the upstream's port; the test's ports differ, so the
        // listener is registered under the upstream's.
        relay.open(listener, upstream);
        (relay, front)
    }

    fn turn_until(relay: &mut Relay, mut done: impl FnMut(&Relay) -> bool) {
        for _ in 0..1000 {
            if done(relay) {
                return;
            }
            relay.turn(Some(Duration::from_millis(10)));
        }
        panic!("the relay did not get there");
    }

    #[test]
    fn bytes_cross_both_ways_and_a_half_close_is_passed_on() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut relay, front) = relay_to(server.local_addr().unwrap(), 8);
        let mut client = TcpStream::connect(front).unwrap();
        client.write_all(b"hello").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        turn_until(&mut relay, |r| r.open_pairs() == 1);
        let (mut inside, _) = server.accept().unwrap();
        inside.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        turn_until(&mut relay, |_| {
            let mut buf = [0u8; 16];
            match inside.read(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    false
                }
                Err(_) => false,
            }
        });
        assert_eq!(got, b"hello");
        inside.set_nonblocking(false).unwrap();
        inside.write_all(b"world").unwrap();
        drop(inside);
        turn_until(&mut relay, |r| r.open_pairs() == 0);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"world");
    }

    #[test]
    fn connection_tokens_are_not_the_wake_token_nor_listeners() {
        assert_ne!(pair_token(0), WAKE);
        assert_ne!(pair_token(0) | 1, WAKE);
        for index in [0, 1, 7, 1 << 40] {
            assert_eq!(pair_index(pair_token(index)), index);
            assert_eq!(pair_index(pair_token(index) | 1), index);
            assert_eq!(pair_token(index) & LISTENER, 0);
        }
    }

    #[test]
    fn past_the_cap_a_connection_is_closed_at_once() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut relay, front) = relay_to(server.local_addr().unwrap(), 1);
        let _first = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.open_pairs() == 1);
        let mut second = TcpStream::connect(front).unwrap();
        relay.turn(Some(Duration::from_millis(10)));
        let mut buf = [0u8; 1];
        assert!(matches!(second.read(&mut buf), Ok(0) | Err(_)));
        assert_eq!(relay.open_pairs(), 1);
    }
}
