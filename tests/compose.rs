//! `POST /files/compose` (SPEC §5) against the real binary: bytes and order, deletion of the
//! sources, every validation error with nothing touched, ownership, limits, a full disk, a kill
//! at random moments, and reflinks on XFS.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{is_root, low_byte, root_or_skip, temporaries, Daemon, Mount, Reply};
use serde_json::json;

const MIB: usize = 1024 * 1024;

/// A daemon whose default user is `user`, so relative paths land in `daemon.home()`.
fn start() -> Daemon {
    common::builder().arg("--default-user").arg("user").start()
}

fn compose(daemon: &Daemon, body: serde_json::Value) -> Reply {
    daemon.call("POST", "/files/compose", body.to_string().as_bytes())
}

fn compose_raw(daemon: &Daemon, body: &[u8]) -> Reply {
    daemon.call("POST", "/files/compose", body)
}

/// Every entry under `dir` with what identifies its state: kind, contents or link target, owner.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let state = if meta.file_type().is_symlink() {
                format!("link {:?}", fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.mode())
            } else if meta.is_file() {
                format!("file {:o} {:?}", meta.mode(), fs::read(&path).unwrap())
            } else {
                format!("other {:o}", meta.mode())
            };
            out.insert(
                path,
                format!("{state} {}:{} ino {}", meta.uid(), meta.gid(), meta.ino()),
            );
        }
    }
    out
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| low_byte(i).wrapping_mul(7).wrapping_add(seed) ^ low_byte(i >> 12))
        .collect()
}

#[test]
fn concatenates_in_order_and_deletes_the_sources() {
    let daemon = start();
    let home = daemon.home();
    let outside = daemon.dir.path().join("elsewhere/c.part");
    common::write_file(&home.join("a.part"), b"hello ");
    common::write_file(&home.join("empty.part"), b"");
    common::write_file(&home.join("sub/b.part"), b"world");
    common::write_file(&outside, b"!");
    let reply = compose(
        &daemon,
        json!({
            "source_paths": ["a.part", "empty.part", "~/sub/b.part", outside, "./a.part", "empty.part"],
            "destination": "out/result.txt",
            "unknown_field": {"ignored": true},
        }),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let dest = home.join("out/result.txt");
    assert_eq!(
        reply.json(),
        json!({"path": dest.to_string_lossy(), "name": "result.txt", "type": "file"})
    );
    assert_eq!(fs::read(&dest).unwrap(), b"hello world!hello ");
    for gone in [
        home.join("a.part"),
        home.join("empty.part"),
        home.join("sub/b.part"),
        outside,
    ] {
        assert!(!gone.exists(), "{} still exists", gone.display());
    }
    assert!(temporaries(&home.join("out")).is_empty());
    assert_eq!(fs::metadata(&dest).unwrap().mode() & 0o7777, 0o644);
}

#[test]
fn replaces_the_previous_destination_and_a_symlinked_one() {
    let daemon = start();
    let home = daemon.home();
    common::write_file(&home.join("dest.txt"), b"old contents, longer than the new");
    common::write_file(&home.join("p1"), b"new");
    let reply = compose(
        &daemon,
        json!({"source_paths": ["p1"], "destination": "dest.txt"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("dest.txt")).unwrap(), b"new");

    // A destination that is a symlink is replaced by the file; the link's target is left alone.
    common::write_file(&home.join("target.txt"), b"target");
    std::os::unix::fs::symlink(home.join("target.txt"), home.join("link.txt")).unwrap();
    common::write_file(&home.join("p2"), b"through");
    let reply = compose(
        &daemon,
        json!({"source_paths": ["p2"], "destination": "link.txt"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(fs::symlink_metadata(home.join("link.txt"))
        .unwrap()
        .is_file());
    assert_eq!(fs::read(home.join("link.txt")).unwrap(), b"through");
    assert_eq!(fs::read(home.join("target.txt")).unwrap(), b"target");
}

#[test]
fn every_validation_error_in_order_with_nothing_touched() {
    let daemon = start();
    let home = daemon.home();
    let h = |name: &str| home.join(name).display().to_string();
    common::write_file(&home.join("a.part"), b"A");
    common::write_file(&home.join("b.part"), b"B");
    common::write_file(&home.join("dest.txt"), b"old");
    fs::create_dir(home.join("dir")).unwrap();
    std::os::unix::fs::symlink(home.join("dest.txt"), home.join("link")).unwrap();
    fs::hard_link(home.join("dest.txt"), home.join("hard")).unwrap();
    std::os::unix::fs::symlink(home.join("dir"), home.join("dirlink")).unwrap();
    let fifo = Command::new("mkfifo")
        .arg(home.join("fifo"))
        .status()
        .unwrap();
    assert!(fifo.success());
    let before = snapshot(daemon.dir.path());

    let cases: Vec<(serde_json::Value, u16, String)> = vec![
        (
            json!({"destination": "x"}),
            400,
            "source_paths must not be empty".into(),
        ),
        (
            json!({"source_paths": [], "destination": "x"}),
            400,
            "source_paths must not be empty".into(),
        ),
        (
            json!({"source_paths": null}),
            400,
            "source_paths must not be empty".into(),
        ),
        (json!({}), 400, "source_paths must not be empty".into()),
        (
            json!({"source_paths": ["a.part"]}),
            400,
            "destination is required".into(),
        ),
        (
            json!({"source_paths": ["a.part"], "destination": ""}),
            400,
            "destination is required".into(),
        ),
        (
            json!({"source_paths": ["missing"], "destination": "dest.txt", "username": "nobody"}),
            401,
            "error looking up user 'nobody': unknown user".into(),
        ),
        (
            json!({"source_paths": ["a.part", "dest.txt"], "destination": "dest.txt"}),
            400,
            format!(
                "source path \"{}\" cannot be the same as destination",
                h("dest.txt")
            ),
        ),
        (
            json!({"source_paths": ["link"], "destination": "dest.txt"}),
            400,
            format!(
                "source path \"{}\" cannot be the same as destination",
                h("link")
            ),
        ),
        (
            json!({"source_paths": ["hard"], "destination": "dest.txt"}),
            400,
            format!(
                "source path \"{}\" cannot be the same as destination",
                h("hard")
            ),
        ),
        (
            json!({"source_paths": ["a.part", "missing", "dest.txt"], "destination": "dest.txt"}),
            404,
            format!("source file not found: {}", h("missing")),
        ),
        (
            json!({"source_paths": ["missing/x"], "destination": "out"}),
            404,
            format!("source file not found: {}", h("missing/x")),
        ),
        (
            json!({"source_paths": ["a.part/x"], "destination": "out"}),
            404,
            format!("source file not found: {}", h("a.part/x")),
        ),
        (
            json!({"source_paths": ["dir", "missing"], "destination": "out"}),
            400,
            format!("source path is not a regular file: {}", h("dir")),
        ),
        (
            json!({"source_paths": ["fifo"], "destination": "out"}),
            400,
            format!("source path is not a regular file: {}", h("fifo")),
        ),
        (
            json!({"source_paths": ["a.part", "bad\u{0}name"], "destination": "out"}),
            400,
            "path contains a NUL byte".into(),
        ),
        (
            json!({"source_paths": ["~other/x"], "destination": "out"}),
            400,
            "cannot resolve path '~other/x': '~user' paths are not supported".into(),
        ),
        (
            json!({"source_paths": ["a.part"], "destination": "dir"}),
            400,
            format!("destination is a directory: {}", h("dir")),
        ),
        (
            json!({"source_paths": ["a.part"], "destination": "dirlink"}),
            400,
            format!("destination is a directory: {}", h("dirlink")),
        ),
        (
            json!({"source_paths": ["a.part"], "destination": "/"}),
            400,
            "destination is a directory: /".into(),
        ),
        (
            json!({"source_paths": ["dir"], "destination": "dir"}),
            400,
            format!(
                "source path \"{}\" cannot be the same as destination",
                h("dir")
            ),
        ),
        (
            json!({"source_paths": ["a.part"], "destination": "b.part/sub/out"}),
            400,
            format!("path is a file: {}", h("b.part")),
        ),
    ];
    for (body, status, message) in &cases {
        let reply = compose(&daemon, body.clone());
        eprintln!("{body} -> {} {}", reply.status, reply.text());
        reply.assert_error(*status, message);
        assert_eq!(snapshot(daemon.dir.path()), before, "after {body}");
    }

    // Malformed bodies and wrong types, in SPEC step 1.
    for body in [
        &b"not json"[..],
        b"",
        b"null",
        b"[]",
        br#"{"source_paths": "a.part", "destination": "out"}"#,
        br#"{"source_paths": [1], "destination": "out"}"#,
        br#"{"source_paths": ["a.part"], "destination": 5}"#,
        br#"{"source_paths": ["a.part"], "destination": "out", "username": []}"#,
    ] {
        let reply = compose_raw(&daemon, body);
        assert_eq!(reply.status, 400, "{}", reply.text());
        let message = reply.json()["message"].as_str().unwrap().to_string();
        assert!(message.starts_with("invalid request body: "), "{message}");
        assert_eq!(snapshot(daemon.dir.path()), before);
    }

    // The destination through a hard link is the same file as a source named by another link.
    let reply = compose(
        &daemon,
        json!({"source_paths": ["link"], "destination": "hard"}),
    );
    reply.assert_error(
        400,
        &format!(
            "source path \"{}\" cannot be the same as destination",
            h("link")
        ),
    );
    assert_eq!(snapshot(daemon.dir.path()), before);
}

#[test]
fn authentication_method_and_body_limit() {
    let daemon = start();
    common::write_file(&daemon.home().join("a"), b"A");
    let body = json!({"source_paths": ["a"], "destination": "out"}).to_string();
    let reply = daemon.call_with("POST", "/files/compose", &[], body.as_bytes());
    reply.assert_error(
        401,
        "unauthorized access, please provide a valid access token or method signing if supported",
    );
    let reply = daemon.get("/files/compose");
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));
    let huge = format!(
        r#"{{"source_paths": ["a"], "destination": "out", "pad": "{}"}}"#,
        "x".repeat(MIB)
    );
    let reply = compose_raw(&daemon, huge.as_bytes());
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(daemon.home().join("a").exists());
    assert!(!daemon.home().join("out").exists());
}

#[test]
fn ten_thousand_sources_are_accepted_and_one_more_refused() {
    let daemon = start();
    let dir = daemon.home().join("many");
    fs::create_dir(&dir).unwrap();
    let names: Vec<String> = (0..10_000).map(|i| format!("many/{i:05}")).collect();
    for (i, name) in names.iter().enumerate() {
        fs::write(daemon.home().join(name), [low_byte(i % 251)]).unwrap();
    }
    let mut too_many = names.clone();
    too_many.push(names[0].clone());
    let reply = compose(
        &daemon,
        json!({"source_paths": too_many, "destination": "out"}),
    );
    reply.assert_error(400, "too many source_paths: at most 10000");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 10_000);
    assert!(!daemon.home().join("out").exists());

    let reply = compose(
        &daemon,
        json!({"source_paths": names, "destination": "out"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let expected: Vec<u8> = (0..10_000).map(|i| low_byte(i % 251)).collect();
    assert_eq!(fs::read(daemon.home().join("out")).unwrap(), expected);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn the_file_and_created_directories_belong_to_the_user() {
    if !root_or_skip(&format!("chown to uid {} needs root", common::USER_UID)) {
        return;
    }
    let daemon = start();
    let home = daemon.home();
    common::write_file(&home.join("a"), b"A");
    common::write_file(&home.join("b"), b"B");
    let reply = compose(
        &daemon,
        json!({"source_paths": ["a", "b"], "destination": "new/deep/out.bin", "username": "user"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let owner = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    let (uid, gid) = (common::USER_UID, common::USER_GID);
    assert_eq!(owner(&home.join("new/deep/out.bin")), (uid, gid, 0o644));
    assert_eq!(owner(&home.join("new/deep")), (uid, gid, 0o755));
    assert_eq!(owner(&home.join("new")), (uid, gid, 0o755));
    // The same compose as root gives root's file.
    common::write_file(&home.join("c"), b"C");
    let reply = compose(
        &daemon,
        json!({"source_paths": [home.join("c")], "destination": home.join("new/root.bin"), "username": "root"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(owner(&home.join("new/root.bin")), (0, 0, 0o644));
}

#[test]
fn two_composes_into_one_destination_end_as_one_of_them() {
    let daemon = start();
    let home = daemon.home();
    for round in 0..4 {
        let mut expected = Vec::new();
        let mut bodies = Vec::new();
        for side in 0..2u8 {
            let mut names = Vec::new();
            let mut all = Vec::new();
            for part in 0..4u8 {
                let name = format!("r{round}s{side}p{part}");
                let data = pattern(side * 16 + part, 2 * MIB + 123);
                common::write_file(&home.join(&name), &data);
                all.extend_from_slice(&data);
                names.push(name);
            }
            expected.push(all);
            bodies.push(json!({"source_paths": names.clone(), "destination": "shared.bin"}));
        }
        let replies: Vec<Reply> = std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|body| scope.spawn(|| compose(&daemon, body.clone())))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for reply in &replies {
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        let got = fs::read(home.join("shared.bin")).unwrap();
        assert!(
            got == expected[0] || got == expected[1],
            "round {round}: a mix"
        );
        let left: Vec<_> = fs::read_dir(&home)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "shared.bin")
            .collect();
        assert!(left.is_empty(), "round {round}: left {left:?}");
    }
}

/// Bytes at the start of every MiB of source `index`, the rest being holes (zeros).
fn mark(index: usize, mib: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&(index as u64 + 1).to_le_bytes());
    out[8..].copy_from_slice(&(mib as u64 + 1).to_le_bytes());
    out
}

#[test]
fn one_gib_in_total_with_empty_sources_between() {
    let workspace = tempfile::tempdir().unwrap();
    let _mount = if is_root() {
        Some(Mount::tmpfs(&workspace.path().join("t"), "2200m"))
    } else {
        eprintln!("not root: the 1 GiB compose runs on sparse files on the disk instead of tmpfs");
        fs::create_dir(workspace.path().join("t")).unwrap();
        None
    };
    let dir = workspace.path().join("t");
    let daemon = start();
    let sizes = [0usize, 256, 0, 256, 256, 0, 256];
    let mut names = Vec::new();
    for (index, &mibs) in sizes.iter().enumerate() {
        let path = dir.join(format!("s{index}"));
        let file = fs::File::create(&path).unwrap();
        file.set_len((mibs * MIB) as u64).unwrap();
        for mib in 0..mibs {
            file.write_all_at(&mark(index, mib), (mib * MIB) as u64)
                .unwrap();
        }
        names.push(path);
    }
    let started = Instant::now();
    let reply = compose(
        &daemon,
        json!({"source_paths": names, "destination": dir.join("out.bin")}),
    );
    eprintln!("1 GiB compose took {:?}", started.elapsed());
    assert_eq!(reply.status, 200, "{}", reply.text());
    let out = fs::File::open(dir.join("out.bin")).unwrap();
    assert_eq!(out.metadata().unwrap().len(), 1024 * MIB as u64);
    let mut chunk = vec![0u8; MIB];
    let mut expected = vec![0u8; MIB];
    let mut at = 0u64;
    for (index, &mibs) in sizes.iter().enumerate() {
        for mib in 0..mibs {
            out.read_exact_at(&mut chunk, at).unwrap();
            expected[..16].copy_from_slice(&mark(index, mib));
            assert!(chunk == expected, "source {index}, MiB {mib} is wrong");
            at += MIB as u64;
        }
    }
    for name in &names {
        assert!(!name.exists());
    }
    assert!(temporaries(&dir).is_empty());
}

#[test]
fn a_full_disk_is_507_and_touches_nothing() {
    if !root_or_skip("mounting a small tmpfs needs root") {
        return;
    }
    let daemon = start();
    let home = daemon.home();
    let small = daemon.dir.path().join("small");
    let _mount = Mount::tmpfs(&small, "4m");
    fs::write(small.join("out.bin"), b"old").unwrap();
    let a = pattern(1, 3 * MIB);
    let b = pattern(2, 3 * MIB);
    common::write_file(&home.join("a"), &a);
    common::write_file(&home.join("b"), &b);
    let before = snapshot(daemon.dir.path());
    let reply = compose(
        &daemon,
        json!({"source_paths": ["a", "b"], "destination": small.join("out.bin")}),
    );
    reply.assert_error(507, "not enough disk space available");
    assert_eq!(snapshot(daemon.dir.path()), before);
    assert!(temporaries(&small).is_empty());
    assert_eq!(fs::read(home.join("a")).unwrap(), a);
    assert_eq!(fs::read(small.join("out.bin")).unwrap(), b"old");
    assert_eq!(
        daemon.get("/health").status,
        204,
        "still serving after ENOSPC"
    );
}

#[test]
fn stale_temporaries_are_removed_by_the_next_compose_into_that_directory() {
    let daemon = start();
    let home = daemon.home();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let after_paren = &stat[stat.rfind(')').unwrap() + 1..];
    let my_start: u64 = after_paren
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let me = std::process::id();
    let stale = format!(".out.bin.sandboxd-{dead}-12345-0.tmp");
    let reused = format!(".out.bin.sandboxd-{me}-{}-3.tmp", my_start + 1);
    let live = format!(".out.bin.sandboxd-{me}-{my_start}-1.tmp");
    let other_dir_stale = format!("elsewhere/.x.sandboxd-{dead}-12345-0.tmp");
    for name in [&stale, &reused, &live, &other_dir_stale] {
        common::write_file(&home.join(name), b"leftover");
    }
    common::write_file(&home.join("a"), b"A");
    let reply = compose(
        &daemon,
        json!({"source_paths": ["a"], "destination": "out.bin"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    // The sweep runs on the daemon's sweeper thread, once per directory: wait for it.
    wait_until("the stale temporaries to go", || {
        !home.join(&stale).exists() && !home.join(&reused).exists()
    });
    assert!(
        home.join(&live).exists(),
        "a live process's temporary was removed"
    );
    assert!(home.join(&other_dir_stale).exists());
}

/// Polls `done` until it holds; fails after 10 s naming `what`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill_rounds(rounds: usize) {
    let workspace = tempfile::tempdir().unwrap();
    let dir = workspace.path().join("k");
    fs::create_dir(&dir).unwrap();
    let parts: Vec<Vec<u8>> = (0..4u8)
        .map(|i| pattern(i * 40 + 1, 12 * MIB + 4097))
        .collect();
    let whole: Vec<u8> = parts.concat();
    let names: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("part{i}"))).collect();
    let dest = dir.join("out.bin");
    let body = json!({"source_paths": names, "destination": dest}).to_string();
    let request = format!(
        "POST /files/compose HTTP/1.1\r\nHost: t\r\nX-Access-Token: {}\r\nContent-Length: {}\r\n\r\n{body}",
        common::TOKEN,
        body.len()
    );
    let reset = || {
        for (name, data) in names.iter().zip(&parts) {
            fs::write(name, data).unwrap();
        }
        fs::write(&dest, b"old").unwrap();
    };
    // Calibrate: how long one whole compose takes here.
    reset();
    let daemon = start();
    let started = Instant::now();
    let reply = daemon.call("POST", "/files/compose", body.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    let full = started.elapsed();
    drop(daemon);
    let mut rng = common::Rng::from_env("COMPOSE_KILL_SEED");
    let (mut old, mut complete) = (0, 0);
    for round in 0..rounds {
        reset();
        let mut daemon = start();
        let mut stream = daemon.connect();
        let delay = Duration::from_micros(
            rng.below(u64::try_from(full.as_micros()).unwrap() * 13 / 10 + 1),
        );
        stream.write_all(request.as_bytes()).unwrap();
        std::thread::sleep(delay);
        daemon.signal("KILL");
        assert!(daemon.wait(Duration::from_secs(5)).is_some());
        let got = fs::read(&dest).ok();
        match got.as_deref() {
            Some(b"old") => {
                old += 1;
                for (name, data) in names.iter().zip(&parts) {
                    assert!(
                        fs::read(name).ok().as_ref() == Some(data),
                        "round {round}: source changed"
                    );
                }
            }
            Some(bytes) if bytes == whole.as_slice() => {
                complete += 1;
                // Killed while deleting: each source is whole or gone.
                for (name, data) in names.iter().zip(&parts) {
                    if let Ok(bytes) = fs::read(name) {
                        assert!(&bytes == data, "round {round}: source half-deleted");
                    }
                }
            }
            Some(bytes) => panic!(
                "round {round} after {delay:?}: partial destination of {} bytes",
                bytes.len()
            ),
            None => panic!("round {round}: the destination vanished"),
        }
        // Nothing is named before it is complete, except between the link and the rename over
        // the old destination; what a kill leaves there, the next daemon's sweeper removes once
        // that daemon writes into the directory.
        let next = start();
        fs::write(dir.join("tiny"), b"t").unwrap();
        let reply = compose(
            &next,
            json!({"source_paths": [dir.join("tiny")], "destination": dir.join("other")}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        wait_until(&format!("round {round}: no temporary"), || {
            temporaries(&dir).is_empty()
        });
    }
    eprintln!("{rounds} kills (compose takes {full:?}): {old} old, {complete} complete");
}

#[test]
fn killed_at_random_moments_never_leaves_a_partial_destination() {
    kill_rounds(6);
}

#[test]
#[ignore = "long: 60 rounds of kill -9; run with --ignored"]
fn killed_at_random_moments_many_times() {
    kill_rounds(60);
}

/// An XFS image with reflink, loop-mounted by `scripts/xfs-reflink-mount`; unmounted on drop.
struct Xfs(PathBuf);

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("--umount").arg(&self.0).status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/xfs-reflink-mount")
}

#[test]
fn on_xfs_with_reflink_four_256_mib_sources_compose_in_under_50_ms_sharing_extents() {
    if !root_or_skip("the XFS loop mount needs root") {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mnt = workspace.path().join("xfs");
    let output = Command::new(script())
        .arg(workspace.path().join("xfs.img"))
        .arg(&mnt)
        .arg("2G")
        .output()
        .unwrap();
    if output.status.code() == Some(3) {
        eprintln!(
            "skipped: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return;
    }
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _xfs = Xfs(mnt.clone());
    let mut names = Vec::new();
    let mut block = vec![0u8; MIB];
    for index in 0..4 {
        let path = mnt.join(format!("s{index}"));
        let mut file = fs::File::create(&path).unwrap();
        for mib in 0..256 {
            block.fill(low_byte(index) + 1);
            block[..16].copy_from_slice(&mark(index, mib));
            file.write_all(&block).unwrap();
        }
        file.sync_all().unwrap();
        names.push(path);
    }
    let used = || {
        let out = Command::new("df")
            .args(["-B1", "--output=used"])
            .arg(&mnt)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    // A second link keeps source 0's blocks alive after the compose deletes `s0`, so the
    // destination's first quarter must show as shared extents.
    fs::hard_link(&names[0], mnt.join("keep0")).unwrap();
    let used_before = used();
    let daemon = start();
    let started = Instant::now();
    let reply = compose(
        &daemon,
        json!({"source_paths": names, "destination": mnt.join("out.bin")}),
    );
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{}", reply.text());
    eprintln!("XFS reflink compose of 4 x 256 MiB took {took:?}");
    let out = fs::File::open(mnt.join("out.bin")).unwrap();
    assert_eq!(out.metadata().unwrap().len(), 1024 * MIB as u64);
    let mut head = [0u8; 32];
    for index in 0..4 {
        for mib in 0..256 {
            out.read_exact_at(&mut head, ((index * 256 + mib) * MIB) as u64)
                .unwrap();
            assert_eq!(head[..16], mark(index, mib), "source {index}, MiB {mib}");
            assert!(head[16..].iter().all(|&b| b == low_byte(index) + 1));
        }
    }
    // Sources are deleted, so shared extents show as space not freed: nothing was copied.
    let grown = used().saturating_sub(used_before);
    assert!(
        grown < 64 * MIB as u64,
        "{grown} bytes more used: the data was copied"
    );
    let fiemap = Command::new("filefrag")
        .arg("-v")
        .arg(mnt.join("out.bin"))
        .output()
        .unwrap();
    let fiemap = String::from_utf8_lossy(&fiemap.stdout).into_owned();
    eprintln!("{}", fiemap.lines().take(8).collect::<Vec<_>>().join("\n"));
    // That nothing was copied is proven by the space used and the shared extents; how fast it
    // is, is the compose benchmark's to say, not a timed test's.
    assert!(fiemap.contains("shared"), "no shared extent:\n{fiemap}");
}

// ---- issue 13: acknowledged writes are never lost, modes kept, nothing left after a kill ----

/// A command from `/usr/sbin` or `/sbin` as well as the `PATH`.
fn tool(name: &str) -> Command {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new(name);
    command.env("PATH", format!("{path}:/usr/sbin:/sbin"));
    command
}

fn has_tool(name: &str) -> bool {
    tool("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .is_ok_and(|out| out.status.success())
}

/// An ext4 filesystem on a loop device (its image on a tmpfs of its own), mounted at `mnt`, that
/// can be frozen with `fsfreeze`: every write to it, a link or a rename included, then waits
/// until it is thawed. Thawed and unmounted when dropped, even when the test fails.
struct Freezable {
    mnt: PathBuf,
    _image_fs: Mount,
}

impl Freezable {
    /// `None` (and a message) where it cannot be made: not root, or no `mkfs.ext4`/`fsfreeze`.
    fn new(at: &Path) -> Option<Freezable> {
        if !root_or_skip("loop mounts and fsfreeze need root") {
            return None;
        }
        for name in ["mkfs.ext4", "fsfreeze"] {
            if !has_tool(name) {
                eprintln!("skipped: no {name}");
                return None;
            }
        }
        let image_fs = Mount::tmpfs(&at.join("image"), "300m");
        let image = at.join("image/fs.img");
        fs::File::create(&image)
            .unwrap()
            .set_len(256 * MIB as u64)
            .unwrap();
        let made = tool("mkfs.ext4").args(["-q", "-F"]).arg(&image).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfs.ext4");
        let mnt = at.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let mounted = tool("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt)
            .status();
        assert!(mounted.is_ok_and(|s| s.success()), "mount -o loop");
        Some(Freezable {
            mnt,
            _image_fs: image_fs,
        })
    }

    fn freeze(&self) {
        let frozen = tool("fsfreeze").arg("-f").arg(&self.mnt).status();
        assert!(frozen.is_ok_and(|s| s.success()), "fsfreeze -f");
    }

    fn thaw(&self) {
        let _ = tool("fsfreeze")
            .arg("-u")
            .arg(&self.mnt)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Freezable {
    fn drop(&mut self) {
        self.thaw();
        let ok = tool("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = tool("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Whether process `pid` has `path` open.
fn holds_open(pid: i32, path: &Path) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .any(|entry| fs::read_link(entry.path()).is_ok_and(|target| target == path))
        })
        .unwrap_or(false)
}

/// Size of `big.part`: large enough that copying it takes a while, sparse so that making it
/// costs nothing.
const BIG: usize = 96 * MIB;

/// What a compose raced with a change of its sources left.
struct Race {
    daemon: Daemon,
    reply: Reply,
    old_a: Vec<u8>,
    dest: PathBuf,
    _fs: Freezable,
}

/// Composes `a.part` (4 KiB) then `big.part` (`BIG`, sparse, marked at both ends) from the
/// home into `out.bin` on a [`Freezable`] filesystem, and runs `during` while the compose is
/// certainly under way: once the daemon holds `big.part` open (so it has read or is reading the
/// sources), the destination's filesystem is frozen, so the compose cannot put its file in
/// place, nor get to deleting sources, until `during` has returned and it is thawed. Without
/// any timing: the freeze holds the compose for as long as `during` takes.
fn race_a_compose(during: impl FnOnce(&Daemon, &Path)) -> Option<Race> {
    let daemon = start();
    let home = daemon.home();
    let fs = Freezable::new(&daemon.dir.path().join("frozen"))?;
    let old_a = pattern(3, 4096);
    common::write_file(&home.join("a.part"), &old_a);
    let big = fs::File::create(home.join("big.part")).unwrap();
    big.set_len(BIG as u64).unwrap();
    big.write_all_at(b"big-start", 0).unwrap();
    big.write_all_at(b"big-end", (BIG - 7) as u64).unwrap();
    let dest = fs.mnt.join("out.bin");
    let body = json!({"source_paths": ["a.part", "big.part"], "destination": dest}).to_string();
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files/compose HTTP/1.1\r\nHost: t\r\nX-Access-Token: {}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        common::TOKEN,
        body.len()
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(common::read_reply(
            &mut std::io::BufReader::new(stream),
            false,
        ));
    });
    let big_part = home.join("big.part");
    wait_until("the daemon to open big.part", || {
        holds_open(daemon.pid(), &big_part)
    });
    fs.freeze();
    during(&daemon, &home);
    assert!(
        rx.try_recv().is_err(),
        "the compose answered while its destination was frozen"
    );
    fs.thaw();
    let reply = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the compose answered")
        .expect("a response");
    Some(Race {
        daemon,
        reply,
        old_a,
        dest,
        _fs: fs,
    })
}

/// The bytes `out.bin` must hold: the old `a.part`, then `big.part` as it was when read.
fn expected_output(old_a: &[u8]) -> Vec<u8> {
    let mut big = vec![0u8; BIG];
    big[..9].copy_from_slice(b"big-start");
    big[BIG - 7..].copy_from_slice(b"big-end");
    [old_a, &big].concat()
}

#[test]
fn a_source_replaced_by_an_upload_during_the_compose_is_kept() {
    let Some(race) = race_a_compose(|daemon, home| {
        // A new a.part, uploaded and answered 200 while the compose runs.
        let reply = daemon.call_with(
            "POST",
            "/files?path=a.part&username=user",
            &[("X-Access-Token", common::TOKEN)],
            b"the new a.part, acknowledged",
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(
            fs::read(home.join("a.part")).unwrap(),
            b"the new a.part, acknowledged"
        );
    }) else {
        return;
    };
    let home = race.daemon.home();
    assert_eq!(race.reply.status, 200, "{}", race.reply.text());
    assert!(
        fs::read(&race.dest).unwrap() == expected_output(&race.old_a),
        "the output is not the old a.part then big.part"
    );
    let a_part = fs::read(home.join("a.part")).expect("the acknowledged upload was deleted");
    assert_eq!(a_part, b"the new a.part, acknowledged");
    assert!(
        !home.join("big.part").exists(),
        "an unchanged source was kept"
    );
    let a_path = home.join("a.part").display().to_string();
    wait_until("the log line", || {
        race.daemon.log().iter().any(|line| {
            line.contains(&format!(
                "source '{a_path}': kept it: the path names another file"
            ))
        })
    });
}

#[test]
fn bytes_appended_to_a_source_during_the_compose_are_kept() {
    let Some(race) = race_a_compose(|_, home| {
        let mut big = fs::OpenOptions::new()
            .append(true)
            .open(home.join("big.part"))
            .unwrap();
        big.write_all(b"+appended meanwhile").unwrap();
    }) else {
        return;
    };
    let home = race.daemon.home();
    assert_eq!(race.reply.status, 200, "{}", race.reply.text());
    assert!(
        fs::read(&race.dest).unwrap() == expected_output(&race.old_a),
        "the output is not a.part then big.part as it was when read"
    );
    let big = fs::read(home.join("big.part")).expect("the appended source was deleted");
    assert_eq!(big.len(), BIG + 19);
    assert!(big.ends_with(b"big-end+appended meanwhile"));
    assert!(
        !home.join("a.part").exists(),
        "an unchanged source was kept"
    );
    let big_part = home.join("big.part").display().to_string();
    wait_until("the log line", || {
        race.daemon
            .log()
            .iter()
            .any(|line| line.contains(&format!("source '{big_part}': kept it: it changed")))
    });
}

#[test]
fn composing_over_a_file_keeps_its_permission_bits() {
    let daemon = start();
    let home = daemon.home();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    common::write_file(&home.join("secret.bin"), b"old");
    fs::set_permissions(
        home.join("secret.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    common::write_file(&home.join("a"), b"A");
    common::write_file(&home.join("b"), b"B");
    let reply = compose(
        &daemon,
        json!({"source_paths": ["a"], "destination": "secret.bin"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("secret.bin")).unwrap(), b"A");
    assert_eq!(mode(&home.join("secret.bin")), 0o600);
    let reply = compose(
        &daemon,
        json!({"source_paths": ["b"], "destination": "fresh.bin"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(mode(&home.join("fresh.bin")), 0o644);
    if root_or_skip("checking the owner set by chown needs root") {
        let meta = fs::metadata(home.join("secret.bin")).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (common::USER_UID, common::USER_GID)
        );
    }
}

#[test]
fn killed_at_random_instants_a_compose_into_a_new_file_leaves_nothing_behind() {
    let workspace = tempfile::tempdir().unwrap();
    let dir = workspace.path().join("k");
    // On a tmpfs of its own when possible, to spare the disk the other tests share.
    let _mount = if is_root() {
        Some(Mount::tmpfs(&dir, "96m"))
    } else {
        fs::create_dir(&dir).unwrap();
        None
    };
    let parts: Vec<Vec<u8>> = (0..4u8)
        .map(|i| pattern(i * 50 + 7, 8 * MIB + 513))
        .collect();
    let whole: Vec<u8> = parts.concat();
    let names: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("part{i}"))).collect();
    let dest = dir.join("out.bin");
    let body = json!({"source_paths": names, "destination": dest}).to_string();
    let request = format!(
        "POST /files/compose HTTP/1.1\r\nHost: t\r\nX-Access-Token: {}\r\nContent-Length: {}\r\n\r\n{body}",
        common::TOKEN,
        body.len()
    );
    let reset = || {
        let _ = fs::remove_file(&dest);
        for (name, data) in names.iter().zip(&parts) {
            fs::write(name, data).unwrap();
        }
    };
    reset();
    let daemon = start();
    let started = Instant::now();
    let reply = daemon.call("POST", "/files/compose", body.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    let full = started.elapsed();
    drop(daemon);
    let mut rng = common::Rng::from_env("COMPOSE_KILL_SEED");
    let (mut none, mut complete) = (0, 0);
    for round in 0..8 {
        reset();
        let mut daemon = start();
        let mut stream = daemon.connect();
        let delay = Duration::from_micros(
            rng.below(u64::try_from(full.as_micros()).unwrap() * 13 / 10 + 1),
        );
        stream.write_all(request.as_bytes()).unwrap();
        std::thread::sleep(delay);
        daemon.signal("KILL");
        assert!(daemon.wait(Duration::from_secs(5)).is_some());
        // Right after the kill, before any other daemon runs: only sources and the whole
        // destination may be there, nothing else, not even a temporary.
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path == dest {
                assert!(
                    fs::read(&dest).unwrap() == whole,
                    "round {round} after {delay:?}: a partial destination"
                );
            } else {
                let index = names
                    .iter()
                    .position(|name| *name == path)
                    .unwrap_or_else(|| panic!("round {round} after {delay:?}: {path:?} left"));
                assert!(
                    fs::read(&path).unwrap() == parts[index],
                    "round {round}: source changed"
                );
            }
        }
        if dest.exists() {
            complete += 1;
        } else {
            none += 1;
            assert!(names.iter().all(|name| name.exists()), "round {round}");
        }
    }
    eprintln!("8 kills (compose takes {full:?}): {none} before, {complete} after the rename");
}
