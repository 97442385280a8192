//! The process: flags, exit codes, signals and drain, readiness notification, logs, subcommands.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn sandboxd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    // No cgroups beside the test runner's, no /fsfreeze of a real filesystem (tests/common).
    command
        .env_remove("SANDBOXD_ACCESS_TOKEN")
        .env("SANDBOXD_PROCESS_CGROUPS", "off")
        .env("SANDBOXD_FSFREEZE_PATH", "/nonexistent/no-fsfreeze");
    command
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["--bogus"][..],
        &["--workers", "0"],
        &["--listen", "not-an-address"],
        &["--header-timeout", "soon"],
    ] {
        let output = sandboxd().args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn help_and_version() {
    let output = sandboxd().arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "sandboxd 0.1.0\n");
    let output = sandboxd().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--access-token-file",
        "--drain-timeout",
        "--cgroup-root",
    ] {
        assert!(help.contains(flag), "{flag}");
    }
}

#[test]
fn unreadable_token_file_exits_2() {
    let output = sandboxd()
        .args([
            "--listen",
            "127.0.0.1:0",
            "--access-token-file",
            "/nonexistent/token",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn sign_help_prints_the_sign_options() {
    let output = sandboxd().args(["sign", "--help"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.starts_with("Usage: sandboxd sign PATH [SIGN OPTIONS]"),
        "{text}"
    );
    assert!(text.contains("--operation read|write"), "{text}");
}

#[test]
fn healthcheck_exit_codes() {
    let daemon = start();
    let status = sandboxd()
        .args(["--healthcheck", &daemon.addr.to_string()])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    // A name, as a probe in a unit file or a Dockerfile writes it.
    let by_name = format!("localhost:{}", daemon.addr.port());
    let status = sandboxd()
        .args(["--healthcheck", &by_name])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let status = sandboxd()
        .args(["--healthcheck", &addr.to_string()])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let status = sandboxd()
        .args(["--healthcheck", "bogus"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
}

#[test]
fn sigterm_finishes_the_request_in_flight_and_exits_0() {
    let mut daemon = start();
    // A keep-alive connection opened before the signal, to watch /health during the drain.
    let watcher = daemon.connect();
    let mut watcher_reader = BufReader::new(watcher.try_clone().unwrap());
    (&watcher)
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut watcher_reader, false).unwrap().status, 204);

    let body = br#"{"envVars":{"DRAINED":"yes"}}"#;
    let mut stream = daemon.connect();
    let head = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body[..5]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    daemon.signal("TERM");
    std::thread::sleep(Duration::from_millis(200));
    assert!(daemon.is_running(), "must wait for the request in flight");

    (&watcher)
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let health = read_reply(&mut watcher_reader, false).unwrap();
    health.assert_error(503, "shutting down");
    assert_eq!(health.header("connection"), Some("close"));

    stream.write_all(&body[5..]).unwrap();
    let reply = read_reply(&mut BufReader::new(stream), false).unwrap();
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("connection"), Some("close"));
    let status = daemon.wait(Duration::from_secs(5)).expect("exited");
    assert_eq!(status.code(), Some(0));
    assert!(
        std::net::TcpStream::connect(daemon.addr).is_err(),
        "no longer accepting"
    );
}

#[test]
fn drain_is_bounded_by_the_drain_timeout() {
    let mut daemon = builder().arg("--drain-timeout").arg("0.5").start();
    let mut stream = daemon.connect();
    let head =
        format!("POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: 100\r\n\r\n{{");
    stream.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    daemon.signal("INT");
    let status = daemon.wait(Duration::from_secs(5)).expect("exited");
    assert_eq!(status.code(), Some(0));
    assert!(daemon.log().iter().any(|l| l.contains("drain timeout")));
}

#[test]
fn notify_socket_gets_ready_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut daemon = builder()
        .env("NOTIFY_SOCKET", socket_path.to_str().unwrap())
        .start();
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    daemon.signal("TERM");
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert_eq!(daemon.wait(Duration::from_secs(5)).unwrap().code(), Some(0));
}

#[test]
fn request_log_has_one_line_per_request_without_secrets() {
    let daemon = start();
    daemon.get("/nope?path=a&signature=v1_SECRETSIG&signature_expiration=9");
    let log = daemon.log_with(|l| l.contains("GET /nope"));
    let line = log
        .iter()
        .find(|l| l.contains("GET /nope"))
        .expect("a request line");
    assert!(
        line.contains("/nope?path=a&signature_expiration=9 404 "),
        "{line}"
    );
    for line in &log {
        assert!(
            !line.contains(TOKEN) && !line.contains("SECRETSIG"),
            "{line}"
        );
    }
}

#[test]
fn sign_prints_a_signed_url() {
    let output = sandboxd()
        .args([
            "sign",
            "/tmp/a b.txt",
            "--username",
            "user",
            "--url",
            "http://h:1",
        ])
        .env("SANDBOXD_ACCESS_TOKEN", "secret-token")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let url = String::from_utf8(output.stdout).unwrap();
    assert!(
        url.starts_with("http://h:1/files?path=%2Ftmp%2Fa+b.txt&username=user&signature=v2_"),
        "{url}"
    );
    assert!(url.contains("&signature_expiration="));
    let output = sandboxd().args(["sign", "/x"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "no token");
}

/// The pid of `parent`'s one child (`unshare --fork`'s: the daemon, PID 1 inside).
fn only_child(parent: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap();
        if let Some(child) = children.split_whitespace().next() {
            return child.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "no child of {parent}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As PID 1 (a minimal image's init), busybox's `poweroff` (SIGUSR2 from another process) drains
/// and powers the machine off instead of being taken for `/upgrade`'s wake-up, and the daemon
/// never exits (an init that exits panics the kernel). In a PID namespace of its own the kernel
/// ends the namespace with SIGINT, which is what the test sees; `reboot` (SIGTERM) ends it with
/// SIGHUP.
#[test]
fn as_pid_1_poweroff_and_reboot_end_the_machine_after_the_drain() {
    if !crate::common::root_or_skip("a PID namespace and reboot(2) need root") {
        return;
    }
    for (name, ended_by, how) in [
        ("USR2", libc::SIGINT, "power-off"),
        ("TERM", libc::SIGHUP, "restart"),
    ] {
        let mut daemon = crate::common::builder()
            .wrap_with_shell("exec unshare --pid --fork --kill-child")
            .start();
        assert_eq!(daemon.get("/health").status, 204);
        let init = only_child(daemon.pid());
        let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
        let ns_pid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
        assert!(ns_pid.trim_end().ends_with("\t1"), "{ns_pid}");
        assert_eq!(
            std::process::Command::new("kill")
                .args([&format!("-{name}"), &init.to_string()])
                .status()
                .unwrap()
                .code(),
            Some(0)
        );
        daemon.log_with(|l| l.contains(&format!("draining, then {how} (PID 1)")));
        // The filesystems are the host's here: synced, never remounted read-only.
        daemon.log_with(|l| {
            l.contains(&format!(
                "PID 1: {how}: every process ended, filesystems synced, left mounted (a PID \
                 namespace of its own: the host's)"
            ))
        });
        let ended = daemon
            .wait(Duration::from_secs(10))
            .expect("the namespace ended");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            ended.signal(),
            Some(ended_by),
            "{ended:?} {:?}",
            daemon.log()
        );
        assert!(!daemon.log().iter().any(|l| l.contains("refused")));
    }
}
