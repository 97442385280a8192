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
//!
//! Its descriptors come from its share of the open-file limit ([`share`]): past the share, or
//! when a descriptor it is given is numbered into the HTTP server's reserve, a connection is
//! accepted and closed at once like one past the cap per port; and when the HTTP server has
//! no descriptor left anyway, it gives up the connection idle longest ([`Relay::shed`]).
//!
//! - [`pump`]: one connection and the moving of its bytes.

mod carried;
mod pump;
pub mod share;

pub use carried::Restored;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::log;
use crate::sys::epoll::{Epoll, Event, EDGE_ALL, EDGE_IN};
use crate::sys::net::{connect_nonblocking, reset_on_close, set_congestion, tcp_socket_for};
use pump::{Flow, Pair, Progress};
use share::Share;

/// The scratch buffer every transfer reads into.
const SCRATCH: usize = 128 << 10;
/// The size asked for a bulk direction's pipe.
const PIPE_BYTES: usize = 1 << 20;
/// Most bytes one connection moves per turn before others get theirs.
const TURN_BYTES: usize = 4 << 20;
/// The congestion control of the connection to the server, which is always on loopback: a
/// pacing one (BBR, some systems' default) arms a timer per departure and sizes segments to
/// its rate, for a link with no queue to spare; Reno, part of every kernel, does neither. With
/// BBR the relay spent 0.37-0.60 s of CPU per GiB sent to the server, with Reno 0.20-0.25
/// (docs/performance.md, Localhost port forwarding). The client's connection keeps the
/// system's: it comes over the sandbox's network.
const LOOPBACK_CONGESTION: &str = "reno";
/// Most connections one listener accepts per turn.
const ACCEPTS_PER_TURN: usize = 64;
/// The token of the supervisor's eventfd.
pub const WAKE: u64 = 0;
const LISTENER: u64 = 1 << 63;
/// Refusals of one port, and connections given up, are logged at most this often (the rest
/// are counted in the next line).
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
    /// The HTTP server is out of descriptors: give up a connection ([`Relay::shed`]).
    Shed,
}

struct Port {
    port: u16,
    listener: TcpListener,
    upstream: SocketAddr,
    open: usize,
    refused: Said,
    /// The upstream's refusal was logged; said again only after a connection got through.
    unreachable_said: bool,
}

/// A line logged at most every [`REFUSAL_LOG_EVERY`], counting what happened since the last.
#[derive(Default)]
struct Said {
    unlogged: u64,
    last: Option<Instant>,
}

impl Said {
    /// Counts one more; true when a line is due now (with the count in `self.unlogged`, reset
    /// by [`Said::logged`]).
    fn due(&mut self, now: Instant) -> bool {
        self.unlogged += 1;
        self.last
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_EVERY)
    }

    fn logged(&mut self, now: Instant) {
        self.unlogged = 0;
        self.last = Some(now);
    }
}

/// Why a connection is closed as soon as it is accepted.
enum Refusal {
    /// `--forward-max-connections` are open through its port.
    PortCap,
    /// The forwarder's share of descriptors is held.
    Share,
    /// Its descriptor is numbered into the HTTP server's reserve.
    Ceiling,
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
    /// Last turn's `again`, being worked through.
    leftover: Vec<u64>,
    events: Vec<Event>,
    per_port: usize,
    share: Share,
    /// Read once a turn: when each connection last had an event.
    now: Instant,
    shed: Said,
}

impl Relay {
    pub fn new(per_port: usize, share: Share) -> io::Result<Relay> {
        Ok(Relay {
            epoll: Epoll::new()?,
            ports: Vec::new(),
            pairs: Vec::new(),
            free: Vec::new(),
            scratch: vec![0; SCRATCH].into_boxed_slice(),
            again: Vec::new(),
            leftover: Vec::new(),
            events: Vec::with_capacity(256),
            per_port,
            share,
            now: Instant::now(),
            shed: Said::default(),
        })
    }

    /// Registers the supervisor's eventfd under [`WAKE`].
    pub fn watch_wake(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        self.epoll.add(fd, WAKE, EDGE_IN)
    }

    /// Connections open through the forwards.
    pub fn connections(&self) -> usize {
        self.pairs.len() - self.free.len()
    }

    pub fn apply(&mut self, command: Command) {
        match command {
            Command::Open { listener, upstream } => self.open(listener, upstream),
            Command::Close { port } => self.close_port(port),
            Command::Shed => {
                self.shed();
            }
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
        self.close_listener(port);
        self.share.take(1);
        self.ports.push(Port {
            port,
            listener,
            upstream,
            open: 0,
            refused: Said::default(),
            unreachable_said: false,
        });
    }

    /// Drops the listener of `port`, if any.
    fn close_listener(&mut self, port: u16) {
        let before = self.ports.len();
        self.ports.retain(|p| p.port != port);
        self.share.give(before - self.ports.len());
    }

    /// The port's listener and every connection through it, each reset both ways: a
    /// connection still open here has not ended both ways, and a clean close would let its
    /// client take what it got so far for the whole stream.
    fn close_port(&mut self, port: u16) {
        self.close_listener(port);
        for index in 0..self.pairs.len() {
            if self.pairs[index]
                .as_ref()
                .is_some_and(|pair| pair.port == port)
            {
                self.remove(index, true);
            }
        }
    }

    /// Closes the connection numbered `index` (reset both ways when `reset`), giving its
    /// descriptors back to the share and its place back to its port.
    fn remove(&mut self, index: usize, reset: bool) {
        let Some(pair) = self.pairs.get_mut(index).and_then(Option::take) else {
            return;
        };
        if reset {
            let _ = reset_on_close(&pair.client);
            let _ = reset_on_close(&pair.upstream);
        }
        self.share.give(pair.descriptors());
        self.free.push(index);
        if let Some(entry) = self.ports.iter_mut().find(|p| p.port == pair.port) {
            entry.open = entry.open.saturating_sub(1);
        }
    }

    /// Gives up the connection that has waited longest for an event, reset both ways (its
    /// peers see a cut stream, never a whole one), so that the HTTP server gets a descriptor;
    /// false when there is none.
    pub fn shed(&mut self) -> bool {
        let idlest = self
            .pairs
            .iter()
            .enumerate()
            .filter_map(|(index, pair)| Some((pair.as_ref()?.last_active, index)))
            .min();
        let Some((since, index)) = idlest else {
            return false;
        };
        let port = self.pairs[index].as_ref().map_or(0, |pair| pair.port);
        self.remove(index, true);
        let now = Instant::now();
        if self.shed.due(now) {
            log::line(format_args!(
                "forward :{port}: closed {} connection(s) to free descriptors for the HTTP \
                 server (the open-file limit is reached); the last idle {} ms",
                self.shed.unlogged,
                now.duration_since(since).as_millis()
            ));
            self.shed.logged(now);
        }
        true
    }

    /// Waits at most `timeout` (none if work is left over) and moves what is ready; true when
    /// the supervisor's eventfd fired.
    pub fn turn(&mut self, timeout: Option<Duration>) -> bool {
        let timeout = if self.again.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        if let Err(e) = self.epoll.wait(&mut self.events, timeout) {
            log::line(format_args!("forward: epoll_wait failed: {e}"));
            std::thread::sleep(Duration::from_millis(100));
        }
        self.now = Instant::now();
        // What was left over from the last turn, then what is new; `again` fills anew as it
        // goes. The two lists are swapped, not reallocated, turn after turn.
        std::mem::swap(&mut self.again, &mut self.leftover);
        let mut woke = false;
        for i in 0..self.leftover.len() {
            woke |= self.dispatch(self.leftover[i], None);
        }
        self.leftover.clear();
        for i in 0..self.events.len() {
            let Event { token, ready } = self.events[i];
            woke |= self.dispatch(token, Some(ready));
        }
        woke
    }

    /// Acts on one token, with what epoll reported of it (`None`: work left over); true for
    /// the supervisor's eventfd.
    fn dispatch(&mut self, token: u64, ready: Option<u32>) -> bool {
        if token == WAKE {
            return true;
        }
        if token & LISTENER != 0 {
            self.accept(u16::try_from(token & 0xffff).unwrap_or(0));
        } else {
            let index = pair_index(token);
            if let (Some(Some(pair)), Some(ready)) = (self.pairs.get_mut(index), ready) {
                pair.note(token & 1 == 1, ready);
            }
            self.drive(index);
        }
        false
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
            let upstream = entry.upstream;
            let admitted = if entry.open >= self.per_port {
                Err(Refusal::PortCap)
            } else if !self.share.has_room(2) {
                Err(Refusal::Share)
            } else if !self.share.below_ceiling(client.as_fd()) {
                Err(Refusal::Ceiling)
            } else {
                // Made before connecting, so that one numbered into the reserve is closed
                // before the server sees a connection.
                match tcp_socket_for(upstream) {
                    Ok(stream) if self.share.below_ceiling(stream.as_fd()) => Ok(Ok(stream)),
                    Ok(_) => Err(Refusal::Ceiling),
                    Err(e) => Ok(Err(e)),
                }
            };
            let stream = match admitted {
                Ok(stream) => stream,
                Err(refusal) => {
                    refuse(entry, refusal, self.per_port, &self.share, self.now);
                    continue;
                }
            };
            let joined = stream.and_then(|stream| {
                // Refused (a kernel without it), the system's own is kept.
                let _ = set_congestion(&stream, LOOPBACK_CONGESTION);
                let connected = connect_nonblocking(&stream, upstream)?;
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
            let mut pair = Pair::new(port, client, stream, connected);
            pair.last_active = self.now;
            if let Err(e) = place(&self.epoll, &mut self.pairs, &mut self.free, pair) {
                log::line(format_args!(
                    "forward :{port}: cannot watch a connection: {e}"
                ));
                continue;
            }
            entry.open += 1;
            self.share.take(2);
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
        pair.last_active = self.now;
        let token = pair_token(index);
        match pair.step(&mut self.scratch, &mut self.share) {
            Progress::Waiting => {}
            Progress::More => {
                if !self.again.contains(&token) {
                    self.again.push(token);
                }
            }
            Progress::Finished => self.remove(index, false),
            Progress::Failed => self.remove(index, true),
        }
    }

    /// Counts the share's descriptors again from the structure (after a live upgrade's export,
    /// which may make pipes, and its take-over).
    fn recount(&mut self) {
        let held = self.ports.len()
            + self
                .pairs
                .iter()
                .flatten()
                .map(Pair::descriptors)
                .sum::<usize>();
        self.share.recount(held);
    }
}

/// Logs a refusal of `entry`'s, at most once a [`REFUSAL_LOG_EVERY`], with the count since.
fn refuse(entry: &mut Port, refusal: Refusal, per_port: usize, share: &Share, now: Instant) {
    if !entry.refused.due(now) {
        return;
    }
    let (port, count) = (entry.port, entry.refused.unlogged);
    match refusal {
        Refusal::PortCap => log::line(format_args!(
            "forward :{port}: refused {count} connection(s): {per_port} open, the cap per port"
        )),
        Refusal::Share => log::line(format_args!(
            "forward :{port}: refused {count} connection(s): the forwarder holds {} \
             descriptors, its share of the open-file limit",
            share.held()
        )),
        Refusal::Ceiling => log::line(format_args!(
            "forward :{port}: refused {count} connection(s): fewer than {} descriptors are \
             free, the HTTP server's reserve",
            share.reserve()
        )),
    }
    entry.refused.logged(now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Budget;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};

    /// A relay forwarding a listener of its own on 127.0.0.1 to `upstream`; its address.
    fn relay_to(upstream: SocketAddr, per_port: usize) -> (Relay, SocketAddr) {
        relay_with(upstream, per_port, Share::unlimited())
    }

    fn relay_with(upstream: SocketAddr, per_port: usize, share: Share) -> (Relay, SocketAddr) {
        let mut relay = Relay::new(per_port, share).unwrap();
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
        turn_until(&mut relay, |r| r.connections() == 1);
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
        turn_until(&mut relay, |r| r.connections() == 0);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"world");
    }

    #[test]
    fn the_connection_to_the_server_uses_reno_and_the_clients_keeps_its_own() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut relay, front) = relay_to(server.local_addr().unwrap(), 8);
        let _client = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.connections() == 1);
        let _inside = server.accept().unwrap();
        let pair = relay.pairs.iter().flatten().next().unwrap();
        assert_eq!(crate::sys::net::congestion(&pair.upstream).unwrap(), "reno");
        let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
        assert_eq!(
            crate::sys::net::congestion(&pair.client).unwrap(),
            system.trim()
        );
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
        turn_until(&mut relay, |r| r.connections() == 1);
        let mut second = TcpStream::connect(front).unwrap();
        relay.turn(Some(Duration::from_millis(10)));
        let mut buf = [0u8; 1];
        assert!(matches!(second.read(&mut buf), Ok(0) | Err(_)));
        assert_eq!(relay.connections(), 1);
    }

    /// A share of `most` descriptors, with no ceiling to speak of.
    fn share_of(most: usize) -> Share {
        Share::new(&Budget {
            limit: 1 << 30,
            reserve: 1,
            forward_share: most,
        })
    }

    /// Whether the relay closed `stream` (an end of stream or a reset, within a second).
    fn closed(stream: &mut TcpStream) -> bool {
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        matches!(stream.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn the_share_of_descriptors_caps_the_connections_of_every_port() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        // The listener and two connections: 5 descriptors.
        let (mut relay, front) = relay_with(server.local_addr().unwrap(), 100, share_of(5));
        assert_eq!(relay.share.held(), 1);
        let first = TcpStream::connect(front).unwrap();
        let _second = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.connections() == 2);
        assert_eq!(relay.share.held(), 5);
        let mut third = TcpStream::connect(front).unwrap();
        relay.turn(Some(Duration::from_millis(10)));
        assert!(closed(&mut third), "past the share");
        assert_eq!(relay.connections(), 2);
        // One ends: its descriptors come back, and the next one is taken.
        let mut inside: Vec<_> = (0..2).map(|_| server.accept().unwrap().0).collect();
        drop(first);
        drop(inside.remove(0));
        turn_until(&mut relay, |r| r.connections() == 1);
        assert_eq!(relay.share.held(), 3);
        let _fourth = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.connections() == 2);
        assert_eq!(relay.share.held(), 5);
        relay.recount();
        assert_eq!(
            relay.share.held(),
            5,
            "the count kept is the count made again"
        );
    }

    #[test]
    fn a_descriptor_numbered_into_the_reserve_is_refused() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        // A ceiling of 3: every descriptor this process gets now is above it.
        let share = Share::new(&Budget {
            limit: 13,
            reserve: 10,
            forward_share: 1000,
        });
        let (mut relay, front) = relay_with(server.local_addr().unwrap(), 100, share);
        let mut client = TcpStream::connect(front).unwrap();
        relay.turn(Some(Duration::from_millis(10)));
        assert!(closed(&mut client));
        assert_eq!((relay.connections(), relay.share.held()), (0, 1));
        server.set_nonblocking(true).unwrap();
        assert!(
            server.accept().is_err(),
            "the server never saw a connection"
        );
    }

    #[test]
    fn shedding_resets_the_connection_idle_longest_and_gives_its_descriptors_back() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut relay, front) = relay_to(server.local_addr().unwrap(), 8);
        let mut idle = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.connections() == 1);
        let (_idle_inside, _) = server.accept().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut busy = TcpStream::connect(front).unwrap();
        turn_until(&mut relay, |r| r.connections() == 2);
        let (mut busy_inside, _) = server.accept().unwrap();
        busy_inside.set_nonblocking(true).unwrap();
        let mut got = [0u8; 1];
        busy.write_all(b"x").unwrap();
        turn_until(&mut relay, |_| {
            busy_inside.read(&mut got).is_ok_and(|n| n == 1)
        });
        assert_eq!(relay.share.held(), 5);
        assert!(relay.shed());
        assert_eq!((relay.connections(), relay.share.held()), (1, 3));
        assert!(closed(&mut idle));
        busy.write_all(b"y").unwrap();
        turn_until(&mut relay, |_| {
            busy_inside.read(&mut got).is_ok_and(|n| n == 1)
        });
        assert_eq!(&got, b"y", "the busy one goes on");
        assert!(relay.shed());
        assert!(!relay.shed(), "none left");
    }
}
