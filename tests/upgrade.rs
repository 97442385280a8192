//! `POST /upgrade` (SPEC §9c): a new binary takes over the running daemon in the same process,
//! the listening socket and `/init`'s state handed over, no connection refused meanwhile; every
//! refusal leaves the old daemon serving as before. The "new" binary is this build's own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{builder, Daemon, TOKEN};

/// A daemon whose `--upgrade-path` is in a directory of the test's.
pub(crate) fn daemon_upgrading_into(dir: &Path) -> Daemon {
    builder()
        .arg("--upgrade-path")
        .arg(dir.join("envd.next").to_str().unwrap())
        .start()
}

pub(crate) fn init(daemon: &Daemon, body: serde_json::Value) {
    let reply = daemon.call("POST", "/init", body.to_string().as_bytes());
    assert_eq!(reply.status, 204, "{}", reply.text());
}

/// Sends `POST /upgrade` with `body` and returns what came back: the raw answer, empty when
/// the connection closed without one (the daemon executed the new binary).
pub(crate) fn upgrade(
    daemon: &Daemon,
    token: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> String {
    let mut stream = upgrade_head(daemon, token, headers, body.len());
    // The daemon may answer (and close) before the whole body is sent.
    let _ = stream.write_all(body);
    read_answer(stream)
}

/// A connection on which the head of `POST /upgrade` with a body of `length` bytes is sent.
pub(crate) fn upgrade_head(
    daemon: &Daemon,
    token: &str,
    headers: &[(&str, &str)],
    length: usize,
) -> TcpStream {
    let mut stream = TcpStream::connect(daemon.addr).unwrap();
    let mut head = format!(
        "POST /upgrade HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {token}\r\nContent-Length: {length}\r\n",
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// Everything the daemon sends on `stream` until it closes it (empty: it executed the new
/// binary).
pub(crate) fn read_answer(mut stream: TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

pub(crate) fn own_binary() -> Vec<u8> {
    std::fs::read(env!("CARGO_BIN_EXE_sandboxd")).unwrap()
}

/// Loops `GET /health` on new connections from another thread until stopped; counts failures.
pub(crate) struct HealthLoop {
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthLoop {
    pub(crate) fn start(daemon: &Daemon) -> HealthLoop {
        let (stop, failures, answered) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let addr = daemon.addr;
        let (s, f, a) = (stop.clone(), failures.clone(), answered.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let ok = TcpStream::connect(addr).ok().and_then(|mut stream| {
                    stream
                        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                        .ok()?;
                    let mut answer = String::new();
                    stream.read_to_string(&mut answer).ok()?;
                    answer.starts_with("HTTP/1.1 204").then_some(())
                });
                match ok {
                    Some(()) => a.fetch_add(1, Ordering::SeqCst),
                    None => f.fetch_add(1, Ordering::SeqCst),
                };
            }
        });
        HealthLoop {
            stop,
            failures,
            answered,
            thread: Some(thread),
        }
    }

    /// Stops; (answered, failed).
    pub(crate) fn stop(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        (
            self.answered.load(Ordering::SeqCst),
            self.failures.load(Ordering::SeqCst),
        )
    }
}

pub(crate) fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names
}

#[test]
fn upgrade_needs_the_token_and_an_authorised_init_first() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    let answer = upgrade(&daemon, "wrong", &[], b"");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let answer = upgrade(&daemon, TOKEN, &[], b"");
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert!(
        answer
            .contains("not initialized: /upgrade is accepted only after an authorised POST /init"),
        "{answer}"
    );
    init(&daemon, json!({}));
    let answer = upgrade(
        &daemon,
        TOKEN,
        &[("X-Envd-Upgrade-Bin", "/usr/bin/other")],
        b"",
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let expected = format!(
        "unsupported upgrade target '/usr/bin/other': the only ones are '{}' (--upgrade-path) \
         and envd's '/usr/bin/envd.next', which means it",
        dir.path().join("envd.next").display()
    );
    assert!(answer.contains(&expected), "{answer}");
    // Larger than any binary accepted: refused from the head, nothing written.
    let reply = daemon.raw(
        format!(
            "POST /upgrade HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Length: 268435457\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    reply.assert_error(413, "the new binary is larger than 268435456 bytes");
    assert_eq!(files_in(dir.path()), Vec::<PathBuf>::new());
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn a_new_binary_takes_over_in_the_same_process_with_the_state_and_no_refused_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = daemon_upgrading_into(dir.path());
    init(
        &daemon,
        json!({"accessToken": "rotated", "envVars": {"KEPT": "yes"}, "defaultUser": "user",
               "timestamp": "2030-01-01T00:00:00Z"}),
    );
    let pid = daemon.pid();
    let health = HealthLoop::start(&daemon);
    std::thread::sleep(Duration::from_millis(100));
    let target = dir.path().join("envd.next");
    let answer = upgrade(
        &daemon,
        "rotated",
        &[("X-Envd-Upgrade-Bin", target.to_str().unwrap())],
        &own_binary(),
    );
    assert_eq!(
        answer, "",
        "no answer: the connection closes with the execve"
    );
    daemon.log_with(|line| line.contains("upgrade: took over from sandboxd "));
    std::thread::sleep(Duration::from_millis(200));
    let (answered, failed) = health.stop();
    assert_eq!(failed, 0, "{answered} answered around the upgrade");
    assert!(answered > 0);
    assert!(daemon.is_running());
    assert_eq!(daemon.pid(), pid);
    // Each answer's line was written, by one image or the other: the workers' buffered lines
    // are written before the `execve` (or within a second after).
    let logged = |daemon: &Daemon| {
        let log = daemon.log();
        log.iter()
            .filter(|l| l.contains(" GET /health 204 "))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while logged(&daemon) < answered && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(logged(&daemon), answered, "{:?}", daemon.log());
    // The binary is in place, whole and executable, with no temporary beside it.
    assert_eq!(std::fs::read(&target).unwrap(), own_binary());
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(files_in(dir.path()), vec![target.clone()]);
    // The process runs the file at the path, by that name (as after envd's upgrade, and as
    // `ps`, systemd and a later upgrade of the running binary see it), not the unnamed staged
    // file's `#1234 (deleted)`: found in a VM guest.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, target.canonicalize().unwrap());
    // /init's state came along: the rotated token, the variables, the order of /inits.
    let envs = daemon.call_with("GET", "/envs", &[("X-Access-Token", "rotated")], b"");
    assert_eq!(envs.status, 200);
    assert_eq!(envs.json()["KEPT"], "yes");
    let stale = json!({"accessToken": "older", "timestamp": "2029-01-01T00:00:00Z"});
    let reply = daemon.call_with(
        "POST",
        "/init",
        &[("X-Access-Token", "rotated")],
        stale.to_string().as_bytes(),
    );
    assert_eq!(reply.status, 204);
    assert_eq!(
        reply.header("x-envd-handover"),
        Some(
            r#"{"failed":false,"procs":0,"procs_failed":0,"retained":0,"retained_failed":0,"watchers":0,"watchers_failed":0}"#
        )
    );
    let envs = daemon.call_with("GET", "/envs", &[("X-Access-Token", "rotated")], b"");
    assert_eq!(envs.status, 200, "the stale /init changed no token");
    // And it can be upgraded again, to the running binary this time (an empty body).
    assert_eq!(upgrade(&daemon, "rotated", &[], b""), "");
    daemon.log_with(|line| line.contains("upgrade: draining before executing the running binary"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon
        .log()
        .iter()
        .filter(|l| l.contains("upgrade: took over from"))
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "{:?}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.pid(), pid);
    let envs = daemon.call_with("GET", "/envs", &[("X-Access-Token", "rotated")], b"");
    assert_eq!(envs.json()["KEPT"], "yes");
}

#[test]
fn a_token_from_the_environment_crosses_an_upgrade_without_a_warning_that_routes_are_open() {
    // The token in the environment, as `make run` and E2B's unit give it: the daemon scrubs it,
    // so the new image has it only from the handover.
    let dir = tempfile::tempdir().unwrap();
    let daemon = builder()
        .no_token()
        .env("SANDBOXD_ACCESS_TOKEN", TOKEN)
        .arg("--upgrade-path")
        .arg(dir.path().join("envd.next").to_str().unwrap())
        .start();
    init(&daemon, json!({"timestamp": "2030-01-01T00:00:00Z"}));
    assert_eq!(upgrade(&daemon, TOKEN, &[], b""), "");
    daemon.log_with(|line| line.contains("upgrade: took over from sandboxd "));
    assert_eq!(
        daemon.call_with("GET", "/envs", &[], b"").status,
        401,
        "enforced"
    );
    assert_eq!(daemon.get("/envs").status, 200);
    let warnings: Vec<String> = daemon
        .log()
        .into_iter()
        .filter(|l| l.contains("no access token configured"))
        .collect();
    assert!(warnings.is_empty(), "{:?}", daemon.log());
}

#[test]
fn a_binary_that_does_not_run_is_400_and_the_old_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let answer = upgrade(&daemon, TOKEN, &[], b"\x7fELF but not really a binary");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer
            .contains("the new binary does not run: '-version' cannot start it: Exec format error"),
        "{answer}"
    );
    // A script that runs but prints no version is refused too.
    let answer = upgrade(&daemon, TOKEN, &[], b"#!/bin/sh\necho hello\n");
    assert!(
        answer.contains("the new binary does not run: '-version' it printed no version: 'hello'"),
        "{answer}"
    );
    // envd's own binary (here a stand-in answering only `-version`) runs, but would not take
    // the listener and processes over: refused before anything is touched.
    let envd = b"#!/bin/sh\ncase \"$1\" in -version) echo 0.6.13;; *) echo \"flag provided but not defined: $1\"; exit 2;; esac\n";
    let answer = upgrade(&daemon, TOKEN, &[], envd);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains(
            "the new binary cannot take over from sandboxd: '--handover-schema' exit status 2: \
             'flag provided but not defined: --handover-schema' (a daemon other than sandboxd, or \
             one without live upgrade, needs a restart instead)"
        ),
        "{answer}"
    );
    assert_eq!(files_in(dir.path()), Vec::<PathBuf>::new());
    assert_eq!(daemon.get("/health").status, 204);
    assert!(!daemon.log().iter().any(|l| l.contains("took over")));
}

#[test]
fn a_cut_upload_leaves_nothing_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    {
        let mut stream = TcpStream::connect(daemon.addr).unwrap();
        let head = format!(
            "POST /upgrade HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: 1048576\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&own_binary()[..4096]).unwrap();
        // Dropped: the connection is cut mid-body.
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files_in(dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", files_in(dir.path()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.get("/health").status, 204);
}
