//! The scanner: which TCP sockets listen, from the kernel's `sock_diag` netlink interface (or,
//! where the kernel cannot answer it, `/proc/net/tcp` and `tcp6`: [`super::proc_net`]), and
//! which of their ports are to be forwarded.
//!
//! One dump per family asks the kernel for the sockets in `LISTEN` only (the state filter is
//! applied in the kernel), so a scan costs the same with ten thousand connections open as with
//! none; `/proc/net/tcp` and `tcp6` list every socket as text (docs/design.md has the
//! measurements). A kernel whose `inet_diag`/`tcp_diag` modules are not loaded answers the dump
//! `ENOENT`; the scanner then reads the files, as envd does, and says which source it uses
//! ([`Scanner::source`]). The messages are built and read here in safe code; `sys::net` moves
//! their bytes. [`plan`] is pure: listening sockets in, the ports to forward out.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::sys::net::DiagSocket;

/// One listening TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub ip: IpAddr,
    pub port: u16,
}

const NLMSG_HEADER: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const TCP_LISTEN: u32 = 10;
/// `inet_diag_req_v2`: family, protocol, ext, pad, states, then the 48-byte socket id.
const REQUEST_BODY: usize = 56;
/// `inet_diag_msg` up to the end of its socket id: family, state, timer, retrans, id.
const MESSAGE_MIN: usize = 4 + 48;

/// Where a scanner reads the listening sockets, kept between scans.
pub enum Scanner {
    Diag(DiagScanner),
    /// `/proc/net/tcp{,6}`, with why `sock_diag` could not be used and the buffer reused.
    ProcNet {
        why: String,
        buf: Vec<u8>,
    },
}

impl Scanner {
    /// A `sock_diag` scanner when a first dump works, else one reading `/proc/net`.
    pub fn new() -> Scanner {
        let diag = DiagScanner::new().and_then(|mut diag| diag.listening().map(|_| diag));
        match diag {
            Ok(diag) => Scanner::Diag(diag),
            Err(e) => Scanner::ProcNet {
                why: e.to_string(),
                buf: Vec::new(),
            },
        }
    }

    /// Every TCP socket in `LISTEN`, IPv4 then IPv6.
    pub fn listening(&mut self) -> io::Result<Vec<Listening>> {
        match self {
            Scanner::Diag(diag) => diag.listening(),
            Scanner::ProcNet { buf, .. } => super::proc_net::listening(buf),
        }
    }

    /// Which source it reads, for the log.
    pub fn source(&self) -> String {
        match self {
            Scanner::Diag(_) => "sock_diag".to_string(),
            Scanner::ProcNet { why, .. } => {
                format!("/proc/net/tcp and tcp6 (sock_diag cannot list them: {why})")
            }
        }
    }
}

/// A netlink socket kept open between scans, and its receive buffer.
pub struct DiagScanner {
    socket: DiagSocket,
    buf: Vec<u8>,
    seq: u32,
}

impl DiagScanner {
    pub fn new() -> io::Result<DiagScanner> {
        Ok(DiagScanner {
            socket: DiagSocket::open()?,
            // The kernel fills a dump datagram up to the page size or so; 32 KiB holds any.
            buf: vec![0; 32 << 10],
            seq: 0,
        })
    }

    /// Every TCP socket in `LISTEN`, IPv4 then IPv6.
    pub fn listening(&mut self) -> io::Result<Vec<Listening>> {
        let mut found = Vec::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            self.seq = self.seq.wrapping_add(1);
            let family = u8::try_from(family).unwrap_or(0);
            self.socket.send(&request(family, self.seq))?;
            loop {
                let len = self.socket.recv(&mut self.buf)?;
                if read_answer(&self.buf[..len.min(self.buf.len())], &mut found)? {
                    break;
                }
            }
        }
        Ok(found)
    }
}

/// The dump request for the TCP sockets of `family` in `LISTEN`.
pub fn request(family: u8, seq: u32) -> Vec<u8> {
    let total = NLMSG_HEADER + REQUEST_BODY;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.push(family);
    m.push(u8::try_from(libc::IPPROTO_TCP).unwrap_or(6));
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    m.resize(total, 0);
    m
}

/// Reads one datagram of a dump answer, adding its sockets to `found`; true when it holds the
/// end of the dump. An error message from the kernel is its error.
pub fn read_answer(mut datagram: &[u8], found: &mut Vec<Listening>) -> io::Result<bool> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed sock_diag answer");
    while datagram.len() >= NLMSG_HEADER {
        let len = usize::try_from(ne_u32(&datagram[0..4])).map_err(|_| bad())?;
        if len < NLMSG_HEADER || len > datagram.len() {
            return Err(bad());
        }
        let kind = u16::from_ne_bytes([datagram[4], datagram[5]]);
        let body = &datagram[NLMSG_HEADER..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = body
                    .get(0..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                return Err(io::Error::from_raw_os_error(
                    errno.checked_neg().unwrap_or(libc::EIO),
                ));
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some(listening) = read_socket(body) {
                    found.push(listening);
                }
            }
            _ => {}
        }
        // Messages are aligned to 4 bytes.
        let next = len.checked_add(3).ok_or_else(bad)? & !3;
        datagram = datagram.get(next..).unwrap_or(&[]);
    }
    Ok(false)
}

/// One `inet_diag_msg`: its local address and port.
fn read_socket(body: &[u8]) -> Option<Listening> {
    if body.len() < MESSAGE_MIN {
        return None;
    }
    let family = i32::from(body[0]);
    // The id: source port (big-endian), destination port, then the source address.
    let port = u16::from_be_bytes([body[4], body[5]]);
    let src = &body[8..24];
    let ip = if family == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(src[0], src[1], src[2], src[3]))
    } else if family == libc::AF_INET6 {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(src);
        let v6 = Ipv6Addr::from(octets);
        // A v4-mapped address is the IPv4 address it maps.
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    } else {
        return None;
    };
    Some(Listening { ip, port })
}

fn ne_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// Forwards by port: the port and the loopback address a forward connects to, sorted by port,
/// one entry per port.
pub type Forwards = Vec<(u16, SocketAddr)>;

/// What [`plan`] decided about the ports seen on loopback.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The upstream is `127.0.0.1` when a server listens there, else `::1`.
    pub forward: Forwards,
    /// Loopback ports left out because the cap on forwarded ports is reached.
    pub over_cap: Vec<u16>,
}

/// Whether `port` is one of `forwards`.
pub fn has(forwards: &Forwards, port: u16) -> bool {
    forwards.binary_search_by_key(&port, |(p, _)| *p).is_ok()
}

/// The ports to forward: those with a listener on `127.0.0.1` or `::1` (envd's choice), except
/// `own` (the daemon's port), those already reachable some other way (a listener on the
/// wildcard address or on `forward_ip` that is not one of `ours`), and past `cap` ports, the
/// highest (left in `over_cap`). Ports in `ours` keep their place under the cap first, so a
/// forward is never dropped for a newcomer.
pub fn plan(
    listening: &[Listening],
    forward_ip: IpAddr,
    own: u16,
    ours: &Forwards,
    cap: usize,
) -> Plan {
    let mut reachable: Vec<u16> = listening
        .iter()
        .filter(|l| l.ip.is_unspecified() || (l.ip == forward_ip && !has(ours, l.port)))
        .map(|l| l.port)
        .collect();
    reachable.sort_unstable();
    let mut loopback: Forwards = listening
        .iter()
        .filter(|l| {
            l.ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || l.ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
        })
        .filter(|l| l.port != own && reachable.binary_search(&l.port).is_err())
        .map(|l| (l.port, SocketAddr::new(l.ip, l.port)))
        .collect();
    // IPv4 first within a port, then one entry per port.
    loopback.sort_unstable_by_key(|(port, upstream)| (*port, upstream.is_ipv6()));
    loopback.dedup_by_key(|(port, _)| *port);
    let mut result = Plan::default();
    let (kept, new): (Forwards, Forwards) =
        loopback.into_iter().partition(|(port, _)| has(ours, *port));
    for (port, upstream) in kept.into_iter().chain(new) {
        if result.forward.len() < cap {
            result.forward.push((port, upstream));
        } else {
            result.over_cap.push(port);
        }
    }
    result.forward.sort_unstable_by_key(|(port, _)| *port);
    result
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A listener at `ip`:`port` (also `proc_net`'s tests').
    pub(in crate::platform::forward) fn l(ip: &str, port: u16) -> Listening {
        Listening {
            ip: ip.parse().unwrap(),
            port,
        }
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_request_asks_for_listening_tcp_sockets_of_one_family() {
        let m = request(2, 9);
        assert_eq!(m.len(), 72);
        assert_eq!(&m[0..4], &72u32.to_ne_bytes());
        assert_eq!(&m[4..6], &20u16.to_ne_bytes());
        assert_eq!(&m[6..8], &0x301u16.to_ne_bytes());
        assert_eq!(&m[8..12], &9u32.to_ne_bytes());
        assert_eq!(&m[16..20], &[2, 6, 0, 0]);
        assert_eq!(&m[20..24], &1024u32.to_ne_bytes());
        assert!(m[24..].iter().all(|b| *b == 0));
    }

    /// A dump message for one socket: header, then inet_diag_msg (72 bytes).
    fn message(family: u8, port: u16, src: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&(16u32 + 72).to_ne_bytes());
        m.extend_from_slice(&20u16.to_ne_bytes());
        m.extend_from_slice(&[2, 0]);
        m.extend_from_slice(&[0; 8]);
        m.extend_from_slice(&[family, 10, 0, 0]);
        m.extend_from_slice(&port.to_be_bytes());
        m.extend_from_slice(&[0, 0]);
        let mut address = [0u8; 16];
        address[..src.len()].copy_from_slice(src);
        m.extend_from_slice(&address);
        m.resize(16 + 72, 0);
        m
    }

    #[test]
    fn an_answer_gives_each_socket_and_ends_at_done() {
        let mut datagram = message(2, 8080, &[127, 0, 0, 1]);
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        datagram.extend(message(10, 3000, &v6));
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[127, 0, 0, 1]);
        datagram.extend(message(10, 5000, &mapped));
        let mut found = Vec::new();
        assert!(!read_answer(&datagram, &mut found).unwrap());
        assert_eq!(
            found,
            vec![l("127.0.0.1", 8080), l("::1", 3000), l("127.0.0.1", 5000)]
        );
        let mut done = 20u32.to_ne_bytes().to_vec();
        done.extend_from_slice(&3u16.to_ne_bytes());
        done.resize(20, 0);
        assert!(read_answer(&done, &mut found).unwrap());
        assert_eq!(found.len(), 3);
    }

    #[test]
    fn a_kernel_error_and_a_truncated_message_are_errors() {
        let mut error = 20u32.to_ne_bytes().to_vec();
        error.extend_from_slice(&2u16.to_ne_bytes());
        error.resize(16, 0);
        error.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        let e = read_answer(&error, &mut Vec::new()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        let mut long = message(2, 1, &[127, 0, 0, 1]);
        long.truncate(40);
        assert!(read_answer(&long, &mut Vec::new()).is_err());
    }

    #[test]
    fn the_kernel_lists_a_listener_of_this_test() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut scanner = Scanner::new();
        assert_eq!(scanner.source(), "sock_diag");
        let found = scanner.listening().unwrap();
        assert!(found.contains(&l("127.0.0.1", port)), "{found:?}");
    }

    #[test]
    fn loopback_ports_are_forwarded_unless_reachable_or_the_daemons() {
        let fwd: IpAddr = "127.0.0.2".parse().unwrap();
        let listening = [
            l("127.0.0.1", 3000),
            l("::1", 3000),
            l("::1", 4000),
            l("127.0.0.1", 49983),
            l("127.0.0.1", 5000),
            l("0.0.0.0", 5000),
            l("127.0.0.1", 6000),
            l("::", 6000),
            l("127.0.0.1", 7000),
            l("127.0.0.2", 7000),
            l("127.0.0.3", 8000),
        ];
        let plan = plan(&listening, fwd, 49983, &Vec::new(), 10);
        let expected: Forwards =
            [(3000, addr("127.0.0.1:3000")), (4000, addr("[::1]:4000"))].into();
        assert_eq!(plan.forward, expected);
        assert!(plan.over_cap.is_empty());
    }

    #[test]
    fn our_own_forward_listener_does_not_hide_its_port() {
        let fwd: IpAddr = "127.0.0.2".parse().unwrap();
        let listening = [l("127.0.0.1", 7000), l("127.0.0.2", 7000)];
        let ours: Forwards = vec![(7000, addr("127.0.0.1:7000"))];
        let plan = plan(&listening, fwd, 1, &ours, 10);
        assert_eq!(plan.forward, ours);
    }

    #[test]
    fn past_the_cap_forwards_kept_win_and_the_rest_is_listed() {
        let fwd: IpAddr = "127.0.0.2".parse().unwrap();
        let listening = [l("127.0.0.1", 1), l("127.0.0.1", 2), l("127.0.0.1", 3)];
        let ours: Forwards = vec![(3, addr("127.0.0.1:3"))];
        let plan = plan(&listening, fwd, 9, &ours, 2);
        let ports: Vec<u16> = plan.forward.iter().map(|(port, _)| *port).collect();
        assert_eq!(ports, vec![1, 3]);
        assert_eq!(plan.over_cap, vec![2]);
    }
}
