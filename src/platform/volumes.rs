//! `/init`'s `volumeMounts` and `lifecycleID`: the sandbox's NFS volumes, mounted as envd
//! mounts them (`setupNFS` in envd's `internal/api/init.go`).
//!
//! The daemon keeps a ledger of what it mounted: mount point → the lifecycle it was mounted
//! for. A volume is (re)mounted unless the ledger has it for the `/init`'s lifecycle
//! ([`should_remount`], envd's truth table): a resumed or forked sandbox gets a new
//! `lifecycleID` and with it fresh mounts, the old ones forced off first (`findmnt` says
//! whether something is mounted there; `umount --force`, then `umount --lazy` when that
//! fails). Volumes are set up in parallel within one budget of [`BUDGET`], with envd's
//! commands and options ([`NFS_OPTIONS`]) through `platform::command`. Volumes no longer
//! listed are left mounted, as envd leaves them.
//!
//! **Differences from envd, on purpose:** the entries are checked before anything is done
//! (envd passes any string to `mount`: an `nfs_target` beginning with `-` would be read as an
//! option); the mount point and its missing parents are created by the daemon, as root, 0755,
//! through descriptors that follow no symlink, under `--system-root` (envd runs `mkdir -p`,
//! which follows whatever a local user put on the path: a link from the volume's path to
//! `/etc` would mount the volume there); a second `/init` during a setup waits for it (envd
//! answers 204 at once having mounted nothing) and then does what is left.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::command::{self, Ran};
use crate::error::ApiError;
use crate::fs::dirs::{make_dir, Made};
use crate::log;
use crate::sys::dir::Dir;

/// envd's NFS options (its proxy speaks NFSv3 over TCP on 2049; no caching, so a pause and
/// resume see the server's files), after `fg,hard`.
pub const NFS_OPTIONS: &str = "sync,rsize=1048576,wsize=1048576,mountproto=tcp,mountport=2049,\
                               proto=tcp,port=2049,nfsvers=3,noacl,noac,lookupcache=none";
/// One `/init`'s whole setup, as envd's `nfsMountTimeout`.
pub const BUDGET: Duration = Duration::from_secs(10);
/// The lazy unmount after a failed forced one gets a fresh budget of its own, as envd's.
pub const LAZY_BUDGET: Duration = Duration::from_secs(2);
/// Volumes one `/init` may list.
pub const MAX_VOLUMES: usize = 64;
/// The longest `path` or `nfs_target` accepted (Linux's `PATH_MAX` less its NUL).
const MAX_TEXT: usize = 4095;

/// One entry of `volumeMounts`, as envd's OpenAPI names its fields.
#[derive(Deserialize, Debug, Clone)]
pub struct VolumeMount {
    nfs_target: String,
    path: String,
}

/// A checked `volumeMounts` with its `lifecycleID`.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// (mount point as the client named it, normalised; NFS target), in the client's order.
    volumes: Vec<(String, String)>,
    lifecycle: String,
}

/// What the daemon mounted, for which lifecycle; and the lock one setup at a time holds.
#[derive(Default)]
pub struct Ledger {
    mounted: Mutex<BTreeMap<String, String>>,
    setting_up: Mutex<()>,
}

impl Ledger {
    fn mounted(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.mounted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mount point → lifecycle, for a live upgrade's handover (the mounts outlive the image).
    pub fn entries(&self) -> Vec<(String, String)> {
        self.mounted()
            .iter()
            .map(|(path, lifecycle)| (path.clone(), lifecycle.clone()))
            .collect()
    }

    /// Takes back the entries a previous image handed over.
    pub fn restore(&self, entries: Vec<(String, String)>) {
        *self.mounted() = entries.into_iter().collect();
    }
}

/// envd's `shouldRemountNFS`: an absent lifecycle is `""`; a volume already mounted for the
/// requested lifecycle is left alone (`""` and `""` included: remounting on every `/init` that
/// names none would never end).
pub fn should_remount(mounted_for: Option<&str>, requested: &str) -> bool {
    mounted_for != Some(requested)
}

impl Request {
    /// The mount points, as normalised (for the fuzz target's invariants).
    #[cfg(feature = "fuzzing")]
    pub fn mount_points(&self) -> Vec<&str> {
        self.volumes.iter().map(|(path, _)| path.as_str()).collect()
    }

    /// Checks `volumeMounts` (absent or `null`: nothing to do) and normalises each path.
    pub fn parse(
        mounts: Option<Vec<VolumeMount>>,
        lifecycle: Option<String>,
    ) -> Result<Option<Request>, ApiError> {
        let Some(mounts) = mounts else {
            return Ok(None);
        };
        if mounts.len() > MAX_VOLUMES {
            return Err(ApiError::bad_request(format!(
                "volumeMounts lists {} volumes; at most {MAX_VOLUMES} are accepted",
                mounts.len()
            )));
        }
        let mut volumes: Vec<(String, String)> = Vec::with_capacity(mounts.len());
        for mount in mounts {
            let path = normalise(&mount.path).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid volumeMounts path '{}': must be an absolute path below '/', without \
                     '.' or '..' components or NUL, at most {MAX_TEXT} bytes",
                    shown(&mount.path)
                ))
            })?;
            let target = &mount.nfs_target;
            if target.is_empty()
                || target.starts_with('-')
                || target.len() > MAX_TEXT
                || target.chars().any(char::is_control)
            {
                return Err(ApiError::bad_request(format!(
                    "invalid volumeMounts nfs_target '{}': must be a non-empty server target \
                     (host:/export) not beginning with '-', without control characters, at most \
                     {MAX_TEXT} bytes",
                    shown(target)
                )));
            }
            if volumes.iter().any(|(seen, _)| *seen == path) {
                return Err(ApiError::bad_request(format!(
                    "volumeMounts lists the path '{path}' twice"
                )));
            }
            volumes.push((path, mount.nfs_target));
        }
        Ok(Some(Request {
            volumes,
            lifecycle: lifecycle.unwrap_or_default(),
        }))
    }

    /// Mounts what the ledger lacks for this lifecycle, in parallel, within [`BUDGET`]. The
    /// first failure in the request's order is the error (envd's words); the volumes that
    /// succeeded stay mounted and recorded.
    pub fn apply(&self, ledger: &Ledger, system_root: &Path) -> Result<(), ApiError> {
        let _one_at_a_time = ledger.setting_up.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + BUDGET;
        let due: Vec<&(String, String)> = {
            let mounted = ledger.mounted();
            self.volumes
                .iter()
                .filter(|(path, _)| {
                    should_remount(mounted.get(path).map(String::as_str), &self.lifecycle)
                })
                .collect()
        };
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let runs: Vec<_> = due
                .iter()
                .map(|(path, target)| {
                    scope.spawn(move || {
                        set_up(ledger, system_root, path, target, &self.lifecycle, deadline)
                    })
                })
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .unwrap_or_else(|_| Err("the mount thread failed".to_string()))
                })
                .collect()
        });
        match results.into_iter().find_map(Result::err) {
            Some(error) => Err(ApiError::bad_request(format!(
                "failed to setup NFS volumes: {error}"
            ))),
            None => Ok(()),
        }
    }
}

/// One volume: the stale mount off, the mount point made, the volume mounted, recorded.
fn set_up(
    ledger: &Ledger,
    system_root: &Path,
    path: &str,
    target: &str,
    lifecycle: &str,
    deadline: Instant,
) -> Result<(), String> {
    let point = system_root.join(path.trim_start_matches('/'));
    let shown = point.display().to_string();
    unmount_stale(ledger, path, &shown, deadline)
        .map_err(|error| format!("failed to unmount stale NFS mount at '{path}': {error}"))?;
    make_mount_point(system_root, path).map_err(|error| {
        format!("failed to mount NFS at '{path}': cannot create the mount point: {error}")
    })?;
    let options = format!("fg,hard,{NFS_OPTIONS}");
    let args = ["-v", "-t", "nfs", "-o", &options, target, &shown];
    let ran = command::run("mount", &args, deadline);
    if let Err(failure) = &ran.result {
        return Err(format!(
            "failed to mount NFS at '{path}': 'mount {}' failed: {failure}{}",
            args.join(" "),
            output_suffix(&ran)
        ));
    }
    ledger
        .mounted()
        .insert(path.to_string(), lifecycle.to_string());
    log::line(format_args!(
        "init: volume {target} mounted at '{path}' for lifecycle '{lifecycle}'"
    ));
    Ok(())
}

/// Forces off whatever is mounted at `point` (nothing: nothing to do), as envd's `unmountNFS`.
fn unmount_stale(
    ledger: &Ledger,
    path: &str,
    point: &str,
    deadline: Instant,
) -> Result<(), String> {
    let found = command::run(
        "findmnt",
        &["--noheadings", "--output", "SOURCE", point],
        deadline,
    );
    match found.exit_code() {
        Some(0) => {}
        // findmnt's "not a mount point".
        Some(1) => return Ok(()),
        _ => {
            let failure = found
                .result
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            return Err(format!(
                "cannot tell whether it is mounted: 'findmnt' failed: {failure}{}",
                output_suffix(&found)
            ));
        }
    }
    let source = found.output.trim();
    if source.is_empty() {
        return Ok(());
    }
    log::line(format_args!(
        "init: unmounting the stale mount at '{path}' (was {source})"
    ));
    let forced = command::run("umount", &["--force", point], deadline);
    if let Err(failure) = &forced.result {
        log::line(format_args!(
            "init: 'umount --force {point}' failed: {failure}{}; trying 'umount --lazy'",
            output_suffix(&forced)
        ));
        let lazy = command::run("umount", &["--lazy", point], Instant::now() + LAZY_BUDGET);
        if let Err(failure) = &lazy.result {
            return Err(format!(
                "'umount --lazy {point}' failed: {failure}{}",
                output_suffix(&lazy)
            ));
        }
    }
    ledger.mounted().remove(path);
    Ok(())
}

/// Opens or creates each directory of `path` below `system_root`, following no symlink.
fn make_mount_point(system_root: &Path, path: &str) -> Result<(), String> {
    let mut dir =
        Dir::open(system_root).map_err(|error| format!("'{}': {error}", system_root.display()))?;
    let mut walked = PathBuf::from("/");
    for name in path.split('/').filter(|name| !name.is_empty()) {
        let name = OsStr::new(name);
        walked.push(name);
        dir = match dir.open_dir(name, false) {
            Ok(next) => next,
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => make_dir(&dir, name, 0, 0)
                .map_err(|made| match made {
                    Made::NotADirectory => format!("'{}' is not a directory", walked.display()),
                    Made::Replaced => format!("'{}' was replaced while made", walked.display()),
                    Made::Failed(error) => format!("'{}': {error}", walked.display()),
                })?,
            Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                let link = dir.stat_at(name, false).is_ok_and(|stat| stat.is_symlink());
                return Err(if link {
                    format!(
                        "'{}' is a symbolic link, which a mount point may not pass through",
                        walked.display()
                    )
                } else {
                    format!("'{}' is not a directory", walked.display())
                });
            }
            Err(error) => return Err(format!("'{}': {error}", walked.display())),
        };
    }
    Ok(())
}

/// `path` as `/a/b` (repeated and trailing slashes dropped), or `None` when it is not an
/// absolute path below `/` without `.`, `..` or NUL.
fn normalise(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > MAX_TEXT {
        return None;
    }
    let mut normal = String::with_capacity(path.len());
    for component in Path::new(path).components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => {
                normal.push('/');
                normal.push_str(name.to_str()?);
            }
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    // `Path::components` drops interior `.`; envd's paths never have one, so refuse it too.
    let has_dot = path.split('/').any(|part| part == "." || part == "..");
    (!normal.is_empty() && !has_dot).then_some(normal)
}

fn output_suffix(ran: &Ran) -> String {
    let output = ran.output.trim();
    if output.is_empty() {
        String::new()
    } else {
        format!(": {output}")
    }
}

/// A client's text in an error: at most 256 characters.
fn shown(text: &str) -> String {
    text.chars().take(256).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(path: &str, target: &str) -> VolumeMount {
        VolumeMount {
            nfs_target: target.to_string(),
            path: path.to_string(),
        }
    }

    #[test]
    fn remounts_follow_envds_truth_table() {
        assert!(should_remount(None, ""));
        assert!(should_remount(None, "abc"));
        assert!(!should_remount(Some(""), ""));
        assert!(should_remount(Some("abc"), ""));
        assert!(should_remount(Some(""), "abc"));
        assert!(!should_remount(Some("abc"), "abc"));
        assert!(should_remount(Some("abc"), "xyz"));
    }

    #[test]
    fn paths_are_normalised_and_bad_ones_refused() {
        assert_eq!(normalise("/mnt/data").as_deref(), Some("/mnt/data"));
        assert_eq!(normalise("//mnt///data/").as_deref(), Some("/mnt/data"));
        for bad in ["", "/", "mnt/data", "/mnt/../etc", "/mnt/./data", "/mnt/\0"] {
            assert_eq!(normalise(bad), None, "{bad:?}");
        }
        assert_eq!(normalise(&format!("/{}", "a".repeat(MAX_TEXT))), None);
    }

    #[test]
    fn absent_volume_mounts_are_nothing_to_do() {
        assert_eq!(Request::parse(None, Some("l".into())), Ok(None));
        let empty = Request::parse(Some(vec![]), None).unwrap().unwrap();
        assert!(empty.volumes.is_empty());
        assert_eq!(empty.lifecycle, "");
    }

    #[test]
    fn entries_are_checked_before_anything_is_done() {
        let refused = |mounts: Vec<VolumeMount>| Request::parse(Some(mounts), None).unwrap_err();
        let error = refused(vec![mount("data", "h:/e")]);
        assert!(error
            .message
            .starts_with("invalid volumeMounts path 'data': must be an absolute path"));
        let error = refused(vec![mount("/data", "-oremount")]);
        assert!(error
            .message
            .starts_with("invalid volumeMounts nfs_target '-oremount'"));
        let error = refused(vec![mount("/data", "")]);
        assert!(error
            .message
            .starts_with("invalid volumeMounts nfs_target ''"));
        let error = refused(vec![mount("/data", "h:/e\n-o x")]);
        assert!(error.message.contains("without control characters"));
        let error = refused(vec![mount("/data", "h:/a"), mount("/data/", "h:/b")]);
        assert_eq!(error.message, "volumeMounts lists the path '/data' twice");
        let error = refused(
            (0..=MAX_VOLUMES)
                .map(|i| mount(&format!("/v{i}"), "h:/e"))
                .collect(),
        );
        assert_eq!(
            error.message,
            "volumeMounts lists 65 volumes; at most 64 are accepted"
        );
        assert_eq!(error.status, 400);
    }

    #[test]
    fn a_mount_point_is_made_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        make_mount_point(root.path(), "/mnt/data/deep").unwrap();
        assert!(root.path().join("mnt/data/deep").is_dir());
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), root.path().join("link"))
            .unwrap();
        let error = make_mount_point(root.path(), "/link/vol").unwrap_err();
        assert_eq!(
            error,
            "'/link' is a symbolic link, which a mount point may not pass through"
        );
        assert!(!root.path().join("elsewhere/vol").exists());
        std::fs::write(root.path().join("file"), "").unwrap();
        let error = make_mount_point(root.path(), "/file/vol").unwrap_err();
        assert_eq!(error, "'/file' is not a directory");
    }
}
