//! The forwarder and the HTTP server share one open-file limit (SPEC §10 "Descriptors", §12
//! "Caps"): a local user holding every forwarded connection the forwarder takes, and
//! unfinished request heads besides, leaves `/health` and the routes answered. The daemon runs
//! with `ulimit -n 1024` (soft and hard, so it cannot raise it), which the forwarder's share
//! reaches in a few hundred connections.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{assert_health_within, builder, Daemon, TOKEN};
use crate::forward::{forwarded, raise_own_nofile};

/// The daemon's open-file limit.
const LIMIT: usize = 1024;

/// Opens connections through `front` in batches until the forwarder stops taking them: a
/// refusal in the log, or connections the server never sees. The clients (refused ones
/// included) and how many reached the server.
fn fill(
    daemon: &Daemon,
    front: SocketAddr,
    inside: &Mutex<Vec<TcpStream>>,
) -> (Vec<TcpStream>, usize) {
    let mut clients = Vec::new();
    let refused = |d: &Daemon| {
        d.log().iter().any(|l| {
            l.contains(&format!("forward :{}: refused", front.port()))
                || l.contains(&format!("forward :{}: accept failed", front.port()))
                || l.contains(&format!("forward :{}: cannot reach", front.port()))
        })
    };
    while clients.len() < 2 * LIMIT {
        for _ in 0..32 {
            match TcpStream::connect(front) {
                Ok(stream) => clients.push(stream),
                Err(_) => return (clients, inside.lock().unwrap().len()),
            }
        }
        // Every connection taken reaches the server; one refused never does.
        let deadline = Instant::now() + Duration::from_secs(3);
        while inside.lock().unwrap().len() < clients.len() && Instant::now() < deadline {
            if refused(daemon) {
                thread::sleep(Duration::from_millis(200));
                return (clients, inside.lock().unwrap().len());
            }
            thread::sleep(Duration::from_millis(2));
        }
        if inside.lock().unwrap().len() < clients.len() {
            return (clients, inside.lock().unwrap().len());
        }
    }
    panic!(
        "the forwarder took {} connections under a limit of {LIMIT}",
        clients.len()
    );
}

/// A daemon under `ulimit -n` [`LIMIT`] forwarding to 127.0.0.`host` (with `timeout`, a flag,
/// at 120 s), and a server behind it holding every connection: every forwarded connection
/// the forwarder takes is open.
struct Exhausted {
    daemon: Daemon,
    front: SocketAddr,
    inside: Arc<Mutex<Vec<TcpStream>>>,
    /// The clients, refused ones included.
    clients: Vec<TcpStream>,
    /// How many reached the server.
    taken: usize,
}

fn forwards_taken(host: u8, timeout: &str) -> Exhausted {
    raise_own_nofile(4 * 1024 + 512);
    let ip = IpAddr::from([127, 0, 0, host]);
    let daemon = builder()
        .wrap_with_shell(&format!("ulimit -n {LIMIT} && exec"))
        // What the test leaves unfinished outlives it.
        .args(&[timeout, "120", "--forward-address", &ip.to_string()])
        .start();
    daemon.log_with(|l| l.contains(&format!("forwarding localhost ports on {ip}")));
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let front = forwarded(&daemon, ip, server.local_addr().unwrap());
    let inside = Arc::new(Mutex::new(Vec::new()));
    {
        let inside = Arc::clone(&inside);
        thread::spawn(move || {
            for stream in server.incoming() {
                let Ok(stream) = stream else { return };
                inside.lock().unwrap().push(stream);
            }
        });
    }
    let (clients, taken) = fill(&daemon, front, &inside);
    eprintln!("{} connections made, {taken} forwarded", clients.len());
    assert!(taken >= 100, "only {taken} forwarded: {:?}", daemon.log());
    Exhausted {
        daemon,
        front,
        inside,
        clients,
        taken,
    }
}

#[test]
fn every_forwarded_connection_allowed_and_unfinished_heads_leave_health_answered() {
    let Exhausted {
        daemon,
        front,
        inside,
        clients,
        taken,
    } = forwards_taken(11, "--header-timeout");
    // Three unfinished request heads, parked by the HTTP server.
    let heads: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut head = daemon.connect();
            head.write_all(b"GET /health HTTP/1.1\r\nHo").unwrap();
            head
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    for _ in 0..20 {
        assert_health_within(&daemon, Duration::from_secs(2));
    }
    let envs = daemon.get("/envs");
    assert_eq!(envs.status, 200, "{:?}", daemon.log());
    // The forwarded connections are all still open, and the forwarder said why it stopped.
    assert_eq!(inside.lock().unwrap().len(), taken);
    daemon.log_with(|l| {
        l.contains("forwarding takes at most 512 descriptors (half the open-file limit of 1024)")
    });
    let refusal = format!("forward :{}: refused 1 connection(s): ", front.port());
    daemon.log_with(|l| {
        l.contains(&refusal)
            && (l.ends_with("fewer than 512 descriptors are free, the HTTP server's reserve")
                || l.contains("its share of the open-file limit"))
    });
    drop(heads);
    drop(clients);
}

#[test]
fn out_of_descriptors_with_every_http_connection_busy_a_forwarded_one_gives_way() {
    let Exhausted {
        daemon,
        front,
        clients,
        ..
    } = forwards_taken(12, "--body-timeout");
    // The rest of the descriptors go to requests whose bodies are under way: neither idle nor
    // unfinished heads, so the HTTP server has nothing of its own to close.
    let head = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    let mut bodies = Vec::new();
    while !daemon.log().iter().any(|l| l.contains("accept failed")) {
        assert!(bodies.len() < LIMIT, "{:?}", daemon.log());
        for _ in 0..16 {
            let mut stream = daemon.connect();
            stream.write_all(head.as_bytes()).unwrap();
            bodies.push(stream);
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert_health_within(&daemon, Duration::from_secs(2));
    daemon.log_with(|l| {
        l.contains(&format!("forward :{}: closed ", front.port()))
            && l.contains("connection(s) to free descriptors for the HTTP server")
    });
    drop(bodies);
    drop(clients);
}
