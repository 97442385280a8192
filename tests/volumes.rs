//! `/init`'s `volumeMounts` and `lifecycleID` (SPEC §9): what is mounted, unmounted and when.
//! This machine's kernel has no NFS client, so `mount` is a fake put first on the daemon's
//! `PATH`: it records its arguments and, as root, mounts a tmpfs named after the NFS target
//! where it is told (the staging point), so that the daemon's attaching and unmounting act on
//! real mounts the tests read back from `/proc/self/mountinfo`. Mount points are made under
//! `--system-root`, a temporary directory; every mount left below it is detached at the end.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::common::{builder, root_or_skip, Daemon, Mount, Reply, USER_GID, USER_UID};

const OPTIONS: &str = "fg,hard,sync,rsize=1048576,wsize=1048576,mountproto=tcp,mountport=2049,\
                       proto=tcp,port=2049,nfsvers=3,noacl,noac,lookupcache=none";
const STAGE: &str = "run/sandboxd/volumes";

/// The fake `mount`'s directory and state, and the system root.
struct Fakes {
    dir: tempfile::TempDir,
    root: tempfile::TempDir,
}

impl Fakes {
    fn new() -> Fakes {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().display().to_string();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let real = ["/usr/bin/mount", "/bin/mount"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .expect("a mount program");
        // Records "mount args"; the last two arguments are the target and the point.
        let body = format!(
            r#"echo "mount $*" >> "$S/calls"
if [ -e "$S/mount-fails" ]; then echo "mount.nfs: Connection refused" >&2; exit 32; fi
if [ -e "$S/mount-lies" ]; then exit 0; fi
for point; do :; done
eval "target=\${{$(($# - 1))}}"
exec {real} -t tmpfs -o size=1m "$target" "$point""#
        );
        let path = bin.join("mount");
        std::fs::write(&path, format!("#!/bin/sh\nS='{state}'\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = tempfile::tempdir().unwrap();
        // A local user may walk down to their home.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Fakes { dir, root }
    }

    fn daemon(&self) -> Daemon {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        builder()
            .arg("--system-root")
            .arg(self.root.path().to_str().unwrap())
            .env("PATH", &path)
            .start()
    }

    /// The calls made since the last look, one per line, each staging point's own name
    /// (`<pid>.<n>`) shown as `N`.
    fn take_calls(&self) -> Vec<String> {
        let file = self.dir.path().join("calls");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        let stage = format!("{}/", self.stage().display());
        text.lines()
            .map(|line| match line.split_once(&stage) {
                Some((head, name)) => {
                    assert!(name.split('.').all(|n| n.parse::<u64>().is_ok()), "{line}");
                    format!("{head}{stage}N")
                }
                None => line.to_string(),
            })
            .collect()
    }

    fn point(&self, path: &str) -> PathBuf {
        self.root.path().join(path.trim_start_matches('/'))
    }

    fn stage(&self) -> PathBuf {
        self.root.path().join(STAGE)
    }

    fn flag(&self, name: &str, on: bool) {
        let file = self.dir.path().join(name);
        if on {
            std::fs::write(file, "").unwrap();
        } else {
            let _ = std::fs::remove_file(file);
        }
    }

    fn mount_call(&self, target: &str) -> String {
        format!(
            "mount -v -t nfs -o {OPTIONS} {target} {}/N",
            self.stage().display()
        )
    }
}

impl Drop for Fakes {
    /// Detaches every mount left below the system root, deepest first.
    fn drop(&mut self) {
        let mut points: Vec<String> = mountinfo()
            .into_iter()
            .map(|(point, _)| point)
            .filter(|point| Path::new(point).starts_with(self.root.path()))
            .collect();
        points.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in points {
            let _ = Command::new("umount").arg("-l").arg(&point).status();
        }
    }
}

/// (mount point, source) of every mount, in mount order.
fn mountinfo() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let source = right.split(' ').nth(1)?;
            Some((point.to_string(), source.to_string()))
        })
        .collect()
}

/// The sources mounted at `point`, bottom first.
fn mounted_at(point: &Path) -> Vec<String> {
    mountinfo()
        .into_iter()
        .filter(|(at, _)| Path::new(at) == point)
        .map(|(_, source)| source)
        .collect()
}

fn init(daemon: &Daemon, body: Value) -> Reply {
    daemon.call("POST", "/init", body.to_string().as_bytes())
}

fn volumes(lifecycle: Option<&str>, mounts: &[(&str, &str)]) -> Value {
    let list: Vec<Value> = mounts
        .iter()
        .map(|(path, target)| json!({"nfs_target": target, "path": path}))
        .collect();
    let mut body = json!({ "volumeMounts": list });
    if let Some(id) = lifecycle {
        body["lifecycleID"] = json!(id);
    }
    body
}

/// Runs `script` with `sh` as the test's local user.
fn as_user(script: &str) {
    let status = Command::new("setpriv")
        .arg(format!("--reuid={USER_UID}"))
        .arg(format!("--regid={USER_GID}"))
        .args(["--clear-groups", "sh", "-ec", script])
        .status()
        .unwrap();
    assert!(status.success(), "{script}");
}

/// A home of the local user's own, with a directory `vols` of theirs in it.
fn user_home(fakes: &Fakes) -> PathBuf {
    let home = fakes.point("/home/user");
    std::fs::create_dir_all(home.join("vols")).unwrap();
    for dir in [home.clone(), home.join("vols")] {
        std::os::unix::fs::chown(&dir, Some(USER_UID), Some(USER_GID)).unwrap();
    }
    home
}

fn sorted(mut calls: Vec<String>) -> Vec<String> {
    calls.sort();
    calls
}

#[test]
fn volumes_are_mounted_with_envds_options_on_points_the_daemon_makes() {
    if !root_or_skip("mounting needs root") {
        return;
    }
    let fakes = Fakes::new();
    let daemon = fakes.daemon();
    let body = volumes(
        Some("life-1"),
        &[
            ("/mnt/data", "10.0.0.5:/vol-a"),
            ("/home/user/v", "10.0.0.5:/vol-b"),
        ],
    );
    assert_eq!(init(&daemon, body).status, 204);
    let expected = vec![
        fakes.mount_call("10.0.0.5:/vol-a"),
        fakes.mount_call("10.0.0.5:/vol-b"),
    ];
    assert_eq!(sorted(fakes.take_calls()), expected);
    assert_eq!(mounted_at(&fakes.point("/mnt/data")), ["10.0.0.5:/vol-a"]);
    assert_eq!(
        mounted_at(&fakes.point("/home/user/v")),
        ["10.0.0.5:/vol-b"]
    );
    // The staging points are gone, and nothing stays mounted there.
    assert_eq!(std::fs::read_dir(fakes.stage()).unwrap().count(), 0);
    assert!(mountinfo()
        .iter()
        .all(|(point, _)| !Path::new(point).starts_with(fakes.stage())));
    let stage_mode = std::fs::metadata(fakes.root.path().join("run/sandboxd"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(stage_mode & 0o7777, 0o755);
    daemon.log_with(|line| {
        line.ends_with("init: volume 10.0.0.5:/vol-a mounted at '/mnt/data' for lifecycle 'life-1'")
    });
}

/// The volume the remount tests mount.
const DATA: [(&str, &str); 1] = [("/mnt/data", "h:/a")];

/// As root, a daemon that mounted [`DATA`] for lifecycle `one` (its calls taken), and the
/// mount point; `None` when the test is skipped.
fn mounted_for_one() -> Option<(Fakes, Daemon, PathBuf)> {
    if !root_or_skip("mounting needs root") {
        return None;
    }
    let fakes = Fakes::new();
    let daemon = fakes.daemon();
    assert_eq!(init(&daemon, volumes(Some("one"), &DATA)).status, 204);
    fakes.take_calls();
    let point = fakes.point("/mnt/data");
    Some((fakes, daemon, point))
}

#[test]
fn the_same_lifecycle_mounts_nothing_and_a_new_one_remounts() {
    let Some((fakes, daemon, point)) = mounted_for_one() else {
        return;
    };
    let mount = DATA;
    std::fs::write(point.join("mark"), "first").unwrap();
    // A resume of the same lifecycle: nothing to do.
    assert_eq!(init(&daemon, volumes(Some("one"), &mount)).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    // A new lifecycle (a fork, a resume elsewhere): the stale mount taken off, then mounted.
    assert_eq!(init(&daemon, volumes(Some("two"), &mount)).status, 204);
    assert_eq!(fakes.take_calls(), vec![fakes.mount_call("h:/a")]);
    assert_eq!(mounted_at(&point), ["h:/a"]);
    assert!(!point.join("mark").exists(), "a fresh mount");
    daemon.log_with(|line| {
        line.ends_with("init: unmounting the stale mount at '/mnt/data' (lifecycle 'one')")
    });
    // No lifecycle after one: remounted (envd's "lifecycle cleared"); then none again: nothing.
    assert_eq!(init(&daemon, volumes(None, &mount)).status, 204);
    assert_eq!(fakes.take_calls().len(), 1);
    assert_eq!(init(&daemon, volumes(None, &mount)).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    // An /init without volumeMounts leaves the volumes as they are.
    assert_eq!(init(&daemon, json!({"lifecycleID": "three"})).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    assert_eq!(mounted_at(&point), ["h:/a"]);
}

#[test]
fn a_busy_stale_mount_is_detached_lazily_when_the_forced_unmount_fails() {
    let Some((_fakes, daemon, point)) = mounted_for_one() else {
        return;
    };
    let mount = DATA;
    let busy = std::fs::File::create(point.join("open")).unwrap();
    assert_eq!(init(&daemon, volumes(Some("two"), &mount)).status, 204);
    assert_eq!(mounted_at(&point), ["h:/a"]);
    assert!(!point.join("open").exists());
    daemon.log_with(|line| {
        line.ends_with(
            "init: the forced unmount of '/mnt/data' failed: Device or resource busy (os error \
             16); detaching it (lazy unmount)",
        )
    });
    drop(busy);
}

#[test]
fn a_mount_the_daemon_did_not_make_is_left_and_mounted_over() {
    if !root_or_skip("mounting needs root") {
        return;
    }
    let fakes = Fakes::new();
    // Mounted before this daemon (a previous one, a snapshot): not in its ledger.
    let point = fakes.point("/mnt/data");
    let old = Mount::tmpfs(&point, "1m");
    let daemon = fakes.daemon();
    assert_eq!(
        init(&daemon, volumes(Some("l"), &[("/mnt/data", "new:/y")])).status,
        204
    );
    assert_eq!(fakes.take_calls(), vec![fakes.mount_call("new:/y")]);
    assert_eq!(mounted_at(&point), ["tmpfs", "new:/y"]);
    drop(old);
}

/// The volume the swap tests mount, in a directory `vols` of the local user's.
const SWAPPED: [(&str, &str); 1] = [("/home/user/vols/data", "h:/a")];

/// [`SWAPPED`] mounted for lifecycle `one`; then the user moves `vols` (the volume with it) to
/// `vols.old` and runs `replace` in their home to put something in its place. Their home.
fn mounted_then_swapped(fakes: &Fakes, daemon: &Daemon, replace: &str) -> PathBuf {
    let home = user_home(fakes);
    assert_eq!(init(daemon, volumes(Some("one"), &SWAPPED)).status, 204);
    fakes.take_calls();
    as_user(&format!(
        "cd '{}' && mv vols vols.old && {replace}",
        home.display()
    ));
    home
}

#[test]
fn a_parent_swapped_for_a_link_to_another_mount_is_refused_and_nothing_is_unmounted() {
    if !root_or_skip("mounting and a local user need root") {
        return;
    }
    let fakes = Fakes::new();
    // Another mount the user may name (standing for /proc, /sys, any mount of the system).
    let victim = fakes.point("/victim/data");
    let other = Mount::tmpfs(&victim, "1m");
    std::fs::write(victim.join("mark"), "kept").unwrap();
    let daemon = fakes.daemon();
    let link = format!("ln -s '{}' vols", fakes.point("/victim").display());
    let home = mounted_then_swapped(&fakes, &daemon, &link);
    // The resume's /init: refused before anything is run or unmounted.
    let reply = init(&daemon, volumes(Some("two"), &SWAPPED));
    assert_eq!(mounted_at(&victim), ["tmpfs"]);
    assert_eq!(
        std::fs::read_to_string(victim.join("mark")).unwrap(),
        "kept"
    );
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    reply.assert_error(
        400,
        "failed to setup NFS volumes: failed to mount NFS at '/home/user/vols/data': cannot open \
         or create the mount point: '/home/user/vols' is a symbolic link, which sandboxd does not \
         follow there",
    );
    assert_eq!(mounted_at(&home.join("vols.old/data")), ["h:/a"]);
    drop(other);
}

#[test]
fn a_parent_swapped_for_a_directory_leaves_the_moved_volume_and_mounts_afresh() {
    if !root_or_skip("mounting and a local user need root") {
        return;
    }
    let fakes = Fakes::new();
    let daemon = fakes.daemon();
    let home = mounted_then_swapped(&fakes, &daemon, "mkdir vols");
    assert_eq!(init(&daemon, volumes(Some("two"), &SWAPPED)).status, 204);
    daemon.log_with(|line| {
        line.ends_with(
            "init: '/home/user/vols/data' is no longer the volume mounted there for lifecycle \
             'one' (moved, replaced or unmounted since): nothing is unmounted",
        )
    });
    assert_eq!(mounted_at(&home.join("vols.old/data")), ["h:/a"]);
    assert_eq!(mounted_at(&home.join("vols/data")), ["h:/a"]);
}

#[test]
fn a_staging_directory_others_may_change_is_refused() {
    let fakes = Fakes::new();
    let shared = fakes.root.path().join("run/sandboxd");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let daemon = fakes.daemon();
    let reply = init(&daemon, volumes(None, &[("/mnt/data", "h:/a")]));
    assert_eq!(reply.status, 400);
    let message = reply.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with(
            "failed to setup NFS volumes: cannot open the staging directory: '/run/sandboxd' is \
             not the daemon's own (owner "
        ) && message.ends_with(", mode 777): another user could redirect a mount made below it"),
        "{message}"
    );
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
}

#[test]
fn a_failed_mount_is_400_in_envds_words_and_the_init_applies_nothing_else() {
    if !root_or_skip("mounting needs root") {
        return;
    }
    let fakes = Fakes::new();
    fakes.flag("mount-fails", true);
    let daemon = fakes.daemon();
    let mut body = volumes(Some("l"), &[("/mnt/data", "h:/a")]);
    body["envVars"] = json!({"SET": "yes"});
    let reply = init(&daemon, body.clone());
    assert_eq!(reply.status, 400);
    let message = reply.json()["message"].as_str().unwrap().to_string();
    let call = fakes.mount_call("h:/a");
    let head = call.strip_suffix('N').unwrap();
    assert!(
        message.starts_with(&format!(
            "failed to setup NFS volumes: failed to mount NFS at '/mnt/data': '{head}"
        )) && message.ends_with("' failed: exit status 32: mount.nfs: Connection refused"),
        "{message}"
    );
    assert_eq!(reply.header("x-envd-version"), Some(sandboxd::ENVD_VERSION));
    assert_eq!(daemon.get("/envs").json().get("SET"), None);
    assert_eq!(std::fs::read_dir(fakes.stage()).unwrap().count(), 0);
    // Retried once the server is there: mounted, and the rest applied.
    fakes.flag("mount-fails", false);
    fakes.take_calls();
    assert_eq!(init(&daemon, body).status, 204);
    assert_eq!(fakes.take_calls().len(), 1);
    assert_eq!(daemon.get("/envs").json()["SET"], "yes");
}

#[test]
fn a_mount_that_claims_success_but_mounted_nothing_is_400() {
    let fakes = Fakes::new();
    fakes.flag("mount-lies", true);
    let daemon = fakes.daemon();
    let reply = init(&daemon, volumes(None, &[("/mnt/data", "h:/a")]));
    assert_eq!(reply.status, 400);
    let message = reply.json()["message"].as_str().unwrap().to_string();
    let stage = fakes.stage().display().to_string();
    assert!(
        message.starts_with(&format!(
            "failed to setup NFS volumes: failed to mount NFS at '/mnt/data': 'mount' succeeded \
             but nothing is mounted at the staging point '{stage}/"
        )),
        "{message}"
    );
    assert_eq!(mounted_at(&fakes.point("/mnt/data")), Vec::<String>::new());
    assert_eq!(std::fs::read_dir(fakes.stage()).unwrap().count(), 0);
}

#[test]
fn bad_entries_are_400_before_any_command_runs() {
    let fakes = Fakes::new();
    let daemon = fakes.daemon();
    let cases = [
        (
            json!({"volumeMounts": [{"nfs_target": "h:/a", "path": "mnt"}]}),
            "invalid volumeMounts path 'mnt': must be an absolute path below '/', without '.' or '..' components or NUL, at most 4095 bytes",
        ),
        (
            json!({"volumeMounts": [{"nfs_target": "h:/a", "path": "/mnt/../etc"}]}),
            "invalid volumeMounts path '/mnt/../etc': must be an absolute path below '/', without '.' or '..' components or NUL, at most 4095 bytes",
        ),
        (
            json!({"volumeMounts": [{"nfs_target": "-oremount", "path": "/mnt"}]}),
            "invalid volumeMounts nfs_target '-oremount': must be a non-empty server target (host:/export) not beginning with '-', without control characters, at most 4095 bytes",
        ),
        (
            json!({"volumeMounts": [{"nfs_target": "h:/a", "path": "/m"}, {"nfs_target": "h:/b", "path": "/m/"}]}),
            "volumeMounts lists the path '/m' twice",
        ),
    ];
    for (body, message) in cases {
        init(&daemon, body).assert_error(400, message);
    }
    let missing = init(&daemon, json!({"volumeMounts": [{"path": "/mnt"}]}));
    assert_eq!(missing.status, 400);
    assert!(
        missing.json()["message"]
            .as_str()
            .unwrap()
            .contains("missing field `nfs_target`"),
        "{}",
        missing.text()
    );
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    assert!(!fakes.point("/mnt").exists());
}

#[test]
fn a_symlink_on_the_volumes_path_is_refused_and_nothing_is_mounted_through_it() {
    let fakes = Fakes::new();
    let elsewhere = fakes.root.path().join("etc");
    std::fs::create_dir(&elsewhere).unwrap();
    // A local user's link where the volume's parent should be.
    std::fs::create_dir_all(fakes.point("/home/user")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, fakes.point("/home/user/data")).unwrap();
    let daemon = fakes.daemon();
    let reply = init(
        &daemon,
        volumes(Some("l"), &[("/home/user/data/v", "h:/a")]),
    );
    reply.assert_error(
        400,
        "failed to setup NFS volumes: failed to mount NFS at '/home/user/data/v': cannot open or create the mount point: '/home/user/data' is a symbolic link, which sandboxd does not follow there",
    );
    assert!(!elsewhere.join("v").exists());
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
}

#[test]
fn a_missing_mount_program_is_the_error() {
    let fakes = Fakes::new();
    std::fs::remove_file(fakes.dir.path().join("bin/mount")).unwrap();
    // The PATH is only the fakes' directory, so no real mount is found either.
    let daemon = builder()
        .arg("--system-root")
        .arg(fakes.root.path().to_str().unwrap())
        .env("PATH", fakes.dir.path().join("bin").to_str().unwrap())
        .start();
    let reply = init(&daemon, volumes(None, &[("/mnt/data", "h:/a")]));
    assert_eq!(reply.status, 400);
    let message = reply.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with(
            "failed to setup NFS volumes: failed to mount NFS at '/mnt/data': 'mount -v -t nfs"
        ) && message.ends_with("failed: cannot start it: No such file or directory (os error 2)"),
        "{message}"
    );
    assert_eq!(std::fs::read_dir(fakes.stage()).unwrap().count(), 0);
}
