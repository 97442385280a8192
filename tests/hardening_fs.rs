//! The filesystem service beside a hostile local user: entries swapped for symlinks while the
//! daemon (root) works on them redirect nothing, and trees of any depth are listed and removed
//! without the daemon aborting.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::connect::{unary, AS_USER};
use crate::common::{self, start, Daemon, Reply};

fn rpc(daemon: &Daemon, method: &str, body: Value) -> Reply {
    let procedure = format!("filesystem.Filesystem/{method}");
    unary(daemon, &procedure, &[("Authorization", AS_USER)], &body)
}

fn assert_code(reply: &Reply, status: u16, code: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.json()["code"], code, "{}", reply.text());
}

/// A chain of `levels` directories named `d` under `top`, made through `/proc/self/fd` so that
/// no path longer than `PATH_MAX` is ever needed. Returns the deepest directory, open.
fn deep_tree(top: &Path, levels: usize) -> File {
    let mut dir = File::open(top).unwrap();
    for _ in 0..levels {
        let at = PathBuf::from(format!("/proc/self/fd/{}/d", dir.as_raw_fd()));
        fs::create_dir(&at).unwrap();
        dir = File::open(&at).unwrap();
    }
    dir
}

#[test]
fn make_dir_never_changes_what_a_racer_swaps_in() {
    if !common::root_or_skip("the daemon must run as root for its chown to matter") {
        return;
    }
    let daemon = start();
    let home = daemon.home();
    // A root file the user must never get: the racer points its symlink at it.
    let secret = daemon.dir.path().join("secret");
    fs::write(&secret, b"root only").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (stop, home, secret) = (Arc::clone(&stop), home.clone(), secret.clone());
        std::thread::spawn(move || {
            let (target, aside) = (home.join("new"), home.join("aside"));
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if fs::rename(&target, &aside).is_ok() {
                    let _ = std::os::unix::fs::symlink(&secret, &target);
                    swaps += 1;
                    let _ = fs::remove_dir(&aside);
                }
                let _ = fs::remove_file(&target);
            }
            swaps
        })
    };
    let mut answered = 0;
    for _ in 0..1500 {
        let reply = rpc(&daemon, "MakeDir", json!({"path": "new"}));
        assert!(
            [200, 400, 404, 409].contains(&reply.status),
            "{} {}",
            reply.status,
            reply.text()
        );
        answered += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    assert_eq!(answered, 1500);
    assert!(swaps > 0, "the racer never swapped anything");
    let meta = fs::metadata(&secret).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "the secret changed owner");
    assert_eq!(meta.mode() & 0o7777, 0o600, "the secret changed mode");
    assert_eq!(fs::read(&secret).unwrap(), b"root only");
}

#[test]
fn make_dir_on_a_dangling_symlink_is_an_error_and_creates_nothing() {
    let daemon = start();
    let home = daemon.home();
    let nowhere = daemon.dir.path().join("nowhere");
    std::os::unix::fs::symlink(&nowhere, home.join("dangling")).unwrap();
    let reply = rpc(&daemon, "MakeDir", json!({"path": "dangling"}));
    assert_code(&reply, 400, "invalid_argument");
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("not a directory"),
        "{}",
        reply.text()
    );
    assert!(!nowhere.exists());
    assert!(fs::symlink_metadata(home.join("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_tree_deeper_than_path_max_is_listed_and_removed_and_the_daemon_lives() {
    let daemon = start();
    let home = daemon.home();
    fs::create_dir(home.join("deep")).unwrap();
    // 10,000 levels: 20,000 bytes of path at the bottom, five times PATH_MAX.
    let bottom = deep_tree(&home.join("deep"), 10_000);
    fs::write(
        format!("/proc/self/fd/{}/leaf.txt", bottom.as_raw_fd()),
        b"x",
    )
    .unwrap();
    drop(bottom);

    let shallow = rpc(&daemon, "ListDir", json!({"path": "deep", "depth": 3}));
    assert_eq!(shallow.status, 200, "{}", shallow.text());
    let paths: Vec<String> = shallow.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    let base = home.join("deep").display().to_string();
    assert_eq!(
        paths,
        [
            format!("{base}/d"),
            format!("{base}/d/d"),
            format!("{base}/d/d/d")
        ]
    );

    // 1,000 levels are listed whole, paths longer than PATH_MAX included.
    let long = rpc(&daemon, "ListDir", json!({"path": "deep", "depth": 1000}));
    assert_eq!(long.status, 200, "{}", &long.text()[..200]);
    let entries = long.json()["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1000);
    assert!(entries[999]["path"].as_str().unwrap().len() > 2000);

    // All 10,000 would be an answer of about 100 MB of paths: refused, daemon alive.
    let all = rpc(&daemon, "ListDir", json!({"path": "deep", "depth": 20_000}));
    assert_code(&all, 429, "resource_exhausted");
    common::assert_health_within(&daemon, std::time::Duration::from_secs(5));

    let removed = rpc(&daemon, "Remove", json!({"path": "deep"}));
    assert_eq!(removed.status, 200, "{}", removed.text());
    assert!(!home.join("deep").exists());
    common::assert_health_within(&daemon, std::time::Duration::from_secs(5));
}

#[test]
fn remove_and_move_act_on_links_never_on_their_targets() {
    let daemon = start();
    let home = daemon.home();
    let outside = daemon.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), b"kept").unwrap();
    std::os::unix::fs::symlink(&outside, home.join("link")).unwrap();
    fs::create_dir(home.join("tree")).unwrap();
    std::os::unix::fs::symlink(&outside, home.join("tree/inner")).unwrap();

    let reply = rpc(&daemon, "Remove", json!({"path": "tree"}));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(!home.join("tree").exists());
    let reply = rpc(
        &daemon,
        "Move",
        json!({"source": "link", "destination": "moved"}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(fs::symlink_metadata(home.join("moved"))
        .unwrap()
        .file_type()
        .is_symlink());
    let reply = rpc(&daemon, "Remove", json!({"path": "moved"}));
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(outside.join("keep")).unwrap(), b"kept");
    // `/` refused by Remove and Move is a unit test (api::filesystem::ops): a daemon that got it
    // wrong here would remove the test machine's whole filesystem.
}
