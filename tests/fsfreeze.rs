//! Issue 25's `/fsfreeze` and `/fsthaw`, only ever on an ext4 image the test makes in a temp
//! dir and loop-mounts (`Ext4Image`: thawed, unmounted and removed when dropped, even when the
//! test fails). While frozen, uploads, compose and the filesystem service's writes are refused
//! (an upload already under way included) and `/health` answers; after the thaw they succeed.

use std::io::{BufReader, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::common::connect::unary;
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
