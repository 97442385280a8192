//! envd's command line (SPEC §1): the binary started as envd's unit file and Makefile start it
//! (`envd -port N -isnotfc`, `-verbose`, `-no-cgroups`, `-cgroup-root`, `-commit`). A daemon named `envd` is
//! only ever started here with `-isnotfc`: nothing contacts a metadata service.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// `envd` (a symlink to the binary) in a fresh temp dir, with a passwd file and a token.
fn envd_command(dir: &std::path::Path) -> Command {
    let link = dir.join("envd");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandboxd"), &link).unwrap();
    let passwd = dir.join("passwd");
    write_file(
        &passwd,
        format!("root:x:0:0:root:{}:/bin/sh\n", dir.display()).as_bytes(),
    );
    let token = dir.join("token");
    write_file(&token, TOKEN.as_bytes());
    let mut command = Command::new(link);
    command
        .arg("--passwd-file")
        .arg(passwd)
        .arg("--access-token-file")
        .arg(token)
        .arg("--system-root")
        .arg(dir)
        .env_remove("SANDBOXD_LISTEN")
        .env_remove("SANDBOXD_MMDS_ADDRESS")
        .env_remove("NOTIFY_SOCKET")
        // No cgroups beside the test runner's (tests/common says why).
        .env("SANDBOXD_PROCESS_CGROUPS", "off")
        .env("SANDBOXD_FSFREEZE_PATH", dir.join("no-fsfreeze"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// `envd -port N -isnotfc` listens on 0.0.0.0:N and serves /health (asked on 127.0.0.1:N). N is
/// a port free on 127.0.0.1 a moment before; if another process takes it in between, the
/// daemon cannot listen and the test tries another.
#[test]
fn envd_port_n_isnotfc_serves_health() {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = envd_command(dir.path())
            .args(["-port", &port.to_string(), "-isnotfc"])
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut log = Vec::new();
        let started = loop {
            match lines.next() {
                Some(Ok(line)) if line.contains(" listening on ") => {
                    log.push(line);
                    break true;
                }
                Some(Ok(line)) => log.push(line),
                _ => break false,
            }
        };
        if !started {
            let _ = child.wait();
            assert!(log.iter().any(|l| l.contains("cannot listen")), "{log:?}");
            continue;
        }
        let addr = format!("0.0.0.0:{port} ");
        assert!(log.iter().any(|l| l.contains(&addr)), "{log:?}");
        assert!(
            !log.iter().any(|l| l.contains("metadata service")),
            "{log:?}"
        );
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        std::io::Write::write_all(
            &mut stream,
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let reply = read_reply(&mut BufReader::new(stream), false).unwrap();
        assert_eq!(reply.status, 204);
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    panic!("no free port could be listened on in three tries");
}

#[test]
fn verbose_is_accepted_and_no_cgroups_turns_the_process_cgroups_off() {
    let daemon = builder()
        .program_name("envd")
        .env("SANDBOXD_PROCESS_CGROUPS", "/nonexistent")
        .args(&[
            "-isnotfc",
            "-verbose",
            "--no-cgroups",
            "-cgroup-root",
            "/nonexistent",
        ])
        .start();
    assert_eq!(daemon.get("/health").status, 204);
    let log = daemon.log_with(|l| l.contains("process cgroups off"));
    let has = |text: &str| log.iter().any(|l| l.contains(text));
    assert!(has(
        "-verbose: accepted for envd's command line; sandboxd always logs to stderr"
    ));
    assert!(has(
        "process cgroups off: processes run in the daemon's own cgroup"
    ));
    // Without -no-cgroups, -cgroup-root is where the groups are made (here: nowhere).
    let daemon = builder().args(&["-cgroup-root", "/nonexistent"]).start();
    assert_eq!(daemon.get("/health").status, 204);
    daemon.log_with(|l| l.contains("process cgroups unavailable (/nonexistent: "));
    assert!(!daemon.log().iter().any(|l| l.contains("-verbose")));
}

#[test]
fn commit_prints_one_line_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    for form in ["-commit", "--commit"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .arg(form)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text, format!("{}\n", sandboxd::COMMIT));
    }
}

/// Bad uses of envd's flags exit 2 with one line naming the flag, before anything listens.
#[test]
fn bad_envd_flags_exit_2_with_their_message() {
    for (args, message) in [
        (
            &["-port", "http"][..],
            "-port must be a port from 0 to 65535, not 'http'",
        ),
        (&["-port"], "-port needs a value"),
        (
            &["-isnotfc=maybe"],
            "-isnotfc takes true or false after '=', not 'maybe'",
        ),
        (
            &["-port", "1", "--listen", "127.0.0.1:1"],
            "-port and --listen both say where",
        ),
        (
            &["-isnotfc", "--mmds-address", "127.0.0.1:1"],
            "-isnotfc says there is no metadata",
        ),
        (&["-isnotfc", "-commit"], "-commit must come first"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .args(args)
            .env_remove("SANDBOXD_LISTEN")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.starts_with(&format!("sandboxd: {message}")),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1);
    }
}
