//! Directory archives beside a hostile local user (issue 34): a tar upload never changes a file
//! the user swaps in for one of its staged names.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::archive::archive;
use crate::common::*;

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
