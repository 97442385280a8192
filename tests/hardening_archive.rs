//! Directory archives beside a hostile local user (issue 34): a tar upload never changes a file
//! the user swaps in for one of its staged names, and a tar download of a directory as wide as
//! a user can make holds a bounded part of its names.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::archive::archive;
use crate::common::*;
use crate::download_gzip::{dechunk, rest_of, rss_kib, start_gzip_download};

/// Whether `name` is one of the daemon's temporaries (`.NAME.sandboxd-PID-START-N.tmp`).
fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.contains(".sandboxd-") && name.ends_with(".tmp")
}

/// Swaps a hard link to `victim` in for every staged symlink seen in `dir` (a new name linked,
/// then renamed over the staged one) until `stop`; how many swaps it made.
fn swap_staged_links(dir: &Path, victim: &Path, stop: &AtomicBool) -> u64 {
    let aside = dir.join("aside");
    let mut swaps = 0;
    while !stop.load(Ordering::Relaxed) {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let staged = is_temporary(&name.to_string_lossy())
                && entry.file_type().is_ok_and(|t| t.is_symlink());
            if staged && fs::hard_link(victim, &aside).is_ok() {
                if fs::rename(&aside, entry.path()).is_ok() {
                    swaps += 1;
                } else {
                    let _ = fs::remove_file(&aside);
                }
            }
        }
    }
    swaps
}

/// A symlink member is made under a staged name in the user's directory, then given to the user
/// and its time set: through a descriptor checked to hold that link, so a hard link to a root
/// file swapped in for the name (as the user may, even with `fs.protected_hardlinks=1`, for a
/// file they may read and write) keeps its owner, mode and time.
#[test]
fn a_hard_link_swapped_in_for_a_staged_symlink_keeps_its_owner() {
    if !root_or_skip("the daemon must run as root for its chown to matter") {
        return;
    }
    let daemon = builder().arg("--default-user").arg("user").start();
    fs::set_permissions(daemon.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dest = daemon.home().join("box");
    fs::create_dir_all(&dest).unwrap();
    for dir in [daemon.home(), dest.clone()] {
        std::os::unix::fs::chown(&dir, Some(USER_UID), Some(USER_GID)).unwrap();
    }
    // Root's file, outside the user's directories, that anyone may read and write.
    let shared = daemon.dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    let victim = shared.join("victim");
    fs::write(&victim, b"root's").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o666)).unwrap();
    let before = fs::metadata(&victim).unwrap();
    // The user may link it into their directory whatever fs.protected_hardlinks says.
    let probe = dest.join("probe");
    let linked = Command::new("setpriv")
        .args([
            &format!("--reuid={USER_UID}"),
            &format!("--regid={USER_GID}"),
            "--clear-groups",
            "ln",
        ])
        .arg(&victim)
        .arg(&probe)
        .status()
        .unwrap();
    assert!(linked.success(), "the user cannot link the victim");
    fs::remove_file(&probe).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (stop, dest, victim) = (Arc::clone(&stop), dest.clone(), victim.clone());
        std::thread::spawn(move || swap_staged_links(&dest, &victim, &stop))
    };
    let names: Vec<String> = (0..300).map(|i| format!("l{i}")).collect();
    let members: Vec<(&str, u8, &[u8], &str)> = names
        .iter()
        .map(|name| (name.as_str(), b'2', &b""[..], "target"))
        .collect();
    let body = archive(&members);
    let target = format!("/files?path={}&format=tar", enc(dest.to_str().unwrap()));
    let (mut placed, mut refused) = (0, 0);
    for _ in 0..60 {
        let reply = daemon.call_with("POST", &target, &[("X-Access-Token", TOKEN)], &body);
        match reply.status {
            200 => placed += 1,
            // The swap seen: the upload fails, and nothing of it stays.
            500 => {
                assert!(
                    reply.text().contains("was replaced by another entry"),
                    "{}",
                    reply.text()
                );
                refused += 1;
            }
            _ => panic!("{} {}", reply.status, reply.text()),
        }
        let now = fs::metadata(&victim).unwrap();
        assert_eq!(
            (now.uid(), now.gid()),
            (0, 0),
            "the victim was given to the user (after {placed} uploads placed, {refused} refused)"
        );
        for entry in fs::read_dir(&dest).unwrap().flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    assert!(swaps > 0, "the racer never swapped anything");
    let after = fs::metadata(&victim).unwrap();
    assert_eq!(after.mode(), before.mode(), "the victim changed mode");
    assert_eq!(
        (after.mtime(), after.mtime_nsec()),
        (before.mtime(), before.mtime_nsec()),
        "the victim's time was set"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"root's");
    eprintln!("{swaps} swaps; {placed} uploads placed, {refused} refused");
}

/// A directory of 40,000 names of 240 bytes (hard links: no inode each) is 10 MiB of names;
/// four archives of it parked by readers that take nothing hold a bounded batch of them each
/// (docs/design.md, "Directory archives"), not the listing. One read to the end has every
/// name once, in the directory's own order (wider than a batch: SPEC §6a).
#[test]
fn parked_archives_of_a_wide_directory_hold_a_bounded_batch_of_names() {
    let daemon = builder().arg("--workers").arg("2").start();
    let wide = daemon.dir.path().join("wide");
    fs::create_dir(&wide).unwrap();
    let first = wide.join(format!("{:08}{}", 0, "n".repeat(232)));
    fs::write(&first, b"").unwrap();
    for i in 1..40_000 {
        fs::hard_link(&first, wide.join(format!("{i:08}{}", "n".repeat(232)))).unwrap();
    }
    let target = format!("/files?path={}&format=tar", enc(wide.to_str().unwrap()));
    // One parked first: the download threads and their buffers exist before the measure.
    let park = || start_gzip_download(&daemon, &target, "identity").0;
    let mut parked = vec![park()];
    std::thread::sleep(Duration::from_millis(1000));
    let before = rss_kib(daemon.pid());
    parked.extend((0..4).map(|_| park()));
    // Each walk fills its queue and the socket's buffers, then waits.
    std::thread::sleep(Duration::from_millis(1500));
    let grown = rss_kib(daemon.pid()).saturating_sub(before);
    // Listed whole, the names are 11 MiB an archive (44 MiB for four).
    assert!(grown < 20 * 1024, "RSS grew by {grown} KiB");
    let (archive, complete) = dechunk(&rest_of(&mut parked[0]));
    assert!(complete);
    let mut names: Vec<String> = archive_names(&archive);
    let listed: Vec<String> = fs::read_dir(&wide)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, listed, "not the directory's own order");
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 40_000, "a name missing or twice");
    eprintln!("RSS grew by {grown} KiB with four more archives parked");
}

/// The member names of a pax archive whose every member has a `path` record.
fn archive_names(archive: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut at = 0;
    while at + 512 <= archive.len() && archive[at..at + 512].iter().any(|&b| b != 0) {
        let header = &archive[at..at + 512];
        let size = std::str::from_utf8(&header[124..135])
            .unwrap()
            .trim_matches(char::from(0));
        let size = usize::from_str_radix(size.trim(), 8).unwrap();
        let data = &archive[at + 512..at + 512 + size];
        if header[156] == b'x' {
            let text = String::from_utf8_lossy(data);
            if let Some(path) = text.lines().find_map(|l| l.split_once(" path=")) {
                names.push(path.1.to_string());
            }
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    names
}
