//! One volume set up: the mount point opened (made) without following a link, the stale mount
//! the ledger recorded there taken off through its descriptor, the volume mounted by `mount`
//! in a staging directory only root can change, then attached onto the mount point held.
//!
//! Why staged: `mount` and its NFS helper canonicalise the mount point they are given
//! (`realpath`) and mount on that text after seconds of talking to the server, so a path under a
//! directory a user owns could be redirected between the daemon's check and the mount, even a
//! `/proc/self/fd/N` one. The staging path, `/run/sandboxd/volumes/<pid>.<n>` under
//! `--system-root`, has no component another user may change (checked: each is the daemon's
//! user's and writable by no one else); the mount made there is cloned (`open_tree`), the clone
//! attached onto the held directory (`move_mount`: the kernel resolves no path) and the staged
//! original detached.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{output_suffix, Ledger, Mounted, NFS_OPTIONS};
use crate::log;
use crate::platform::command;
use crate::platform::walk;
use crate::sys::dir::Dir;
use crate::sys::mount::{self, Unmount};

/// The staging directory below `--system-root`.
pub const STAGE: &str = "/run/sandboxd/volumes";

/// Names of staging points: unique within the daemon's life (with its pid, across upgrades).
static STAGED: AtomicU64 = AtomicU64::new(0);

/// The staging directory, held, and its path: made if missing; refused unless every component
/// below `--system-root` is the daemon's user's and writable by no one else.
pub fn open_stage(system_root: &Path) -> Result<(Dir, PathBuf), String> {
    let mut dir =
        Dir::open(system_root).map_err(|e| format!("'{}': {e}", system_root.display()))?;
    let mut walked = PathBuf::from("/");
    for name in STAGE.split('/').filter(|name| !name.is_empty()) {
        walked.push(name);
        dir = walk::step(&dir, OsStr::new(name), &walked)?;
        let stat = dir
            .stat()
            .map_err(|e| format!("'{}': {e}", walked.display()))?;
        if stat.uid != crate::sys::creds::fsuid() || stat.mode & 0o022 != 0 {
            return Err(format!(
                "'{}' is not the daemon's own (owner {}, mode {:o}): another user could \
                 redirect a mount made below it",
                walked.display(),
                stat.uid,
                stat.mode & 0o7777
            ));
        }
    }
    Ok((dir, system_root.join(STAGE.trim_start_matches('/'))))
}

/// Sets up the volume `target` at `path` for `lifecycle` and records it in `ledger`.
pub fn set_up(
    ledger: &Ledger,
    system_root: &Path,
    stage: &(Dir, PathBuf),
    (path, target): (&str, &str),
    lifecycle: &str,
    deadline: Instant,
) -> Result<(), String> {
    let point_error = |error: String| {
        format!("failed to mount NFS at '{path}': cannot open or create the mount point: {error}")
    };
    // `path` is normalised: absolute, at least one component.
    let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
    let name = OsStr::new(name);
    let parent = walk::open_below(system_root, parent_path).map_err(point_error)?;
    let mut point = walk::step(&parent, name, Path::new(path)).map_err(point_error)?;
    let recorded = ledger.mounted().get(path).cloned();
    if let Some(recorded) = recorded {
        if unmount_stale(path, &point, &recorded)? {
            point = walk::step(&parent, name, Path::new(path)).map_err(point_error)?;
        }
        ledger.mounted().remove(path);
    }
    let root = mount_staged(stage, target, &point, deadline)
        .map_err(|error| format!("failed to mount NFS at '{path}': {error}"))?;
    ledger.mounted().insert(
        path.to_string(),
        Mounted {
            lifecycle: lifecycle.to_string(),
            root: Some(root),
        },
    );
    log::line(format_args!(
        "init: volume {target} mounted at '{path}' for lifecycle '{lifecycle}'"
    ));
    Ok(())
}

/// Takes off the mount the ledger recorded at `path` when `point` (the topmost mount there,
/// held) is still its root: forced, then lazily when that fails (envd's `umount --force`, then
/// `--lazy`). Anything else there is left as it is. True when something was taken off.
fn unmount_stale(path: &str, point: &Dir, recorded: &Mounted) -> Result<bool, String> {
    let stale = |error: String| format!("failed to unmount stale NFS mount at '{path}': {error}");
    let found = mount::identity(point.as_fd())
        .map_err(|e| stale(format!("cannot read what is mounted there: {e}")))?;
    if recorded.root != Some(found) {
        log::line(format_args!(
            "init: '{path}' is no longer the volume mounted there for lifecycle '{}' (moved, \
             replaced or unmounted since): nothing is unmounted",
            recorded.lifecycle
        ));
        return Ok(false);
    }
    log::line(format_args!(
        "init: unmounting the stale mount at '{path}' (lifecycle '{}')",
        recorded.lifecycle
    ));
    if let Err(error) = mount::unmount(point, Unmount::Force) {
        log::line(format_args!(
            "init: the forced unmount of '{path}' failed: {error}; detaching it (lazy unmount)"
        ));
        mount::unmount(point, Unmount::Lazy)
            .map_err(|e| stale(format!("the lazy unmount failed: {e}")))?;
    }
    Ok(true)
}

/// Runs envd's `mount` on a fresh staging point, then attaches the mount onto `point`; the
/// staging point is taken off and removed whatever happens. The identity of the mounted root.
fn mount_staged(
    (stage, stage_path): &(Dir, PathBuf),
    target: &str,
    point: &Dir,
    deadline: Instant,
) -> Result<(u64, u64), String> {
    let name = format!(
        "{}.{}",
        std::process::id(),
        STAGED.fetch_add(1, Ordering::Relaxed)
    );
    let name = OsStr::new(&name);
    let staged = stage_path.join(name);
    stage
        .mkdir(name, 0o700)
        .map_err(|e| format!("cannot make the staging point '{}': {e}", staged.display()))?;
    let shown = staged.display().to_string();
    let options = format!("fg,hard,{NFS_OPTIONS}");
    let args = ["-v", "-t", "nfs", "-o", &options, target, &shown];
    let ran = command::run("mount", &args, deadline);
    let result = match &ran.result {
        Err(failure) => Err(format!(
            "'mount {}' failed: {failure}{}",
            args.join(" "),
            output_suffix(&ran)
        )),
        Ok(()) => attach_staged(stage, name, &shown, point),
    };
    take_off_staged(stage, name, &shown);
    result
}

/// The mount at `name` in the staging directory, cloned and attached onto `point`.
fn attach_staged(
    stage: &Dir,
    name: &OsStr,
    shown: &str,
    point: &Dir,
) -> Result<(u64, u64), String> {
    let os = |what: &str, e: std::io::Error| format!("cannot {what} '{shown}': {e}");
    if !is_mounted(stage, name).map_err(|e| os("read", e))? {
        return Err(format!(
            "'mount' succeeded but nothing is mounted at the staging point '{shown}'"
        ));
    }
    let tree = mount::clone_mount(stage, name).map_err(|e| os("clone the mount at", e))?;
    let root = mount::identity(tree.as_fd()).map_err(|e| os("read the mount at", e))?;
    mount::attach(tree.as_fd(), point).map_err(|e| {
        format!("cannot attach the mount made at '{shown}' onto the mount point: {e}")
    })?;
    Ok(root)
}

/// Whether something is mounted on `name` in `stage` (its root is on another device).
fn is_mounted(stage: &Dir, name: &OsStr) -> std::io::Result<bool> {
    let top = stage.open_dir(name, false)?;
    Ok(mount::identity(top.as_fd())?.0 != mount::identity(stage.as_fd())?.0)
}

/// Detaches whatever is mounted at the staging point and removes it; failures are logged (a
/// left staging point costs a name, never a volume).
fn take_off_staged(stage: &Dir, name: &OsStr, shown: &str) {
    let detached = match is_mounted(stage, name) {
        Ok(true) => stage
            .open_dir(name, false)
            .and_then(|top| mount::unmount(&top, Unmount::Lazy)),
        Ok(false) => Ok(()),
        Err(error) => Err(error),
    };
    if let Err(error) = detached.and_then(|()| stage.remove(name, true)) {
        log::line(format_args!(
            "init: cannot take off the staging point '{shown}': {error}"
        ));
    }
}
