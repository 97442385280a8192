//! Localhost port forwarding (SPEC §12): servers this test starts on `127.0.0.1` and `::1`,
//! reached through the daemon's forward address on the loopback.
//!
//! Every daemon's scanner sees every listening socket of the machine, the other tests' servers
//! and daemons included, so each test gives its daemon a forward address of its own
//! (`127.0.0.2` and up: all of 127/8 is the loopback's on Linux, no setup), and no two
//! daemons bind the same address and port.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::common::{builder, Daemon};

/// A daemon forwarding to 127.0.0.`host`, plus extra arguments.
fn forwarding(host: u8, extra: &[&str]) -> (Daemon, IpAddr) {
    let ip = IpAddr::from([127, 0, 0, host]);
    let daemon = builder()
        .args(&["--forward-address", &ip.to_string()])
        .args(extra)
        .start();
    daemon.log_with(|l| l.contains(&format!("forwarding localhost ports on {ip}")));
    (daemon, ip)
}

/// Waits until the daemon says it forwards `port` to `upstream`; the forward's address.
pub(crate) fn forwarded(daemon: &Daemon, ip: IpAddr, upstream: SocketAddr) -> SocketAddr {
    let line = format!("forwarding {ip}:{} to {upstream}", upstream.port());
    daemon.log_with(|l| l.ends_with(&line));
    SocketAddr::new(ip, upstream.port())
}

/// A connection to `to` whose reads and writes give up after a minute (a bug is a failure,
/// not a hang).
pub(crate) fn connect(to: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(to).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
}

fn count(daemon: &Daemon, text: &str) -> usize {
    daemon.log().iter().filter(|l| l.contains(text)).count()
}

/// A server answering one HTTP request per connection with a fixed body, forever.
fn http_server(listener: TcpListener) {
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let body = format!("you sent {} bytes of head", head.len());
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// An echo server: each connection gets back what it sends, then the end of it.
fn echo_server(listener: TcpListener) {
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let _ = std::io::copy(&mut reader, &mut stream);
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    });
}

#[test]
fn an_http_server_on_ipv4_and_an_echo_server_on_ipv6_answer_whole() {
    let (daemon, ip) = forwarding(2, &[]);
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap();
    http_server(http);
    let echo = TcpListener::bind("[::1]:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    echo_server(echo);

    let front = forwarded(&daemon, ip, http_addr);
    let mut client = connect(front);
    let request = b"GET /x HTTP/1.1\r\nHost: sandbox\r\n\r\n";
    client.write_all(request).unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    assert_eq!(request.len(), 34);
    assert_eq!(
        answer,
        "HTTP/1.1 200 OK\r\nContent-Length: 25\r\nConnection: close\r\n\r\nyou sent 34 bytes of head"
    );

    let front = forwarded(&daemon, ip, echo_addr);
    let mut client = connect(front);
    let message: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let writer = {
        let mut client = client.try_clone().unwrap();
        let message = message.clone();
        thread::spawn(move || {
            client.write_all(&message).unwrap();
            client.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut echoed = Vec::new();
    client.read_to_end(&mut echoed).unwrap();
    writer.join().unwrap();
    assert_eq!(echoed, message);
    // No forward was bound twice (no other daemon uses this address).
    assert_eq!(count(&daemon, &format!("cannot forward {ip}:")), 0);
}

#[test]
fn a_half_close_is_passed_on_both_ways() {
    let (daemon, ip) = forwarding(3, &[]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let mut client = connect(front);
    let (mut inside, _) = server.accept().unwrap();

    // The client's end reaches the server, which still answers.
    client.write_all(b"question").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    inside.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"question");
    inside.write_all(b"answer").unwrap();
    let mut answer = [0u8; 6];
    client.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"answer");
    inside.shutdown(Shutdown::Write).unwrap();
    assert_eq!(client.read(&mut answer).unwrap(), 0);

    // A server that closes half-way: its end reaches the client, which still sends.
    let mut client = connect(front);
    let (mut inside, _) = server.accept().unwrap();
    inside.write_all(b"bye").unwrap();
    inside.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
    client.write_all(b"still here").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut late = Vec::new();
    inside.read_to_end(&mut late).unwrap();
    assert_eq!(late, b"still here");
}

/// 64 MiB each way at once, a pattern that differs at every offset; hashes compared.
#[test]
fn a_large_transfer_arrives_whole_both_ways() {
    const SIZE: usize = 64 << 20;
    let (daemon, ip) = forwarding(4, &[]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let data = |seed: u64| -> Vec<u8> {
        let mut x = seed;
        (0..SIZE / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    };
    let up = data(0x9e37_79b9_7f4a_7c15);
    let down = data(0x1234_5678_9abc_def1);
    let (up_hash, down_hash) = (Sha256::digest(&up), Sha256::digest(&down));

    // The listener stays until the transfer is checked: a server whose listener goes has its
    // forward's connections reset at the next scan (SPEC §12).
    let listening = server.try_clone().unwrap();
    let server_side = thread::spawn(move || {
        let (mut inside, _) = server.accept().unwrap();
        let mut writer = inside.try_clone().unwrap();
        let sender = thread::spawn(move || {
            writer.write_all(&down).unwrap();
            writer.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::with_capacity(SIZE);
        inside.read_to_end(&mut got).unwrap();
        sender.join().unwrap();
        got
    });
    let mut client = connect(front);
    let mut writer = client.try_clone().unwrap();
    let sender = thread::spawn(move || {
        writer.write_all(&up).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut got = Vec::with_capacity(SIZE);
    client.read_to_end(&mut got).unwrap();
    sender.join().unwrap();
    let arrived = server_side.join().unwrap();
    assert_eq!(arrived.len(), SIZE);
    assert_eq!(Sha256::digest(&arrived), up_hash);
    assert_eq!(got.len(), SIZE);
    assert_eq!(Sha256::digest(&got), down_hash);
    drop(listening);
}

/// The listener going away closes the forward and its open connections; a new server on the
/// same port is forwarded again.
#[test]
fn a_listener_going_away_closes_its_forward_and_a_new_one_is_forwarded() {
    let (daemon, ip) = forwarding(5, &[]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = server.local_addr().unwrap();
    let front = forwarded(&daemon, ip, upstream);
    let mut client = connect(front);
    client.write_all(b"x").unwrap();
    // The server keeps the accepted connection open: only its listener goes.
    let (_inside, _) = server.accept().unwrap();
    drop(server);
    daemon.log_with(|l| {
        l.ends_with(&format!(
            "forward {front} closed: nothing listens on {upstream} any more"
        ))
    });
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1];
    // Reset, never ended cleanly: a cut stream must not look whole.
    match client.read(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the forwarded connection is not reset: {other:?}"),
    }
    let refused = TcpStream::connect(front).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    // The port reused by a new server, on the other family this time.
    let line = format!("forwarding {front} to");
    assert_eq!(count(&daemon, &line), 1);
    let reused = TcpListener::bind(SocketAddr::new("::1".parse().unwrap(), upstream.port()))
        .expect("the port is free again");
    echo_server(reused);
    daemon.log_with(|l| l.ends_with(&format!("forwarding {front} to [::1]:{}", upstream.port())));
    let mut client = connect(front);
    client.write_all(b"new server").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut echoed = Vec::new();
    client.read_to_end(&mut echoed).unwrap();
    assert_eq!(echoed, b"new server");
}

/// The soft RLIMIT_NOFILE of this process, raised from outside (no unsafe in tests).
pub(crate) fn raise_own_nofile(to: u64) {
    let limit = |soft: bool| -> u64 {
        std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|limits| {
                let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
                let field = if soft { 3 } else { 4 };
                line.split_whitespace().nth(field)?.parse().ok()
            })
            .unwrap_or(0)
    };
    if limit(true) < to {
        let to = to.min(limit(false));
        let status = std::process::Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={to}:"))
            .status();
        assert!(
            limit(true) >= to,
            "cannot raise RLIMIT_NOFILE to {to}: {status:?}"
        );
    }
}

fn threads(daemon: &Daemon) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[test]
fn a_thousand_concurrent_connections_without_a_thread_each() {
    const CONNECTIONS: usize = 1000;
    raise_own_nofile(2 * CONNECTIONS as u64 + 512);
    let (daemon, ip) = forwarding(6, &[]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let threads_before = threads(&daemon);
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let acceptor = {
        let accepted = std::sync::Arc::clone(&accepted);
        thread::spawn(move || {
            for _ in 0..CONNECTIONS {
                let (stream, _) = server.accept().unwrap();
                accepted.lock().unwrap().push(stream);
            }
            // The listener stays: its going would close the forward and its connections.
            server
        })
    };
    // In batches the server's backlog (std's 128) holds: the relay connects upstream as fast
    // as clients arrive, and a SYN the server's full queue drops is retried seconds later.
    let mut clients: Vec<TcpStream> = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS / 100 {
        clients.extend((0..100).map(|_| connect(front)));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while accepted.lock().unwrap().len() < clients.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {} accepted: {:?}",
                accepted.lock().unwrap().len(),
                clients.len(),
                daemon.log()
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
    let _server = acceptor.join().unwrap();
    let mut inside = std::mem::take(&mut *accepted.lock().unwrap());
    assert_eq!(threads(&daemon), threads_before);
    for (i, client) in clients.iter_mut().enumerate() {
        client.write_all(&(i as u64).to_le_bytes()).unwrap();
    }
    // Each accepted connection echoes its 8 bytes (whichever client it is).
    for stream in &mut inside {
        let mut got = [0u8; 8];
        stream
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("{e}: {:?}", daemon.log()));
        stream.write_all(&got).unwrap();
    }
    for (i, client) in clients.iter_mut().enumerate() {
        let mut got = [0u8; 8];
        client.read_exact(&mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i as u64);
    }
    assert_eq!(threads(&daemon), threads_before);
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn a_stalled_client_does_not_hold_up_the_others() {
    let (daemon, ip) = forwarding(7, &[]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    // The stalled client reads nothing while its server sends until the buffers fill.
    let _stalled = connect(front);
    let (inside, _) = server.accept().unwrap();
    let flood = thread::spawn(move || {
        let mut inside = inside;
        let chunk = vec![7u8; 1 << 16];
        let mut sent = 0usize;
        inside
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        while inside.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        (sent, inside)
    });
    let (sent, _inside) = flood.join().unwrap();
    assert!(sent >= 1 << 16, "only {sent} bytes went out");
    // Another client is served in full meanwhile.
    server.set_nonblocking(false).unwrap();
    echo_server(server);
    for round in 0..20u8 {
        let mut client = connect(front);
        client.write_all(&[round; 1000]).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut echoed = Vec::new();
        client.read_to_end(&mut echoed).unwrap();
        assert_eq!(echoed, vec![round; 1000]);
    }
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn the_caps_refuse_with_a_log_line() {
    let (daemon, ip) = forwarding(8, &["--forward-max-connections", "2"]);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let held: Vec<TcpStream> = (0..2).map(|_| connect(front)).collect();
    let _inside: Vec<TcpStream> = (0..2).map(|_| server.accept().unwrap().0).collect();
    let mut third = connect(front);
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert!(matches!(third.read(&mut buf), Ok(0) | Err(_)));
    daemon.log_with(|l| {
        l.ends_with(&format!(
            "forward :{}: refused 1 connection(s): 2 open, the cap per port",
            front.port()
        ))
    });
    drop(held);

    // One port at most: of two servers, one is left out, and said so.
    let (daemon, _) = forwarding(9, &["--forward-max-ports", "1"]);
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let ports = [
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    ];
    daemon.log_with(|l| {
        ports.iter().any(|port| {
            l.ends_with(&format!(
                "not forwarding localhost:{port}: 1 ports are forwarded, the cap"
            ))
        })
    });
}

#[test]
fn the_daemons_own_port_is_not_forwarded() {
    let (daemon, ip) = forwarding(10, &[]);
    // A server started after the daemon: once it is forwarded, a scan has seen both.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    forwarded(&daemon, ip, server.local_addr().unwrap());
    let own = daemon.addr.port();
    assert_eq!(count(&daemon, &format!("forwarding {ip}:{own} ")), 0);
    let refused = TcpStream::connect(SocketAddr::new(ip, own)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn an_address_on_no_interface_is_waited_for_and_said_once() {
    // ::2 is on no interface of a test machine (only ::1 is the loopback's).
    let daemon = builder().args(&["--forward-address", "::2"]).start();
    daemon.log_with(|l| {
        l.contains("forward address ::2 is not usable")
            && l.ends_with("forwarding waits until it is on an interface")
    });
    // Later scans say nothing more.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    drop(server);
    assert_eq!(count(&daemon, "forward address ::2"), 1);
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn off_starts_no_forwarder() {
    let daemon = builder().args(&["--forward-address", "off"]).start();
    assert_eq!(daemon.get("/health").status, 204);
    assert_eq!(count(&daemon, "forward"), 0);
}
