//! Issue 34: an `/init` waiting for the metadata service's token hash holds no HTTP worker, and
//! the `/init`s that wait together share one read (SPEC §9, step 2). The service is the fake
//! MMDS of `mmds` on 127.0.0.1, made to accept connections and never answer.

use std::io::BufReader;
use std::net::TcpStream;
use std::time::Instant;

use crate::common::connect::WAIT;
use crate::common::mmds::{sha512_hex, FakeMmds};
use crate::common::{answered_yet, builder, read_reply, Daemon, TOKEN};
use crate::mmds::{metadata, wait_for_id};
use crate::routes::UNAUTHORIZED;

/// The daemon's workers: the `/init`s below outnumber them four times.
const WORKERS: usize = 4;

/// Sends an `/init` without a token on a connection of its own; the answer is read later.
fn send_init(daemon: &Daemon, body: &str) -> TcpStream {
    daemon.send("POST", "/init", &[], body.as_bytes())
}

#[test]
fn inits_waiting_for_a_silent_metadata_service_hold_no_worker_and_share_one_read() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(
        builder().args(&["--workers", &WORKERS.to_string()]),
        root.path(),
    );
    // The poller has read the service: from here on only /init's reads reach it (an /init
    // without a token is never authorised, so it asks for no poll).
    wait_for_id(&daemon, TOKEN, "isb-1");
    mmds.set(|s| s.stall = true);
    let before = mmds.connections();
    // A first /init: its read is under way, and the service will never answer it.
    let first = send_init(&daemon, r#"{"accessToken":"intruder"}"#);
    let deadline = Instant::now() + WAIT;
    while mmds.connections() == before {
        assert!(Instant::now() < deadline, "the first /init's read began");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Four times as many /inits as workers while it runs, with a wrong token or none: each
    // needs the hash, so they wait for the next read.
    let waiting: Vec<TcpStream> = (0..4 * WORKERS)
        .map(|i| send_init(&daemon, [r#"{"accessToken":"intruder"}"#, "{}"][i % 2]))
        .collect();
    // /health and an authenticated call are answered while every one of them still waits: none
    // holds a worker.
    assert_eq!(daemon.call_with("GET", "/health", &[], b"").status, 204);
    assert_eq!(daemon.get("/envs").status, 200);
    let early = waiting.iter().filter(|s| answered_yet(s)).count();
    assert_eq!(
        early, 0,
        "/inits answered before /health: they held workers"
    );
    // Then each gets its 401, from the one read they shared.
    for stream in waiting.into_iter().chain([first]) {
        stream.set_read_timeout(Some(2 * WAIT)).unwrap();
        let reply = read_reply(&mut BufReader::new(stream), false).expect("an answer");
        reply.assert_error(401, UNAUTHORIZED);
        assert_eq!(reply.header("cache-control"), Some("no-store"));
        assert!(reply.header("x-envd-version").is_some());
    }
    assert_eq!(
        mmds.connections(),
        before + 2,
        "one read for the first /init, one for the {} that came during it",
        4 * WORKERS
    );
    assert_eq!(daemon.get("/envs").status, 200, "the token is unchanged");
}
