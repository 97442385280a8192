//! Directories for written files (SPEC §4) and the record a write answers with (SPEC §2.1, §5).
//!
//! This module owns creating the missing parent directories of a file about to be written: mode
//! exactly 0755 whatever the umask, owned by the user, existing directories left alone, a
//! non-directory in the way refused. It also owns the `{"path","name","type"}` JSON
//! record of a written file.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::fs::error::FsError;

/// The mode of every directory sandboxd creates.
pub const DIR_MODE: u32 = 0o755;

/// Creates the missing parent directories of `path` (mode exactly 0755 regardless of umask, chowned to uid:gid);
/// existing directories are left alone. A non-directory in the way → [`FsError::NotADirectory`]
/// naming that component. Races with other creators (EEXIST) are fine. Other OS errors →
/// [`FsError::io`].
///
/// Symlinks to directories count as directories. `path` itself is not created.
pub fn create_parents(path: &Path, uid: u32, gid: u32) -> Result<(), FsError> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    // The common case, one stat: the parent is already there.
    if matches!(fs::metadata(parent), Ok(meta) if meta.is_dir()) {
        return Ok(());
    }
    let mut missing: Vec<&Path> = parent
        .ancestors()
        .filter(|dir| !dir.as_os_str().is_empty())
        .collect();
    missing.reverse();
    for dir in missing {
        match fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => return Err(FsError::NotADirectory(dir.to_path_buf())),
            Err(err) if err.kind() == io::ErrorKind::NotFound => create_dir(dir, uid, gid)?,
            Err(err) => return Err(io_error(err, "checking directory", dir)),
        }
    }
    Ok(())
}

/// Creates one directory; if another creator won the race, accepts its directory as it is.
fn create_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), FsError> {
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            return match fs::metadata(dir) {
                Ok(meta) if meta.is_dir() => Ok(()),
                Ok(_) => Err(FsError::NotADirectory(dir.to_path_buf())),
                Err(err) => Err(io_error(err, "creating directory", dir)),
            };
        }
        Err(err) => return Err(io_error(err, "creating directory", dir)),
    }
    // Mode and owner are set through a descriptor opened without following symlinks, so a
    // directory swapped for a symlink meanwhile cannot redirect the chmod or chown.
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|err| io_error(err, "opening directory", dir))?;
    handle
        .set_permissions(Permissions::from_mode(DIR_MODE))
        .map_err(|err| io_error(err, "setting the mode of directory", dir))?;
    std::os::unix::fs::fchown(&handle, Some(uid), Some(gid))
        .map_err(|err| io_error(err, "setting the owner of directory", dir))?;
    Ok(())
}

fn io_error(err: io::Error, doing: &str, dir: &Path) -> FsError {
    FsError::io(err, format!("{doing} '{}'", dir.display()))
}

/// The `{"path","name","type"}` record of SPEC §2.1 / §5 for a written file (`type` "file", `name` = base name).
pub fn file_record(path: &Path) -> serde_json::Value {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    serde_json::json!({
        "path": path.to_string_lossy(),
        "name": name,
        "type": "file",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::process::Command;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn owner(path: &Path) -> (u32, u32) {
        let meta = fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    #[test]
    fn creates_nested_parents_but_not_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (uid, gid) = owner(tmp.path());
        let file = tmp.path().join("a/b/c/file.txt");
        create_parents(&file, uid, gid).unwrap();
        for dir in ["a", "a/b", "a/b/c"] {
            let dir = tmp.path().join(dir);
            assert!(fs::metadata(&dir).unwrap().is_dir(), "{}", dir.display());
            assert_eq!(mode(&dir), 0o755, "{}", dir.display());
        }
        assert!(!file.exists());
        // A second call finds everything in place.
        create_parents(&file, uid, gid).unwrap();
    }

    #[test]
    fn existing_directories_are_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let (uid, gid) = owner(tmp.path());
        let existing = tmp.path().join("keep");
        fs::create_dir(&existing).unwrap();
        fs::set_permissions(&existing, Permissions::from_mode(0o700)).unwrap();
        create_parents(&existing.join("new/file.txt"), uid + 1, gid + 1).unwrap();
        assert_eq!(mode(&existing), 0o700);
        assert_eq!(owner(&existing), (uid, gid));
        assert_eq!(mode(&existing.join("new")), 0o755);
    }

    #[test]
    fn symlink_to_a_directory_counts_as_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let (uid, gid) = owner(tmp.path());
        fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        create_parents(&tmp.path().join("link/sub/file.txt"), uid, gid).unwrap();
        assert!(tmp.path().join("real/sub").is_dir());
    }

    #[test]
    fn a_file_in_the_way_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (uid, gid) = owner(tmp.path());
        fs::create_dir(tmp.path().join("a")).unwrap();
        fs::write(tmp.path().join("a/b"), b"not a directory").unwrap();
        let in_the_way = tmp.path().join("a/b");
        let result = create_parents(&tmp.path().join("a/b/c/d.txt"), uid, gid);
        assert!(
            matches!(&result, Err(FsError::NotADirectory(dir)) if *dir == in_the_way),
            "{result:?}"
        );
        assert!(!tmp.path().join("a/b/c").exists());
        // The direct parent being a file is the same error.
        let result = create_parents(&tmp.path().join("a/b/d.txt"), uid, gid);
        assert!(
            matches!(&result, Err(FsError::NotADirectory(dir)) if *dir == in_the_way),
            "{result:?}"
        );
    }

    #[test]
    fn no_parent_is_nothing_to_do() {
        assert!(create_parents(Path::new("/"), 0, 0).is_ok());
        assert!(create_parents(Path::new("file.txt"), 0, 0).is_ok());
    }

    fn running_as_root() -> bool {
        fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    }

    #[test]
    fn created_directories_are_chowned_to_the_user() {
        if !running_as_root() {
            // CI runs as root and sets this: there a root-only test must not pass unrun.
            let required =
                std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1");
            assert!(
                !required,
                "chown to another user needs root (SANDBOXD_REQUIRE_ROOT_TESTS=1)"
            );
            eprintln!("skipped: chown to another user needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let before = owner(tmp.path());
        let (uid, gid) = (12345, 23456);
        assert_ne!((uid, gid), before);
        create_parents(&tmp.path().join("x/y/file.txt"), uid, gid).unwrap();
        assert_eq!(owner(&tmp.path().join("x")), (uid, gid));
        assert_eq!(owner(&tmp.path().join("x/y")), (uid, gid));
        assert_eq!(owner(tmp.path()), before);
    }

    const UMASK_CHILD: &str = "SANDBOXD_TEST_UMASK_077_CHILD";
    const UMASK_TEST: &str = "fs::dirs::tests::mode_is_0755_under_umask_077";

    fn current_umask() -> Option<String> {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("Umask:"))
            .map(|value| value.trim().to_string())
    }

    /// The umask is process-wide and setting it needs `unsafe`, so this test re-runs itself in a
    /// child test process started by `sh` after `umask 077`.
    #[test]
    fn mode_is_0755_under_umask_077() {
        if std::env::var_os(UMASK_CHILD).is_some() {
            assert_eq!(current_umask().as_deref(), Some("0077"));
            let tmp = tempfile::tempdir().unwrap();
            let (uid, gid) = owner(tmp.path());
            create_parents(&tmp.path().join("p/q/file.txt"), uid, gid).unwrap();
            assert_eq!(mode(&tmp.path().join("p")), 0o755);
            assert_eq!(mode(&tmp.path().join("p/q")), 0o755);
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let output = Command::new("sh")
            .arg("-c")
            .arg("umask 077 && exec \"$0\" \"$@\"")
            .arg(exe)
            .args(["--exact", UMASK_TEST, "--test-threads=1", "--nocapture"])
            .env(UMASK_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
    }

    #[test]
    fn file_record_names_the_file() {
        assert_eq!(
            file_record(Path::new("/home/user/demo/out.bin")),
            serde_json::json!({"path": "/home/user/demo/out.bin", "name": "out.bin", "type": "file"})
        );
        assert_eq!(
            file_record(Path::new("/a b/ünï.txt")).to_string(),
            r#"{"name":"ünï.txt","path":"/a b/ünï.txt","type":"file"}"#
        );
    }
}
