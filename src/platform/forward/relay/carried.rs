//! The relay's side of a live upgrade: its listeners and connections written down (on the
//! parked relay of the old image) and taken back (in the new one), every descriptor checked.
//!
//! A direction's bytes read and not yet written cross in its pipe, itself a descriptor that
//! crosses the `execve` with what it holds; the few held in memory (a direction that never had
//! a pipe) are written into a pipe made for them at export, so the handover stays small
//! whatever the connections hold. Only when no pipe can be made do they travel in the
//! handover itself (at most [`SCRATCH`] bytes a direction).

use std::fs::File;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};

use super::{place, Flow, Pair, Relay, LISTENER, PIPE_BYTES, SCRATCH};
use crate::log;
use crate::platform::forward::handover::{Adopted, CarriedConnection, CarriedFlow, CarriedForward};
use crate::platform::forward::scan::Forwards;
use crate::sys::net::{is_listening, pipe_len, splice_pipe};
use crate::upgrade::carry::{Carry, Inherited};

/// What a previous image carried, taken back and checked, for [`Relay::take_over`].
#[derive(Default)]
pub struct Restored {
    listeners: Vec<(TcpListener, SocketAddr)>,
    pairs: Vec<Pair>,
}

impl Relay {
    /// Every forward and connection, written down; their descriptors kept in `carry`. Bytes a
    /// direction holds in memory go into its pipe first (the relay is parked: nothing else
    /// moves them, and if the upgrade fails the relay goes on from there).
    pub fn export(&mut self, carry: &mut Carry) -> Vec<CarriedForward> {
        let mut forwards: Vec<CarriedForward> = self
            .ports
            .iter()
            .map(|port| CarriedForward {
                port: u32::from(port.port),
                listener_fd: carry
                    .keep(port.listener.as_fd())
                    .map_err(|e| said(port.port, "cannot carry its listener", &e))
                    .ok(),
                upstream: port.upstream.to_string(),
                connections: Vec::new(),
            })
            .collect();
        for pair in self.pairs.iter_mut().flatten() {
            let Some(forward) = forwards.iter_mut().find(|f| f.port == u32::from(pair.port)) else {
                continue;
            };
            pair.flows.iter_mut().for_each(pending_into_pipe);
            match carry_pair(pair, carry) {
                Ok(connection) => forward.connections.push(connection),
                Err(e) => said(pair.port, "cannot carry a connection", &e),
            }
        }
        // Pipes were made for what directions held in memory.
        self.recount();
        forwards
    }

    /// Serves what a previous image carried (listeners bound elsewhere than `address` are
    /// closed); the forwards now served, for the supervisor.
    pub fn take_over(&mut self, restored: Restored, address: IpAddr) -> Forwards {
        let mut forwards = Forwards::new();
        for (listener, upstream) in restored.listeners {
            let port = upstream.port();
            if listener.local_addr().map(|a| a.ip()).ok() != Some(address)
                || forwards.iter().any(|(p, _)| *p == port)
            {
                said(
                    port,
                    "the carried listener is not one of the forward address's",
                    &"closed",
                );
                continue;
            }
            self.open(listener, upstream);
            if self.ports.iter().any(|p| p.port == port) {
                forwards.push((port, upstream));
                self.again.push(LISTENER | u64::from(port));
            }
        }
        for pair in restored.pairs {
            let port = pair.port;
            let entry = self.ports.iter_mut().find(|p| p.port == port);
            if entry.as_ref().is_some_and(|e| e.open >= self.per_port) {
                said(port, "a carried connection is over the cap", &"closed");
                continue;
            }
            let descriptors = pair.descriptors();
            if !self.share.has_room(descriptors) {
                said(
                    port,
                    "a carried connection is over the forwarder's share of descriptors",
                    &"closed",
                );
                continue;
            }
            match place(&self.epoll, &mut self.pairs, &mut self.free, pair) {
                Ok(token) => {
                    if let Some(entry) = entry {
                        entry.open += 1;
                    }
                    self.share.take(descriptors);
                    // Moved at the first turn, whatever happened while nobody watched.
                    self.again.push(token);
                }
                Err(e) => said(port, "cannot watch a carried connection", &e),
            }
        }
        forwards
    }
}

/// Logs what became of a forward's listener or connection.
fn said(port: u16, what: &str, why: &dyn std::fmt::Display) {
    log::line(format_args!("upgrade: forward :{port}: {what}: {why}"));
}

/// Moves bytes a direction holds in memory into its pipe (made for them if need be), where
/// they cross the `execve`; what does not fit stays pending.
fn pending_into_pipe(flow: &mut Flow) {
    if flow.pending.is_empty() || flow.in_pipe > 0 {
        return;
    }
    if flow.pipe.is_none() {
        flow.pipe = splice_pipe(PIPE_BYTES).ok();
    }
    let Some((_, write)) = &flow.pipe else {
        return;
    };
    // The pipe is non-blocking: a write it cannot take whole is cut short, never waited on.
    let written = write
        .try_clone()
        .map(File::from)
        .and_then(|mut pipe| pipe.write(&flow.pending))
        .unwrap_or(0);
    flow.pending.drain(..written);
    flow.in_pipe = written;
}

fn carry_pair(pair: &Pair, carry: &mut Carry) -> io::Result<CarriedConnection> {
    Ok(CarriedConnection {
        client_fd: carry.keep(pair.client.as_fd())?,
        upstream_fd: carry.keep(pair.upstream.as_fd())?,
        connected: pair.connected,
        flows: pair
            .flows
            .iter()
            .map(|flow| carry_flow(flow, carry))
            .collect::<io::Result<_>>()?,
    })
}

fn carry_flow(flow: &Flow, carry: &mut Carry) -> io::Result<CarriedFlow> {
    let pipe = match &flow.pipe {
        Some((read, write)) => vec![carry.keep(read.as_fd())?, carry.keep(write.as_fd())?],
        None => Vec::new(),
    };
    Ok(CarriedFlow {
        pipe,
        pending: flow.pending.clone(),
        eof: flow.eof,
        shut: flow.shut,
    })
}

impl Restored {
    /// Takes back the descriptors `forwards` names, each checked: a listener must listen, a
    /// connection's sockets be sockets, a pipe hold what it says; an upstream must be the
    /// loopback at the forward's own port. What fails is closed, logged and counted.
    pub fn from_handover(
        forwards: &[CarriedForward],
        inherited: &mut Inherited,
    ) -> (Restored, Adopted) {
        let mut restored = Restored::default();
        let mut adopted = Adopted::default();
        for forward in forwards {
            let target = upstream_of(forward);
            if let Some(fd) = forward.listener_fd {
                let listener = inherited.take(fd).ok_or("not carried");
                match target.and_then(|up| Ok((listening(listener?)?, up))) {
                    Ok(entry) => {
                        restored.listeners.push(entry);
                        adopted.listeners += 1;
                    }
                    Err(e) => {
                        log::line(format_args!(
                            "upgrade: forward :{} to '{}': its listener is not taken back ({e}); \
                             the next scan binds it again",
                            forward.port, forward.upstream
                        ));
                        adopted.listeners_failed += 1;
                    }
                }
            }
            for connection in &forward.connections {
                let pair = target.and_then(|up| pair_of(up.port(), connection, inherited));
                match pair {
                    Ok(pair) => {
                        restored.pairs.push(pair);
                        adopted.connections += 1;
                    }
                    Err(e) => {
                        log::line(format_args!(
                            "upgrade: forward :{} to '{}': a connection is not taken back: {e}",
                            forward.port, forward.upstream
                        ));
                        adopted.connections_failed += 1;
                    }
                }
            }
        }
        (restored, adopted)
    }
}

/// The forward's upstream: the loopback, at the forward's own port (a handover naming any
/// other address is not followed).
fn upstream_of(forward: &CarriedForward) -> Result<SocketAddr, &'static str> {
    let loopback = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    forward
        .upstream
        .parse()
        .ok()
        .filter(|up: &SocketAddr| {
            loopback.contains(&up.ip()) && u32::from(up.port()) == forward.port
        })
        .ok_or("the upstream is not the loopback at the forward's port")
}

fn listening(fd: OwnedFd) -> Result<TcpListener, &'static str> {
    match is_listening(fd.as_fd()) {
        Ok(true) => Ok(TcpListener::from(fd)),
        _ => Err("not a listening stream socket"),
    }
}

fn pair_of(
    port: u16,
    carried: &CarriedConnection,
    inherited: &mut Inherited,
) -> Result<Pair, &'static str> {
    let mut socket = |fd: i32| {
        let stream = TcpStream::from(inherited.take(fd).ok_or("a socket was not carried")?);
        stream
            .local_addr()
            .and_then(|_| stream.set_nonblocking(true))
            .map_err(|_| "not a socket")?;
        Ok(stream)
    };
    let client = socket(carried.client_fd)?;
    let upstream = socket(carried.upstream_fd)?;
    let [to_upstream, to_client] = match &carried.flows[..] {
        [to_upstream, to_client] => [to_upstream, to_client].map(|f| flow_of(f, inherited)),
        _ => return Err("not two directions"),
    };
    let (to_upstream, to_client) = (to_upstream?, to_client?);
    let mut pair = Pair::new(port, client, upstream, carried.connected);
    pair.flows = [to_upstream, to_client];
    Ok(pair)
}

fn flow_of(carried: &CarriedFlow, inherited: &mut Inherited) -> Result<Flow, &'static str> {
    if carried.pending.len() > SCRATCH {
        return Err("more pending bytes than one read");
    }
    let pipe = match carried.pipe[..] {
        [] => None,
        [read, write] => {
            let read = inherited.take(read).ok_or("a pipe was not carried")?;
            let write = inherited.take(write).ok_or("a pipe was not carried")?;
            Some((read, write))
        }
        _ => return Err("not a pipe's two ends"),
    };
    // What the pipe holds is sent on, as the kernel counts it.
    let in_pipe = match &pipe {
        Some((read, _)) => pipe_len(read.as_fd()).map_err(|_| "not a pipe")?,
        None => 0,
    };
    Ok(Flow {
        pending: carried.pending.clone(),
        pipe,
        in_pipe,
        eof: carried.eof,
        shut: carried.shut,
        ..Flow::default()
    })
}

#[cfg(test)]
mod tests {
    use super::super::share::Share;
    use super::*;
    use std::io::Read;
    use std::os::fd::IntoRawFd;
    use std::time::Duration;

    fn forward(port: u16, upstream: &str) -> CarriedForward {
        CarriedForward {
            port: u32::from(port),
            listener_fd: None,
            upstream: upstream.into(),
            connections: Vec::new(),
        }
    }

    /// A connected pair of sockets: (ours, the peer's).
    fn sockets() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (peer, _) = listener.accept().unwrap();
        (ours, peer)
    }

    /// Hands `fds` over as a previous image would: numbers only, claimed by an `Inherited`.
    fn inherited(fds: Vec<OwnedFd>) -> (Vec<i32>, Inherited) {
        let numbers: Vec<i32> = fds.into_iter().map(IntoRawFd::into_raw_fd).collect();
        let claimed = Inherited::claim(&numbers);
        (numbers, claimed)
    }

    #[test]
    fn an_upstream_must_be_the_loopback_at_the_forwards_own_port() {
        assert_eq!(
            upstream_of(&forward(8000, "127.0.0.1:8000")),
            Ok("127.0.0.1:8000".parse().unwrap())
        );
        assert_eq!(
            upstream_of(&forward(8000, "[::1]:8000")),
            Ok("[::1]:8000".parse().unwrap())
        );
        for (port, upstream) in [
            (8000, "10.0.0.1:8000"),
            (8000, "127.0.0.2:8000"),
            (8000, "127.0.0.1:8001"),
            (65_536 + 8000, "127.0.0.1:8000"),
            (8000, "localhost:8000"),
            (8000, ""),
        ] {
            let mut carried = forward(0, upstream);
            carried.port = port;
            assert!(upstream_of(&carried).is_err(), "{upstream} for {port}");
        }
    }

    #[test]
    fn what_is_missing_or_of_the_wrong_kind_is_counted_failed_and_the_rest_taken_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (client, _client_peer) = sockets();
        let (upstream, _upstream_peer) = sockets();
        let (read, write) = splice_pipe(1 << 16).unwrap();
        File::from(write.try_clone().unwrap())
            .write_all(b"in the pipe")
            .unwrap();
        let (not_listening, _peer) = sockets();
        let (n, mut inherited) = inherited(vec![
            OwnedFd::from(listener),
            OwnedFd::from(client),
            OwnedFd::from(upstream),
            read,
            write,
            OwnedFd::from(not_listening),
        ]);
        let upstream = format!("127.0.0.1:{port}");
        let good = CarriedConnection {
            client_fd: n[1],
            upstream_fd: n[2],
            connected: true,
            flows: vec![
                CarriedFlow {
                    pipe: vec![n[3], n[4]],
                    pending: b"then these".to_vec(),
                    eof: true,
                    shut: false,
                },
                CarriedFlow::default(),
            ],
        };
        // Its numbers again: each descriptor is taken back once, the second use fails.
        let again = good.clone();
        let forwards = vec![
            CarriedForward {
                listener_fd: Some(n[0]),
                connections: vec![good, again],
                ..forward(port, &upstream)
            },
            // Not a listener; then a number never carried.
            CarriedForward {
                listener_fd: Some(n[5]),
                ..forward(port, &upstream)
            },
            CarriedForward {
                listener_fd: Some(1 << 20),
                ..forward(port, &upstream)
            },
            // Elsewhere than the loopback: nothing of it is taken.
            CarriedForward {
                connections: vec![CarriedConnection::default()],
                ..forward(port, "10.0.0.1:1")
            },
        ];
        let (restored, adopted) = Restored::from_handover(&forwards, &mut inherited);
        assert_eq!(
            adopted,
            Adopted {
                listeners: 1,
                listeners_failed: 2,
                connections: 1,
                connections_failed: 2,
            }
        );
        assert_eq!(restored.listeners.len(), 1);
        assert_eq!(restored.listeners[0].1, upstream.parse().unwrap());
        let pair = &restored.pairs[0];
        assert_eq!((pair.port, pair.connected), (port, true));
        let [to_upstream, to_client] = &pair.flows;
        assert_eq!(to_upstream.in_pipe, 11);
        assert_eq!(to_upstream.pending, b"then these");
        assert!(to_upstream.eof && !to_upstream.shut);
        assert!(to_client.pipe.is_none() && to_client.pending.is_empty());
        inherited.close_rest();
    }

    #[test]
    fn a_connection_exported_and_taken_back_delivers_what_it_held_in_order() {
        // The old relay: a connection whose direction to the upstream holds bytes in memory.
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = front.local_addr().unwrap();
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = server.local_addr().unwrap();
        let mut old = Relay::new(8, Share::unlimited()).unwrap();
        old.open(front, target);
        let (client, mut client_peer) = sockets();
        let upstream = TcpStream::connect(target).unwrap();
        let (mut inside, _) = server.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        upstream.set_nonblocking(true).unwrap();
        let mut held = Flow {
            pending: b"held in memory".to_vec(),
            ..Flow::default()
        };
        pending_into_pipe(&mut held);
        assert_eq!((held.in_pipe, held.pending.len()), (14, 0));
        held.pending = b", then more".to_vec();
        let mut pair = Pair::new(target.port(), client, upstream, true);
        pair.flows = [held, Flow::default()];
        old.pairs.push(Some(pair));
        let mut carry = Carry::new();
        let forwards = old.export(&mut carry);
        assert_eq!(forwards.len(), 1);
        assert_eq!(forwards[0].port, u32::from(target.port()));
        assert_eq!(forwards[0].upstream, target.to_string());
        let flow = &forwards[0].connections[0].flows[0];
        assert_eq!(
            (flow.pipe.len(), &flow.pending[..]),
            (2, &b", then more"[..])
        );
        // The next image: the numbers written down, the duplicates left to it.
        let numbers = carry.numbers();
        std::mem::forget(carry);
        drop(old);
        let mut inherited = Inherited::claim(&numbers);
        let (restored, adopted) = Restored::from_handover(&forwards, &mut inherited);
        assert_eq!((adopted.listeners, adopted.connections), (1, 1));
        let mut new = Relay::new(8, Share::unlimited()).unwrap();
        let served = new.take_over(restored, address.ip());
        assert_eq!(served, vec![(target.port(), target)]);
        inside
            .set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..500 {
            new.turn(Some(Duration::from_millis(10)));
            let mut buf = [0u8; 64];
            if let Ok(n) = inside.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
            if got.len() >= 25 {
                break;
            }
        }
        assert_eq!(got, b"held in memory, then more");
        // And the other way, through the new relay.
        inside.write_all(b"back").unwrap();
        client_peer
            .set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let mut back = [0u8; 4];
        for _ in 0..500 {
            new.turn(Some(Duration::from_millis(10)));
            if client_peer.read_exact(&mut back).is_ok() {
                break;
            }
        }
        assert_eq!(&back, b"back");
        // A listener elsewhere than the forward address is not served.
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        let restored = Restored {
            listeners: vec![(elsewhere, target)],
            pairs: Vec::new(),
        };
        let mut other = Relay::new(8, Share::unlimited()).unwrap();
        assert!(other
            .take_over(restored, "127.0.0.2".parse().unwrap())
            .is_empty());
    }

    #[test]
    fn a_pipe_with_one_end_too_many_pending_bytes_or_one_direction_are_refused() {
        let (read, _write) = splice_pipe(1 << 16).unwrap();
        let (client, _peer) = sockets();
        let (upstream, _other) = sockets();
        let (n, mut inherited) = inherited(vec![read, client.into(), upstream.into()]);
        let one_end = CarriedFlow {
            pipe: vec![n[0]],
            ..CarriedFlow::default()
        };
        assert_eq!(
            flow_of(&one_end, &mut inherited).err(),
            Some("not a pipe's two ends")
        );
        let too_many = CarriedFlow {
            pending: vec![0; SCRATCH + 1],
            ..CarriedFlow::default()
        };
        assert_eq!(
            flow_of(&too_many, &mut inherited).err(),
            Some("more pending bytes than one read")
        );
        let one_way = CarriedConnection {
            client_fd: n[1],
            upstream_fd: n[2],
            connected: true,
            flows: vec![CarriedFlow::default()],
        };
        assert_eq!(
            pair_of(1, &one_way, &mut inherited).err(),
            Some("not two directions")
        );
        inherited.close_rest();
    }
}
