//! `/init`'s `volumeMounts` and `lifecycleID` (SPEC §9): what is mounted, unmounted and when.
//! This machine's kernel has no NFS client, so `mount`, `umount` and `findmnt` are fakes put
//! first on the daemon's `PATH`: each records its arguments, and they keep a table of "mounted"
//! points in a file, so `findmnt` answers what the fake `mount` did. Mount points are made
//! under `--system-root`, a temporary directory.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::common::{builder, Daemon, Reply};

const OPTIONS: &str = "fg,hard,sync,rsize=1048576,wsize=1048576,mountproto=tcp,mountport=2049,\
                       proto=tcp,port=2049,nfsvers=3,noacl,noac,lookupcache=none";

/// The fake helpers' directory, their shared state, and the system root.
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
        // Each: records "name args" in calls; mounts holds "point source" lines.
        let scripts = [
            (
                "findmnt",
                r#"echo "findmnt $*" >> "$S/calls"
for point; do :; done
line=$(grep -F "$point " "$S/mounts" 2>/dev/null | head -n1)
[ -n "$line" ] || exit 1
echo "${line#* }""#,
            ),
            (
                "mount",
                r#"echo "mount $*" >> "$S/calls"
if [ -e "$S/mount-fails" ]; then echo "mount.nfs: Connection refused" >&2; exit 32; fi
for point; do :; done
eval "target=\${$(($# - 1))}"
echo "$point $target" >> "$S/mounts""#,
            ),
            (
                "umount",
                r#"echo "umount $*" >> "$S/calls"
if [ "$1" = --force ] && [ -e "$S/force-fails" ]; then echo "umount: target is busy" >&2; exit 16; fi
grep -vF "$2 " "$S/mounts" > "$S/mounts.new"; mv "$S/mounts.new" "$S/mounts""#,
            ),
        ];
        for (name, body) in scripts {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\nS='{state}'\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(dir.path().join("mounts"), "").unwrap();
        Fakes {
            dir,
            root: tempfile::tempdir().unwrap(),
        }
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

    /// The calls made since the last look, one per line.
    fn take_calls(&self) -> Vec<String> {
        let file = self.dir.path().join("calls");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        text.lines().map(str::to_string).collect()
    }

    fn mounts(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mounts")).unwrap()
    }

    fn point(&self, path: &str) -> PathBuf {
        self.root.path().join(path.trim_start_matches('/'))
    }

    fn flag(&self, name: &str, on: bool) {
        let file = self.dir.path().join(name);
        if on {
            std::fs::write(file, "").unwrap();
        } else {
            let _ = std::fs::remove_file(file);
        }
    }

    fn mount_call(&self, target: &str, path: &str) -> String {
        format!(
            "mount -v -t nfs -o {OPTIONS} {target} {}",
            self.point(path).display()
        )
    }

    fn findmnt_call(&self, path: &str) -> String {
        format!(
            "findmnt --noheadings --output SOURCE {}",
            self.point(path).display()
        )
    }
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

fn sorted(mut calls: Vec<String>) -> Vec<String> {
    calls.sort();
    calls
}

#[test]
fn volumes_are_mounted_with_envds_options_on_points_the_daemon_makes() {
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
        fakes.findmnt_call("/home/user/v"),
        fakes.findmnt_call("/mnt/data"),
        fakes.mount_call("10.0.0.5:/vol-a", "/mnt/data"),
        fakes.mount_call("10.0.0.5:/vol-b", "/home/user/v"),
    ];
    assert_eq!(sorted(fakes.take_calls()), sorted(expected));
    for path in ["/mnt/data", "/home/user/v"] {
        let point = fakes.point(path);
        assert!(point.is_dir(), "{point:?}");
    }
    daemon.log_with(|line| {
        line.ends_with("init: volume 10.0.0.5:/vol-a mounted at '/mnt/data' for lifecycle 'life-1'")
    });
}

#[test]
fn the_same_lifecycle_mounts_nothing_and_a_new_one_remounts() {
    let fakes = Fakes::new();
    let daemon = fakes.daemon();
    let mount = [("/mnt/data", "h:/a")];
    assert_eq!(init(&daemon, volumes(Some("one"), &mount)).status, 204);
    fakes.take_calls();
    // A resume of the same lifecycle: nothing to do.
    assert_eq!(init(&daemon, volumes(Some("one"), &mount)).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    // A new lifecycle (a fork, a resume elsewhere): the stale mount forced off, then mounted.
    assert_eq!(init(&daemon, volumes(Some("two"), &mount)).status, 204);
    let point = fakes.point("/mnt/data").display().to_string();
    assert_eq!(
        fakes.take_calls(),
        vec![
            fakes.findmnt_call("/mnt/data"),
            format!("umount --force {point}"),
            fakes.mount_call("h:/a", "/mnt/data"),
        ]
    );
    assert_eq!(fakes.mounts(), format!("{point} h:/a\n"));
    // No lifecycle after one: remounted (envd's "lifecycle cleared"); then none again: nothing.
    assert_eq!(init(&daemon, volumes(None, &mount)).status, 204);
    assert_eq!(fakes.take_calls().len(), 3);
    assert_eq!(init(&daemon, volumes(None, &mount)).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    // An /init without volumeMounts leaves the volumes as they are.
    assert_eq!(init(&daemon, json!({"lifecycleID": "three"})).status, 204);
    assert_eq!(fakes.take_calls(), Vec::<String>::new());
    assert_eq!(fakes.mounts(), format!("{point} h:/a\n"));
}

#[test]
fn a_stale_mount_is_forced_off_and_lazily_when_force_fails() {
    let fakes = Fakes::new();
    let point = fakes.point("/mnt/data").display().to_string();
    // Mounted before this daemon (a previous one, a snapshot): not in its ledger.
    std::fs::write(fakes.dir.path().join("mounts"), format!("{point} old:/x\n")).unwrap();
    fakes.flag("force-fails", true);
    let daemon = fakes.daemon();
    assert_eq!(
        init(&daemon, volumes(Some("l"), &[("/mnt/data", "new:/y")])).status,
        204
    );
    assert_eq!(
        fakes.take_calls(),
        vec![
            fakes.findmnt_call("/mnt/data"),
            format!("umount --force {point}"),
            format!("umount --lazy {point}"),
            fakes.mount_call("new:/y", "/mnt/data"),
        ]
    );
    assert_eq!(fakes.mounts(), format!("{point} new:/y\n"));
    daemon.log_with(|line| {
        line.ends_with(&format!(
            "init: 'umount --force {point}' failed: exit status 16: umount: target is busy; trying 'umount --lazy'"
        ))
    });
}

#[test]
fn a_failed_mount_is_400_in_envds_words_and_the_init_applies_nothing_else() {
    let fakes = Fakes::new();
    fakes.flag("mount-fails", true);
    let daemon = fakes.daemon();
    let mut body = volumes(Some("l"), &[("/mnt/data", "h:/a")]);
    body["envVars"] = json!({"SET": "yes"});
    let reply = init(&daemon, body.clone());
    reply.assert_error(
        400,
        &format!(
            "failed to setup NFS volumes: failed to mount NFS at '/mnt/data': '{}' failed: exit status 32: mount.nfs: Connection refused",
            fakes.mount_call("h:/a", "/mnt/data")
        ),
    );
    assert_eq!(reply.header("x-envd-version"), Some(sandboxd::ENVD_VERSION));
    assert_eq!(daemon.get("/envs").json().get("SET"), None);
    // Retried once the server is there: mounted, and the rest applied.
    fakes.flag("mount-fails", false);
    fakes.take_calls();
    assert_eq!(init(&daemon, body).status, 204);
    assert_eq!(fakes.take_calls().len(), 2);
    assert_eq!(daemon.get("/envs").json()["SET"], "yes");
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
        "failed to setup NFS volumes: failed to mount NFS at '/home/user/data/v': cannot create the mount point: '/home/user/data' is a symbolic link, which a mount point may not pass through",
    );
    assert!(!elsewhere.join("v").exists());
    let calls = fakes.take_calls();
    assert!(
        calls.iter().all(|call| !call.starts_with("mount ")),
        "{calls:?}"
    );
}

#[test]
fn a_missing_mount_program_is_the_error() {
    let fakes = Fakes::new();
    std::fs::remove_file(fakes.dir.path().join("bin/mount")).unwrap();
    // Nothing mounted, said without the tools the full fake uses: the PATH is only the fakes'
    // directory, so no real mount is found either.
    std::fs::write(fakes.dir.path().join("bin/findmnt"), "#!/bin/sh\nexit 1\n").unwrap();
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
}
