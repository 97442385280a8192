//! Opening a system directory below `--system-root` as root, one component at a time, without
//! following a symlink anywhere on the way and creating what is missing: the walk `/init`'s
//! volumes and the metadata poller's `/run/e2b` make before they act, so that what they act on
//! is the directory held, not whatever a path names a moment later.
//!
//! A component that is a symlink is refused (it is not replaced: the link may be a user's),
//! as is one that is not a directory. A missing one is made as root, 0755 (`fs::dirs`), then
//! opened again without following a link, so one a user plants in the race is refused too.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::fs::dirs::{make_dir, Made};
use crate::sys::dir::Dir;

/// Opens `root`, then each directory of the absolute `path` below it (see the module).
/// Errors name the component as `path` names it.
pub fn open_below(root: &Path, path: &str) -> Result<Dir, String> {
    let mut dir = Dir::open(root).map_err(|error| format!("'{}': {error}", root.display()))?;
    let mut walked = PathBuf::from("/");
    for name in path.split('/').filter(|name| !name.is_empty()) {
        walked.push(name);
        dir = step(&dir, OsStr::new(name), &walked)?;
    }
    Ok(dir)
}

/// Opens (or makes, then opens) the directory `name` in `dir`, following no symlink; `walked`
/// is its path in errors.
pub fn step(dir: &Dir, name: &OsStr, walked: &Path) -> Result<Dir, String> {
    let mut made = false;
    loop {
        match dir.open_dir(name, false) {
            Ok(next) => return Ok(next),
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) && !made => {
                made = true;
                // What `make_dir` opens is dropped: the loop opens it again, following nothing.
                make_dir(dir, name, 0, 0).map_err(|made| match made {
                    Made::NotADirectory => format!("'{}' is not a directory", walked.display()),
                    Made::Replaced => format!("'{}' was replaced while made", walked.display()),
                    Made::Failed(error) => format!("'{}': {error}", walked.display()),
                })?;
            }
            Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                let link = dir.stat_at(name, false).is_ok_and(|stat| stat.is_symlink());
                return Err(if link {
                    format!(
                        "'{}' is a symbolic link, which sandboxd does not follow there",
                        walked.display()
                    )
                } else {
                    format!("'{}' is not a directory", walked.display())
                });
            }
            Err(error) => return Err(format!("'{}': {error}", walked.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_made_and_no_link_is_followed() {
        let root = tempfile::tempdir().unwrap();
        open_below(root.path(), "/mnt/data/deep").unwrap();
        assert!(root.path().join("mnt/data/deep").is_dir());
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), root.path().join("link"))
            .unwrap();
        let error = open_below(root.path(), "/link/vol").unwrap_err();
        assert_eq!(
            error,
            "'/link' is a symbolic link, which sandboxd does not follow there"
        );
        assert!(!root.path().join("elsewhere/vol").exists());
        std::fs::write(root.path().join("file"), "").unwrap();
        let error = open_below(root.path(), "/file/vol").unwrap_err();
        assert_eq!(error, "'/file' is not a directory");
        // A dangling link is refused too, not made through.
        std::os::unix::fs::symlink(root.path().join("absent"), root.path().join("dangling"))
            .unwrap();
        let error = open_below(root.path(), "/dangling").unwrap_err();
        assert_eq!(
            error,
            "'/dangling' is a symbolic link, which sandboxd does not follow there"
        );
        assert!(!root.path().join("absent").exists());
    }
}
