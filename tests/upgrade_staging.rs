//! Where `POST /upgrade` puts the new binary and what it runs (SPEC §9c steps 3 and 4): never
//! a file a user could have planted. An upgrade directory another user can write (or one above
//! it) is refused before anything is written; the staged binary is checked and executed from
//! its descriptor, so a file swapped in at its path afterwards never runs; and one upgrade is
//! received at a time.

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{builder, root_or_skip, unnamed_files, Daemon, TOKEN, USER_GID, USER_UID};
use crate::upgrade::{
    daemon_upgrading_into, files_in, init, own_binary, read_answer, upgrade, upgrade_head,
};

/// A script that, whoever runs it, appends who it ran as to `marker` and answers like a
/// sandboxd (so that a daemon fooled into running it goes on as far as it can).
fn planted(at: &Path, marker: &Path) {
    std::fs::write(
        at,
        format!(
            "#!/bin/sh\nid -u >> '{}'\ncase \"$1\" in -version) echo 0.6.13;; \
             --handover-schema) echo 1;; esac\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `path` holds this build's binary, the one the tests send (compared without printing it).
fn assert_sent(path: &Path) {
    let same = std::fs::read(path).unwrap() == own_binary();
    assert!(same, "{} is not the binary sent", path.display());
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// The test user, in a loop until killed: copies `planted` over every name in `dir` that the
/// daemon stages or places its binary at.
fn racer(dir: &Path, planted: &Path) -> Child {
    let script = format!(
        "cd '{}' || exit 1; while :; do for f in .envd.next.upgrade-* envd.next; do \
         cp '{}' x.$$ && mv -f x.$$ \"$f\"; done; done",
        dir.display(),
        planted.display()
    );
    Command::new("setpriv")
        .args([
            &format!("--reuid={USER_UID}"),
            &format!("--regid={USER_GID}"),
            "--clear-groups",
            "sh",
            "-c",
            &script,
        ])
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Kills the racer's whole group (a `cp` under way too), and waits for it.
fn stop(mut child: Child) {
    let group = format!("-{}", child.id());
    let killed = Command::new("kill").args(["-KILL", "--", &group]).status();
    assert!(killed.unwrap().success());
    child.wait().unwrap();
}

/// `POST /upgrade`'s answer must be this refusal of `dir` (the directory named in it).
fn assert_unsafe(answer: &str, target: &Path, dir: &Path, why: &str) {
    assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
    let expected = format!(
        "--upgrade-path '{}' is not safe to upgrade into: '{}' {why}; its directory and every \
         directory above it must be owned by root and writable by root alone (one above it may \
         be writable by others when sticky, as /tmp)",
        target.display(),
        dir.display()
    );
    assert!(answer.contains(&expected), "{answer}\n{expected}");
}

#[test]
fn an_upgrade_directory_another_user_can_write_is_refused_and_their_file_never_runs() {
    if !root_or_skip("making directories of another user needs root") {
        return;
    }
    // base (root, 0755) / shared / bin / envd.next, and a private directory for the marker
    // that only root can write: a line there means root ran the planted file.
    let base = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(base.path()).unwrap();
    let _cleanup = RemoveOnDrop(base.clone());
    chmod(&base, 0o755);
    let (shared, bin) = (base.join("shared"), base.join("shared/bin"));
    std::fs::create_dir_all(&bin).unwrap();
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let marker = private.join("ran");
    let script = base.join("planted");
    planted(&script, &marker);
    let target = bin.join("envd.next");
    let daemon = daemon_upgrading_into(&bin);
    init(&daemon, json!({}));

    // The user owns the directory, and plants their file at every name the daemon uses.
    chown(&bin, USER_UID, USER_GID);
    let racing = racer(&bin, &script);
    std::thread::sleep(Duration::from_millis(200));
    let answer = upgrade(&daemon, TOKEN, &[], &own_binary());
    std::thread::sleep(Duration::from_millis(300));
    stop(racing);
    assert!(
        !marker.exists(),
        "ran as uid {:?}",
        std::fs::read_to_string(&marker)
    );
    assert_unsafe(&answer, &target, &bin, "is owned by uid 4242");
    // Nothing of root's was written there.
    for file in files_in(&bin) {
        let owner = std::fs::symlink_metadata(&file).unwrap().uid();
        assert_eq!(owner, USER_UID, "{}", file.display());
    }

    let binary = own_binary();
    let refused = |dir: &Path, why: &str| {
        let answer = upgrade(&daemon, TOKEN, &[], &binary);
        assert_unsafe(&answer, &target, dir, why);
    };
    // Root's, but writable by others.
    for file in files_in(&bin) {
        std::fs::remove_file(file).unwrap();
    }
    chown(&bin, 0, 0);
    chmod(&bin, 0o777);
    refused(&bin, "(mode 777) is writable by its group and others");
    // Even sticky: the user may create the names the daemon uses.
    chmod(&bin, 0o1777);
    refused(&bin, "(mode 1777) is writable by its group and others");
    // The directory is fine, one above it is not: the user could move it away and put one of
    // their own in its place. Sticky above is fine (as /tmp).
    chmod(&bin, 0o755);
    chmod(&shared, 0o775);
    refused(&shared, "(mode 775) is writable by its group");
    assert_eq!(files_in(&bin), Vec::<PathBuf>::new());
    assert!(!marker.exists(), "{:?}", std::fs::read_to_string(&marker));
    assert_eq!(daemon.get("/health").status, 204);
    assert!(!daemon.log().iter().any(|l| l.contains("took over")));

    chmod(&shared, 0o1777);
    assert_eq!(upgrade(&daemon, TOKEN, &[], &own_binary()), "");
    daemon.log_with(|line| line.contains("upgrade: took over from sandboxd "));
    assert_sent(&target);
    assert!(!marker.exists());
}

/// Removes a tree whose directories another user owned (tempfile's own removal would do, but
/// a sticky directory of root's is left for root to remove).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The staged name of the daemon's upgrade into `dir`, used where the filesystem has no
/// `O_TMPFILE` (and by the code before this test).
fn staged_name(daemon: &Daemon, dir: &Path) -> PathBuf {
    dir.join(format!(".envd.next.upgrade-{}", daemon.pid()))
}

/// How many staged files of an upgrade `daemon` is receiving into `dir`: unnamed ones it holds
/// open, or one under the staged name.
fn staged(daemon: &Daemon, dir: &Path) -> usize {
    unnamed_files(daemon.pid(), dir) + usize::from(staged_name(daemon, dir).exists())
}

/// Waits until `daemon` receives an upgrade into `dir`.
fn until_staged(daemon: &Daemon, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while staged(daemon, dir) == 0 {
        assert!(Instant::now() < deadline, "{:?}", files_in(dir));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An upgrade whose body is sent in two halves: the first now, the second by [`finish`].
fn half_upgrade(daemon: &Daemon, binary: &[u8]) -> TcpStream {
    let mut stream = upgrade_head(daemon, TOKEN, &[], binary.len());
    stream.write_all(&binary[..binary.len() / 2]).unwrap();
    stream
}

/// Sends the rest of a [`half_upgrade`]; the answer (empty: the daemon executed the binary).
fn finish(mut stream: TcpStream, binary: &[u8]) -> String {
    stream.write_all(&binary[binary.len() / 2..]).unwrap();
    read_answer(stream)
}

#[test]
fn a_file_swapped_in_at_the_staged_binarys_path_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let private = tempfile::tempdir().unwrap();
    let marker = private.path().join("ran");
    let script = private.path().join("planted");
    planted(&script, &marker);
    let daemon = builder()
        .args(&[
            "--upgrade-path",
            dir.path().join("envd.next").to_str().unwrap(),
        ])
        .args(&["--drain-timeout", "30"])
        .start();
    init(&daemon, json!({}));
    let pid = daemon.pid();
    let binary = own_binary();
    let target = dir.path().join("envd.next");

    // Swapped while the body arrives: the checks run the file written, not the name's.
    let stream = half_upgrade(&daemon, &binary);
    until_staged(&daemon, dir.path());
    std::fs::copy(&script, dir.path().join("swap")).unwrap();
    std::fs::rename(dir.path().join("swap"), staged_name(&daemon, dir.path())).unwrap();
    // And swapped at the target during the drain, between the checks and the execve: a
    // connection that sends nothing holds the drain meanwhile.
    let holder = TcpStream::connect(daemon.addr).unwrap();
    let upgrading = std::thread::spawn(move || finish(stream, &binary));
    daemon.log_with(|l| l.contains("upgrade: draining before executing"));
    // The binary written is what was placed, whatever the staged name held.
    assert_sent(&target);
    std::fs::copy(&script, dir.path().join("swap")).unwrap();
    std::fs::rename(dir.path().join("swap"), &target).unwrap();
    drop(holder);
    assert_eq!(upgrading.join().unwrap(), "");
    daemon.log_with(|line| line.contains("upgrade: took over from sandboxd "));
    assert!(!marker.exists(), "{:?}", std::fs::read_to_string(&marker));
    assert_eq!(daemon.pid(), pid);
    // The image running is the binary written (its file replaced at the path since).
    let running = PathBuf::from(format!("/proc/{pid}/exe"));
    assert_sent(&running);
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn a_second_upgrade_while_one_is_received_is_409_and_the_first_completes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let binary = own_binary();
    let first = half_upgrade(&daemon, &binary);
    until_staged(&daemon, dir.path());
    let named = staged_name(&daemon, dir.path());
    let inode = std::fs::metadata(&named).ok().map(|m| m.ino());
    let expected = "another upgrade is under way (its binary being received, checked or \
                    executed): one at a time; try again when it has ended";
    // With a body, and without (the running binary again): both wait their turn.
    for body in [&binary[..], b""] {
        let answer = upgrade(&daemon, TOKEN, &[], body);
        assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
        assert!(answer.contains(expected), "{answer}");
    }
    // The first one's staged file is untouched, and it completes.
    assert_eq!(staged(&daemon, dir.path()), 1);
    assert_eq!(std::fs::metadata(&named).ok().map(|m| m.ino()), inode);
    assert_eq!(finish(first, &binary), "");
    daemon.log_with(|line| line.contains("upgrade: took over from sandboxd "));
    let target = dir.path().join("envd.next");
    assert_sent(&target);
    assert_eq!(files_in(dir.path()), vec![target]);
    // Its turn ended with it: the next upgrade is taken.
    assert_eq!(upgrade(&daemon, TOKEN, &[], b""), "");
    daemon.log_with(|line| line.contains("upgrade: draining before executing the running binary"));
}
