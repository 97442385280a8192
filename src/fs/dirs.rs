//! Directories for written files (SPEC §4) and the record a write answers with (SPEC §2.1, §5).
//!
//! This module owns opening the directory a file is about to be written into, creating the
//! missing ones on the way: mode exactly 0755 whatever the umask, owned by the user, existing
//! directories left alone, a non-directory in the way refused. The symlinks of the path as the
//! client named it are followed (a link to a directory counts as a directory), but a directory
//! this module creates is set up through its own descriptor, opened without following a
//! symlink, and only if it is still the empty directory just made: a local user who swaps it
//! for a symlink or another directory meanwhile fails the request and redirects nothing. It
//! also owns the `{"path","name","type"}` JSON record of a written file.

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::fs::error::FsError;
use crate::sys::dir::Dir;

/// The mode of every directory sandboxd creates.
pub const DIR_MODE: u32 = 0o755;

/// Opens the directory `dir`, first creating it and any missing ancestor (mode exactly 0755
/// regardless of umask, owned by uid:gid); existing directories are left alone. A
/// non-directory in the way → [`FsError::NotADirectory`] naming that component. Races with
/// other creators (EEXIST) are fine. Other OS errors → [`FsError::io`].
///
/// Symlinks to directories count as directories.
pub fn open_or_create(dir: &Path, uid: u32, gid: u32) -> Result<Dir, FsError> {
    // The common case, one open: the directory is already there.
    match Dir::open(dir) {
        Ok(handle) => return Ok(handle),
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {}
        Err(err) => return Err(io_error(err, "opening directory", dir)),
    }
    let start = if dir.is_absolute() { "/" } else { "." };
    let mut current = Dir::open(Path::new(start)).map_err(|err| io_error(err, "opening", dir))?;
    let mut walked = Path::new(start).to_path_buf();
    for component in dir.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        walked.push(name);
        current = match current.open_dir(name, true) {
            Ok(next) => next,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                make_dir(&current, name, uid, gid).map_err(|err| match err {
                    Made::NotADirectory => FsError::NotADirectory(walked.clone()),
                    Made::Replaced => io_error(replaced(), "creating directory", &walked),
                    Made::Failed(err) => io_error(err, "creating directory", &walked),
                })?
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(FsError::NotADirectory(walked))
            }
            Err(err) => return Err(io_error(err, "opening directory", &walked)),
        };
    }
    Ok(current)
}

/// Why [`make_dir`] did not give a directory.
#[derive(Debug)]
pub enum Made {
    /// Something other than a directory (a file, a dangling symlink) has the name.
    NotADirectory,
    /// The new directory was replaced by something else before it was set up.
    Replaced,
    /// An OS error.
    Failed(io::Error),
}

/// Creates the directory `name` in `parent` (exactly 0755, owned by uid:gid) and opens it; if
/// another creator won the race, opens theirs as it is. The new directory's mode and owner are
/// set through a descriptor opened without following a symlink, and only once it is known to
/// be the directory just made (owned by this thread's filesystem user, empty): otherwise
/// [`Made::Replaced`], and nothing is changed.
pub fn make_dir(parent: &Dir, name: &OsStr, uid: u32, gid: u32) -> Result<Dir, Made> {
    match parent.mkdir(name, DIR_MODE) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            return match parent.open_dir(name, true) {
                Ok(dir) => Ok(dir),
                Err(err) if matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ENOENT)) => {
                    Err(Made::NotADirectory)
                }
                Err(err) => Err(Made::Failed(err)),
            };
        }
        Err(err) => return Err(Made::Failed(err)),
    }
    set_up(parent, name, uid, gid)
}

fn set_up(parent: &Dir, name: &OsStr, uid: u32, gid: u32) -> Result<Dir, Made> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let dir = match parent.open_file(name, flags) {
        Ok(dir) => dir,
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT)
            ) =>
        {
            return Err(Made::Replaced)
        }
        Err(err) => return Err(Made::Failed(err)),
    };
    let stat = dir.metadata().map_err(Made::Failed)?;
    // Made by this thread: owned by its filesystem user (root, or the user with
    // `--fs-as-user`), and empty. (Not "two links": btrfs counts one for every directory.)
    if stat.uid() != crate::sys::creds::fsuid() || stat.nlink() > 2 {
        return Err(Made::Replaced);
    }
    let held = Dir::from(dir);
    if !held.is_empty().map_err(Made::Failed)? {
        return Err(Made::Replaced);
    }
    held.set_mode_and_owner(DIR_MODE, uid, gid)
        .map_err(Made::Failed)?;
    Ok(held)
}

/// The error of a directory swapped for something else between its creation and its set-up.
pub fn replaced() -> io::Error {
    io::Error::other("the new directory was replaced while it was being set up")
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

/// The JSON array of [`file_record`]s of `paths`, the same bytes, written straight out: a tar
/// upload answers thousands, and building a `Value` of each to print it took a tenth of a
/// 2,600-member upload's time.
pub fn file_records_json(paths: &[PathBuf]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + paths.len() * 96);
    out.push(b'[');
    for (i, path) in paths.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let name = path.file_name().map(|name| name.to_string_lossy());
        out.extend_from_slice(b"{\"name\":");
        json_string(&mut out, name.as_deref().unwrap_or(""));
        out.extend_from_slice(b",\"path\":");
        json_string(&mut out, &path.to_string_lossy());
        out.extend_from_slice(b",\"type\":\"file\"}");
    }
    out.push(b']');
    out
}

/// `text` as a JSON string: as it is between quotes when nothing in it needs escaping (a
/// path's usual case), else as `serde_json` escapes it.
fn json_string(out: &mut Vec<u8>, text: &str) {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, Permissions};
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    /// Creates the missing parents of the file `path`, as a write does.
    fn create_parents(path: &Path, uid: u32, gid: u32) -> Result<(), FsError> {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => {
                open_or_create(parent, uid, gid).map(drop)
            }
            _ => Ok(()),
        }
    }

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
    fn a_new_directory_swapped_before_its_set_up_is_refused_and_nothing_is_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = Dir::open(tmp.path()).unwrap();
        let target = tmp.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("new")).unwrap();
        let (uid, gid) = owner(tmp.path());
        let err = set_up(&parent, OsStr::new("new"), uid + 1, gid + 1).unwrap_err();
        assert!(matches!(err, Made::Replaced), "{err:?}");
        assert_eq!(mode(&target), 0o700);
        assert_eq!(owner(&target), (uid, gid));
        // A directory with something in it is not one just made either.
        fs::create_dir_all(tmp.path().join("full/sub")).unwrap();
        let err = set_up(&parent, OsStr::new("full"), uid + 1, gid + 1).unwrap_err();
        assert!(matches!(err, Made::Replaced), "{err:?}");
        // Nor one holding a file (two links, as an empty one has).
        fs::create_dir(tmp.path().join("with-file")).unwrap();
        fs::write(tmp.path().join("with-file/f"), b"x").unwrap();
        let err = set_up(&parent, OsStr::new("with-file"), uid + 1, gid + 1).unwrap_err();
        assert!(matches!(err, Made::Replaced), "{err:?}");
        assert_eq!(owner(&tmp.path().join("with-file")), (uid, gid));
        // An empty one just made is set up.
        fs::create_dir(tmp.path().join("fresh")).unwrap();
        set_up(&parent, OsStr::new("fresh"), uid, gid).unwrap();
        assert_eq!(mode(&tmp.path().join("fresh")), 0o755);
        assert_eq!(owner(&tmp.path().join("full")), (uid, gid));
    }

    #[test]
    fn a_dangling_symlink_in_the_way_is_not_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", tmp.path().join("dangling")).unwrap();
        let (uid, gid) = owner(tmp.path());
        let result = create_parents(&tmp.path().join("dangling/file.txt"), uid, gid);
        assert!(
            matches!(&result, Err(FsError::NotADirectory(dir)) if dir.ends_with("dangling")),
            "{result:?}"
        );
    }

    #[test]
    fn no_parent_is_nothing_to_do() {
        assert!(create_parents(Path::new("/"), 0, 0).is_ok());
        assert!(create_parents(Path::new("file.txt"), 0, 0).is_ok());
        assert!(open_or_create(Path::new("/"), 0, 0).is_ok());
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

    #[test]
    fn records_written_straight_are_the_records_printed() {
        use std::os::unix::ffi::OsStrExt;
        let paths: Vec<PathBuf> = [
            &b"/home/user/a.txt"[..],
            b"/a b/\xc3\xbcn\"q\\.txt",
            b"/bad/\xff\xfe",
            b"/",
            b"/tab\there/\x01",
        ]
        .iter()
        .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
        .collect();
        let printed =
            serde_json::Value::Array(paths.iter().map(|p| file_record(p)).collect()).to_string();
        assert_eq!(
            String::from_utf8(file_records_json(&paths)).unwrap(),
            printed
        );
        assert_eq!(file_records_json(&[]), b"[]");
    }
}
