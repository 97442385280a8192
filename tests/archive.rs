//! Directory archives (SPEC §6a, §8a) against the real binary: a tree of files, directories,
//! links, modes, times, metadata and an empty directory downloaded as tar and read by GNU tar
//! (and `diff -r`), uploaded back byte for byte, gzip both ways, signed URLs both ways, every
//! refusal with its error and the destination untouched, a cut upload that leaves nothing, a
//! file that shrinks while sent, and a stalled reader that holds no worker.

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use crate::download_gzip::{dechunk, gunzip, noise, rest_of, rss_kib, start_gzip_download};

const MIB: usize = 1 << 20;

fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    if !found {
        eprintln!("skipped: {tool} is not installed");
    }
    found
}

fn tar_target(path: &Path) -> String {
    format!("/files?path={}&format=tar", enc(&path.to_string_lossy()))
}

/// The archive of `dir` as sent, unchunked; asserts the answer was complete.
fn download(daemon: &Daemon, dir: &Path, accept: &str) -> (Reply, Vec<u8>) {
    let reply = daemon.call_with(
        "GET",
        &tar_target(dir),
        &[("X-Access-Token", TOKEN), ("Accept-Encoding", accept)],
        b"",
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (data, complete) = dechunk(&reply.body);
    assert!(complete, "the answer was cut: {:?}", daemon.log());
    (reply, data)
}

/// Sets the modification time of `path` (not following a symlink) with `touch -h`.
fn touch(path: &Path, date: &str) {
    let status = Command::new("touch")
        .args(["-h", "-d", date])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A tree with every kind of member: files of several sizes and modes, a nested and an empty
/// directory, symlinks (one dangling, one to a directory outside), a long name, metadata, a
/// FIFO (never archived), times with nanoseconds.
pub fn sample_tree(root: &Path, outside: &Path) {
    fs::create_dir_all(root.join("sub/empty")).unwrap();
    fs::create_dir_all(root.join("deep/a/b")).unwrap();
    write_file(&root.join("a.txt"), b"hello\n");
    write_file(&root.join("sub/big.bin"), &noise(300_000));
    write_file(&root.join("sub/zero"), b"");
    let long = "n".repeat(140);
    write_file(&root.join("deep/a/b").join(&long), b"a long name\n");
    fs::set_permissions(root.join("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("sub/big.bin"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(root.join("deep/a"), fs::Permissions::from_mode(0o700)).unwrap();
    symlink("../a.txt", root.join("sub/link")).unwrap();
    symlink("missing/target", root.join("dangling")).unwrap();
    symlink(outside, root.join("out")).unwrap();
    xattr::set(root.join("a.txt"), "user.e2b.owner", b"alice").unwrap();
    xattr::set(root.join("sub"), "user.e2b.purpose", b"tests").unwrap();
    let status = Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    for (path, date) in [
        ("a.txt", "2020-01-02 03:04:05.123456789"),
        ("sub/big.bin", "2019-05-06 07:08:09"),
        ("sub/link", "2018-01-01 00:00:01.5"),
        ("sub/empty", "2017-01-01 00:00:00"),
        ("sub", "2016-06-06 06:06:06.000000006"),
        ("deep/a/b", "2015-01-01 00:00:00"),
        ("deep/a", "2015-01-01 00:00:00"),
        ("deep", "2015-01-01 00:00:00"),
    ] {
        touch(&root.join(path), date);
    }
}

/// `tar -t` of an archive: one line per member as GNU tar lists it.
fn listing(archive: &[u8]) -> Vec<String> {
    let mut child = Command::new("tar")
        .args(["-tvf", "-", "--full-time", "--numeric-owner"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(archive).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Extracts `archive` into `into` with GNU tar, metadata included.
fn gnu_extract(archive: &[u8], into: &Path) {
    fs::create_dir_all(into).unwrap();
    let mut child = Command::new("tar")
        .args([
            "-x",
            "--xattrs",
            "--xattrs-include=user.*",
            "-p",
            "-f",
            "-",
            "-C",
        ])
        .arg(into)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(archive).unwrap();
    assert!(child.wait().unwrap().success());
}

/// `diff -r --no-dereference`: the same names, kinds, contents and link targets.
fn assert_same_tree(a: &Path, b: &Path) {
    let output = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn a_tree_downloads_as_a_tar_gnu_tar_reads_whole() {
    if !have("tar") || !have("diff") {
        return;
    }
    let daemon = start();
    let root = daemon.dir.path().join("tree");
    let outside = daemon.dir.path().join("outside");
    write_file(&outside.join("secret"), b"not in the archive");
    sample_tree(&root, &outside);
    let (reply, archive) = download(&daemon, &root, "");
    assert_eq!(reply.header("content-type"), Some("application/x-tar"));
    assert_eq!(
        reply.header("content-disposition"),
        Some("inline; filename=\"tree.tar\"")
    );
    assert_eq!(reply.header("transfer-encoding"), Some("chunked"));
    assert_eq!(reply.header("content-encoding"), None);
    let long = "n".repeat(140);
    let uid = fs::metadata(&root).unwrap().uid();
    let ids = format!("{uid}/{}", fs::metadata(&root).unwrap().gid());
    assert_eq!(
        listing(&archive),
        [
            format!("-rw------- {ids} 6 2020-01-02 03:04:05.123456789 a.txt"),
            format!(
                "lrwxrwxrwx {ids} 0 {} dangling -> missing/target",
                mtime_of(&root.join("dangling"))
            ),
            format!("drwxr-xr-x {ids} 0 2015-01-01 00:00:00 deep/"),
            format!("drwx------ {ids} 0 2015-01-01 00:00:00 deep/a/"),
            format!("drwxr-xr-x {ids} 0 2015-01-01 00:00:00 deep/a/b/"),
            format!(
                "-rw-r--r-- {ids} 12 {} deep/a/b/{long}",
                mtime_of(&root.join("deep/a/b").join(&long))
            ),
            format!(
                "lrwxrwxrwx {ids} 0 {} out -> {}",
                mtime_of(&root.join("out")),
                outside.display()
            ),
            format!("drwxr-xr-x {ids} 0 2016-06-06 06:06:06.000000006 sub/"),
            format!("-rwxr-xr-x {ids} 300000 2019-05-06 07:08:09 sub/big.bin"),
            format!("drwxr-xr-x {ids} 0 2017-01-01 00:00:00 sub/empty/"),
            format!("lrwxrwxrwx {ids} 0 2018-01-01 00:00:01.5 sub/link -> ../a.txt"),
            format!(
                "-rw-r--r-- {ids} 0 {} sub/zero",
                mtime_of(&root.join("sub/zero"))
            ),
        ]
    );
    let copy = daemon.dir.path().join("copy");
    gnu_extract(&archive, &copy);
    fs::remove_file(root.join("fifo")).unwrap();
    assert_same_tree(&root, &copy);
    assert_eq!(
        xattr::get(copy.join("a.txt"), "user.e2b.owner").unwrap(),
        Some(b"alice".to_vec())
    );
    assert_eq!(
        xattr::get(copy.join("sub"), "user.e2b.purpose").unwrap(),
        Some(b"tests".to_vec())
    );
    // The same tree gives the same bytes; the gzip form is them compressed.
    let (_, again) = download(&daemon, &root, "identity");
    assert!(again == archive);
    let (reply, gzip) = download(&daemon, &root, "gzip");
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert!(gunzip(&gzip) == archive);
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` of a path's mtime (not following a link), as
/// `tar --full-time` shows it.
fn mtime_of(path: &Path) -> String {
    let output = Command::new("stat")
        .args(["-c", "%y"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let stamp = text.trim().rsplit_once(' ').unwrap().0.to_string();
    match stamp.split_once('.') {
        Some((whole, fraction)) => {
            let fraction = fraction.trim_end_matches('0');
            if fraction.is_empty() {
                whole.to_string()
            } else {
                format!("{whole}.{fraction}")
            }
        }
        None => stamp,
    }
}

#[test]
fn head_and_refusals_of_a_tar_download() {
    let daemon = start();
    let root = daemon.dir.path().join("tree");
    write_file(&root.join("a"), b"a");
    let reply = daemon.call("HEAD", &tar_target(&root), b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/x-tar"));
    assert_eq!(reply.header("content-length"), None);
    assert!(reply.body.is_empty());
    daemon
        .get(&format!(
            "/files?path={}&format=zip",
            enc(&root.to_string_lossy())
        ))
        .assert_error(
            400,
            "format 'zip' is not supported: only tar archives are (format=tar; \
             gzip-compressed with Accept-Encoding or Content-Encoding)",
        );
    daemon
        .get(&format!(
            "/files?path={}&format=cpio",
            enc(&root.to_string_lossy())
        ))
        .assert_error(400, "unknown format 'cpio': the only archive format is tar");
    let file = root.join("a");
    daemon.get(&tar_target(&file)).assert_error(
        400,
        &format!("path '{}' is not a directory", file.display()),
    );
    let missing = root.join("missing");
    daemon
        .get(&tar_target(&missing))
        .assert_error(404, &format!("path '{}' does not exist", missing.display()));
    daemon
        .call_with("GET", &tar_target(&root), &[], b"")
        .assert_error(401, "missing signature query parameter");
    daemon
        .call_with(
            "GET",
            &tar_target(&root),
            &[
                ("X-Access-Token", TOKEN),
                ("Accept-Encoding", "identity;q=0"),
            ],
            b"",
        )
        .assert_error(
            406,
            &format!(
                "no acceptable content coding for '{}': Accept-Encoding 'identity;q=0' \
                 refuses both codings sandboxd sends, gzip and identity",
                root.display()
            ),
        );
}

#[test]
fn a_signed_read_url_downloads_a_tar() {
    let daemon = builder().arg("--default-user").arg("user").start();
    write_file(&daemon.home().join("proj/a.txt"), b"signed");
    let target = daemon.sign("proj", &["--username", "user", "--format", "tar"]);
    assert!(target.contains("&format=tar"), "{target}");
    let reply = daemon.call_with("GET", &target, &[], b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (archive, complete) = dechunk(&reply.body);
    assert!(complete);
    let names: Vec<String> = listing(&archive)
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a.txt"]);
}

#[test]
fn a_file_that_shrinks_while_archived_cuts_the_answer() {
    let daemon = start();
    let root = daemon.dir.path().join("tree");
    let path = root.join("big.bin");
    write_file(&path, &noise(64 * MIB));
    let (mut reader, head) = start_gzip_download(&daemon, &tar_target(&root), "identity");
    assert_eq!(head.status, 200);
    // The job stops when the socket and its queue are full: far before the end.
    std::thread::sleep(Duration::from_millis(300));
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(MIB as u64)
        .unwrap();
    let body = rest_of(&mut reader);
    let (archive, complete) = dechunk(&body);
    assert!(!complete, "no last chunk: the client sees the answer cut");
    assert!(archive.len() < 64 * MIB);
    daemon.log_with(|l| {
        l.contains("tar download of '")
            && l.contains("cut: 'big.bin' shrank to 1048576 bytes while it was sent")
    });
    assert_health_within(&daemon, Duration::from_secs(1));
}

#[test]
fn stalled_tar_readers_hold_no_worker_and_little_memory() {
    let daemon = builder().arg("--workers").arg("2").start();
    let root = daemon.dir.path().join("tree");
    for i in 0..4 {
        write_file(&root.join(format!("f{i}")), &noise(16 * MIB));
    }
    let before = rss_kib(daemon.pid());
    // Four readers that take nothing: twice the workers and the download threads.
    let mut stalled: Vec<_> = (0..4)
        .map(|_| start_gzip_download(&daemon, &tar_target(&root), "identity").0)
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    let small = daemon.dir.path().join("small");
    write_file(&small.join("x"), b"x");
    let (_, archive) = download(&daemon, &small, "");
    assert_eq!(listing(&archive).len(), 1);
    let grown = rss_kib(daemon.pid()).saturating_sub(before);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB");
    // One reads on: all of it arrives.
    let (archive, complete) = dechunk(&rest_of(&mut stalled[0]));
    assert!(complete);
    assert_eq!(listing(&archive).len(), 4);
    drop(stalled);
    assert_health_within(&daemon, Duration::from_secs(1));
}

// ---- uploads (SPEC §8a) ----

/// Every entry under `dir` (not following links): its relative name, kind and mode, and its
/// bytes or link target. Two equal snapshots: nothing changed.
fn snapshot(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        // Entries may vanish meanwhile (a cut upload being undone): skipped, and the callers
        // that wait for a state take snapshots until it comes.
        let Ok(entries) = fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let data = if meta.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else if meta.file_type().is_symlink() {
                fs::read_link(&path)
                    .map(|t| t.into_os_string().into_encoded_bytes())
                    .unwrap_or_default()
            } else if meta.is_file() {
                fs::read(&path).unwrap_or_default()
            } else {
                Vec::new()
            };
            out.push((rel, meta.mode(), data));
        }
    }
    out.sort();
    out
}

fn upload_tar(
    daemon: &Daemon,
    method: &str,
    dir: &Path,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut all = vec![("X-Access-Token", TOKEN)];
    all.extend_from_slice(headers);
    daemon.call_with(method, &tar_target(dir), &all, body)
}

/// A connection that has sent the head of a tar upload into `dir` with a body of `len` bytes:
/// the caller sends the body, or part of it.
fn tar_upload_head(daemon: &Daemon, method: &str, dir: &Path, len: usize) -> TcpStream {
    let mut stream = daemon.connect();
    write!(
        stream,
        "{method} {} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: {len}\r\n\r\n",
        tar_target(dir),
    )
    .unwrap();
    stream
}

/// A ustar header block for `name` of type `flag`, `size` bytes of data, linking to `link`.
fn ustar(name: &str, flag: u8, size: u64, link: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[..name.len()].copy_from_slice(name.as_bytes());
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0000000\0");
    b[116..124].copy_from_slice(b"0000000\0");
    b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    b[136..148].copy_from_slice(b"14524770400\0");
    b[156] = flag;
    b[157..157 + link.len()].copy_from_slice(link.as_bytes());
    b[257..265].copy_from_slice(b"ustar\x0000");
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    b[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    b
}

/// An archive of `(name, type, data, link)` members, with its end blocks.
pub fn archive(members: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, flag, data, link) in members {
        out.extend_from_slice(&ustar(name, *flag, data.len() as u64, link));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A pax extended header giving the next member these records.
fn pax(records: &[(&str, &str)]) -> Vec<u8> {
    let mut data = String::new();
    for (key, value) in records {
        let rest = key.len() + value.len() + 3;
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        data.push_str(&format!("{len} {key}={value}\n"));
    }
    let mut out = ustar("pax", b'x', data.len() as u64, "");
    out.extend_from_slice(data.as_bytes());
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

#[test]
fn a_downloaded_tree_uploads_back_byte_for_byte_owned_by_the_user() {
    if !have("tar") || !have("diff") {
        return;
    }
    let daemon = builder().arg("--default-user").arg("user").start();
    let root = daemon.home().join("tree");
    let outside = daemon.dir.path().join("outside");
    write_file(&outside.join("secret"), b"not in the archive");
    sample_tree(&root, &outside);
    fs::remove_file(root.join("fifo")).unwrap();
    if is_root() {
        let status = Command::new("chown")
            .args(["-hR", &format!("{USER_UID}:{USER_GID}")])
            .arg(&root)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let (_, first) = download(&daemon, &root, "");
    // Into a new directory (made), then into it again (over what is there: the same).
    let copy = daemon.home().join("new/copy");
    for round in 0..2 {
        let reply = upload_tar(&daemon, "POST", &copy, &[], &first);
        assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
        let paths: Vec<String> = reply
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["path"].as_str().unwrap().to_string())
            .collect();
        let long = "n".repeat(140);
        assert_eq!(
            paths,
            [
                copy.join("a.txt"),
                copy.join("deep/a/b").join(&long),
                copy.join("sub/big.bin"),
                copy.join("sub/zero"),
            ]
            .map(|p| p.to_string_lossy().into_owned())
        );
        assert_same_tree(&root, &copy);
        let (_, again) = download(&daemon, &copy, "");
        assert!(again == first, "round {round}: the archives differ");
        assert!(temporaries(&copy).is_empty() && temporaries(copy.parent().unwrap()).is_empty());
    }
    if is_root() {
        for path in ["", "a.txt", "sub", "sub/link", "deep/a/b"] {
            let meta = fs::symlink_metadata(copy.join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (USER_UID, USER_GID), "{path}");
        }
    }
    assert_eq!(
        xattr::get(copy.join("a.txt"), "user.e2b.owner").unwrap(),
        Some(b"alice".to_vec())
    );
    // The new directory's parent was made for the user, as an upload's parents are.
    assert_eq!(
        fs::metadata(daemon.home().join("new")).unwrap().mode() & 0o7777,
        0o755
    );
}

/// `ustar`'s header with `mode` instead of 0644.
fn ustar_mode(name: &str, flag: u8, size: u64, mode: u32) -> Vec<u8> {
    let mut b = ustar(name, flag, size, "");
    b[100..108].copy_from_slice(format!("{mode:07o}\0").as_bytes());
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    b[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    b
}

/// No file of an answered upload is still open for writing: each program it unpacked runs at
/// once (`execve` of a file open for writing fails with `ETXTBSY`), the last member, one in a
/// new directory, a hard link and one replacing another included.
#[test]
fn every_unpacked_program_runs_as_soon_as_the_upload_is_answered() {
    let daemon = start();
    let dest = daemon.home().join("bin");
    let script = b"#!/bin/sh\necho ran\n";
    let mut body = Vec::new();
    for name in ["first", "sub/second", "last"] {
        body.extend_from_slice(&ustar_mode(name, b'0', script.len() as u64, 0o755));
        body.extend_from_slice(script);
        body.resize(body.len().div_ceil(512) * 512, 0);
    }
    body.extend_from_slice(&ustar("linked", b'1', 0, "first"));
    body.resize(body.len() + 1024, 0);
    // Into a new directory, then again over what the first round made.
    for round in 0..2 {
        let reply = upload_tar(&daemon, "PUT", &dest, &[], &body);
        assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
        for name in ["first", "sub/second", "last", "linked"] {
            let out = Command::new(dest.join(name))
                .output()
                .unwrap_or_else(|e| panic!("round {round}, {name}: {e}"));
            assert_eq!(out.stdout, b"ran\n", "round {round}, {name}");
        }
    }
}

/// Files are made with their mode at once where nobody can reach them yet, and their owner is
/// changed only where it is not the user's: in a set-group-ID directory (whose group a new file
/// takes), both into a new directory and into the existing one, every file still ends up the
/// user's, with the archive's exact mode (none of the daemon's umask).
#[test]
fn unpacked_files_are_the_users_with_exact_modes_in_a_set_group_id_directory() {
    if !root_or_skip("making files owned by another group needs root") {
        return;
    }
    let daemon = builder().arg("--default-user").arg("user").start();
    let shared = daemon.home().join("shared");
    fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(0), Some(777)).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o2777)).unwrap();
    let modes = [0o777, 0o640, 0o400, 0o000];
    let mut body = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let data = format!("file {i}");
        body.extend_from_slice(&ustar_mode(
            &format!("f{i}"),
            b'0',
            data.len() as u64,
            *mode,
        ));
        body.extend_from_slice(data.as_bytes());
        body.resize(body.len().div_ceil(512) * 512, 0);
    }
    body.resize(body.len() + 1024, 0);
    let dest = shared.join("tree");
    // Into a new directory, then into it again (it exists: each file beside its place).
    for round in 0..2 {
        let reply = upload_tar(&daemon, "PUT", &dest, &[], &body);
        assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
        for (i, mode) in modes.iter().enumerate() {
            let meta = fs::metadata(dest.join(format!("f{i}"))).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o7777),
                (USER_UID, USER_GID, *mode),
                "round {round}, f{i}"
            );
            assert_eq!(
                fs::read(dest.join(format!("f{i}"))).unwrap(),
                format!("file {i}").as_bytes()
            );
        }
    }
}

/// One block of data no filesystem holds by chance: a line naming `what`, this process and
/// this moment, repeated to 4 KiB.
fn marker_block(what: &str) -> Vec<u8> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let line = format!("sandboxd {what} {} {nanos}\n", std::process::id());
    line.bytes().cycle().take(4096).collect()
}

/// Whether `block` reached the image's device: a file's data starts on a block boundary (of
/// 1 KiB on a small ext4 image), and its first KiB already holds the unique line (the rest of
/// the file need not be in the next blocks).
fn on_device(image: &Path, block: &[u8]) -> bool {
    let bytes = fs::read(image).unwrap();
    (0..bytes.len())
        .step_by(1024)
        .any(|at| bytes[at..].starts_with(&block[..1024]))
}

#[test]
fn an_archive_that_replaces_a_file_is_on_the_device_when_answered() {
    let Some(image) = crate::common::image::Ext4Image::make() else {
        return;
    };
    let daemon = builder().start();
    let dest = image.mount.join("tree");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join("a.txt"), b"old").unwrap();
    let new = marker_block("replacing");
    let added = marker_block("added beside");
    let body = archive(&[("a.txt", b'0', &new, ""), ("b.txt", b'0', &added, "")]);
    let reply = upload_tar(&daemon, "PUT", &dest, &[], &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(dest.join("a.txt")).unwrap(), new);
    // The old data is replaced only once the new is on the device (one `syncfs`), and so is
    // everything else of the upload. Only `b.txt` shows the sync: ext4 also starts writing a
    // file renamed over another by itself, but it would not have allocated `b.txt`'s blocks.
    assert!(on_device(&image.image, &new), "the replacing file's data");
    assert!(on_device(&image.image, &added), "the new file beside it");
}

#[test]
fn a_name_taken_while_the_archive_streams_is_replaced_only_once_the_upload_is_on_the_device() {
    let Some(image) = crate::common::image::Ext4Image::make() else {
        return;
    };
    let daemon = builder().start();
    let dest = image.mount.join("tree");
    fs::create_dir(&dest).unwrap();
    let new = marker_block("taken meanwhile");
    let added = marker_block("added before it");
    let body = archive(&[("b.txt", b'0', &added, ""), ("a.txt", b'0', &new, "")]);
    let mut stream = tar_upload_head(&daemon, "PUT", &dest, body.len());
    // The members whole, not the end blocks: they are staged under temporary names, and
    // `a.txt` was free when it arrived.
    let cut = body.len() - 1024;
    stream.write_all(&body[..cut]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while temporaries(&dest).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "nothing was staged");
        std::thread::sleep(Duration::from_millis(10));
    }
    fs::write(dest.join("a.txt"), b"made meanwhile").unwrap();
    stream.write_all(&body[cut..]).unwrap();
    let reply = read_reply(&mut std::io::BufReader::new(stream), false).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(dest.join("a.txt")).unwrap(), new);
    // Found taken at the commit, so everything was made durable before the rename over it:
    // `b.txt`'s data too, which ext4 writes on a rename over a name only for the renamed file.
    assert!(on_device(&image.image, &added), "the file placed before it");
    assert!(on_device(&image.image, &new), "the file that took the name");
}

#[test]
fn a_replacing_upload_is_synced_on_every_filesystem_it_wrote_to() {
    let Some(image) = crate::common::image::Ext4Image::make() else {
        return;
    };
    let daemon = builder().start();
    let dest = daemon.home().join("tree");
    write_file(&dest.join("keep.txt"), b"old");
    // A directory of the destination that is another filesystem.
    let _sub = Mount::bind(&image.mount, &dest.join("sub"));
    let added = marker_block("on the other filesystem");
    let body = archive(&[
        ("sub/b.txt", b'0', &added, ""),
        ("keep.txt", b'0', &b"new"[..], ""),
    ]);
    let reply = upload_tar(&daemon, "PUT", &dest, &[], &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(dest.join("sub/b.txt")).unwrap(), added);
    assert!(on_device(&image.image, &added));
}

#[test]
fn a_gnu_tar_archive_uploads_gzipped_by_put_and_a_signed_url() {
    if !have("tar") || !have("diff") {
        return;
    }
    let daemon = builder().arg("--default-user").arg("user").start();
    let src = daemon.dir.path().join("src");
    fs::create_dir_all(src.join("empty")).unwrap();
    // GNU tar's own format: a name over 100 bytes goes in a long-name ('L') member.
    let long = "l".repeat(180);
    write_file(&src.join("d").join(&long), b"long");
    write_file(&src.join("d/small"), &noise(70_000));
    symlink("small", src.join("d/to-small")).unwrap();
    let output = Command::new("tar")
        .args(["--format=gnu", "-czf", "-", "-C"])
        .arg(&src)
        .arg(".")
        .output()
        .unwrap();
    assert!(output.status.success());
    let dest = daemon.home().join("gz");
    let reply = upload_tar(
        &daemon,
        "PUT",
        &dest,
        &[("Content-Encoding", "gzip")],
        &output.stdout,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_same_tree(&src, &dest);
    // A signed write URL, no token.
    let target = daemon.sign(
        "signed",
        &[
            "--username",
            "user",
            "--operation",
            "write",
            "--format",
            "tar",
        ],
    );
    let plain = Command::new("tar")
        .args(["-cf", "-", "-C"])
        .arg(&src)
        .arg(".")
        .output()
        .unwrap();
    let reply = daemon.call_with("PUT", &target, &[], &plain.stdout);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_same_tree(&src, &daemon.home().join("signed"));
    // A read signature is no way to write.
    let read = daemon.sign("other", &["--username", "user", "--format", "tar"]);
    daemon
        .call_with("PUT", &read, &[], &plain.stdout)
        .assert_error(401, "invalid signature");
    assert!(!daemon.home().join("other").exists());
}

#[test]
fn every_refused_archive_answers_its_error_and_changes_nothing() {
    let daemon = builder().arg("--default-user").arg("user").start();
    let dest = daemon.home().join("dest");
    write_file(&dest.join("keep.txt"), b"kept");
    fs::create_dir_all(dest.join("sub")).unwrap();
    let outside = daemon.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    symlink(&outside, dest.join("out")).unwrap();
    let shown = dest.display().to_string();
    let long = "n".repeat(256);
    let long_pax = [
        pax(&[("path", &long)]),
        archive(&[("x", b'0', &b"x"[..], "")]),
    ]
    .concat();
    let mut big = pax(&[("size", &(17u64 << 30).to_string())]);
    big.extend_from_slice(&ustar("huge", b'0', 0, ""));
    big.resize(big.len() + 1024, 0);
    let mut bad_sum = archive(&[("a", b'0', &b"a"[..], "")]);
    bad_sum[0] = b'b';
    let truncated = archive(&[("a", b'0', &b"abc"[..], "")])[..1024].to_vec();
    let cases: Vec<(Vec<u8>, String)> = vec![
        (archive(&[("ok", b'0', &b"fine"[..], ""), ("/etc/evil", b'0', &b"x"[..], "")]),
            "member '/etc/evil' has an absolute name".into()),
        (archive(&[("a/../../evil", b'0', &b"x"[..], "")]),
            "member 'a/../../evil' has a '..' component".into()),
        (archive(&[("l", b'2', &b""[..], "elsewhere"), ("l/x", b'0', &b"x"[..], "")]),
            "member 'l/x' needs 'l' to be a directory, but the archive made it a symbolic link".into()),
        (archive(&[("out/x", b'0', &b"x"[..], "")]),
            format!("member 'out/x' passes through '{shown}/out', a symbolic link")),
        (archive(&[("h", b'1', &b""[..], "/etc/passwd")]),
            "hard link 'h' names '/etc/passwd', which is not a file earlier in the archive".into()),
        (archive(&[("h", b'1', &b""[..], "keep.txt")]),
            "hard link 'h' names 'keep.txt', which is not a file earlier in the archive".into()),
        (archive(&[("dev", b'3', &b""[..], "")]),
            "member 'dev' is a device or FIFO (type '3'): only files, directories and links are unpacked".into()),
        (archive(&[("fifo", b'6', &b""[..], "")]),
            "member 'fifo' is a device or FIFO (type '6'): only files, directories and links are unpacked".into()),
        (archive(&[("sparse", b'S', &b""[..], "")]),
            "member 'sparse' has type 'S', which sandboxd does not unpack".into()),
        (long_pax, format!("member '{long}' has a component over 255 bytes")),
        (archive(&[("sub", b'0', &b"x"[..], "")]),
            format!("member 'sub' is not a directory, but '{shown}/sub' is one")),
        (archive(&[("twice", b'0', &b"1"[..], ""), ("twice", b'0', &b"2"[..], "")]),
            "member 'twice' appears twice in the archive".into()),
        (big, "the archive's files take more than 17179869184 bytes".into()),
        (bad_sum, "invalid tar archive: the header at byte 0 has a wrong checksum".into()),
        (truncated, "invalid tar archive: the archive ends before its end-of-archive block".into()),
    ];
    let before = snapshot(&dest);
    let parent_before = snapshot(&daemon.home());
    for (body, message) in &cases {
        upload_tar(&daemon, "POST", &dest, &[], body).assert_error(400, message);
        assert_eq!(snapshot(&dest), before, "{message}");
        assert!(temporaries(&dest).is_empty(), "{message}");
    }
    assert!(snapshot(&outside).is_empty());
    // Into a directory that does not exist: refused, and it still does not.
    let new = daemon.home().join("never");
    upload_tar(&daemon, "POST", &new, &[], &cases[0].0).assert_error(400, &cases[0].1);
    assert_eq!(snapshot(&daemon.home()), parent_before);
    // The head's refusals, before any byte is read.
    upload_tar(
        &daemon,
        "POST",
        &dest,
        &[("Content-Type", "multipart/form-data; boundary=x")],
        b"x",
    )
    .assert_error(
        400,
        "a tar upload's body is the archive itself: send it raw, not as multipart/form-data",
    );
    upload_tar(&daemon, "POST", &dest, &[("X-Metadata-Owner", "a")], b"x").assert_error(
        400,
        "X-Metadata-* headers are not taken with format=tar: each member's metadata is its \
         SCHILY.xattr.user.e2b.* records",
    );
    let file = dest.join("keep.txt");
    upload_tar(&daemon, "POST", &file, &[], &cases[0].0).assert_error(
        400,
        &format!("path '{}' is not a directory", file.display()),
    );
    daemon
        .call_with(
            "POST",
            "/files?format=tar",
            &[("X-Access-Token", TOKEN)],
            b"x",
        )
        .assert_error(400, "the path query parameter is required with format=tar");
    daemon
        .call_with(
            "POST",
            "/files?path=dest&format=zip",
            &[("X-Access-Token", TOKEN)],
            b"x",
        )
        .assert_error(
            400,
            "format 'zip' is not supported: only tar archives are (format=tar; \
             gzip-compressed with Accept-Encoding or Content-Encoding)",
        );
    assert_eq!(snapshot(&dest), before);
}

/// The refusals of docs/spec.md §8a not in the test above: each answers its exact error and
/// leaves the destination as it was.
#[test]
fn the_other_refusals_answer_their_errors_and_change_nothing() {
    let daemon = start();
    let dest = daemon.dir.path().join("dest");
    write_file(&dest.join("keep.txt"), b"kept");
    let shown = dest.display().to_string();
    // A path of 4095 bytes at most, the destination's counted: components of 200 bytes.
    let part = "p".repeat(200);
    let parts = (4096 - shown.len()) / 201 + 1;
    let deep = vec![part.as_str(); parts].join("/");
    let deep_len = shown.len() + parts * 201;
    let key = "k".repeat(247);
    let member_with = |records: &[(&str, &str)], name: &str| {
        [pax(records), archive(&[(name, b'0', &b"x"[..], "")])].concat()
    };
    let mut oversized = ustar("pax", b'x', 70_000, "");
    oversized.resize(oversized.len() + 70_000 + 1024, 0);
    let mut bad_size = archive(&[("a", b'0', &b""[..], "")]);
    bad_size[124..136].copy_from_slice(b"zzzzzzzzzzz\0");
    bad_size[148..156].fill(b' ');
    let sum: u32 = bad_size[..512].iter().map(|&x| u32::from(x)).sum();
    bad_size[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let cases: Vec<(Vec<u8>, String)> = vec![
        (member_with(&[("path", &deep)], "x"),
            format!("member '{deep}' makes a path of {deep_len} bytes, more than 4095")),
        (archive(&[("", b'0', &b"x"[..], "")]), "member '' has an empty name".into()),
        (archive(&[(".", b'0', &b"x"[..], "")]),
            "member '.' names the destination itself".into()),
        (archive(&[("keep.txt/x", b'0', &b"x"[..], "")]),
            format!("member 'keep.txt/x' needs '{shown}/keep.txt' to be a directory, but it is a file")),
        (archive(&[("f", b'0', &b"x"[..], ""), ("f/x", b'0', &b"x"[..], "")]),
            "member 'f/x' needs 'f' to be a directory, but the archive made it a file".into()),
        (archive(&[("d/", b'5', &b""[..], ""), ("d", b'0', &b"x"[..], "")]),
            format!("member 'd' is not a directory, but a directory of that name is in the archive or at '{shown}/d'")),
        (member_with(&[(&format!("SCHILY.xattr.user.e2b.{key}"), "v")], "m"),
            format!("member 'm' has invalid metadata: key '{key}' is 247 bytes long, more than 246")),
        (oversized,
            "invalid tar archive: the extended header at byte 0 has 70000 bytes, more than 65536".into()),
        (bad_size, "invalid tar archive: the header at byte 0 has an invalid size field".into()),
        (member_with(&[("size", "ten")], "x"),
            "invalid tar archive: the pax header at byte 0 is malformed: a number that is not decimal".into()),
        // A NUL in any name a record carries: the archive's fault (400), never a failed call.
        (member_with(&[("path", "a\0b")], "x"),
            "invalid tar archive: the pax header at byte 0 is malformed: a path with a NUL byte".into()),
        (member_with(&[("path", "\0")], "x"),
            "invalid tar archive: the pax header at byte 0 is malformed: a path with a NUL byte".into()),
        ([pax(&[("linkpath", "t\0t")]), archive(&[("l", b'2', &b""[..], "")])].concat(),
            "invalid tar archive: the pax header at byte 0 is malformed: a linkpath with a NUL byte".into()),
        ([archive(&[("f", b'0', &b"x"[..], "")])[..1024].to_vec(),
            pax(&[("linkpath", "f\0")]), archive(&[("h", b'1', &b""[..], "")])].concat(),
            "invalid tar archive: the pax header at byte 1024 is malformed: a linkpath with a NUL byte".into()),
        (member_with(&[("SCHILY.xattr.user.e2b.k\0y", "v")], "m"),
            "member 'm' has invalid metadata: key 'k\\x00y' has byte 0x00 at offset 1, not printable ASCII".into()),
        (member_with(&[("SCHILY.xattr.user.e2b.k", "v\0")], "m"),
            "member 'm' has invalid metadata: the value of key 'k' has byte 0x00 at offset 1, not printable ASCII".into()),
    ];
    let before = snapshot(&dest);
    for (body, message) in &cases {
        upload_tar(&daemon, "POST", &dest, &[], body).assert_error(400, message);
        assert_eq!(snapshot(&dest), before, "{message}");
        assert!(temporaries(&dest).is_empty(), "{message}");
    }
}

/// Names and link targets are held until the commit: more than 16 MiB of them is refused.
#[test]
fn more_names_than_the_bound_is_refused() {
    let daemon = start();
    let dest = daemon.dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    // Symbolic links with targets of 4,000 bytes: 4,200 of them pass 16 MiB.
    let target = "t".repeat(4000);
    let mut body = Vec::new();
    for i in 0..4200 {
        body.extend_from_slice(&pax(&[("linkpath", &target)]));
        body.extend_from_slice(&ustar(&format!("l{i}"), b'2', 0, ""));
    }
    body.resize(body.len() + 1024, 0);
    upload_tar(&daemon, "POST", &dest, &[], &body)
        .assert_error(400, "the archive's names take more than 16777216 bytes");
    assert!(snapshot(&dest).is_empty());
}

#[test]
fn more_than_the_members_allowed_is_refused() {
    let daemon = start();
    let dest = daemon.dir.path().join("dest");
    // 100,001 members: the same directory again and again (cheap to make).
    let mut body = Vec::with_capacity(100_002 * 512);
    let header = ustar("d/", b'5', 0, "");
    for _ in 0..100_001 {
        body.extend_from_slice(&header);
    }
    body.resize(body.len() + 1024, 0);
    upload_tar(&daemon, "POST", &dest, &[], &body)
        .assert_error(400, "the archive has more than 100000 members");
    assert!(!dest.exists());
    assert!(temporaries(daemon.dir.path()).is_empty());
}

#[test]
fn a_connection_cut_mid_upload_leaves_nothing() {
    let daemon = builder().arg("--default-user").arg("user").start();
    let home = daemon.home();
    write_file(&home.join("existing/keep"), b"kept");
    let data = noise(4 * MIB);
    let body = archive(&[
        ("a.bin", b'0', &data, ""),
        ("new/b.bin", b'0', &data, ""),
        ("keep", b'0', &b"replaced"[..], ""),
        ("c.bin", b'0', &data, ""),
    ]);
    for dest in [home.join("existing"), home.join("fresh")] {
        let before = snapshot(&home);
        let mut stream = tar_upload_head(&daemon, "POST", &dest, body.len());
        // All but the last member's data and the end blocks.
        let cut = body.len() - MIB - 1024;
        stream.write_all(&body[..cut]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while snapshot(&home).len() == before.len() {
            assert!(std::time::Instant::now() < deadline, "nothing was staged");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(stream);
        while snapshot(&home) != before {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                snapshot(&home).iter().map(|e| &e.0).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(fs::read(home.join("existing/keep")).unwrap(), b"kept");
    assert!(!home.join("fresh").exists());
}

#[test]
fn past_the_bound_on_streamed_downloads_an_archive_is_503() {
    let daemon = start();
    let root = daemon.dir.path().join("tree");
    // More than the socket buffers take: each stalled answer stays unfinished.
    write_file(&root.join("n.bin"), &noise(16 * MIB));
    // `api::download::gzip::MAX_DOWNLOADS` places, shared with the compressed downloads.
    let held: Vec<_> = (0..32)
        .map(|_| {
            let (reader, head) = start_gzip_download(&daemon, &tar_target(&root), "identity");
            assert_eq!(head.status, 200);
            reader
        })
        .collect();
    let message = "too many streamed downloads under way (at most 32): try again later";
    daemon.get(&tar_target(&root)).assert_error(503, message);
    let head = daemon.call("HEAD", &tar_target(&root), b"");
    assert_eq!(head.status, 503);
    drop(held);
    // The places come back as the connections close.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = daemon.call("HEAD", &tar_target(&root), b"");
        if reply.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the places never came back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
