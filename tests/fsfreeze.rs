//! Issue 25's `/fsfreeze` and `/fsthaw`, only ever on an ext4 image the test makes in a temp
//! dir and loop-mounts (`Ext4Image`: thawed, unmounted and removed when dropped, even when the
//! test fails). While frozen, uploads, compose and the filesystem service's writes are refused
//! (an upload already under way included) and `/health` answers; after the thaw they succeed.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::common::connect::{unary, WAIT};
use crate::common::image::Ext4Image;
use crate::common::*;

fn daemon_on(image: &Ext4Image, args: &[&str]) -> Daemon {
    builder()
        .arg("--fsfreeze-path")
        .arg(image.mount.to_str().unwrap())
        .args(args)
        .start()
}

fn upload(daemon: &Daemon, path: &Path, body: &[u8]) -> Reply {
    daemon.call_with(
        "POST",
        &format!("/files?path={}", enc(path.to_str().unwrap())),
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

fn post(daemon: &Daemon, path: &str) -> Reply {
    daemon.call("POST", path, b"")
}

const FROZEN: &str =
    "the filesystem is frozen (POST /fsfreeze): nothing is written until POST /fsthaw";

#[test]
fn writes_are_refused_while_frozen_health_answers_and_all_succeed_after_the_thaw() {
    let Some(image) = Ext4Image::make() else {
        return;
    };
    let daemon = daemon_on(&image, &[]);
    let file = image.mount.join("a.txt");
    assert_eq!(upload(&daemon, &file, b"before").status, 200);
    // An upload under way: its head and half its body sent before the freeze.
    let mut stream = daemon.connect();
    let target = format!(
        "/files?path={}",
        enc(image.mount.join("b.txt").to_str().unwrap())
    );
    write!(
        stream,
        "POST {target} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 8\r\n\r\nhalf"
    )
    .unwrap();
    stream.flush().unwrap();
    // Under way: its unnamed file is open on the image before the freeze.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while files_in_progress(&daemon, &image.mount) == 0 {
        assert!(std::time::Instant::now() < deadline, "the upload began");
        std::thread::sleep(Duration::from_millis(10));
    }
    let reply = post(&daemon, "/fsfreeze");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(post(&daemon, "/fsfreeze").status, 204, "idempotent");
    stream.write_all(b"more").unwrap();
    let refused = read_reply(&mut BufReader::new(stream), false).expect("an answer");
    refused.assert_error(503, FROZEN);
    upload(&daemon, &file, b"during").assert_error(503, FROZEN);
    let compose = json!({"source_paths": [file.to_str().unwrap()],
                         "destination": image.mount.join("c").to_str().unwrap()});
    daemon
        .call("POST", "/files/compose", compose.to_string().as_bytes())
        .assert_error(503, FROZEN);
    // A live upgrade writes its binary: refused from the head too (whatever else it lacks).
    daemon
        .call("POST", "/upgrade", b"")
        .assert_error(503, FROZEN);
    let mkdir = json!({"path": image.mount.join("d").to_str().unwrap()});
    let reply = unary(&daemon, "filesystem.Filesystem/MakeDir", &[], &mkdir);
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!({"code": "unavailable", "message": FROZEN})
    );
    for _ in 0..20 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    assert_eq!(daemon.get("/metrics").status, 200);
    // Reads go on.
    let reply = daemon.get(&format!("/files?path={}", enc(file.to_str().unwrap())));
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"before"[..]));
    let reply = post(&daemon, "/fsthaw");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(post(&daemon, "/fsthaw").status, 204, "idempotent");
    assert_eq!(upload(&daemon, &file, b"after").status, 200);
    assert_eq!(std::fs::read(&file).unwrap(), b"after");
    assert!(
        !image.mount.join("b.txt").exists(),
        "the refused upload left nothing"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while files_in_progress(&daemon, &image.mount) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "its unnamed file was closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let reply = daemon.call("POST", "/files/compose", compose.to_string().as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = unary(&daemon, "filesystem.Filesystem/MakeDir", &[], &mkdir);
    assert_eq!(reply.status, 200, "{}", reply.text());
}

/// A caller without the token (or a valid signature) is told 401 while the filesystem is
/// frozen, as at any other time, never that it is frozen (found in a QEMU guest, issue 35).
#[test]
fn while_frozen_a_write_without_the_token_is_401_not_503() {
    let Some(image) = Ext4Image::make() else {
        return;
    };
    let daemon = daemon_on(&image, &[]);
    assert_eq!(post(&daemon, "/fsfreeze").status, 204);
    let target = format!(
        "/files?path={}",
        enc(image.mount.join("a.txt").to_str().unwrap())
    );
    for method in ["POST", "PUT"] {
        let reply = daemon.call_with(method, &target, &[], b"x");
        assert_eq!(reply.status, 401, "{method}: {}", reply.text());
        let reply = daemon.call_with(method, &target, &[("X-Access-Token", "wrong")], b"x");
        assert_eq!(reply.status, 401, "{method}: {}", reply.text());
    }
    let signed = format!("{target}&signature=v1_nope&signature_expiration=4102444800");
    assert_eq!(daemon.call_with("PUT", &signed, &[], b"x").status, 401);
    for route in ["/files/compose", "/upgrade"] {
        let reply = daemon.call_with("POST", route, &[], b"{}");
        assert_eq!(reply.status, 401, "{route}: {}", reply.text());
    }
    // With the token: frozen.
    daemon.call("PUT", &target, b"x").assert_error(503, FROZEN);
    assert_eq!(post(&daemon, "/fsthaw").status, 204);
    assert_eq!(daemon.call("PUT", &target, b"x").status, 200);
}

#[test]
fn the_watchdog_thaws_a_filesystem_freeze_nobody_ended() {
    let Some(image) = Ext4Image::make() else {
        return;
    };
    let daemon = daemon_on(&image, &["--thaw-watchdog", "0.3"]);
    assert_eq!(post(&daemon, "/fsfreeze").status, 204);
    let line = format!(
        "thaw watchdog: a /fsfreeze nobody ended was thawed ({})",
        image.mount.display()
    );
    let log = daemon.log_with(|l| l.ends_with(&line));
    assert!(log.iter().any(|l| l.ends_with(&line)));
    let file = image.mount.join("after-watchdog");
    assert_eq!(upload(&daemon, &file, b"x").status, 200);
}

#[test]
fn a_path_that_cannot_be_frozen_is_500_naming_it_and_writes_go_on() {
    // The harness's default --fsfreeze-path does not exist: nothing real is ever frozen.
    let daemon = start();
    let reply = post(&daemon, "/fsfreeze");
    let path = daemon.dir.path().join("no-fsfreeze");
    reply.assert_error(
        500,
        &format!(
            "FIFREEZE {}: No such file or directory (os error 2)",
            path.display()
        ),
    );
    let reply = post(&daemon, "/fsthaw");
    reply.assert_error(
        500,
        &format!(
            "FITHAW {}: No such file or directory (os error 2)",
            path.display()
        ),
    );
    assert_eq!(daemon.call_with("POST", "/fsfreeze", &[], b"").status, 401);
    let file = daemon.home().join("x");
    assert_eq!(upload(&daemon, &file, b"x").status, 200);
}

const FREEZING: &str = "a filesystem freeze is in progress (POST /fsfreeze waits for the \
                        writes under way): nothing is written until POST /fsthaw";

/// The test's image frozen behind the daemon's back (`fsfreeze -f`), so that a write the
/// daemon lets through sleeps in the kernel; thawed when dropped, before the daemon is killed
/// (a process with a thread asleep on a frozen filesystem cannot end).
struct FrozenBehind<'a>(&'a Path);

impl FrozenBehind<'_> {
    fn freeze(path: &Path) -> FrozenBehind<'_> {
        let frozen = std::process::Command::new("fsfreeze")
            .arg("-f")
            .arg(path)
            .status()
            .unwrap();
        assert!(frozen.success(), "fsfreeze -f on the test's image");
        FrozenBehind(path)
    }
}

impl Drop for FrozenBehind<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .arg("-u")
            .arg(self.0)
            .status();
    }
}

/// The answer to a request sent with `Daemon::send`, waited for at most `WAIT`.
fn answer(stream: TcpStream) -> Reply {
    stream.set_read_timeout(Some(WAIT)).unwrap();
    read_reply(&mut BufReader::new(stream), false).expect("an answer in time")
}

/// Whether a thread of `pid` sleeps uninterruptibly (state D: in the kernel, on the frozen
/// filesystem).
fn asleep_in_the_kernel(pid: i32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('D'))
        })
    })
}

#[test]
fn while_a_freeze_waits_for_a_write_later_writers_are_refused_at_once_and_hold_no_worker() {
    const WORKERS: usize = 4;
    let Some(image) = Ext4Image::make() else {
        return;
    };
    let daemon = daemon_on(&image, &["--workers", &WORKERS.to_string()]);
    // A write call that takes long: a MakeDir the daemon lets through, asleep on the image
    // frozen behind its back.
    let behind = FrozenBehind::freeze(&image.mount);
    let mkdir = json!({"path": image.mount.join("slow").to_str().unwrap()});
    let slow = daemon.send(
        "POST",
        "/filesystem.Filesystem/MakeDir",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/json"),
        ],
        mkdir.to_string().as_bytes(),
    );
    let deadline = std::time::Instant::now() + WAIT;
    while !asleep_in_the_kernel(daemon.pid()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the MakeDir reached the kernel"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // /fsfreeze waits for it. An upload that fails its checks once past the gate (an unknown
    // format) shows when the gate has closed: 400 before, 503 after.
    let freeze = daemon.send("POST", "/fsfreeze", &[("X-Access-Token", TOKEN)], b"");
    let probe = format!(
        "/files?path={}&format=bogus",
        enc(image.mount.join("p").to_str().unwrap())
    );
    loop {
        let reply = answer(daemon.send("POST", &probe, &[("X-Access-Token", TOKEN)], b"x"));
        if reply.status == 503 {
            reply.assert_error(503, FREEZING);
            break;
        }
        reply.assert_error(
            400,
            "unknown format 'bogus': the only archive format is tar",
        );
        assert!(std::time::Instant::now() < deadline, "the freeze began");
    }
    // Three times as many writers as workers, all at once: without a token, 401; with one,
    // refused. None waits for the freeze.
    let file = enc(image.mount.join("f").to_str().unwrap());
    let upload = format!("/files?path={file}");
    let compose = json!({"source_paths": [image.mount.join("f").to_str().unwrap()],
                         "destination": image.mount.join("c").to_str().unwrap()})
    .to_string();
    let mkdir_body = mkdir.to_string();
    let octets = ("Content-Type", "application/octet-stream");
    let json_type = ("Content-Type", "application/json");
    // (method, target, body, content type)
    let requests = [
        ("POST", upload.as_str(), &b"data"[..], octets),
        ("PUT", &upload, b"data", octets),
        ("POST", "/files/compose", compose.as_bytes(), json_type),
        ("POST", "/upgrade", b"", octets),
        (
            "POST",
            "/filesystem.Filesystem/MakeDir",
            mkdir_body.as_bytes(),
            json_type,
        ),
        (
            "POST",
            "/filesystem.Filesystem/Remove",
            mkdir_body.as_bytes(),
            json_type,
        ),
    ];
    let mut sent = Vec::new();
    while sent.len() < 3 * WORKERS {
        for &(method, target, body, content_type) in &requests {
            for token in [None, Some(TOKEN)] {
                let mut headers = vec![content_type];
                headers.extend(token.map(|t| ("X-Access-Token", t)));
                let stream = daemon.send(method, target, &headers, body);
                sent.push((method, target, token, stream));
            }
        }
    }
    for (method, target, token, stream) in sent {
        let reply = answer(stream);
        let what = format!("{method} {target} with token {token:?}");
        let connect = target.starts_with("/filesystem.");
        match (token, connect) {
            (None, false) => assert_eq!(reply.status, 401, "{what}: {}", reply.text()),
            (None, true) => assert_eq!(
                (reply.status, reply.json()["code"].as_str()),
                (401, Some("unauthenticated")),
                "{what}"
            ),
            (Some(_), false) => reply.assert_error(503, FREEZING),
            (Some(_), true) => {
                assert_eq!(reply.status, 503, "{what}: {}", reply.text());
                assert_eq!(
                    reply.json(),
                    json!({"code": "unavailable", "message": FREEZING}),
                    "{what}"
                );
            }
        }
    }
    // /health answers while the slow write and the freeze still wait.
    assert_eq!(daemon.call_with("GET", "/health", &[], b"").status, 204);
    assert!(
        !answered_yet(&slow) && !answered_yet(&freeze),
        "both still wait"
    );
    // Thawed behind the daemon's back: the slow write ends, then the freeze.
    drop(behind);
    let reply = answer(slow);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = answer(freeze);
    assert_eq!(reply.status, 204, "{}", reply.text());
    upload_refused_while_frozen(&daemon, &image);
}

/// Once frozen, a writer is refused as frozen; after `/fsthaw` it succeeds.
fn upload_refused_while_frozen(daemon: &Daemon, image: &Ext4Image) {
    let file = image.mount.join("after");
    upload(daemon, &file, b"x").assert_error(503, FROZEN);
    assert_eq!(post(daemon, "/fsthaw").status, 204);
    assert_eq!(upload(daemon, &file, b"x").status, 200);
    assert!(image.mount.join("slow").is_dir());
}
