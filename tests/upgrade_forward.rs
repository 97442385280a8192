//! Port forwarding across a live upgrade (SPEC §9c "Forwards" and §12): the forward listeners
//! cross the `execve` (no connection refused while the new image starts), and so do the
//! relayed connections with the bytes in flight, and a failed `execve` leaves the forwarder
//! going on where it stopped. Each test's daemon forwards on an address of its own (127.0.0.61
//! and up), as tests/forward.rs explains.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{builder, low_byte, Daemon, TOKEN};
use crate::forward::{connect, forwarded};

/// An initialised daemon forwarding on 127.0.0.`host`, upgradable into a directory of the
/// test's.
fn daemon(host: u8, dir: &std::path::Path) -> (Daemon, IpAddr) {
    let ip = IpAddr::from([127, 0, 0, host]);
    let daemon = builder()
        .args(&["--forward-address", &ip.to_string()])
        .args(&["--upgrade-path", dir.join("envd.next").to_str().unwrap()])
        .start();
    daemon.log_with(|l| l.contains(&format!("forwarding localhost ports on {ip}")));
    let reply = daemon.call("POST", "/init", json!({}).to_string().as_bytes());
    assert_eq!(reply.status, 204, "{}", reply.text());
    (daemon, ip)
}

/// A connection through `front` and the server's end of it (`server` is its upstream), both
/// giving up after a minute.
fn joined(front: SocketAddr, server: &TcpListener) -> (TcpStream, TcpStream) {
    let client = connect(front);
    let (inside, _) = server.accept().unwrap();
    inside
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    (client, inside)
}

fn count(daemon: &Daemon, text: &str) -> usize {
    daemon.log().iter().filter(|l| l.contains(text)).count()
}

/// The `n`th adoption of forwards (from 1), once logged: (listeners taken back, carried,
/// connections taken back, carried). Every loopback listener of the machine is forwarded (the
/// other tests' too), so only this test's connections are counted exactly.
fn adoption(daemon: &Daemon, n: usize) -> (usize, usize, usize, usize) {
    const LINE: &str = "upgrade: forwards: took back ";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = daemon.log();
        if let Some(line) = log.iter().filter(|l| l.contains(LINE)).nth(n - 1) {
            let numbers: Vec<usize> = line
                .split(LINE)
                .nth(1)
                .unwrap()
                .split(' ')
                .filter_map(|word| word.parse().ok())
                .collect();
            return (numbers[0], numbers[1], numbers[2], numbers[3]);
        }
        assert!(Instant::now() < deadline, "{log:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// `POST /upgrade` with an empty body (the running binary again); the connection closes with
/// the `execve`, unanswered.
fn upgrade(daemon: &Daemon) {
    let mut stream = TcpStream::connect(daemon.addr).unwrap();
    write!(
        stream,
        "POST /upgrade HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Length: 0\r\n\r\n"
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert_eq!(
        answer, "",
        "no answer: the connection closes with the execve"
    );
}

/// A server answering one line per connection: what it read, in upper case.
fn upper_server(listener: TcpListener) {
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            thread::spawn(move || {
                let mut got = Vec::new();
                let mut byte = [0u8; 1];
                while !got.ends_with(b"\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    got.push(byte[0]);
                }
                let _ = stream.write_all(&got.to_ascii_uppercase());
            });
        }
    });
}

/// One exchange through the forward on a new connection: `Some` when whole.
fn exchange(front: SocketAddr, n: usize) -> Option<()> {
    let mut client = TcpStream::connect(front).ok()?;
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    client.write_all(format!("hello {n}\n").as_bytes()).ok()?;
    let mut answer = String::new();
    client.read_to_string(&mut answer).ok()?;
    (answer == format!("HELLO {n}\n")).then_some(())
}

#[test]
fn a_forwarded_port_keeps_accepting_across_an_upgrade_and_a_new_connection_works_after() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, ip) = daemon(61, dir.path());
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = server.local_addr().unwrap();
    upper_server(server);
    let front = forwarded(&daemon, ip, upstream);

    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client_loop = {
        let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                match exchange(front, n) {
                    Some(()) => answered.fetch_add(1, Ordering::SeqCst),
                    None => failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        })
    };
    while answered.load(Ordering::SeqCst) < 20 {
        thread::sleep(Duration::from_millis(5));
    }
    upgrade(&daemon);
    daemon.log_with(|l| l.contains("upgrade: took over from sandboxd "));
    // The loop's connection under way, if any, is carried over too.
    let (listeners, carried, connections, open) = adoption(&daemon, 1);
    assert!(listeners >= 1 && listeners == carried && connections == open && open <= 1);
    let after = answered.load(Ordering::SeqCst);
    while answered.load(Ordering::SeqCst) < after + 20 {
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    client_loop.join().unwrap();
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "{} answered around the upgrade",
        answered.load(Ordering::SeqCst)
    );
    // The new image serves the carried listener: it did not bind the port again.
    assert_eq!(exchange(front, 7), Some(()));
    assert_eq!(
        count(&daemon, &format!("forwarding {ip}:{} to", upstream.port())),
        1
    );
    assert_eq!(count(&daemon, "cannot forward"), 0);
    // And a server started after the swap is forwarded too.
    let late = TcpListener::bind("[::1]:0").unwrap();
    let late_addr = late.local_addr().unwrap();
    upper_server(late);
    let late_front = forwarded(&daemon, ip, late_addr);
    assert_eq!(exchange(late_front, 8), Some(()));
}

/// Writes `bytes` to `stream` from a thread of its own (a peer that is not read blocks).
fn write_in_background(mut stream: TcpStream, bytes: Vec<u8>) -> thread::JoinHandle<()> {
    thread::spawn(move || stream.write_all(&bytes).unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| low_byte(i).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    stream.read_exact(&mut got).unwrap();
    got
}

#[test]
fn a_connection_open_across_the_upgrade_keeps_its_bytes_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, ip) = daemon(62, dir.path());
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let (mut client, mut inside) = joined(front, &server);
    client.write_all(b"before").unwrap();
    assert_eq!(read_exactly(&mut inside, 6), b"before");
    inside.write_all(b"reply").unwrap();
    assert_eq!(read_exactly(&mut client, 5), b"reply");

    // Both ways, more than socket buffers hold: nobody reads, so bytes sit in the kernel's
    // buffers and in the relay's pipes when the upgrade comes.
    const LEN: usize = 8 << 20;
    let up = pattern(LEN, 1);
    let down = pattern(LEN, 2);
    let up_writer = write_in_background(client.try_clone().unwrap(), up.clone());
    let down_writer = write_in_background(inside.try_clone().unwrap(), down.clone());
    thread::sleep(Duration::from_millis(200));
    upgrade(&daemon);
    let (listeners, carried, connections, open) = adoption(&daemon, 1);
    assert!(listeners >= 1 && listeners == carried);
    assert_eq!((connections, open), (1, 1));
    let reader = {
        let mut inside = inside.try_clone().unwrap();
        thread::spawn(move || read_exactly(&mut inside, LEN))
    };
    let got_down = read_exactly(&mut client, LEN);
    let got_up = reader.join().unwrap();
    up_writer.join().unwrap();
    down_writer.join().unwrap();
    assert!(
        got_up == up,
        "client to server: bytes lost, doubled or reordered"
    );
    assert!(
        got_down == down,
        "server to client: bytes lost, doubled or reordered"
    );

    // The connection goes on, and its ends are passed on after the swap.
    client.write_all(b"after").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    inside.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"after");
    inside.write_all(b"bye").unwrap();
    inside.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"bye");
}

fn entries(dir: String) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// The inodes of the sockets listening on `ip` (IPv4), from /proc/net/tcp.
fn listeners_on(ip: [u8; 4]) -> Vec<String> {
    let local = format!("{:08X}:", u32::from_le_bytes(ip));
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields[1].starts_with(&local) && fields[3] == "0A").then(|| fields[9].to_string())
        })
        .collect()
}

/// The daemon's descriptors, leaving out its forward listeners on `ip` (one per loopback
/// listener of the whole machine: the other tests' servers come and go): the same two reads
/// in a row.
fn descriptors(pid: i32, ip: [u8; 4]) -> usize {
    let once = || {
        let mut listening = listeners_on(ip);
        let links: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .collect();
        listening.extend(listeners_on(ip));
        links
            .iter()
            .filter(|target| {
                !listening
                    .iter()
                    .any(|inode| **target == format!("socket:[{inode}]"))
            })
            .count()
    };
    loop {
        let first = once();
        if once() == first {
            return first;
        }
    }
}

#[test]
fn ten_upgrades_leave_descriptors_and_threads_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, ip) = daemon(63, dir.path());
    assert_eq!(ip, IpAddr::from([127, 0, 0, 63]));
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let (mut client, mut inside) = joined(front, &server);
    client.write_all(b"0").unwrap();
    assert_eq!(read_exactly(&mut inside, 1), b"0");
    let pid = daemon.pid();
    let address = [127, 0, 0, 63];
    let (fds, tasks) = (
        descriptors(pid, address),
        entries(format!("/proc/{pid}/task")),
    );
    for round in 1..=10 {
        upgrade(&daemon);
        let (listeners, carried, connections, open) = adoption(&daemon, round);
        assert!(listeners >= 1 && listeners == carried);
        assert_eq!((connections, open), (1, 1));
        // The connection carried over each time still carries bytes both ways.
        let byte = [b'0' + low_byte(round % 10)];
        client.write_all(&byte).unwrap();
        assert_eq!(read_exactly(&mut inside, 1), byte);
        inside.write_all(&byte).unwrap();
        assert_eq!(read_exactly(&mut client, 1), byte);
    }
    assert_eq!(daemon.pid(), pid);
    assert_eq!(descriptors(pid, address), fds, "descriptors");
    assert_eq!(entries(format!("/proc/{pid}/task")), tasks, "threads");
    assert_eq!(count(&daemon, "not taken back"), 0);
}

#[test]
fn a_failed_execve_leaves_the_forwards_serving_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let ip = IpAddr::from([127, 0, 0, 64]);
    let target = dir.path().join("envd.next");
    let daemon = builder()
        .args(&["--forward-address", &ip.to_string()])
        .args(&["--upgrade-path", target.to_str().unwrap()])
        .args(&["--drain-timeout", "30"])
        .start();
    daemon.log_with(|l| l.contains(&format!("forwarding localhost ports on {ip}")));
    let reply = daemon.call("POST", "/init", json!({}).to_string().as_bytes());
    assert_eq!(reply.status, 204, "{}", reply.text());
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = server.local_addr().unwrap();
    let front = forwarded(&daemon, ip, upstream);
    let (mut client, mut inside) = joined(front, &server);
    client.write_all(b"one").unwrap();
    assert_eq!(read_exactly(&mut inside, 3), b"one");

    // A connection that sends nothing holds the drain, so that the binary can be made
    // unrunnable between its check and the execve.
    let holder = TcpStream::connect(daemon.addr).unwrap();
    let binary = std::fs::read(env!("CARGO_BIN_EXE_sandboxd")).unwrap();
    let addr = daemon.addr;
    let upgrade = thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "POST /upgrade HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Length: {}\r\n\r\n",
            binary.len()
        )
        .unwrap();
        stream.write_all(&binary).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    });
    daemon.log_with(|l| l.contains("upgrade: draining before executing"));
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Bytes sent while the forwarder is parked wait in the kernel.
    client.write_all(b"two").unwrap();
    drop(holder);
    let answer = upgrade.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
    assert!(
        answer.contains("upgrade failed: cannot execute"),
        "{answer}"
    );
    daemon.log_with(|l| l.contains("upgrade failed, serving on"));

    // The forwarder goes on where it stopped: the open connection both ways, new ones, scans.
    assert_eq!(read_exactly(&mut inside, 3), b"two");
    inside.write_all(b"back").unwrap();
    assert_eq!(read_exactly(&mut client, 4), b"back");
    let (mut second, mut second_inside) = joined(front, &server);
    second.write_all(b"new").unwrap();
    assert_eq!(read_exactly(&mut second_inside, 3), b"new");
    let late = TcpListener::bind("127.0.0.1:0").unwrap();
    forwarded(&daemon, ip, late.local_addr().unwrap());
    assert_eq!(count(&daemon, "took over"), 0);
}
