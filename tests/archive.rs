//! Directory archives (SPEC §6a, §8a) against the real binary: a tree of files, directories,
//! links, modes, times, metadata and an empty directory downloaded as tar and read by GNU tar
//! (and `diff -r`), uploaded back byte for byte, gzip both ways, signed URLs both ways, every
//! refusal with its error and the destination untouched, a cut upload that leaves nothing, a
//! file that shrinks while sent, and a stalled reader that holds no worker.

use std::fs;
use std::io::Write;
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
            "format 'zip' is not supported: sandboxd streams tar only (format=tar, with \
             Accept-Encoding: gzip to compress it)",
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
