//! `/init`'s `volumeMounts` and `lifecycleID`: the sandbox's NFS volumes, mounted as envd
//! mounts them (`setupNFS` in envd's `internal/api/init.go`). This module owns the request's
//! checks, the ledger and the order of a setup; [`setup`] does one volume.
//!
//! The daemon keeps a ledger of what it mounted: mount point → the lifecycle it was mounted
//! for and the identity (device, inode) of the mounted root. A volume is (re)mounted unless the
//! ledger has it for the `/init`'s lifecycle ([`should_remount`], envd's truth table): a resumed
//! or forked sandbox gets a new `lifecycleID` and with it fresh mounts, the old ones forced off
//! first (then lazily when that fails). Volumes are set up in parallel within one budget of
//! [`BUDGET`], with envd's `mount` command and options ([`NFS_OPTIONS`]) through
//! `platform::command`. Volumes no longer listed are left mounted, as envd leaves them.
//!
//! **Differences from envd, on purpose** (root never acts by a path a user can redirect):
//! - the entries are checked before anything is done (envd passes any string to `mount`: an
//!   `nfs_target` beginning with `-` would be read as an option);
//! - before anything else the mount point is opened, its missing directories made (root,
//!   0755), component by component following no symlink, under `--system-root` (envd runs
//!   `findmnt`, `umount --force` and `mkdir -p` by path: a user who links the volume's path,
//!   or a parent, to `/proc` or `/etc` gets that unmounted or mounted over by root);
//! - only what the ledger says the daemon mounted there is unmounted, and only while the
//!   directory found there is still that mount's root (same device and inode); it is taken off
//!   through its descriptor (`umount2` on `/proc/self/fd/N`), not by `umount` and a path, so
//!   envd's `findmnt` is not run. A mount the daemon did not record (one from before a restart
//!   that lost the ledger) is left, and the volume is mounted on top of it; envd would force
//!   whatever is there off. `umount.nfs`'s notice to the server is not sent (its stale handles
//!   are what is being dropped);
//! - `mount` mounts in a staging directory only root can change and the mount is then attached
//!   onto the directory held ([`setup`]): envd's `mount` is given the path;
//! - a second `/init` during a setup waits for it (envd answers 204 at once having mounted
//!   nothing) and then does what is left.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::command::Ran;
use crate::error::ApiError;

pub mod setup;

/// envd's NFS options (its proxy speaks NFSv3 over TCP on 2049; no caching, so a pause and
/// resume see the server's files), after `fg,hard`.
pub const NFS_OPTIONS: &str = "sync,rsize=1048576,wsize=1048576,mountproto=tcp,mountport=2049,\
                               proto=tcp,port=2049,nfsvers=3,noacl,noac,lookupcache=none";
/// One `/init`'s whole setup, as envd's `nfsMountTimeout`.
pub const BUDGET: Duration = Duration::from_secs(10);
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

/// What the daemon mounted at one mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    /// The lifecycle it was mounted for (`""` when the `/init` named none).
    pub lifecycle: String,
    /// Device and inode of the mounted root, as the kernel had them cached; `None` when a
    /// previous image handed over an entry without them (that mount is then never unmounted).
    pub root: Option<(u64, u64)>,
}

/// What the daemon mounted, where; and the lock one setup at a time holds.
#[derive(Default)]
pub struct Ledger {
    mounted: Mutex<BTreeMap<String, Mounted>>,
    setting_up: Mutex<()>,
}

impl Ledger {
    fn mounted(&self) -> MutexGuard<'_, BTreeMap<String, Mounted>> {
        self.mounted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mount point → what was mounted, for a live upgrade's handover (the mounts outlive the
    /// image).
    pub fn entries(&self) -> Vec<(String, Mounted)> {
        self.mounted()
            .iter()
            .map(|(path, mounted)| (path.clone(), mounted.clone()))
            .collect()
    }

    /// Takes back the entries a previous image handed over.
    pub fn restore(&self, entries: Vec<(String, Mounted)>) {
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
                    should_remount(
                        mounted.get(path).map(|m| m.lifecycle.as_str()),
                        &self.lifecycle,
                    )
                })
                .collect()
        };
        if due.is_empty() {
            return Ok(());
        }
        let stage = setup::open_stage(system_root).map_err(|error| {
            ApiError::bad_request(format!(
                "failed to setup NFS volumes: cannot open the staging directory: {error}"
            ))
        })?;
        let stage = &stage;
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let runs: Vec<_> = due
                .iter()
                .map(|(path, target)| {
                    scope.spawn(move || {
                        let volume = (path.as_str(), target.as_str());
                        setup::set_up(
                            ledger,
                            system_root,
                            stage,
                            volume,
                            &self.lifecycle,
                            deadline,
                        )
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

/// A program's output at the end of an error, when it printed any.
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
}
